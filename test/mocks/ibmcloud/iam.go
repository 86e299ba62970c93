package vpcfake

import (
	"mime"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Grant types of IAM's token operation the fake serves.
const (
	grantAPIKey  = "urn:ibm:params:oauth:grant-type:apikey"
	grantCRToken = "urn:ibm:params:oauth:grant-type:cr-token"
)

// APIKeyIAMID is the iam_id of the identity behind an API key: the
// subject of the access tokens the API key grant issues, for policies.
const APIKeyIAMID = "IBMid-fake-apikey-owner"

// TrustedProfile is an IAM trusted profile whose compute-resource link the
// fake's IAM checks: POST /identity/token with grant type cr-token, the
// compute resource's token (cr_token) and the profile's id or name. Verify
// decides whether the CR token is one the profile trusts (a Kubernetes
// ServiceAccount token checked against the cluster's keys, say) and
// returns its subject; the subject must be Subject when that is set.
type TrustedProfile struct {
	ID, Name string
	Subject  string
	Verify   func(crToken string) (subject string, err error)
	// Lifetime of the access tokens issued; zero means an hour, as IAM.
	Lifetime time.Duration
	// Refusal, when set, is told why a request was refused (never the
	// token).
	Refusal func(why string)

	// Issued and Refused count the token requests.
	Issued, Refused atomic.Int64

	mu     sync.Mutex
	tokens []string // every access token issued, for leak checks
}

// IAMID is the profile's iam_id, the subject of its policies.
func (p *TrustedProfile) IAMID() string { return "iam-" + p.ID }

// AccessTokens are the access tokens the profile was issued.
func (p *TrustedProfile) AccessTokens() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.tokens...)
}

func (p *TrustedProfile) refuse(w http.ResponseWriter, code, msg, why string) {
	p.Refused.Add(1)
	if p.Refusal != nil {
		p.Refusal(why)
	}
	writeIAMProblem(w, http.StatusBadRequest, code, msg)
}

// grantee is who an access token speaks for, and until when.
type grantee struct {
	iamID   string
	expires time.Time
	uses    *atomic.Int64
	revoked bool
}

// Revoke makes the server refuse these access tokens from now on, as if
// they had expired.
func (s *Server) Revoke(tokens ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range tokens {
		if g, ok := s.tokens[t]; ok {
			g.revoked = true
			s.tokens[t] = g
		}
	}
}

// Uses counts the VPC and search calls this access token was accepted for.
func (s *Server) Uses(token string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g, ok := s.tokens[token]; ok {
		return g.uses.Load()
	}
	return 0
}

// token is IAM's "get token" operation: a form POST that exchanges an API
// key, or a compute resource token for a trusted profile, for a bearer
// token the VPC and search routes then accept until it expires. Expiry
// uses the wall clock, as the SDK compares it with its own.
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
	var who string
	ttl := time.Hour
	switch gt := r.PostForm.Get("grant_type"); gt {
	case "":
		writeIAMProblem(w, http.StatusBadRequest, "BXNIM0109E", "Property missing or empty. Property name: 'grant_type'.")
		return
	case grantAPIKey:
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
		who = APIKeyIAMID
	case grantCRToken:
		p, ok := s.crTokenGrant(w, r)
		if !ok {
			return
		}
		who = p.IAMID()
		if p.Lifetime > 0 {
			ttl = p.Lifetime
		}
		defer p.Issued.Add(1)
	default:
		writeIAMProblem(w, http.StatusBadRequest, "BXNIM0104E", "The grant type is not supported by this fake.")
		return
	}
	tok := s.fixedToken
	if tok == "" {
		tok = randomHex(24)
	}
	if s.profile != nil && who == s.profile.IAMID() {
		s.profile.mu.Lock()
		s.profile.tokens = append(s.profile.tokens, tok)
		s.profile.mu.Unlock()
	}
	now := time.Now()
	s.mu.Lock()
	s.tokens[tok] = grantee{iamID: who, expires: now.Add(ttl), uses: &atomic.Int64{}}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, iamToken{
		AccessToken:  tok,
		RefreshToken: "not_supported",
		TokenType:    "Bearer",
		ExpiresIn:    int64(ttl.Seconds()),
		Expiration:   now.Add(ttl).Unix(),
		Scope:        "ibm openid",
	})
}

// crTokenGrant checks a cr-token request against the trusted profile.
func (s *Server) crTokenGrant(w http.ResponseWriter, r *http.Request) (*TrustedProfile, bool) {
	p := s.profile
	if p == nil {
		writeIAMProblem(w, http.StatusBadRequest, "BXNIM0104E", "No trusted profile is set up in this fake.")
		return nil, false
	}
	cr := r.PostForm.Get("cr_token")
	id, name := r.PostForm.Get("profile_id"), r.PostForm.Get("profile_name")
	switch {
	case cr == "":
		p.refuse(w, "BXNIM0109E", "Property missing or empty. Property name: 'cr_token'.", "no cr_token")
		return nil, false
	case id == "" && name == "":
		p.refuse(w, "BXNIM0109E", "Property missing or empty. Property name: 'profile_id' or 'profile_name'.", "no profile")
		return nil, false
	case (id != "" && id != p.ID) || (name != "" && name != p.Name):
		p.refuse(w, "BXNIM0513E", "The trusted profile could not be found.", "profile id "+id+" name "+name)
		return nil, false
	}
	sub, err := p.Verify(cr)
	if err != nil {
		// The reason may describe the token's claims, never the token.
		p.refuse(w, "BXNIM0467E", "The compute resource token is not valid.", err.Error())
		return nil, false
	}
	if p.Subject != "" && sub != p.Subject {
		p.refuse(w, "BXNIM0468E", "The compute resource is not linked to the trusted profile.", "subject "+sub)
		return nil, false
	}
	return p, true
}

// caller is the iam_id behind the request's bearer token ("" if none).
func (s *Server) caller(r *http.Request) string {
	g, _ := s.grantee(r)
	return g.iamID
}

// grantee finds the request's bearer token; ok only while it is valid.
func (s *Server) grantee(r *http.Request) (grantee, bool) {
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) <= len(prefix) || h[:len(prefix)] != prefix {
		return grantee{}, false
	}
	s.mu.Lock()
	g, ok := s.tokens[h[len(prefix):]]
	s.mu.Unlock()
	return g, ok && !g.revoked && time.Now().Before(g.expires)
}

// authorized reports whether the request carries a valid access token,
// and counts its use.
func (s *Server) authorized(r *http.Request) bool {
	g, ok := s.grantee(r)
	if ok {
		g.uses.Add(1)
	}
	return ok
}
