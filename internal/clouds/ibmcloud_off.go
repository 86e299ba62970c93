//go:build !caa_ibmcloud && (caa_aws || caa_azure)

package clouds

// ibmcloudCloud: this build leaves IBM Cloud out (see clouds.go).
func ibmcloudCloud() *Cloud { return nil }
