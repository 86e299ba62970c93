package armfake

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// The managed identity API that azidentity speaks to App Service's local
// endpoint (IDENTITY_ENDPOINT + IDENTITY_HEADER), and the audience of
// Resource Manager in the public cloud, which caa keeps when
// --azure-endpoint moves the URL.
const (
	ManagedIdentityAPIVersion = "2019-08-01"
	ARMAudience               = "https://management.core.windows.net/"
)

// ManagedIdentity fakes App Service's managed identity endpoint, so that a
// caa process using DefaultAzureCredential gets its token from the test
// (IDENTITY_ENDPOINT=<server>/msi/token, IDENTITY_HEADER=Header): a GET with
// the X-IDENTITY-HEADER secret, the api-version and Resource Manager's
// audience, answered with Token. Anything else is refused and counted.
type ManagedIdentity struct {
	Token, Header   string
	Issued, Refused atomic.Int64
	// Refusal, when set, hears why a request was refused.
	Refusal func(why string)
}

// Path is where ManagedIdentity answers.
const ManagedIdentityPath = "/msi/token"

// ServeHTTP answers a token request.
func (mi *ManagedIdentity) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	problem := ""
	switch {
	case r.URL.Path != ManagedIdentityPath:
		problem = "path " + r.URL.Path
	case r.Method != http.MethodGet:
		problem = "method " + r.Method
	case r.Header.Get("X-IDENTITY-HEADER") != mi.Header:
		problem = "missing or wrong X-IDENTITY-HEADER"
	case q.Get("api-version") != ManagedIdentityAPIVersion:
		problem = "api-version " + q.Get("api-version")
	case q.Get("resource") != ARMAudience:
		problem = "resource " + q.Get("resource")
	case q.Has("client_id") || q.Has("mi_res_id") || q.Has("principal_id"):
		problem = "a user-assigned identity was asked for"
	}
	w.Header().Set("Content-Type", "application/json")
	if problem != "" {
		mi.Refused.Add(1)
		if mi.Refusal != nil {
			mi.Refusal(problem)
		}
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "invalid_request", "error_description": problem})
		return
	}
	mi.Issued.Add(1)
	_ = json.NewEncoder(w).Encode(map[string]string{
		"access_token": mi.Token,
		"expires_on":   strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10),
		"resource":     q.Get("resource"),
		"token_type":   "Bearer",
	})
}
