package ec2fake

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

const sigV4Algorithm = "AWS4-HMAC-SHA256"

// sigV4 is the parsed Authorization header of a SigV4-signed request.
type sigV4 struct {
	accessKeyID   string
	region        string
	service       string
	signedHeaders []string
	signature     string
}

// parseSigV4 reads "AWS4-HMAC-SHA256 Credential=AKID/date/region/service/
// aws4_request, SignedHeaders=a;b, Signature=hex".
func parseSigV4(header string) (sigV4, bool) {
	rest, ok := strings.CutPrefix(header, sigV4Algorithm+" ")
	if !ok {
		return sigV4{}, false
	}
	var out sigV4
	for part := range strings.SplitSeq(rest, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return sigV4{}, false
		}
		switch k {
		case "Credential":
			scope := strings.Split(v, "/")
			if len(scope) != 5 || scope[4] != "aws4_request" || scope[0] == "" {
				return sigV4{}, false
			}
			out.accessKeyID, out.region, out.service = scope[0], scope[2], scope[3]
		case "SignedHeaders":
			out.signedHeaders = strings.Split(v, ";")
		case "Signature":
			out.signature = v
		}
	}
	if out.accessKeyID == "" || len(out.signedHeaders) == 0 || out.signature == "" {
		return sigV4{}, false
	}
	return out, true
}

// caller is who signed a request, and for which region.
type caller struct {
	principal string
	region    string
}

// staticPrincipal is the identity of the keys given with WithCredentials.
const staticPrincipal = "arn:aws:iam::" + ownerID + ":user/caa"

// authenticate checks the request's signature: its shape always, and its
// value when the server was given credentials or a keyring. A key from
// the keyring must be one it issued and has not expired, and the request
// must carry that key's session token. EC2 answers 401 AuthFailure for
// every failure, and never says which part was wrong.
func (s *server) authenticate(r *http.Request, body []byte) (caller, *apiError) {
	failure := &apiError{http.StatusUnauthorized, "AuthFailure", "AWS was not able to validate the provided access credentials."}
	sig, ok := parseSigV4(r.Header.Get("Authorization"))
	if !ok || sig.service != "ec2" {
		return caller{}, failure
	}
	who := caller{principal: staticPrincipal, region: sig.region}
	if s.accessKeyID == "" && s.keyring == nil {
		return who, nil
	}
	var secret string
	switch {
	case s.accessKeyID != "" && sig.accessKeyID == s.accessKeyID:
		secret = s.secretAccessKey
	case s.keyring != nil:
		creds, ok := s.keyring.valid(sig.accessKeyID)
		if !ok || !hmac.Equal([]byte(r.Header.Get("X-Amz-Security-Token")), []byte(creds.SessionToken)) {
			return caller{}, failure
		}
		secret, who.principal = creds.SecretAccessKey, creds.Principal
	default:
		return caller{}, failure
	}
	signedAt, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return caller{}, failure
	}
	want, err := expectedSignature(r, body, sig, signedAt, aws.Credentials{AccessKeyID: sig.accessKeyID, SecretAccessKey: secret})
	if err != nil || !hmac.Equal([]byte(want), []byte(sig.signature)) {
		return caller{}, failure
	}
	if s.keyring != nil {
		s.keyring.use(sig.accessKeyID)
	}
	return who, nil
}

// expectedSignature signs a copy of the request, holding only the headers
// the client signed, with the secret of the key it names.
func expectedSignature(r *http.Request, body []byte, sig sigV4, signedAt time.Time, creds aws.Credentials) (string, error) {
	cp, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	for _, h := range sig.signedHeaders {
		switch h {
		case "host", "content-length", "x-amz-date":
			// The signer sets these itself from the request.
		default:
			cp.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	sum := sha256.Sum256(body)
	if err := v4.NewSigner().SignHTTP(r.Context(), creds, cp, hex.EncodeToString(sum[:]), sig.service, sig.region, signedAt); err != nil {
		return "", err
	}
	got, ok := parseSigV4(cp.Header.Get("Authorization"))
	if !ok {
		return "", errMalformedSignature
	}
	return got.signature, nil
}
