//go:build !caa_azure && (caa_aws || caa_ibmcloud)

package clouds

// azureCloud: this build leaves Azure out (see clouds.go).
func azureCloud() *Cloud { return nil }
