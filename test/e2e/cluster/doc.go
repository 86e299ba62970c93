// Package cluster runs a real etcd and kube-apiserver on 127.0.0.1 for the
// end-to-end tests, with helpers that stand in for the missing kubelet and
// controllers (nodes, peer pods, pod phases, forced deletes).
//
// Both binaries are built from the Go module proxy by the wrapper modules in
// test/e2e/tools and cached outside the repository (see EnsureBinaries); the
// first build takes minutes, later runs reuse the cache.
package cluster
