package ec2fake

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math/big"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// STSAPIVersion is the only STS API version the fake answers.
const STSAPIVersion = "2011-06-15"

// ErrTokenExpired marks a web identity token past its exp claim.
var ErrTokenExpired = errors.New("token expired")

// TokenVerifier checks a web identity token and returns its subject.
type TokenVerifier func(token string) (subject string, err error)

// STS serves AssumeRoleWithWebIdentity of the STS Query API, the call an
// SDK's web identity provider makes for IAM roles for service accounts
// (IRSA): the token is checked by Verify, its subject must be Subject (the
// role's trust policy), and the answer is fresh keys from Keyring, valid
// for Lifetime. Every other action gets InvalidAction. Refusals use STS's
// own codes: InvalidIdentityToken, ExpiredTokenException, AccessDenied.
type STS struct {
	Keyring *Keyring
	Verify  TokenVerifier
	// RoleARN is the one role that may be assumed; Subject the one token
	// subject its trust policy admits.
	RoleARN string
	Subject string
	// Lifetime of the issued keys (STS's default is an hour).
	Lifetime time.Duration

	// Issued and Refused count the answers.
	Issued, Refused atomic.Int64
	// Refusal, when set, is told why a request was refused.
	Refusal func(why string)

	seq atomic.Uint64
}

func (s *STS) refuse(w http.ResponseWriter, status int, code, message string) {
	s.Refused.Add(1)
	if s.Refusal != nil {
		s.Refusal(code + ": " + message)
	}
	type errorXML struct {
		Type    string `xml:"Type"`
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	doc := struct {
		XMLName   xml.Name `xml:"https://sts.amazonaws.com/doc/2011-06-15/ ErrorResponse"`
		Error     errorXML `xml:"Error"`
		RequestID string   `xml:"RequestId"`
	}{Error: errorXML{"Sender", code, message}, RequestID: s.requestID()}
	writeSTS(w, status, doc)
}

func (s *STS) requestID() string {
	return fmt.Sprintf("%08x-5757-4000-8000-%012x", uint32(time.Now().UnixNano()), s.seq.Add(1))
}

func writeSTS(w http.ResponseWriter, status int, doc any) {
	out, err := xml.Marshal(doc)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(xml.Header))
	_, _ = w.Write(out)
}

func (s *STS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); r.Method != http.MethodPost || err != nil || mt != "application/x-www-form-urlencoded" {
		s.refuse(w, http.StatusBadRequest, "InvalidRequest", "The fake STS accepts form-encoded POST requests only.")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		s.refuse(w, http.StatusBadRequest, "MalformedQueryString", "The request body could not be read.")
		return
	}
	q, err := url.ParseQuery(string(body))
	if err != nil {
		s.refuse(w, http.StatusBadRequest, "MalformedQueryString", "The request body is not a valid query string.")
		return
	}
	switch {
	case q.Get("Action") != "AssumeRoleWithWebIdentity":
		s.refuse(w, http.StatusBadRequest, "InvalidAction", fmt.Sprintf("Could not find operation %s for version %s", q.Get("Action"), q.Get("Version")))
		return
	case q.Get("Version") != STSAPIVersion:
		s.refuse(w, http.StatusBadRequest, "InvalidAction", "Could not find operation AssumeRoleWithWebIdentity for version "+q.Get("Version"))
		return
	case r.Header.Get("Authorization") != "":
		// The SDK sends this call unsigned: the token is the credential.
		s.refuse(w, http.StatusBadRequest, "InvalidRequest", "AssumeRoleWithWebIdentity is called without AWS credentials.")
		return
	}
	for _, p := range []string{"RoleArn", "RoleSessionName", "WebIdentityToken"} {
		if q.Get(p) == "" {
			s.refuse(w, http.StatusBadRequest, "ValidationError", fmt.Sprintf("1 validation error detected: Value null at '%s' failed to satisfy constraint: Member must not be null", p))
			return
		}
	}
	subject, err := s.Verify(q.Get("WebIdentityToken"))
	switch {
	case errors.Is(err, ErrTokenExpired):
		s.refuse(w, http.StatusBadRequest, "ExpiredTokenException", "Token expired: current date/time is past the token's exp claim")
		return
	case err != nil:
		s.refuse(w, http.StatusBadRequest, "InvalidIdentityToken", "The web identity token is not valid: "+err.Error())
		return
	}
	if q.Get("RoleArn") != s.RoleARN || subject != s.Subject {
		s.refuse(w, http.StatusForbidden, "AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity")
		return
	}
	roleName := s.RoleARN[strings.LastIndex(s.RoleARN, "/")+1:]
	session := q.Get("RoleSessionName")
	principal := fmt.Sprintf("arn:aws:sts::%s:assumed-role/%s/%s", ownerID, roleName, session)
	lifetime := s.Lifetime
	if lifetime <= 0 {
		lifetime = time.Hour
	}
	c := s.Keyring.Issue(principal, lifetime)
	type credsXML struct {
		AccessKeyID     string `xml:"AccessKeyId"`
		SecretAccessKey string `xml:"SecretAccessKey"`
		SessionToken    string `xml:"SessionToken"`
		Expiration      string `xml:"Expiration"`
	}
	type userXML struct {
		Arn           string `xml:"Arn"`
		AssumedRoleID string `xml:"AssumedRoleId"`
	}
	type resultXML struct {
		SubjectFromWebIdentityToken string   `xml:"SubjectFromWebIdentityToken"`
		Audience                    string   `xml:"Audience"`
		AssumedRoleUser             userXML  `xml:"AssumedRoleUser"`
		Credentials                 credsXML `xml:"Credentials"`
	}
	doc := struct {
		XMLName   xml.Name  `xml:"https://sts.amazonaws.com/doc/2011-06-15/ AssumeRoleWithWebIdentityResponse"`
		Result    resultXML `xml:"AssumeRoleWithWebIdentityResult"`
		RequestID string    `xml:"ResponseMetadata>RequestId"`
	}{
		Result: resultXML{
			SubjectFromWebIdentityToken: subject, Audience: STSAudience,
			AssumedRoleUser: userXML{Arn: principal, AssumedRoleID: "AROAFAKEROLE0000CAA:" + session},
			Credentials: credsXML{AccessKeyID: c.AccessKeyID, SecretAccessKey: c.SecretAccessKey,
				SessionToken: c.SessionToken, Expiration: c.Expiration.Format(time.RFC3339)},
		},
		RequestID: s.requestID(),
	}
	s.Issued.Add(1)
	writeSTS(w, http.StatusOK, doc)
}

// STSAudience is the audience EKS gives IRSA's projected tokens.
const STSAudience = "sts.amazonaws.com"

// JWKSVerifier checks JWTs signed with a key of the JSON Web Key Set jwks
// (ES256 or RS256, the algorithms a Kubernetes service-account issuer
// uses), with issuer iss, audience aud among their aud claim, and exp
// after now: what STS checks of a token from an OIDC provider.
func JWKSVerifier(jwks []byte, iss, aud string, now func() time.Time) (TokenVerifier, error) {
	if now == nil {
		now = time.Now
	}
	var set struct {
		Keys []struct {
			Kty, Kid, Alg, Crv, X, Y, N, E string
		} `json:"keys"`
	}
	if err := json.Unmarshal(jwks, &set); err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	keys := map[string]crypto.PublicKey{}
	for _, k := range set.Keys {
		switch k.Kty {
		case "EC":
			if k.Crv != "P-256" {
				continue
			}
			x, errX := base64.RawURLEncoding.DecodeString(k.X)
			y, errY := base64.RawURLEncoding.DecodeString(k.Y)
			if errX != nil || errY != nil || len(x) != 32 || len(y) != 32 {
				return nil, fmt.Errorf("jwks: key %s: bad coordinates", k.Kid)
			}
			pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
			if err != nil {
				return nil, fmt.Errorf("jwks: key %s: %w", k.Kid, err)
			}
			keys[k.Kid] = pub
		case "RSA":
			n, e := b64Int(k.N), b64Int(k.E)
			if n == nil || e == nil {
				return nil, fmt.Errorf("jwks: key %s: bad modulus or exponent", k.Kid)
			}
			keys[k.Kid] = &rsa.PublicKey{N: n, E: int(e.Int64())}
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("jwks: no ES256 or RS256 key")
	}
	return func(token string) (string, error) {
		parts := strings.Split(token, ".")
		if len(parts) != 3 {
			return "", errors.New("not a JWT")
		}
		var header struct{ Alg, Kid string }
		if err := decodeSegment(parts[0], &header); err != nil {
			return "", fmt.Errorf("header: %w", err)
		}
		key, ok := keys[header.Kid]
		if !ok {
			return "", errors.New("signed by an unknown key")
		}
		sig, err := base64.RawURLEncoding.DecodeString(parts[2])
		if err != nil {
			return "", errors.New("malformed signature")
		}
		digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
		switch k := key.(type) {
		case *ecdsa.PublicKey:
			if header.Alg != "ES256" || len(sig) != 64 ||
				!ecdsa.Verify(k, digest[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
				return "", errors.New("bad signature")
			}
		case *rsa.PublicKey:
			if header.Alg != "RS256" || rsa.VerifyPKCS1v15(k, crypto.SHA256, digest[:], sig) != nil {
				return "", errors.New("bad signature")
			}
		}
		var claims struct {
			Iss string          `json:"iss"`
			Sub string          `json:"sub"`
			Aud json.RawMessage `json:"aud"`
			Exp int64           `json:"exp"`
			Nbf int64           `json:"nbf"`
		}
		if err := decodeSegment(parts[1], &claims); err != nil {
			return "", fmt.Errorf("claims: %w", err)
		}
		var auds stringList
		if err := auds.UnmarshalJSON(claims.Aud); err != nil {
			return "", fmt.Errorf("claims: aud: %w", err)
		}
		t := now().Unix()
		switch {
		case claims.Iss != iss:
			return "", fmt.Errorf("issuer %q is not the trusted provider", claims.Iss)
		case !slices.Contains(auds, aud):
			return "", fmt.Errorf("audience %v does not include %s", []string(auds), aud)
		case claims.Exp == 0 || t >= claims.Exp:
			return "", ErrTokenExpired
		case claims.Nbf != 0 && t < claims.Nbf:
			return "", errors.New("token not valid yet")
		}
		return claims.Sub, nil
	}, nil
}

func b64Int(s string) *big.Int {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) == 0 {
		return nil
	}
	return new(big.Int).SetBytes(b)
}

func decodeSegment(seg string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// ContainerCredentials is the EKS Pod Identity agent's credentials
// endpoint (AWS_CONTAINER_CREDENTIALS_FULL_URI): a GET whose Authorization
// header carries the pod's token (read by the SDK from
// AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE) gets fresh keys from Keyring,
// valid for Lifetime. The tokens it accepts are set with SetTokens, so a
// test can rotate them as the kubelet does.
type ContainerCredentials struct {
	Keyring   *Keyring
	Principal string
	Lifetime  time.Duration

	// Issued and Refused count the answers.
	Issued, Refused atomic.Int64
	Refusal         func(why string)

	tokens atomic.Pointer[[]string]
}

// SetTokens replaces the tokens the endpoint accepts.
func (c *ContainerCredentials) SetTokens(tokens ...string) {
	ts := slices.Clone(tokens)
	c.tokens.Store(&ts)
}

func (c *ContainerCredentials) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	refuse := func(status int, code, message string) {
		c.Refused.Add(1)
		if c.Refusal != nil {
			c.Refusal(code + ": " + message)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"code": code, "message": message})
	}
	if r.Method != http.MethodGet {
		refuse(http.StatusMethodNotAllowed, "InvalidRequest", "GET only")
		return
	}
	got := r.Header.Get("Authorization")
	tokens := c.tokens.Load()
	if got == "" || tokens == nil || !slices.Contains(*tokens, got) {
		refuse(http.StatusUnauthorized, "AccessDeniedException", "the service account token was not accepted")
		return
	}
	lifetime := c.Lifetime
	if lifetime <= 0 {
		lifetime = 6 * time.Hour
	}
	creds := c.Keyring.Issue(c.Principal, lifetime)
	c.Issued.Add(1)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{
		"AccessKeyId": creds.AccessKeyID, "SecretAccessKey": creds.SecretAccessKey, "Token": creds.SessionToken,
		"AccountId": ownerID, "Expiration": creds.Expiration.Format(time.RFC3339),
	})
}
