package ibmcloud_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/lifetest"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// These tests run the provider, through the SDK, on the trusted-profile
// route (a compute-resource token file exchanged at the fake IAM), against
// a fake VPC that enforces deploy/overlays/ibmcloud/access-policies.json:
// the preflight, caa's whole life in-process with the real reconciler, and
// what each missing grant does.

const (
	profileID     = "Profile-0a1b2c3d-e2e"
	profileName   = "caa-peer-pods"
	policyGroup   = "r006-sg-1"
	policyNetwork = "r006-fake-vpc"
	// policyCluster is the IKS cluster whose workers' security group,
	// kube-<id>, every VM of the policy tests joins (the fake names a
	// group by its id).
	policyCluster      = "c0ffee-policy"
	policyClusterGroup = "kube-" + policyCluster
	policyIAMID        = "iam-" + profileID
)

// shippedPolicies reads the shipped policy file with its placeholders
// filled for the fake's account.
func shippedPolicies(t testing.TB) *vpcfake.Policies {
	t.Helper()
	p, err := vpcfake.ReadPolicies(filepath.Join("..", "..", "..", "deploy", "overlays", "ibmcloud", "access-policies.json"), map[string]string{
		"REPLACE_ME_TRUSTED_PROFILE_ID":        profileID,
		"REPLACE_ME_ACCOUNT_ID":                "fakeaccount",
		"REPLACE_ME_RESOURCE_GROUP_ID":         vpcfake.DefaultResourceGroup,
		"REPLACE_ME_SUBNET_ID":                 vpcfake.DefaultSubnet,
		"REPLACE_ME_VPC_ID":                    vpcfake.DefaultVPC,
		"REPLACE_ME_SECURITY_GROUP_ID":         policyGroup,
		"REPLACE_ME_IMAGE_ID":                  conformance.ImageGood,
		"REPLACE_ME_CLUSTER_SECURITY_GROUP_ID": policyClusterGroup,
	})
	require.NoError(t, err)
	return p
}

// wallClockOptions is the suite's cloud on the wall clock.
func wallClockOptions() cloud.Options {
	o := conformance.Options(nil)
	o.Now = time.Now
	return o
}

// profileRig is the fake VPC with a trusted profile whose CR token the
// test controls, and a provider on it.
type profileRig struct {
	cloud   *cloud.Cloud
	profile *vpcfake.TrustedProfile
	policy  atomic.Pointer[vpcfake.Policies]
	token   atomic.Pointer[string] // the CR token the profile trusts now
	file    string
	cfg     ibmcloud.Config
	p       *ibmcloud.Provider
	logs    func() string
}

func newProfileRig(t *testing.T, opts cloud.Options, lifetime time.Duration) *profileRig {
	t.Helper()
	r := &profileRig{cloud: cloud.New(opts), file: filepath.Join(t.TempDir(), "sa-token")}
	r.profile = &vpcfake.TrustedProfile{ID: profileID, Name: profileName, Lifetime: lifetime,
		Verify: func(tok string) (string, error) {
			if cur := r.token.Load(); cur == nil || tok != *cur {
				return "", errors.New("not the token of the linked ServiceAccount")
			}
			return "system:serviceaccount:caa-system:caa", nil
		}}
	r.policy.Store(shippedPolicies(t))
	srv := httptest.NewServer(vpcfake.NewServer(r.cloud, vpcfake.WithTrustedProfile(r.profile), vpcfake.WithPolicies(r.policy.Load),
		vpcfake.WithNetwork(vpcfake.Network{VPC: vpcfake.DefaultVPC, Subnets: []string{vpcfake.DefaultSubnet}, SecurityGroups: []string{policyGroup, policyClusterGroup}})))
	t.Cleanup(srv.Close)
	r.rotate(t)
	t.Setenv(ibmcloud.EnvAPIKey, "")
	t.Setenv(ibmcloud.EnvAuthType, "container")
	t.Setenv(ibmcloud.EnvProfileID, profileID)
	t.Setenv(ibmcloud.EnvCRTokenFile, r.file)
	r.logs = captureSDKLogs(t)
	r.cfg = testConfig(srv.URL)
	r.cfg.Image = conformance.ImageGood
	r.cfg.InstanceType = conformance.TypeSmall
	p, err := ibmcloud.New(context.Background(), r.cfg)
	require.NoError(t, err)
	r.p = p
	return r
}

// rotate writes a new CR token to the file (atomically, as the kubelet
// does) and makes the profile trust only it.
func (r *profileRig) rotate(t *testing.T) string {
	t.Helper()
	tok := fmt.Sprintf("cr-token-%d-%d", time.Now().UnixNano(), len(r.profile.AccessTokens()))
	require.NoError(t, os.WriteFile(r.file+".new", []byte(tok), 0o600))
	require.NoError(t, os.Rename(r.file+".new", r.file))
	r.token.Store(&tok)
	return tok
}

func TestPreflightUnderTheShippedPolicies(t *testing.T) {
	r := newProfileRig(t, wallClockOptions(), time.Hour)
	require.NoError(t, r.p.Preflight(context.Background()))
	assert.Equal(t, int64(1), r.profile.Issued.Load(), "one token exchange for every check")
	assert.Equal(t, "trusted profile "+profileID+" with the compute-resource token in "+r.file+" (IBMCLOUD_AUTH_TYPE=container)", r.p.Credentials())
}

// TestPreflightNamesEachMissingReadGrant takes each grant out in turn:
// those whose reads the preflight makes fail it with ErrAuth naming the
// action and the resource; the others (the create-only grants) pass it
// and are left to the first create (TestEachMissingGrantStopsTheNodeAndLosesNothing).
func TestPreflightNamesEachMissingReadGrant(t *testing.T) {
	full := shippedPolicies(t)
	// The preflight's reads, by resource type: a grant is one of them if
	// the policies without it no longer allow that read (the cluster
	// group's grants leave the configured group readable).
	read := map[string]vpcfake.Access{
		"subnet":         {Type: "subnet", Verb: "read", ID: vpcfake.DefaultSubnet},
		"vpc":            {Type: "vpc", Verb: "read", ID: vpcfake.DefaultVPC},
		"security-group": {Type: "security-group", Verb: "read", ID: policyGroup},
		"image":          {Type: "image", Verb: "read", ID: conformance.ImageGood},
		"instance":       {Type: "instance", Verb: "list", Group: vpcfake.DefaultResourceGroup},
		"volume":         {Type: "volume", Verb: "list", Group: vpcfake.DefaultResourceGroup},
	}
	r := newProfileRig(t, wallClockOptions(), time.Hour)
	checked := 0
	for _, g := range full.Grants() {
		t.Run(g.String(), func(t *testing.T) {
			r.policy.Store(full.Without(g))
			err := r.p.Preflight(context.Background())
			access, typed := read[g.Type]
			reads := typed && !full.Without(g).Allows(policyIAMID, access)
			action := access.Action()
			if !reads {
				assert.NoError(t, err, "the preflight makes no read this grant is for")
				return
			}
			checked++
			require.Error(t, err)
			assert.ErrorIs(t, err, provider.ErrAuth)
			assert.Contains(t, err.Error(), action, "the error names the action")
			assert.Contains(t, err.Error(), "access-policies.json")
			t.Logf("without %s: %v", g, err)
		})
	}
	// Every read that a single grant allows is checked (the configured
	// group is also readable through the cluster's listing grant).
	single := 0
	for _, access := range read {
		for _, g := range full.Grants() {
			if !full.Without(g).Allows(policyIAMID, access) {
				single++
				break
			}
		}
	}
	assert.GreaterOrEqual(t, single, len(read)-1)
	assert.Equal(t, single, checked, "every read grant is checked")
}

func TestPreflightNamesTheSettingOfAResourceVPCDoesNotKnow(t *testing.T) {
	r := newProfileRig(t, wallClockOptions(), time.Hour)
	for _, tc := range []struct {
		setting string
		change  func(*ibmcloud.Config)
	}{
		{"--ibmcloud-subnet-id", func(c *ibmcloud.Config) { c.SubnetID = "0717-no-such-subnet" }},
		{"--ibmcloud-vpc-id", func(c *ibmcloud.Config) { c.VPCID = "r006-another-vpc" }},
		{"--ibmcloud-security-group-ids", func(c *ibmcloud.Config) { c.SecurityGroupIDs = []string{policyGroup, "r006-no-such-sg"} }},
		{"--ibmcloud-image", func(c *ibmcloud.Config) { c.Image = "r006-no-such-image" }},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			cfg := r.cfg
			tc.change(&cfg)
			p, err := ibmcloud.New(context.Background(), cfg)
			require.NoError(t, err)
			// Wide open, so the refusal is VPC's 404, not a policy's 403.
			r.policy.Store(nil)
			defer r.policy.Store(shippedPolicies(t))
			err = p.Preflight(context.Background())
			require.Error(t, err)
			assert.ErrorIs(t, err, provider.ErrInvalidSpec)
			assert.Contains(t, err.Error(), tc.setting)
			t.Logf("%v", err)
		})
	}
}

func TestPreflightNamesAnUnreadableTokenFileAndARefusedToken(t *testing.T) {
	r := newProfileRig(t, wallClockOptions(), time.Hour)
	require.NoError(t, os.Remove(r.file))
	err := r.p.Preflight(context.Background())
	require.Error(t, err)
	assert.ErrorIs(t, err, provider.ErrAuth)
	assert.Contains(t, err.Error(), r.file)
	assert.Contains(t, err.Error(), ibmcloud.EnvCRTokenFile)

	// A token the profile does not trust: IAM refuses the exchange.
	require.NoError(t, os.WriteFile(r.file, []byte("a-token-of-another-service-account"), 0o600))
	err = r.p.Preflight(context.Background())
	require.Error(t, err)
	assert.ErrorIs(t, err, provider.ErrAuth)
	assert.Contains(t, err.Error(), ibmcloud.EnvProfileID, "the error says where to look")
	assert.NotContains(t, err.Error(), "a-token-of-another-service-account")
	assert.Positive(t, r.profile.Refused.Load())
	t.Logf("%v", err)

	// The same provider recovers once the file holds a good token.
	r.rotate(t)
	require.NoError(t, r.p.Preflight(context.Background()))
}

// TestTokensRotateWithoutARestart: access tokens live 11 s, which the SDK
// treats as expired after 1 s; the CR token file is replaced and the old
// token no longer trusted; the same provider keeps working on tokens
// exchanged from the new file. No token appears in an error or the SDK's
// log.
func TestTokensRotateWithoutARestart(t *testing.T) {
	r := newProfileRig(t, wallClockOptions(), 11*time.Second)
	ctx := context.Background()
	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-rot"}
	vm, err := r.p.Create(ctx, conformance.Spec(1, sel.Node))
	require.NoError(t, err)
	first := r.profile.Issued.Load()
	crTokens := []string{*r.token.Load()}

	for round := range 2 {
		crTokens = append(crTokens, r.rotate(t))
		issued := r.profile.Issued.Load()
		require.Eventually(t, func() bool {
			_, err := r.p.Get(ctx, vm.ID)
			return err == nil && r.profile.Issued.Load() > issued
		}, 30*time.Second, 50*time.Millisecond, "round %d: a new access token from the rotated CR token", round)
		vms, err := r.p.List(ctx, sel)
		require.NoError(t, err)
		require.Len(t, vms, 1)
	}
	require.NoError(t, r.p.Delete(ctx, vm.ID))
	assert.Greater(t, r.profile.Issued.Load(), first+1)

	logs := r.logs()
	for _, s := range append(crTokens, r.profile.AccessTokens()...) {
		assert.NotContains(t, logs, s, "a token is in the SDK's log")
	}
}

const policyNode = "node-policy"

// lifeConfig is one node on the trusted-profile route under the shipped
// policies, on a fake whose clock is the node's.
func lifeConfig(t *testing.T) lifetest.Config {
	clk := lifetest.NewClock(time.Now())
	opts := conformance.Options(nil)
	opts.Now = clk.Now
	r := newProfileRig(t, opts, time.Hour)
	// The node is an IKS worker: every VM also joins kube-<cluster id>,
	// found by listing the VPC's groups at start, so every grant of the
	// shipped file is one the life needs.
	id, err := r.p.AddClusterSecurityGroup(context.Background(), policyCluster)
	require.NoError(t, err)
	require.Equal(t, policyClusterGroup, id)
	full := r.policy.Load()
	grants := map[string]vpcfake.Grant{}
	for _, g := range full.Grants() {
		grants[g.String()] = g
	}
	require.Len(t, grants, len(full.Grants()), "each grant has its own name")
	return lifetest.Config{
		Provider: r.p, Cloud: r.cloud, Clock: clk, Name: "ibmcloud", Events: noEvents{},
		Cluster: conformance.Cluster, Node: policyNode, Type: conformance.TypeSmall, Image: conformance.ImageGood,
		ConfirmMissing: 2 * time.Second,
		PreflightFirst: true,
		// The fake's tags are its own: a VM's pod is read through the SDK.
		OwnersByList: true,
		// An orphan: a VM tagged for this node whose pod is gone, made
		// through the provider.
		Orphan: func(t *testing.T) string {
			orphan, err := r.p.Create(context.Background(), provider.Spec{Key: "uid-gone-a1", Cluster: conformance.Cluster, Node: policyNode,
				PodUID: "uid-gone", PodNamespace: "team", PodName: "gone", InstanceType: conformance.TypeSmall, Image: conformance.ImageGood})
			require.NoError(t, err)
			return orphan.ID
		},
		Logs: r.logs, Refused: "forbidden",
		Deny:    func(grant string) { r.policy.Store(full.Without(grants[grant])) },
		Restore: func() { r.policy.Store(full) },
		// Looking lists through the SDK: around the policies.
		Lift: func() { r.policy.Store(nil) },
	}
}

// TestWholeLifeUnderTheShippedPolicies: start and create, restart and
// adopt, recreate a killed VM, delete a gone pod's VM, collect an orphan,
// and rebuild a lost ledger from the cloud's tags, every call on the
// trusted-profile route under exactly deploy/overlays/ibmcloud's
// policies, none refused.
func TestWholeLifeUnderTheShippedPolicies(t *testing.T) {
	lifetest.WholeLife(t, lifeConfig(t))
}

// TestEachMissingGrantStopsTheNodeAndLosesNothing takes each grant of the
// shipped policies away in turn, at a step that needs them all (a new pod
// to create, a gone pod's VM to delete, a kept pod's VM to read): the pass
// fails with a node-blocking error that names the action, nothing
// crashes, no VM is deleted or made twice and no record lost; once the
// grant is back, the same reconciler converges.
func TestEachMissingGrantStopsTheNodeAndLosesNothing(t *testing.T) {
	var perms []lifetest.Permission
	full := shippedPolicies(t)
	for _, g := range full.Grants() {
		// Listing the security groups finds the cluster's group once, at
		// start (TestTheClusterGroupUnderTheShippedPolicies); no pass needs it.
		atStart := !full.Without(g).Allows(policyIAMID, vpcfake.Access{Type: "security-group", Verb: "list"})
		perms = append(perms, lifetest.Permission{Name: g.String(), Named: g.ActionPrefix(), PreflightOnly: atStart})
	}
	lifetest.EachMissing(t, perms, lifetest.Missing{Noun: "grant", Passes: 3}, lifeConfig)
}

// TestTheClusterGroupUnderTheShippedPolicies: on an IKS worker caa lists
// the VPC's security groups once to find kube-<cluster id>; the shipped
// policies allow it, and without their listing grant the start is refused
// with the action named and nothing made.
func TestTheClusterGroupUnderTheShippedPolicies(t *testing.T) {
	r := newProfileRig(t, wallClockOptions(), time.Hour)
	ctx := context.Background()
	full := r.policy.Load()
	var listing []vpcfake.Grant
	for _, g := range full.Grants() {
		if g.Type == "security-group" && !full.Without(g).Allows(policyIAMID, vpcfake.Access{Type: "security-group", Verb: "list"}) {
			listing = append(listing, g)
		}
	}
	require.Len(t, listing, 1, "one grant lets caa list the security groups")

	r.policy.Store(full.Without(listing[0]))
	_, err := r.p.AddClusterSecurityGroup(ctx, policyCluster)
	require.Error(t, err)
	assert.ErrorIs(t, err, provider.ErrAuth)
	assert.Contains(t, err.Error(), "is.security-group.security-group.list")
	t.Logf("without %s: %v", listing[0], err)

	r.policy.Store(full)
	id, err := r.p.AddClusterSecurityGroup(ctx, policyCluster)
	require.NoError(t, err)
	assert.Equal(t, policyClusterGroup, id)
	vm, err := r.p.Create(ctx, conformance.Spec(1, policyNode))
	require.NoError(t, err, "a create that attaches the cluster's group under the shipped policies")
	require.NoError(t, r.p.Delete(ctx, vm.ID))
}

// TestPreflightChecksTheTaggingEndpoint: the preflight reads one tag from
// Global Tagging, where Create and List attach the instances' tags, and a
// tagging endpoint that is not Global Tagging (a wrong path, nothing
// listening) or that refuses caa's token fails it with an error naming
// --ibmcloud-tagging-endpoint.
func TestPreflightChecksTheTaggingEndpoint(t *testing.T) {
	r := newProfileRig(t, wallClockOptions(), time.Hour)
	ctx := context.Background()
	r.cloud.ResetCounters()
	require.NoError(t, r.p.Preflight(ctx))
	assert.EqualValues(t, 1, r.cloud.Counters()[vpcfake.OpTagList], "one read of Global Tagging")

	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	// Another IBM Cloud fake: its IAM never issued caa's token.
	stranger := httptest.NewServer(vpcfake.NewServer(cloud.New(wallClockOptions())))
	t.Cleanup(stranger.Close)
	for _, tc := range []struct {
		name, endpoint string
		kind           error
	}{
		{"a path that is not Global Tagging", r.cfg.SearchEndpoint + "/not-tagging", provider.ErrInvalidSpec},
		{"nothing listening", closed.URL, nil},
		{"a service that refuses the token", stranger.URL, provider.ErrAuth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := r.cfg
			cfg.TaggingEndpoint = tc.endpoint
			cfg.ReadTimeout = 2 * time.Second
			p, err := ibmcloud.New(ctx, cfg)
			require.NoError(t, err)
			err = p.Preflight(ctx)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "--ibmcloud-tagging-endpoint")
			assert.Contains(t, err.Error(), tc.endpoint)
			if tc.kind != nil {
				assert.ErrorIs(t, err, tc.kind)
			}
			t.Logf("%v", err)
		})
	}
}
