package ibmcloud_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/test/conformance"
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
)

// shippedPolicies reads the shipped policy file with its placeholders
// filled for the fake's account.
func shippedPolicies(t testing.TB) *vpcfake.Policies {
	t.Helper()
	p, err := vpcfake.ReadPolicies(filepath.Join("..", "..", "..", "deploy", "overlays", "ibmcloud", "access-policies.json"), map[string]string{
		"REPLACE_ME_TRUSTED_PROFILE_ID": profileID,
		"REPLACE_ME_ACCOUNT_ID":         "fakeaccount",
		"REPLACE_ME_RESOURCE_GROUP_ID":  vpcfake.DefaultResourceGroup,
		"REPLACE_ME_SUBNET_ID":          vpcfake.DefaultSubnet,
		"REPLACE_ME_VPC_ID":             vpcfake.DefaultVPC,
		"REPLACE_ME_SECURITY_GROUP_ID":  policyGroup,
		"REPLACE_ME_IMAGE_ID":           conformance.ImageGood,
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
		vpcfake.WithNetwork(vpcfake.Network{VPC: vpcfake.DefaultVPC, Subnets: []string{vpcfake.DefaultSubnet}, SecurityGroups: []string{policyGroup}})))
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
	read := map[string]string{
		"subnet": "is.subnet.subnet.read", "vpc": "is.vpc.vpc.read", "security-group": "is.security-group.security-group.read",
		"image": "is.image.image.read", "instance": "is.instance.instance.list", "volume": "is.volume.volume.list",
	}
	r := newProfileRig(t, wallClockOptions(), time.Hour)
	checked := 0
	for _, g := range full.Grants() {
		t.Run(g.String(), func(t *testing.T) {
			r.policy.Store(full.Without(g))
			err := r.p.Preflight(context.Background())
			action, reads := read[g.Type]
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
	assert.Equal(t, len(read), checked, "every read grant is checked")
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

// policyLife is one node on the trusted-profile route under the shipped
// policies: a ledger, the real reconciler and its pods.
type policyLife struct {
	t     *testing.T
	r     *profileRig
	clock *testClock
	path  string
	led   *ledger.Ledger
	rec   *reconcile.Reconciler
	pods  []*reconcile.Pod
}

const policyNode = "node-policy"

func newPolicyLife(t *testing.T) *policyLife {
	clk := &testClock{now: time.Now()}
	opts := conformance.Options(nil)
	opts.Now = clk.Now
	l := &policyLife{t: t, r: newProfileRig(t, opts, time.Hour), clock: clk, path: filepath.Join(t.TempDir(), "ledger.db")}
	l.open()
	for i := range 3 {
		l.pods = append(l.pods, &reconcile.Pod{UID: fmt.Sprintf("uid-%d", i), Namespace: "team", Name: fmt.Sprintf("pod-%d", i), RuntimeClass: "kata-remote"})
	}
	return l
}

// open opens the ledger and a new reconciler on it: a restart of caa.
func (l *policyLife) open() {
	if l.led != nil {
		require.NoError(l.t, l.led.Close())
	}
	led, err := ledger.Open(ledger.Options{Path: l.path, Node: policyNode, Cluster: conformance.Cluster, Timeout: time.Second, Now: l.clock.Now})
	require.NoError(l.t, err)
	l.t.Cleanup(func() { _ = led.Close() })
	l.led = led
	ex := &reconcile.Executor{Ledger: led, Provider: l.r.p, Events: noEvents{}, Cluster: conformance.Cluster, Node: policyNode,
		RetryBase: time.Millisecond, RetryMax: time.Millisecond, Now: l.clock.Now}
	l.rec = &reconcile.Reconciler{Exec: ex, Config: reconcile.Config{
		Spec:           provider.SpecConfig{DefaultType: conformance.TypeSmall, DefaultImage: conformance.ImageGood},
		ConfirmMissing: 2 * time.Second, Provider: "ibmcloud",
	}, OrphanGrace: time.Minute, Now: l.clock.Now}
}

func (l *policyLife) pass() reconcile.PassResult {
	l.clock.Advance(time.Second)
	return l.rec.Pass(context.Background(), l.pods, true)
}

// converge runs passes until one converges with nothing left to do, and
// returns the cloud writes they made.
func (l *policyLife) converge(what string) int {
	l.t.Helper()
	writes := 0
	for range 10 {
		res := l.pass()
		require.NoError(l.t, res.Err, "%s: pass error", what)
		writes += res.CloudWrites
		if res.Converged() && res.CloudWrites == 0 && len(res.Orphans) == 0 {
			return writes
		}
	}
	l.t.Fatalf("%s: no convergence in 10 passes", what)
	return 0
}

// vms maps each pod UID to its live VM, failing on a pod with two.
func (l *policyLife) vms() map[string]string {
	l.t.Helper()
	vms, err := l.r.p.List(context.Background(), provider.Selector{Cluster: conformance.Cluster, Node: policyNode})
	require.NoError(l.t, err)
	out := map[string]string{}
	for _, in := range l.r.cloud.Live() {
		for _, vm := range vms {
			if vm.ID != in.ID {
				continue
			}
			uid := vm.Owner().PodUID
			if old, dup := out[uid]; dup {
				l.t.Errorf("pod %s has two live VMs: %s and %s", uid, old, in.ID)
			}
			out[uid] = in.ID
		}
	}
	require.Len(l.t, out, len(l.r.cloud.Live()), "every live VM is listed")
	return out
}

func (l *policyLife) records() map[string]string {
	rs, err := l.led.List(ledger.Filter{})
	require.NoError(l.t, err)
	out := map[string]string{}
	for _, r := range rs {
		out[r.PodUID] = r.VMID
	}
	return out
}

// TestWholeLifeUnderTheShippedPolicies: start and create, restart and
// adopt, recreate a killed VM, delete a gone pod's VM, collect an orphan,
// and rebuild a lost ledger from the cloud's tags, every call on the
// trusted-profile route under exactly deploy/overlays/ibmcloud's
// policies, none refused.
func TestWholeLifeUnderTheShippedPolicies(t *testing.T) {
	l := newPolicyLife(t)
	ctx := context.Background()
	require.NoError(t, l.r.p.Preflight(ctx))

	assert.Equal(t, 3, l.converge("start"))
	first := l.vms()
	assert.Len(t, first, 3)
	assert.Equal(t, first, l.records())

	l.open()
	assert.Zero(t, l.converge("adopt"), "adopting writes nothing")
	assert.Equal(t, first, l.vms())

	require.NoError(t, l.r.cloud.Kill(first["uid-1"]))
	assert.Equal(t, 1, l.converge("recreate"))
	now := l.vms()
	assert.NotEqual(t, first["uid-1"], now["uid-1"])
	assert.Equal(t, first["uid-0"], now["uid-0"])

	l.pods = l.pods[:2]
	assert.Equal(t, 1, l.converge("delete"))
	assert.Len(t, l.vms(), 2)

	// An orphan: a VM tagged for this node whose pod is gone.
	orphan, err := l.r.p.Create(ctx, provider.Spec{Key: "uid-gone-a1", Cluster: conformance.Cluster, Node: policyNode,
		PodUID: "uid-gone", PodNamespace: "team", PodName: "gone", InstanceType: conformance.TypeSmall, Image: conformance.ImageGood})
	require.NoError(t, err)
	res := l.pass()
	require.NoError(t, res.Err)
	require.Len(t, res.Orphans, 1, "the orphan waits out its grace")
	l.clock.Advance(2 * time.Minute)
	res = l.pass()
	require.NoError(t, res.Err)
	assert.Equal(t, 1, res.OrphansDeleted)
	assert.NotContains(t, l.vms(), "uid-gone", "orphan %s deleted", orphan.ID)

	// rebuild: what `caa ledger rebuild` does, one listing then adopt.
	before := l.vms()
	require.NoError(t, l.led.Close())
	l.led = nil
	l.path = filepath.Join(t.TempDir(), "rebuilt.db")
	l.open()
	vms, err := l.r.p.List(ctx, provider.Selector{Cluster: conformance.Cluster, Node: policyNode})
	require.NoError(t, err)
	for _, vm := range vms {
		for _, p := range l.pods {
			if vm.State.Alive() && p.UID == vm.Owner().PodUID {
				_, err := l.rec.Exec.Apply(ctx, reconcile.Input{Pod: p, VM: &vm},
					reconcile.Action{Kind: reconcile.KindAdopt, Reason: reconcile.ReasonRebuilt})
				require.NoError(t, err)
			}
		}
	}
	assert.Equal(t, before, l.records())
	assert.Zero(t, l.converge("after rebuild"))
	assert.Equal(t, before, l.vms())
	assert.NotContains(t, l.r.logs(), "forbidden")
}

// TestEachMissingGrantStopsTheNodeAndLosesNothing takes each grant of the
// shipped policies away in turn, at a step that needs them all (a new pod
// to create, a gone pod's VM to delete, a kept pod's VM to read): the pass
// fails with a node-blocking error that names the action, nothing
// crashes, no VM is deleted or made twice and no record lost; once the
// grant is back, the same reconciler converges.
func TestEachMissingGrantStopsTheNodeAndLosesNothing(t *testing.T) {
	full := shippedPolicies(t)
	for _, g := range full.Grants() {
		t.Run(g.String(), func(t *testing.T) {
			l := newPolicyLife(t)
			third := l.pods[2]
			l.pods = l.pods[:2]
			l.converge("start")
			before := l.vms()
			l.pods = []*reconcile.Pod{l.pods[0], third}

			l.r.policy.Store(full.Without(g))
			var res reconcile.PassResult
			for range 3 {
				res = l.pass()
				if res.Err != nil {
					break
				}
			}
			require.Error(t, res.Err, "a pass without %s fails", g)
			assert.ErrorIs(t, res.Err, reconcile.ErrDaemon, "a missing grant blocks the node")
			assert.ErrorIs(t, res.Err, provider.ErrAuth)
			assert.Contains(t, res.Err.Error(), g.ActionPrefix(), "the error names the action")
			assert.False(t, res.Converged())
			t.Logf("without %s: %v", g, res.Err)
			// Nothing lost, nothing made twice.
			l.r.policy.Store(nil)
			now := l.vms()
			assert.Equal(t, before["uid-0"], now["uid-0"])
			assert.Equal(t, before["uid-0"], l.records()["uid-0"])
			assert.LessOrEqual(t, len(now), 3)

			l.r.policy.Store(full)
			l.converge("the grant given back")
			l.r.policy.Store(nil)
			after := l.vms()
			assert.ElementsMatch(t, []string{"uid-0", "uid-2"}, keysOf(after))
			assert.Equal(t, before["uid-0"], after["uid-0"], "the kept pod's VM was never replaced")
			assert.Equal(t, after, l.records())
		})
	}
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
