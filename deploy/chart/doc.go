// Package chart holds the tests of caa's Helm chart (deploy/chart/caa).
//
// It is a module of its own so that Helm's Go SDK, which links kubectl's
// libraries, the apiextensions and apiserver modules and more, stays out
// of caa's go.mod: the daemon's dependency graph and its k8s.io versions
// are decided by the daemon alone. `make test` runs this module's tests
// after the main module's.
package chart
