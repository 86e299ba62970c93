//go:build !caa_aws && (caa_azure || caa_ibmcloud)

package clouds

// awsCloud: this build leaves AWS out (see clouds.go).
func awsCloud() *Cloud { return nil }
