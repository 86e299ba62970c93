package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// This file runs the real caa binary on IBM Cloud's keyless route, a
// trusted profile with a compute-resource token, and under the access
// policies of deploy/overlays/ibmcloud, against a fake that checks what it
// is given:
//
//   - the CR token is a real ServiceAccount token of caa-system/caa from
//     the test apiserver's TokenRequest API (audience "iam", as IBM's
//     Kubernetes service projects it), in the file named by
//     IBMCLOUD_CR_TOKEN_FILENAME; IBMCLOUD_AUTH_TYPE=container and
//     IBMCLOUD_IAM_PROFILE_NAME select the SDK's ContainerAuthenticator;
//   - the fake IAM verifies the token against the apiserver's published
//     JWKS (issuer, audience, expiry) and its subject against the profile's
//     link, and issues access tokens that live 12 seconds (the SDK renews
//     10 seconds before expiry, so every 2 seconds);
//   - the fake VPC and Global Search accept only those access tokens, and
//     authorize every call against the shipped policies.
//
// During the run the token file is rotated, the old token refused and the
// old access tokens revoked: caa keeps working without a restart.

const (
	ibmProfileID   = "Profile-9d7c1e2e-caa"
	ibmProfileName = "caa-peer-pods"
	ibmGroup       = "r006-e2e-sg"
	ibmAudience    = "iam"
)

// shippedIBMPolicies is deploy/overlays/ibmcloud/access-policies.json for
// the fake's account.
func shippedIBMPolicies(t *testing.T) *vpcfake.Policies {
	t.Helper()
	p, err := vpcfake.ReadPolicies(filepath.Join("..", "..", "deploy", "overlays", "ibmcloud", "access-policies.json"), map[string]string{
		"REPLACE_ME_TRUSTED_PROFILE_ID": ibmProfileID,
		"REPLACE_ME_ACCOUNT_ID":         "fakeaccount",
		"REPLACE_ME_RESOURCE_GROUP_ID":  vpcfake.DefaultResourceGroup,
		"REPLACE_ME_SUBNET_ID":          vpcfake.DefaultSubnet,
		"REPLACE_ME_VPC_ID":             vpcfake.DefaultVPC,
		"REPLACE_ME_SECURITY_GROUP_ID":  ibmGroup,
		"REPLACE_ME_IMAGE_ID":           ibmImage,
		// This cluster is not one of IBM's Kubernetes service: the
		// cluster group's policy names a group the VPC does not have.
		"REPLACE_ME_CLUSTER_SECURITY_GROUP_ID": "kube-not-here",
	})
	require.NoError(t, err)
	return p
}

// ibmIdentityCloud is the fake VPC with the shipped policies and a trusted
// profile, and the daemon's flags and environment for that route.
type ibmIdentityCloud struct {
	core    *cloud.Cloud
	vpc     *vpcfake.Server
	profile *vpcfake.TrustedProfile
	policy  atomic.Pointer[vpcfake.Policies]
	args    []string
	env     []string
	tokenAt string

	revoked sync.Map  // CR tokens no longer good, once rotated
	secrets secretSet // the CR tokens, by name
}

func newIBMIdentityCloud(ctx context.Context, t *testing.T, c *cluster.Cluster) *ibmIdentityCloud {
	t.Helper()
	ic := &ibmIdentityCloud{
		core:    cloud.New(cloud.Options{IDPrefix: "0717_", PageSize: 5, Images: []string{ibmImage}, Types: []string{ibmProfile}, Zone: ibmZone}),
		tokenAt: filepath.Join(t.TempDir(), "sa-token"),
	}
	ic.policy.Store(shippedIBMPolicies(t))

	verify := apiserverVerifier(ctx, t, c, ibmAudience)
	ic.profile = &vpcfake.TrustedProfile{ID: ibmProfileID, Name: ibmProfileName,
		Subject: "system:serviceaccount:" + saNamespace + ":" + saName, Lifetime: 12 * time.Second,
		Refusal: func(why string) { t.Logf("fake IAM refused a CR token exchange: %s", why) },
		Verify: func(tok string) (string, error) {
			if _, old := ic.revoked.Load(tok); old {
				return "", fmt.Errorf("a token replaced by a newer one")
			}
			return verify(tok)
		}}
	ic.vpc = vpcfake.NewServer(ic.core, vpcfake.WithTrustedProfile(ic.profile), vpcfake.WithPolicies(ic.policy.Load),
		vpcfake.WithNetwork(vpcfake.Network{VPC: vpcfake.DefaultVPC, Subnets: []string{vpcfake.DefaultSubnet}, SecurityGroups: []string{ibmGroup}})).(*vpcfake.Server)
	srv := httptest.NewServer(ic.vpc)
	t.Cleanup(srv.Close)

	tok := saToken(ctx, t, c, ibmAudience)
	ic.secret("CR token", tok)
	ic.writeToken(t, tok)
	ic.args = []string{"--provider", "ibmcloud",
		"--ibmcloud-endpoint", srv.URL + "/v1", "--ibmcloud-iam-endpoint", srv.URL, "--ibmcloud-search-endpoint", srv.URL,
		"--ibmcloud-zone", ibmZone, "--ibmcloud-vpc-id", vpcfake.DefaultVPC, "--ibmcloud-subnet-id", vpcfake.DefaultSubnet,
		"--ibmcloud-security-group-ids", ibmGroup, "--ibmcloud-resource-group-id", vpcfake.DefaultResourceGroup,
		"--ibmcloud-image", ibmImage, "--ibmcloud-instance-type", ibmProfile, "--log-level", "debug"}
	ic.env = append(hermeticEnv(), "IBMCLOUD_AUTH_TYPE=container", "IBMCLOUD_IAM_PROFILE_NAME="+ibmProfileName,
		"IBMCLOUD_CR_TOKEN_FILENAME="+ic.tokenAt)
	return ic
}

func (ic *ibmIdentityCloud) secret(name, value string) { ic.secrets.add(name, value) }

// allSecrets are the CR tokens and every access token IAM issued.
func (ic *ibmIdentityCloud) allSecrets() map[string]string {
	out := ic.secrets.all()
	for i, tok := range ic.profile.AccessTokens() {
		out[fmt.Sprintf("access token %d", i)] = tok
	}
	return out
}

// writeToken replaces the token file atomically, as the kubelet does.
func (ic *ibmIdentityCloud) writeToken(t *testing.T, token string) {
	writeTokenFile(t, ic.tokenAt, token)
}

// usedSince counts the access tokens issued from index from on that VPC or
// search accepted at least once.
func (ic *ibmIdentityCloud) usedSince(from int) int {
	n := 0
	for _, tok := range ic.profile.AccessTokens()[from:] {
		if ic.vpc.Uses(tok) > 0 {
			n++
		}
	}
	return n
}

// TestIBMCloudIdentityTrustedProfile: caa's full startup (preflight,
// listing, creates) on the trusted-profile route under the shipped
// policies; the CR token rotates and the access tokens expire while it
// runs; a new pod gets its VM and a deleted pod loses its VM on tokens
// from the new CR token, without a restart; no token appears in caa's
// output, the events, /status or the ledger.
func TestIBMCloudIdentityTrustedProfile(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	ic := newIBMIdentityCloud(ctx, t, c)
	run := startIdentityRun(ctx, t, c, "ibmcloud trusted profile", ic.args, ic.env, func() map[string]string { return ibmLiveVMs(t, ic.core) })
	require.Positive(t, ic.usedSince(0), "VPC accepted the access tokens the profile was issued")
	assert.Contains(t, run.d.logs.String(), "trusted profile "+ibmProfileName, "caa says which credential route it uses")

	// Rotation: a new CR token; the old one is refused from now on.
	old, err := os.ReadFile(ic.tokenAt)
	require.NoError(t, err)
	tok := saToken(ctx, t, c, ibmAudience)
	require.NotEqual(t, string(old), tok)
	ic.secret("rotated CR token", tok)
	rotatedAt := len(ic.profile.AccessTokens())
	ic.writeToken(t, tok)
	ic.revoked.Store(string(old), true)
	require.Eventually(t, func() bool { return ic.usedSince(rotatedAt) > 0 }, time.Minute, 100*time.Millisecond,
		"caa's SDK exchanged the rotated CR token and VPC saw the access token (the audit lists every 2s)")
	ic.vpc.Revoke(ic.profile.AccessTokens()[:rotatedAt]...) // only tokens from the new CR token work from here on

	// Work on the new tokens, no restart: a new pod, a deleted pod.
	run.churn(ctx, t, "the new pod got a VM and the deleted pod's VM went, on the rotated token")
	require.Eventually(t, func() bool { return ic.usedSince(rotatedAt) >= 2 }, time.Minute, 100*time.Millisecond,
		"a second access token from the rotated CR token, once the first expired")
	status := run.status(t)
	t.Logf("trusted profile: %d access tokens issued, %d exchanges refused (the old CR token, after rotation)",
		ic.profile.Issued.Load(), ic.profile.Refused.Load())
	assert.GreaterOrEqual(t, ic.profile.Issued.Load(), int64(3))
	run.d.stop(t)
	assert.NotContains(t, run.d.logs.String(), "forbidden", "no call was refused by the policies")

	// Invariant I7: no token anywhere caa writes.
	secrets := ic.allSecrets()
	require.Greater(t, len(secrets), 4)
	run.assertNoSecrets(ctx, t, status, secrets)
}

// TestIBMCloudPreflightNamesTheMissingGrant starts caa under the shipped
// policies minus one grant whose read the preflight makes: it touches no
// pod, its readiness reason and a Node event name the IAM action, and once
// the grant is back (no restart) it turns ready. Then a subnet VPC does
// not know: the reason names the setting.
func TestIBMCloudPreflightNamesTheMissingGrant(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	full := shippedIBMPolicies(t)
	// The preflight's reads by resource type; a grant is checked when the
	// policies without it no longer allow its read (the configured group
	// stays readable through the cluster group's listing grant).
	reads := map[string]vpcfake.Access{
		"subnet":         {Type: "subnet", Verb: "read", ID: vpcfake.DefaultSubnet},
		"vpc":            {Type: "vpc", Verb: "read", ID: vpcfake.DefaultVPC},
		"security-group": {Type: "security-group", Verb: "read", ID: ibmGroup},
		"image":          {Type: "image", Verb: "read", ID: ibmImage},
		"instance":       {Type: "instance", Verb: "list", Group: vpcfake.DefaultResourceGroup},
		"volume":         {Type: "volume", Verb: "list", Group: vpcfake.DefaultResourceGroup},
	}
	iamID := "iam-" + ibmProfileID
	single := 0
	for _, access := range reads {
		for _, g := range full.Grants() {
			if !full.Without(g).Allows(iamID, access) {
				single++
				break
			}
		}
	}
	require.GreaterOrEqual(t, single, len(reads)-1)
	n := 0
	for _, g := range full.Grants() {
		access, ok := reads[g.Type]
		if !ok || full.Without(g).Allows(iamID, access) {
			continue
		}
		action := access.Action()
		n++
		node := fmt.Sprintf("preflight-%d", n) // this grant's own: the subtests run side by side
		t.Run(action, func(t *testing.T) {
			t.Parallel() // each its own node, cloud and caa: the waits overlap
			ic := newIBMIdentityCloud(ctx, t, c)
			ic.policy.Store(full.Without(g))
			nodeWithPod(ctx, t, c, node)
			d := launchCaa(t, c, node, filepath.Join(t.TempDir(), "caa", "ledger.db"), "ibmcloud preflight", ic.args, ic.env)
			preflightNamesMissing(ctx, t, c, d, node, action, g.String(), ic.core, 0, func() { ic.policy.Store(full) })
		})
	}
	require.Equal(t, single, n, "a grant for every read of the preflight that one grant allows")

	// Under the shipped policies, which name the subnet, IAM refuses a
	// subnet they do not cover before VPC could say it does not exist; the
	// reason names the setting all the same.
	t.Run("wrong subnet", func(t *testing.T) {
		t.Parallel()
		ic := newIBMIdentityCloud(ctx, t, c)
		const node = "preflight-subnet"
		_, err := c.CreateNode(ctx, node)
		require.NoError(t, err)
		args := append(slices.Clone(ic.args), "--ibmcloud-subnet-id", "0717-no-such-subnet")
		d := launchCaa(t, c, node, filepath.Join(t.TempDir(), "caa", "ledger.db"), "ibmcloud preflight", args, ic.env)
		settingNamed(t, d, ic.core, "0717-no-such-subnet", "--ibmcloud-subnet-id")
	})
}

// TestIBMCloudLeastPrivilegeLife runs caa's life through the binary on the
// trusted-profile route under exactly the shipped policies: start and
// create, restart and adopt, a killed VM recreated, a deleted pod's VM
// deleted, an orphan collected, and `caa ledger rebuild`. No call is
// refused.
func TestIBMCloudLeastPrivilegeLife(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	ic := newIBMIdentityCloud(ctx, t, c)
	leastPrivilegeLife(ctx, t, c, leastPrivilege{label: "ibmcloud least privilege", args: ic.args, env: ic.env,
		core: ic.core, live: func() map[string]string { return ibmLiveVMs(t, ic.core) },
		refusal: "forbidden", refusalMsg: "no call was refused by the policies",
		// put straight into the cloud: its implicit boot volume carries the tags
		orphan:  cloud.CreateRequest{Token: "orphan", Name: "caa-orphan", Image: ibmImage, InstanceType: ibmProfile},
		secrets: ic.allSecrets})
}
