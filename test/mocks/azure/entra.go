package armfake

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Entra ID's workload identity federation, as much of it as azidentity's
// WorkloadIdentityCredential (inside DefaultAzureCredential) speaks to an
// authority host it is told to use (AZURE_AUTHORITY_HOST) with instance
// discovery off:
//
//   - GET {host}/{tenant}/v2.0/.well-known/openid-configuration, the tenant
//     discovery document MSAL reads for the token endpoint (its issuer must
//     be on the same host, which MSAL checks);
//   - POST {host}/{tenant}/oauth2/v2.0/token with grant_type
//     client_credentials, the application's client_id, a client_assertion
//     of type jwt-bearer (the projected ServiceAccount token) and the scope
//     of Resource Manager.
//
// The assertion is checked by Verify (a JWKS check of the cluster's
// issuer, e.g.), and its subject must be the federated credential's
// Subject. The answer is a fresh random access token valid for Lifetime,
// which Check accepts until then (plus Grace, for a request sent just
// before the expiry), so the fake ARM can take exactly these tokens
// (WithAccessTokens(e.Check)). MSAL requires https for the authority, so
// serve this with TLS.
type Entra struct {
	TenantID, ClientID string
	// Subject is the federated identity credential's subject, e.g.
	// system:serviceaccount:caa-system:caa.
	Subject string
	// Verify checks the assertion (signature, issuer, audience, expiry)
	// and returns its subject.
	Verify func(assertion string) (subject string, err error)
	// Lifetime of the access tokens (Entra's default is about an hour);
	// Grace is how long past it Check still accepts one.
	Lifetime, Grace time.Duration
	// Now is the clock of expiries (default time.Now).
	Now func() time.Time

	// Issued and Refused count the token answers.
	Issued, Refused atomic.Int64
	// Refusal, when set, hears why a token request was refused.
	Refusal func(why string)

	mu          sync.Mutex
	tokens      map[string]time.Time // access token -> expiry
	order       []string
	assertions  map[string]int // assertion -> tokens issued for it
	lastSubject string
}

// EntraAudience is the audience Azure gives workload identity tokens: the
// ServiceAccount token must be projected with it.
const EntraAudience = "api://AzureADTokenExchange"

// ARMScope is the scope azidentity asks for Resource Manager.
const ARMScope = ARMAudience + "/.default"

func (e *Entra) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// ServeHTTP serves the discovery document and the token endpoint.
func (e *Entra) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) == 4 && parts[1] == "v2.0" && parts[2] == ".well-known" && parts[3] == "openid-configuration" && r.Method == http.MethodGet:
		e.discovery(w, r, parts[0])
	case len(parts) == 4 && parts[1] == "oauth2" && parts[2] == "v2.0" && parts[3] == "token" && r.Method == http.MethodPost:
		e.token(w, r, parts[0])
	default:
		e.refuse(w, http.StatusNotFound, "invalid_request", 90002, fmt.Sprintf("no endpoint %s %s in this fake", r.Method, r.URL.Path))
	}
}

func (e *Entra) base(r *http.Request) string {
	scheme := "https"
	if r.TLS == nil {
		scheme = "http"
	}
	return scheme + "://" + r.Host
}

func (e *Entra) discovery(w http.ResponseWriter, r *http.Request, tenant string) {
	if !strings.EqualFold(tenant, e.TenantID) {
		e.refuse(w, http.StatusBadRequest, "invalid_tenant", 90002, fmt.Sprintf("Tenant '%s' not found.", tenant))
		return
	}
	base := e.base(r) + "/" + e.TenantID
	writeJSONPlain(w, http.StatusOK, map[string]any{
		"issuer":                                base + "/v2.0",
		"token_endpoint":                        base + "/oauth2/v2.0/token",
		"authorization_endpoint":                base + "/oauth2/v2.0/authorize",
		"jwks_uri":                              base + "/discovery/v2.0/keys",
		"response_types_supported":              []string{"code", "id_token", "token"},
		"token_endpoint_auth_methods_supported": []string{"client_secret_post", "private_key_jwt"},
	})
}

func (e *Entra) token(w http.ResponseWriter, r *http.Request, tenant string) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
		e.refuse(w, http.StatusBadRequest, "invalid_request", 900144, "The request body must be form-encoded.")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		e.refuse(w, http.StatusBadRequest, "invalid_request", 900144, "The request body could not be read.")
		return
	}
	q, err := url.ParseQuery(string(body))
	if err != nil {
		e.refuse(w, http.StatusBadRequest, "invalid_request", 900144, "The request body is not a form.")
		return
	}
	switch {
	case !strings.EqualFold(tenant, e.TenantID):
		e.refuse(w, http.StatusBadRequest, "invalid_tenant", 90002, fmt.Sprintf("Tenant '%s' not found.", tenant))
		return
	case q.Get("grant_type") != "client_credentials":
		e.refuse(w, http.StatusBadRequest, "unsupported_grant_type", 70003, "The app requested an unsupported grant type '"+q.Get("grant_type")+"'.")
		return
	case q.Get("client_id") != e.ClientID:
		e.refuse(w, http.StatusBadRequest, "unauthorized_client", 700016, "Application with identifier '"+q.Get("client_id")+"' was not found in the directory.")
		return
	case q.Get("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer" || q.Get("client_assertion") == "":
		e.refuse(w, http.StatusBadRequest, "invalid_client", 7000218, "The request body must contain 'client_assertion' of type jwt-bearer.")
		return
	case q.Has("client_secret"):
		e.refuse(w, http.StatusBadRequest, "invalid_client", 7000218, "A workload identity request carries no client secret.")
		return
	case !armScopeOnly(q.Get("scope")):
		e.refuse(w, http.StatusBadRequest, "invalid_scope", 1002012, "The provided value for scope "+q.Get("scope")+" is not valid here.")
		return
	}
	assertion := q.Get("client_assertion")
	subject, err := e.Verify(assertion)
	if err != nil {
		// The reason, never the token.
		e.refuse(w, http.StatusUnauthorized, "invalid_client", 700024, "Client assertion is not valid: "+err.Error())
		return
	}
	if subject != e.Subject {
		e.refuse(w, http.StatusBadRequest, "invalid_request", 70021, "No matching federated identity record found for presented assertion subject '"+subject+"'.")
		return
	}
	lifetime := e.Lifetime
	if lifetime <= 0 {
		lifetime = time.Hour
	}
	tok := "fake-entra-at." + strings.ToLower(rand.Text()) + strings.ToLower(rand.Text())
	e.mu.Lock()
	if e.tokens == nil {
		e.tokens, e.assertions = map[string]time.Time{}, map[string]int{}
	}
	e.tokens[tok] = e.now().Add(lifetime)
	e.order = append(e.order, tok)
	e.assertions[assertion]++
	e.lastSubject = subject
	e.mu.Unlock()
	e.Issued.Add(1)
	secs := int64((lifetime + time.Second - 1) / time.Second)
	writeJSONPlain(w, http.StatusOK, map[string]any{
		"token_type": "Bearer", "expires_in": secs, "ext_expires_in": secs, "access_token": tok,
	})
}

func (e *Entra) refuse(w http.ResponseWriter, status int, code string, aadsts int, message string) {
	e.Refused.Add(1)
	if e.Refusal != nil {
		e.Refusal(fmt.Sprintf("%s AADSTS%d: %s", code, aadsts, message))
	}
	writeJSONPlain(w, status, map[string]any{
		"error": code, "error_description": fmt.Sprintf("AADSTS%d: %s", aadsts, message),
		"error_codes": []int{aadsts}, "timestamp": e.now().UTC().Format("2006-01-02 15:04:05Z"),
	})
}

// Check accepts an access token this fake issued, until its expiry plus
// Grace; one past it is ErrAccessTokenExpired.
func (e *Entra) Check(token string) error {
	e.mu.Lock()
	exp, ok := e.tokens[token]
	e.mu.Unlock()
	switch {
	case !ok:
		return fmt.Errorf("not issued by this fake Entra ID")
	case !e.now().Before(exp.Add(e.Grace)):
		return ErrAccessTokenExpired
	}
	return nil
}

// Tokens returns every access token issued, oldest first.
func (e *Entra) Tokens() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.order...)
}

// IssuedFor returns how many access tokens were issued for an assertion.
func (e *Entra) IssuedFor(assertion string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.assertions[assertion]
}

func writeJSONPlain(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store, no-cache")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// armScopeOnly reports whether a token request's scope is Resource
// Manager's, beside the OpenID scopes MSAL adds to every request.
func armScopeOnly(scope string) bool {
	arm := false
	for _, sc := range strings.Fields(scope) {
		switch sc {
		case ARMScope:
			arm = true
		case "openid", "offline_access", "profile":
		default:
			return false
		}
	}
	return arm
}
