package vpcfake

import (
	"mime"
	"net/http"
	"time"
)

// grantAPIKey is the OAuth grant type IAM uses for API keys.
const grantAPIKey = "urn:ibm:params:oauth:grant-type:apikey"

// token is IAM's "get token" operation for API keys: a form POST that
// answers with a bearer token the VPC routes then accept. Expiry uses the
// wall clock, as the SDK compares it with its own.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	if !s.admit(w, r, OpIAMToken, false, true) {
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/x-www-form-urlencoded" {
		writeIAMProblem(w, http.StatusBadRequest, "BXNIM0109E", "Property missing or empty: the request body must be form encoded.")
		return
	}
	if err := r.ParseForm(); err != nil {
		writeIAMProblem(w, http.StatusBadRequest, "BXNIM0109E", "The request body could not be parsed.")
		return
	}
	switch gt := r.PostForm.Get("grant_type"); {
	case gt == "":
		writeIAMProblem(w, http.StatusBadRequest, "BXNIM0109E", "Property missing or empty. Property name: 'grant_type'.")
		return
	case gt != grantAPIKey:
		writeIAMProblem(w, http.StatusBadRequest, "BXNIM0104E", "The grant type is not supported by this fake.")
		return
	}
	key := r.PostForm.Get("apikey")
	if key == "" {
		writeIAMProblem(w, http.StatusBadRequest, "BXNIM0109E", "Property missing or empty. Property name: 'apikey'.")
		return
	}
	if s.apiKey != "" && key != s.apiKey {
		// Never echo the key.
		writeIAMProblem(w, http.StatusBadRequest, "BXNIM0415E", "Provided API key could not be found.")
		return
	}
	tok := s.fixedToken
	if tok == "" {
		tok = randomHex(24)
	}
	s.mu.Lock()
	s.tokens[tok] = true
	s.mu.Unlock()
	const ttl = time.Hour
	writeJSON(w, http.StatusOK, iamToken{
		AccessToken:  tok,
		RefreshToken: randomHex(24),
		TokenType:    "Bearer",
		ExpiresIn:    int64(ttl.Seconds()),
		Expiration:   time.Now().Add(ttl).Unix(),
		Scope:        "ibm openid",
	})
}
