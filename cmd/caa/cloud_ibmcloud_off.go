//go:build !caa_ibmcloud && (caa_aws || caa_azure)

package main

// ibmcloudCloud: this build leaves IBM Cloud out (see clouds.go).
func ibmcloudCloud() *cloud { return nil }
