package ec2fake

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/mocks/cloud"
)

const (
	testIssuer  = "https://oidc.example.test/cluster"
	testRole    = "arn:aws:iam::123456789012:role/caa"
	testSubject = "system:serviceaccount:caa-system:caa"
)

// testIDP is an OIDC provider: a signing key and its JWKS.
type testIDP struct {
	key  *ecdsa.PrivateKey
	kid  string
	jwks []byte
}

func newTestIDP(t *testing.T) *testIDP {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	point, err := key.PublicKey.Bytes() // 0x04, X, Y
	require.NoError(t, err)
	b64 := base64.RawURLEncoding.EncodeToString
	jwks, err := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig",
		"x": b64(point[1:33]), "y": b64(point[33:]),
	}}})
	require.NoError(t, err)
	return &testIDP{key: key, kid: "k1", jwks: jwks}
}

func (p *testIDP) token(t *testing.T, claims map[string]any) string {
	seg := func(v any) string {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signing := seg(map[string]string{"alg": "ES256", "kid": p.kid, "typ": "JWT"}) + "." + seg(claims)
	digest := sha256.Sum256([]byte(signing))
	r, s, err := ecdsa.Sign(rand.Reader, p.key, digest[:])
	require.NoError(t, err)
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func (p *testIDP) saToken(t *testing.T, aud, sub string, exp time.Time) string {
	return p.token(t, map[string]any{"iss": testIssuer, "aud": []string{aud}, "sub": sub, "exp": exp.Unix(), "iat": time.Now().Unix()})
}

func TestJWKSVerifier(t *testing.T) {
	idp := newTestIDP(t)
	verify, err := JWKSVerifier(idp.jwks, testIssuer, STSAudience, nil)
	require.NoError(t, err)
	later := time.Now().Add(time.Hour)

	sub, err := verify(idp.saToken(t, STSAudience, testSubject, later))
	require.NoError(t, err)
	assert.Equal(t, testSubject, sub)

	_, err = verify(idp.saToken(t, STSAudience, testSubject, time.Now().Add(-time.Second)))
	assert.ErrorIs(t, err, ErrTokenExpired)
	_, err = verify(idp.saToken(t, "https://kubernetes.default.svc", testSubject, later))
	assert.ErrorContains(t, err, "audience")
	_, err = verify(idp.token(t, map[string]any{"iss": "https://elsewhere", "aud": STSAudience, "sub": testSubject, "exp": later.Unix()}))
	assert.ErrorContains(t, err, "issuer")
	other := newTestIDP(t)
	_, err = verify(other.saToken(t, STSAudience, testSubject, later))
	assert.ErrorContains(t, err, "bad signature", "a token signed by another key")
	good := idp.saToken(t, STSAudience, testSubject, later)
	_, err = verify(good[:len(good)-4] + "AAAA")
	assert.Error(t, err, "a tampered signature")
	_, err = verify("not-a-jwt")
	assert.Error(t, err)
}

// isolate clears every AWS setting of the environment for the SDK's
// default chain, then sets env.
func isolate(t *testing.T, env map[string]string) {
	dir := t.TempDir()
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ROLE_ARN",
		"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_SESSION_NAME", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
		"AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_STS", "AWS_ENDPOINT_URL_EC2"} {
		t.Setenv(k, "")
		require.NoError(t, os.Unsetenv(k))
	}
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_REGION", "us-east-1")
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// fakeClock is a clock a test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

// defaultChainClient is an EC2 client on the SDK's default chain, as caa
// builds one, against the fake at url.
func defaultChainClient(t *testing.T, url string) *ec2.Client {
	cfg, err := config.LoadDefaultConfig(context.Background())
	require.NoError(t, err)
	return ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(url); o.RetryMaxAttempts = 1 }, detachBodies)
}

// lastKey is the access key of the newest issued credentials.
func lastKey(t *testing.T, k *Keyring) string {
	issued := k.Issued()
	require.NotEmpty(t, issued)
	return issued[len(issued)-1].AccessKeyID
}

// TestWebIdentityThroughTheDefaultChain: AWS_ROLE_ARN and
// AWS_WEB_IDENTITY_TOKEN_FILE, exchanged at the fake STS by the SDK's own
// provider, give keys the EC2 fake accepts; when they expire the SDK reads
// the rewritten token file and gets new ones.
func TestWebIdentityThroughTheDefaultChain(t *testing.T) {
	ctx := context.Background()
	idp := newTestIDP(t)
	verify, err := JWKSVerifier(idp.jwks, testIssuer, STSAudience, nil)
	require.NoError(t, err)
	keys := NewKeyring(nil, 0)
	sts := &STS{Keyring: keys, Verify: verify, RoleARN: testRole, Subject: testSubject, Lifetime: time.Hour}
	stsSrv := httptest.NewServer(sts)
	t.Cleanup(stsSrv.Close)
	core := cloud.New(CloudOptions(cloud.Options{}))
	ec2Srv := httptest.NewServer(NewServer(core, WithKeyring(keys)))
	t.Cleanup(ec2Srv.Close)

	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(idp.saToken(t, STSAudience, testSubject, time.Now().Add(time.Hour))), 0o600))
	isolate(t, map[string]string{"AWS_ROLE_ARN": testRole, "AWS_WEB_IDENTITY_TOKEN_FILE": tokenFile, "AWS_ENDPOINT_URL_STS": stsSrv.URL})
	client := defaultChainClient(t, ec2Srv.URL)
	_, err = client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
	require.NoError(t, err)
	first := lastKey(t, keys)
	assert.Equal(t, int64(1), keys.Uses(first))
	assert.Equal(t, int64(1), sts.Issued.Load())
	assert.Contains(t, keys.Issued()[0].Principal, "assumed-role/caa/")

	// The keys expire; the kubelet has meanwhile written a new token.
	keys.Revoke(first)
	_, err = client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
	assert.Equal(t, "AuthFailure", apiCode(t, err), "revoked keys are refused (the SDK still holds them: they looked valid for an hour)")

	// Short-lived keys: the SDK refreshes them at expiry, reading the
	// token file again.
	sts2 := &STS{Keyring: keys, Verify: verify, RoleARN: testRole, Subject: testSubject, Lifetime: 2 * time.Second}
	stsSrv2 := httptest.NewServer(sts2)
	t.Cleanup(stsSrv2.Close)
	t.Setenv("AWS_ENDPOINT_URL_STS", stsSrv2.URL)
	client = defaultChainClient(t, ec2Srv.URL)
	_, err = client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
	require.NoError(t, err)
	k1 := lastKey(t, keys)
	rotated := idp.saToken(t, STSAudience, testSubject, time.Now().Add(2*time.Hour))
	require.NoError(t, os.WriteFile(tokenFile, []byte(rotated), 0o600))
	require.Eventually(t, func() bool {
		_, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
		return err == nil && lastKey(t, keys) != k1 && keys.Uses(lastKey(t, keys)) > 0
	}, 20*time.Second, 100*time.Millisecond, "the SDK fetched new keys once the old ones expired, and EC2 saw them")
	assert.GreaterOrEqual(t, sts2.Issued.Load(), int64(2))
	assert.Zero(t, sts2.Refused.Load())

	// A token for another subject or audience, or none at all, gets no keys.
	for name, tok := range map[string]string{
		"another service account": idp.saToken(t, STSAudience, "system:serviceaccount:default:other", time.Now().Add(time.Hour)),
		"another audience":        idp.saToken(t, "https://kubernetes.default.svc", testSubject, time.Now().Add(time.Hour)),
		"an expired token":        idp.saToken(t, STSAudience, testSubject, time.Now().Add(-time.Minute)),
	} {
		require.NoError(t, os.WriteFile(tokenFile, []byte(tok), 0o600))
		refused := sts2.Refused.Load()
		fresh := defaultChainClient(t, ec2Srv.URL)
		_, err := fresh.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
		assert.Error(t, err, name)
		assert.Greater(t, sts2.Refused.Load(), refused, name)
	}
}

// TestContainerCredentialsThroughTheDefaultChain: the EKS Pod Identity
// route, AWS_CONTAINER_CREDENTIALS_FULL_URI with the token read from
// AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE, through the SDK's own provider.
func TestContainerCredentialsThroughTheDefaultChain(t *testing.T) {
	ctx := context.Background()
	keys := NewKeyring(nil, 0)
	// The SDK refreshes container credentials 5 minutes before they
	// expire: a lifetime of 5m2s makes it ask again 2s after each issue.
	endpoint := &ContainerCredentials{Keyring: keys, Principal: "arn:aws:sts::123456789012:assumed-role/caa/eks-pod-identity", Lifetime: 5*time.Minute + 2*time.Second}
	first := fmt.Sprintf("pod-identity-token-%d", time.Now().UnixNano())
	endpoint.SetTokens(first)
	credSrv := httptest.NewServer(endpoint)
	t.Cleanup(credSrv.Close)
	core := cloud.New(CloudOptions(cloud.Options{}))
	ec2Srv := httptest.NewServer(NewServer(core, WithKeyring(keys)))
	t.Cleanup(ec2Srv.Close)

	tokenFile := filepath.Join(t.TempDir(), "eks-pod-identity-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(first), 0o600))
	isolate(t, map[string]string{"AWS_CONTAINER_CREDENTIALS_FULL_URI": credSrv.URL + "/v1/credentials", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": tokenFile})
	client := defaultChainClient(t, ec2Srv.URL)
	_, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
	require.NoError(t, err)
	k1 := lastKey(t, keys)

	second := first + "-rotated"
	require.NoError(t, os.WriteFile(tokenFile, []byte(second), 0o600))
	endpoint.SetTokens(second)
	require.Eventually(t, func() bool {
		_, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
		return err == nil && lastKey(t, keys) != k1 && keys.Uses(lastKey(t, keys)) > 0
	}, 20*time.Second, 100*time.Millisecond, "new keys with the rotated token")
	assert.Zero(t, endpoint.Refused.Load())

	endpoint.SetTokens("something-else")
	fresh := defaultChainClient(t, ec2Srv.URL)
	_, err = fresh.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
	assert.Error(t, err, "a token the endpoint does not accept gets no keys")
	assert.Positive(t, endpoint.Refused.Load())
}

// TestKeyringKeysAreCheckedWhole: EC2 accepts an issued key only with its
// session token, its own secret, and before it expires (plus the skew).
func TestKeyringKeysAreCheckedWhole(t *testing.T) {
	ctx := context.Background()
	clk := &fakeClock{now: time.Now()}
	keys := NewKeyring(clk.Now, 10*time.Second)
	core := cloud.New(CloudOptions(cloud.Options{}))
	srv := httptest.NewServer(NewServer(core, WithKeyring(keys)))
	t.Cleanup(srv.Close)
	c := keys.Issue("arn:aws:sts::123456789012:assumed-role/caa/s", time.Minute)
	call := func(id, secret, token string) error {
		client := ec2.New(ec2.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL), RetryMaxAttempts: 1,
			Credentials: credentials.NewStaticCredentialsProvider(id, secret, token)}, detachBodies)
		_, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
		return err
	}
	require.NoError(t, call(c.AccessKeyID, c.SecretAccessKey, c.SessionToken))
	assert.Equal(t, "AuthFailure", apiCode(t, call(c.AccessKeyID, c.SecretAccessKey, "")), "no session token")
	assert.Equal(t, "AuthFailure", apiCode(t, call(c.AccessKeyID, c.SecretAccessKey, "FwoGwrong")), "another session token")
	assert.Equal(t, "AuthFailure", apiCode(t, call(c.AccessKeyID, "wrong-secret", c.SessionToken)), "another secret")
	assert.Equal(t, "AuthFailure", apiCode(t, call("ASIANEVERISSUED0000", c.SecretAccessKey, c.SessionToken)), "a key never issued")
	clk.Advance(time.Minute + 5*time.Second)
	require.NoError(t, call(c.AccessKeyID, c.SecretAccessKey, c.SessionToken), "within the skew")
	clk.Advance(10 * time.Second)
	assert.Equal(t, "AuthFailure", apiCode(t, call(c.AccessKeyID, c.SecretAccessKey, c.SessionToken)), "expired")
	assert.Equal(t, int64(2), keys.Uses(c.AccessKeyID))
}
