//go:build !caa_azure && (caa_aws || caa_ibmcloud)

package main

// azureCloud: this build leaves Azure out (see clouds.go).
func azureCloud() *cloud { return nil }
