package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/e2e/cluster"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// This file runs the real caa binary on AWS's keyless credential routes and
// under the least-privilege IAM policy of deploy/overlays/aws, against fakes
// that check what they are given:
//
//   - IRSA: a real ServiceAccount token from the test apiserver's
//     TokenRequest API (audience sts.amazonaws.com) in the file named by
//     AWS_WEB_IDENTITY_TOKEN_FILE, with AWS_ROLE_ARN. The SDK's own web
//     identity provider exchanges it at a fake STS (AWS_ENDPOINT_URL_STS)
//     that verifies the JWT against the apiserver's published JWKS, its
//     issuer, audience, expiry and subject, and issues short-lived keys.
//   - EKS Pod Identity: AWS_CONTAINER_CREDENTIALS_FULL_URI (an http server
//     on 127.0.0.1, which the SDK allows) and
//     AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE, whose token the endpoint
//     checks in the Authorization header.
//
// The fake EC2 accepts only keys those endpoints issued, with their session
// token and until they expire, and authorizes every call against the
// shipped policy. During each run the token is rotated and the keys expire:
// caa keeps working, and EC2 sees the new keys.

const (
	awsImage  = "ami-0123456789abcdef0"
	awsType   = ec2Type
	awsSubnet = "subnet-0123456789abcdef0"
	awsGroup  = "sg-0123456789abcdef0"
	// roleARN is the role whose trust policy admits the token of caa's
	// ServiceAccount (saNamespace/saName).
	roleARN = "arn:aws:iam::123456789012:role/caa-e2e"
)

// shippedAWSPolicy is deploy/overlays/aws/iam-policy.json.
func shippedAWSPolicy(t *testing.T) *ec2fake.Policy {
	t.Helper()
	p, err := ec2fake.ReadPolicy(filepath.Join("..", "..", "deploy", "overlays", "aws", "iam-policy.json"))
	require.NoError(t, err)
	return p
}

// identityCloud is a fake EC2 with the shipped policy, its keyring, and
// the daemon's flags and environment for one credential route.
type identityCloud struct {
	core    *cloud.Cloud
	keys    *ec2fake.Keyring
	policy  atomic.Pointer[ec2fake.Policy]
	url     string
	args    []string
	env     []string
	tokenAt string // the token file the route reads

	secrets secretSet // every token and key in play, by name
}

func newIdentityCloud(t *testing.T) *identityCloud {
	t.Helper()
	ic := &identityCloud{
		core: cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{awsImage}, Types: []string{awsType}})),
		// A key is good 30s past its expiration: a request signed just
		// before it is not refused for arriving just after.
		keys:    ec2fake.NewKeyring(nil, 30*time.Second),
		tokenAt: filepath.Join(t.TempDir(), "token"),
	}
	ic.policy.Store(shippedAWSPolicy(t))
	srv := httptest.NewServer(ec2fake.NewServer(ic.core, ec2fake.WithKeyring(ic.keys), ec2fake.WithPolicyFunc(ic.policy.Load),
		ec2fake.WithNetwork([]string{awsSubnet}, []string{awsGroup})))
	t.Cleanup(srv.Close)
	ic.url = srv.URL
	ic.args = []string{"--provider", "aws", "--aws-endpoint", srv.URL, "--aws-region", "us-east-1",
		"--aws-subnet-id", awsSubnet, "--aws-security-group-ids", awsGroup, "--aws-image", awsImage, "--aws-instance-type", awsType,
		"--log-level", "debug"}
	ic.env = append(hermeticEnv(), "AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	return ic
}

func (ic *identityCloud) secret(name, value string) { ic.secrets.add(name, value) }

// allSecrets are the tokens and every key the keyring issued.
func (ic *identityCloud) allSecrets() map[string]string {
	out := ic.secrets.all()
	for i, c := range ic.keys.Issued() {
		out[fmt.Sprintf("secret access key %d", i)] = c.SecretAccessKey
		out[fmt.Sprintf("session token %d", i)] = c.SessionToken
	}
	return out
}

// writeToken replaces the token file atomically, as the kubelet does.
func (ic *identityCloud) writeToken(t *testing.T, token string) { writeTokenFile(t, ic.tokenAt, token) }

// route is one keyless credential route: it sets up its endpoint on ic,
// and rotate hands out a new token (and stops accepting the old one).
type route struct {
	name   string
	setup  func(ctx context.Context, t *testing.T, c *cluster.Cluster, ic *identityCloud)
	rotate func(ctx context.Context, t *testing.T, c *cluster.Cluster, ic *identityCloud)
	// exchanges counts the keys issued and the refused requests.
	exchanges func() (issued, refused int64)
}

// irsa is IAM roles for service accounts: a projected token exchanged at
// STS for keys that live 3 seconds, so they expire many times a run.
func irsa() *route {
	var sts *ec2fake.STS
	var revoked sync.Map // tokens no longer good, once rotated
	r := &route{name: "IRSA"}
	r.setup = func(ctx context.Context, t *testing.T, c *cluster.Cluster, ic *identityCloud) {
		verify := apiserverVerifier(ctx, t, c, ec2fake.STSAudience)
		sts = &ec2fake.STS{Keyring: ic.keys, RoleARN: roleARN, Subject: "system:serviceaccount:" + saNamespace + ":" + saName,
			Lifetime: 3 * time.Second, Refusal: func(why string) { t.Logf("fake STS refused a request: %s", why) },
			Verify: func(token string) (string, error) {
				if _, old := revoked.Load(token); old {
					return "", fmt.Errorf("a token replaced by a newer one")
				}
				return verify(token)
			}}
		srv := httptest.NewServer(sts)
		t.Cleanup(srv.Close)
		tok := saToken(ctx, t, c, ec2fake.STSAudience)
		ic.secret("web identity token", tok)
		ic.writeToken(t, tok)
		ic.env = append(ic.env, "AWS_ROLE_ARN="+roleARN, "AWS_WEB_IDENTITY_TOKEN_FILE="+ic.tokenAt,
			"AWS_ROLE_SESSION_NAME=caa-e2e", "AWS_ENDPOINT_URL_STS="+srv.URL)
	}
	r.rotate = func(ctx context.Context, t *testing.T, c *cluster.Cluster, ic *identityCloud) {
		old, err := os.ReadFile(ic.tokenAt)
		require.NoError(t, err)
		tok := saToken(ctx, t, c, ec2fake.STSAudience)
		require.NotEqual(t, string(old), tok)
		ic.secret("rotated web identity token", tok)
		ic.writeToken(t, tok)
		revoked.Store(string(old), true)
	}
	r.exchanges = func() (int64, int64) { return sts.Issued.Load(), sts.Refused.Load() }
	return r
}

// podIdentity is EKS Pod Identity: the agent's endpoint, whose keys the
// SDK refreshes 5 minutes before they expire; a lifetime of 5m3s makes
// that every 3 seconds.
func podIdentity() *route {
	endpoint := &ec2fake.ContainerCredentials{Principal: "arn:aws:sts::123456789012:assumed-role/caa-e2e/eks-caa-system-caa",
		Lifetime: 5*time.Minute + 3*time.Second}
	r := &route{name: "EKS Pod Identity"}
	r.setup = func(ctx context.Context, t *testing.T, c *cluster.Cluster, ic *identityCloud) {
		endpoint.Keyring = ic.keys
		endpoint.Refusal = func(why string) { t.Logf("fake pod identity endpoint refused a request: %s", why) }
		srv := httptest.NewServer(endpoint)
		t.Cleanup(srv.Close)
		require.True(t, strings.HasPrefix(srv.URL, "http://127.0.0.1:"), "the SDK allows plain http to loopback only")
		tok := saToken(ctx, t, c, "pods.eks.amazonaws.com")
		endpoint.SetTokens(tok)
		ic.secret("pod identity token", tok)
		ic.writeToken(t, tok)
		ic.env = append(ic.env, "AWS_CONTAINER_CREDENTIALS_FULL_URI="+srv.URL+"/v1/credentials",
			"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE="+ic.tokenAt)
	}
	r.rotate = func(ctx context.Context, t *testing.T, c *cluster.Cluster, ic *identityCloud) {
		tok := saToken(ctx, t, c, "pods.eks.amazonaws.com")
		ic.secret("rotated pod identity token", tok)
		ic.writeToken(t, tok)
		endpoint.SetTokens(tok)
	}
	r.exchanges = func() (int64, int64) { return endpoint.Issued.Load(), endpoint.Refused.Load() }
	return r
}

// TestAWSIdentityIRSA runs caa on IRSA under the shipped policy.
func TestAWSIdentityIRSA(t *testing.T) {
	t.Parallel()
	runIdentity(t, irsa())
}

// TestAWSIdentityPodIdentity runs caa on EKS Pod Identity under the
// shipped policy.
func TestAWSIdentityPodIdentity(t *testing.T) {
	t.Parallel()
	runIdentity(t, podIdentity())
}

// runIdentity: caa starts and creates a VM per pod with keys from the
// route; the token rotates and the keys expire while it runs; a new pod
// gets its VM and a deleted pod loses its VM with the new keys, without a
// restart; no token or key appears in caa's output, events, /status or
// ledger.
func runIdentity(t *testing.T, r *route) {
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	ic := newIdentityCloud(t)
	r.setup(ctx, t, c, ic)
	run := startIdentityRun(ctx, t, c, "aws "+r.name, ic.args, ic.env, func() map[string]string { return liveVMs(ic.core) })
	issued := ic.keys.Issued()
	require.NotEmpty(t, issued)
	firstKey := issued[len(issued)-1].AccessKeyID
	assert.Positive(t, ic.keys.Uses(firstKey), "EC2 accepted the keys the %s route issued", r.name)

	// Rotation: a new token, and the keys in use expire.
	r.rotate(ctx, t, c, ic)
	rotatedAt := len(ic.keys.Issued())
	newKeyUsed := func() bool {
		for _, k := range ic.keys.Issued()[rotatedAt:] {
			if ic.keys.Uses(k.AccessKeyID) > 0 {
				return true
			}
		}
		return false
	}
	require.Eventually(t, newKeyUsed, time.Minute, 100*time.Millisecond,
		"caa's SDK fetched keys with the rotated token and EC2 saw them (the daemon's audit lists every 2s)")
	for _, k := range ic.keys.Issued()[:rotatedAt] {
		ic.keys.Revoke(k.AccessKeyID) // only keys from the new token work from here on
	}

	// Work with the new keys, no restart: a new pod, a deleted pod.
	run.churn(ctx, t, "the new pod got a VM and the deleted pod's VM went, with the rotated credentials")
	// The keys keep expiring and being renewed from the new token.
	require.Eventually(t, func() bool {
		used := 0
		for _, k := range ic.keys.Issued()[rotatedAt:] {
			if ic.keys.Uses(k.AccessKeyID) > 0 {
				used++
			}
		}
		return used >= 2
	}, time.Minute, 100*time.Millisecond, "a second set of keys from the rotated token, once the first expired")
	status := run.status(t)
	issuedKeys, refused := r.exchanges()
	t.Logf("%s: %d keys issued, %d requests refused (the old token, after rotation), %d keys in all", r.name, issuedKeys, refused, len(ic.keys.Issued()))
	assert.GreaterOrEqual(t, issuedKeys, int64(3))
	run.d.stop(t)

	// Invariant I7: no token or key anywhere caa writes.
	run.assertNoSecrets(ctx, t, status, ic.allSecrets())
}

// staticKeyCloud is the fake EC2 with the shipped policy, for caa on the
// static keys of awsEnv.
func staticKeyCloud(t *testing.T) *identityCloud {
	ic := newIdentityCloud(t)
	srv := httptest.NewServer(ec2fake.NewServer(ic.core, ec2fake.WithCredentials("AKIDE2ETEST", "e2e-secret-key"),
		ec2fake.WithPolicyFunc(ic.policy.Load), ec2fake.WithNetwork([]string{awsSubnet}, []string{awsGroup})))
	t.Cleanup(srv.Close)
	ic.url = srv.URL
	for i, a := range ic.args {
		if a == "--aws-endpoint" {
			ic.args[i+1] = srv.URL
		}
	}
	ic.env = awsEnv()
	return ic
}

// TestAWSLeastPrivilegeLife runs caa's life through the binary under
// exactly the shipped policy: start and create, restart and adopt, a
// killed VM recreated, a deleted pod's VM deleted, an orphan collected,
// and `caa ledger rebuild`. No call is refused.
func TestAWSLeastPrivilegeLife(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	ic := staticKeyCloud(t)
	leastPrivilegeLife(ctx, t, c, leastPrivilege{label: "aws least privilege", args: ic.args, env: ic.env,
		core: ic.core, live: func() map[string]string { return liveVMs(ic.core) },
		refusal: "UnauthorizedOperation", refusalMsg: "no call was refused by the policy",
		orphan: cloud.CreateRequest{Token: "orphan", Image: awsImage, InstanceType: awsType}})
}

// TestAWSPreflightNamesTheMissingPermission starts caa under the shipped
// policy minus one action at a time: it touches no pod, its readiness
// reason and a Node event name the action, and once the permission is
// given back (no restart) it turns ready. Then a subnet EC2 does not know:
// the reason names the setting.
func TestAWSPreflightNamesTheMissingPermission(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	full := shippedAWSPolicy(t)
	for i, action := range full.Actions() {
		t.Run(action, func(t *testing.T) {
			t.Parallel() // each its own node, cloud and caa: the waits overlap
			ic := staticKeyCloud(t)
			// One instance of caa's in the account (another cluster's), for
			// the terminate's dry run.
			_, err := ic.core.Create(cloud.CreateRequest{Token: "other", Image: awsImage, InstanceType: awsType, Tags: map[string]string{
				"caa-cluster": "another-cluster", "caa-node": "n", "caa-managed-by": "caa", "caa-pod-uid": "u", "caa-key": "k"}})
			require.NoError(t, err)
			ic.policy.Store(full.Without(action))
			node := fmt.Sprintf("preflight-%d", i)
			nodeWithPod(ctx, t, c, node)
			d := launchCaa(t, c, node, filepath.Join(t.TempDir(), "caa", "ledger.db"), "aws preflight", ic.args, ic.env)
			preflightNamesMissing(ctx, t, c, d, node, action, action, ic.core, 1, func() { ic.policy.Store(full) })
		})
	}
	// A wrong setting is named the same way: a subnet EC2 does not know.
	t.Run("wrong subnet", func(t *testing.T) {
		t.Parallel()
		ic := staticKeyCloud(t)
		const node = "preflight-subnet"
		_, err := c.CreateNode(ctx, node)
		require.NoError(t, err)
		args := append(slices.Clone(ic.args), "--aws-subnet-id", "subnet-0badbadbadbadbad0")
		d := launchCaa(t, c, node, filepath.Join(t.TempDir(), "caa", "ledger.db"), "aws preflight", args, ic.env)
		settingNamed(t, d, ic.core, "InvalidSubnetID.NotFound", "--aws-subnet-id or CAA_AWS_SUBNET_ID")
	})
}
