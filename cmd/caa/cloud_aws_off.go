//go:build !caa_aws && (caa_azure || caa_ibmcloud)

package main

// awsCloud: this build leaves AWS out (see clouds.go).
func awsCloud() *cloud { return nil }
