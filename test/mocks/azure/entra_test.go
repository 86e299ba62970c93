package armfake_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	azcloud "github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

const (
	tenantID = "72f988bf-0000-4000-8000-0000000caa01"
	clientID = "0c1d2e3f-0000-4000-8000-0000000caa02"
	issuer   = "https://oidc.example.test/caa-cluster"
	saSub    = "system:serviceaccount:caa-system:caa"
)

// issuerKey signs ServiceAccount-like tokens and publishes its JWKS.
type issuerKey struct{ key *ecdsa.PrivateKey }

func newIssuerKey(t *testing.T) issuerKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return issuerKey{k}
}

func (k issuerKey) jwks(t *testing.T) []byte {
	pub := k.key.PublicKey
	raw, err := pub.Bytes() // uncompressed point: 0x04 || X || Y
	require.NoError(t, err)
	b64 := base64.RawURLEncoding.EncodeToString
	out, err := json.Marshal(map[string]any{"keys": []any{map[string]string{
		"kty": "EC", "kid": "k1", "alg": "ES256", "crv": "P-256", "x": b64(raw[1:33]), "y": b64(raw[33:])}}})
	require.NoError(t, err)
	return out
}

func (k issuerKey) token(t *testing.T, sub, aud string, exp time.Time) string {
	b64 := base64.RawURLEncoding.EncodeToString
	head, err := json.Marshal(map[string]string{"alg": "ES256", "kid": "k1", "typ": "JWT"})
	require.NoError(t, err)
	claims, err := json.Marshal(map[string]any{"iss": issuer, "sub": sub, "aud": []string{aud}, "exp": exp.Unix(), "iat": time.Now().Unix()})
	require.NoError(t, err)
	signing := b64(head) + "." + b64(claims)
	digest := sha256.Sum256([]byte(signing))
	r, s, err := ecdsa.Sign(rand.Reader, k.key, digest[:])
	require.NoError(t, err)
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signing + "." + b64(sig)
}

type entraSetup struct {
	entra     *armfake.Entra
	srv       *httptest.Server
	key       issuerKey
	tokenFile string
	refusals  []string
	mu        sync.Mutex
}

func newEntra(t *testing.T, lifetime time.Duration) *entraSetup {
	es := &entraSetup{key: newIssuerKey(t), tokenFile: filepath.Join(t.TempDir(), "token")}
	verify, err := ec2fake.JWKSVerifier(es.key.jwks(t), issuer, armfake.EntraAudience, nil)
	require.NoError(t, err)
	es.entra = &armfake.Entra{TenantID: tenantID, ClientID: clientID, Subject: saSub, Lifetime: lifetime,
		Verify: func(tok string) (string, error) { return verify(tok) },
		Refusal: func(why string) {
			es.mu.Lock()
			defer es.mu.Unlock()
			es.refusals = append(es.refusals, why)
		}}
	es.srv = httptest.NewTLSServer(es.entra)
	t.Cleanup(es.srv.Close)
	return es
}

func (es *entraSetup) writeToken(t *testing.T, tok string) {
	require.NoError(t, os.WriteFile(es.tokenFile+".new", []byte(tok), 0o600))
	require.NoError(t, os.Rename(es.tokenFile+".new", es.tokenFile))
}

// credential is azidentity's own workload identity credential, told the
// fake's authority host with instance discovery off, as caa's settings
// --azure-authority-host and --azure-disable-instance-discovery do.
func (es *entraSetup) credential(t *testing.T) azcore.TokenCredential {
	cred, err := azidentity.NewWorkloadIdentityCredential(&azidentity.WorkloadIdentityCredentialOptions{
		ClientID: clientID, TenantID: tenantID, TokenFilePath: es.tokenFile, DisableInstanceDiscovery: true,
		ClientOptions: azcore.ClientOptions{Cloud: azcloud.Configuration{ActiveDirectoryAuthorityHost: es.srv.URL + "/",
			Services: azcloud.AzurePublic.Services}, Transport: es.srv.Client()},
	})
	require.NoError(t, err)
	return cred
}

var armScope = policy.TokenRequestOptions{Scopes: []string{armfake.ARMScope}}

// TestEntraIssuesTokensForAVerifiedFederatedToken: the SDK's workload
// identity credential gets an access token for a ServiceAccount token the
// fake verifies; the fake ARM takes exactly such tokens until they expire.
func TestEntraIssuesTokensForAVerifiedFederatedToken(t *testing.T) {
	es := newEntra(t, time.Hour)
	sa := es.key.token(t, saSub, armfake.EntraAudience, time.Now().Add(time.Hour))
	es.writeToken(t, sa)
	tok, err := es.credential(t).GetToken(context.Background(), armScope)
	require.NoError(t, err)
	require.NoError(t, es.entra.Check(tok.Token))
	assert.Equal(t, int64(1), es.entra.Issued.Load())
	assert.Equal(t, 1, es.entra.IssuedFor(sa))
	assert.WithinDuration(t, time.Now().Add(time.Hour), tok.ExpiresOn, time.Minute)
	assert.Error(t, es.entra.Check("fake-entra-at.forged"))

	// The fake ARM takes the token and refuses others.
	c := cloud.New(cloud.Options{Images: []string{platform}, Types: []string{size}})
	arm := httptest.NewServer(armfake.NewServer(c, armfake.WithAccessTokens(es.entra.Check)))
	t.Cleanup(arm.Close)
	get := func(bearer string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, arm.URL+vms+"?api-version="+apiVersion, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body struct{ Error struct{ Code string } }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body.Error.Code
	}
	status, _ := get(tok.Token)
	assert.Equal(t, http.StatusOK, status)
	status, code := get("fake-entra-at.forged")
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Equal(t, "InvalidAuthenticationToken", code)
}

// TestEntraExpiresItsTokens: an access token is good until its lifetime
// (plus the grace) and then ExpiredAuthenticationToken at the ARM.
func TestEntraExpiresItsTokens(t *testing.T) {
	es := newEntra(t, time.Minute)
	var mu sync.Mutex
	now := time.Now()
	es.entra.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	es.entra.Grace = 5 * time.Second
	es.writeToken(t, es.key.token(t, saSub, armfake.EntraAudience, time.Now().Add(time.Hour)))
	tok, err := es.credential(t).GetToken(context.Background(), armScope)
	require.NoError(t, err)
	require.NoError(t, es.entra.Check(tok.Token))
	mu.Lock()
	now = now.Add(time.Minute + 4*time.Second)
	mu.Unlock()
	require.NoError(t, es.entra.Check(tok.Token), "within the grace")
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	assert.ErrorIs(t, es.entra.Check(tok.Token), armfake.ErrAccessTokenExpired)
}

// TestEntraRefusesBadFederatedTokens: another subject, another audience,
// an expired token or another signer: no access token, and the reason
// never quotes the token.
func TestEntraRefusesBadFederatedTokens(t *testing.T) {
	other := newIssuerKey(t)
	for name, mk := range map[string]func(es *entraSetup) string{
		"other subject": func(es *entraSetup) string {
			return es.key.token(t, "system:serviceaccount:x:y", armfake.EntraAudience, time.Now().Add(time.Hour))
		},
		"other audience": func(es *entraSetup) string {
			return es.key.token(t, saSub, "sts.amazonaws.com", time.Now().Add(time.Hour))
		},
		"expired": func(es *entraSetup) string {
			return es.key.token(t, saSub, armfake.EntraAudience, time.Now().Add(-time.Minute))
		},
		"other signer": func(es *entraSetup) string {
			return other.token(t, saSub, armfake.EntraAudience, time.Now().Add(time.Hour))
		},
	} {
		t.Run(name, func(t *testing.T) {
			es := newEntra(t, time.Hour)
			tok := mk(es)
			es.writeToken(t, tok)
			_, err := es.credential(t).GetToken(context.Background(), armScope)
			require.Error(t, err)
			assert.Zero(t, es.entra.Issued.Load())
			assert.Positive(t, es.entra.Refused.Load())
			es.mu.Lock()
			defer es.mu.Unlock()
			for _, why := range es.refusals {
				assert.NotContains(t, why, tok)
			}
			assert.NotContains(t, err.Error(), tok)
		})
	}
}
