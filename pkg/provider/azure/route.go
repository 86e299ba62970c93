package azure

import "strings"

// CredentialRoute describes, from the environment getenv reads, which link
// of DefaultAzureCredential will give caa its tokens, in the chain's
// order: a service principal from the environment (a client secret or
// certificate), workload identity, or a managed identity. It names the
// client, tenant and token file, never a secret or a token, so it may be
// logged at start.
func CredentialRoute(getenv func(string) string) string {
	client, tenant := getenv("AZURE_CLIENT_ID"), getenv("AZURE_TENANT_ID")
	who := func(parts ...string) string {
		var out []string
		for i := 0; i+1 < len(parts); i += 2 {
			if parts[i+1] != "" {
				out = append(out, parts[i]+" "+parts[i+1])
			}
		}
		if len(out) == 0 {
			return ""
		}
		return " (" + strings.Join(out, ", ") + ")"
	}
	switch {
	case client != "" && tenant != "" && getenv("AZURE_CLIENT_SECRET") != "":
		return "service principal with a client secret" + who("client", client, "tenant", tenant)
	case client != "" && tenant != "" && getenv("AZURE_CLIENT_CERTIFICATE_PATH") != "":
		return "service principal with a certificate" + who("client", client, "tenant", tenant)
	case client != "" && tenant != "" && getenv("AZURE_FEDERATED_TOKEN_FILE") != "":
		return "workload identity" + who("client", client, "tenant", tenant, "token file", getenv("AZURE_FEDERATED_TOKEN_FILE"),
			"authority", getenv("AZURE_AUTHORITY_HOST"))
	case getenv("IDENTITY_ENDPOINT") != "":
		return "managed identity (local identity endpoint)" + who("client", client)
	}
	return "managed identity (IMDS), else the Azure CLI" + who("client", client)
}
