package azure_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/caa-project/caa/pkg/provider/azure"
)

func TestCredentialRoute(t *testing.T) {
	for want, env := range map[string]map[string]string{
		"service principal with a client secret (client c, tenant t)": {"AZURE_CLIENT_ID": "c", "AZURE_TENANT_ID": "t", "AZURE_CLIENT_SECRET": "s3cret"},
		"service principal with a certificate (client c, tenant t)":   {"AZURE_CLIENT_ID": "c", "AZURE_TENANT_ID": "t", "AZURE_CLIENT_CERTIFICATE_PATH": "/p"},
		"workload identity (client c, tenant t, token file /var/run/token, authority https://login.microsoftonline.com/)": {
			"AZURE_CLIENT_ID": "c", "AZURE_TENANT_ID": "t", "AZURE_FEDERATED_TOKEN_FILE": "/var/run/token",
			"AZURE_AUTHORITY_HOST": "https://login.microsoftonline.com/"},
		"managed identity (local identity endpoint)":             {"IDENTITY_ENDPOINT": "http://127.0.0.1/msi", "IDENTITY_HEADER": "h3ader"},
		"managed identity (IMDS), else the Azure CLI":            {},
		"managed identity (IMDS), else the Azure CLI (client c)": {"AZURE_CLIENT_ID": "c"},
	} {
		got := azure.CredentialRoute(func(k string) string { return env[k] })
		assert.Equal(t, want, got)
		assert.NotContains(t, got, "s3cret")
		assert.NotContains(t, got, "h3ader")
	}
}
