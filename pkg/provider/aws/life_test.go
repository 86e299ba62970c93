package aws

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// These tests run caa's reconciler in-process, with this provider through
// the SDK, against a fake EC2 that enforces the shipped IAM policy: the
// whole life of a node's VMs under exactly that policy, and what each
// missing permission does to it.

const (
	lifeCluster = "cluster-life"
	lifeNode    = "node-a"
)

type lifeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *lifeClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *lifeClock) Advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

// life is one node: a ledger, a reconciler and its pods, on a fake EC2
// whose policy the test can change.
type life struct {
	t      *testing.T
	f      fakeEC2
	policy atomic.Pointer[ec2fake.Policy]
	clock  *lifeClock
	path   string
	led    *ledger.Ledger
	rec    *reconcile.Reconciler
	pods   []*reconcile.Pod
}

func newLife(t *testing.T, policy *ec2fake.Policy) *life {
	l := &life{t: t, clock: &lifeClock{now: time.Now()}, path: filepath.Join(t.TempDir(), "ledger.db")}
	l.policy.Store(policy)
	l.f = newPolicyFake(t, l.policy.Load, nil)
	l.open()
	for i := range 3 {
		l.pods = append(l.pods, &reconcile.Pod{UID: fmt.Sprintf("uid-%d", i), Namespace: "team", Name: fmt.Sprintf("pod-%d", i), RuntimeClass: "kata-remote"})
	}
	return l
}

// open opens the ledger and makes a new reconciler on it: a restart of caa.
func (l *life) open() {
	if l.led != nil {
		require.NoError(l.t, l.led.Close())
	}
	led, err := ledger.Open(ledger.Options{Path: l.path, Node: lifeNode, Cluster: lifeCluster, Timeout: time.Second})
	require.NoError(l.t, err)
	l.t.Cleanup(func() { _ = led.Close() })
	l.led = led
	exec := &reconcile.Executor{Ledger: led, Provider: l.f.provider, Cluster: lifeCluster, Node: lifeNode,
		RetryBase: time.Millisecond, RetryMax: time.Millisecond, Now: l.clock.Now}
	l.rec = &reconcile.Reconciler{Exec: exec, Config: reconcile.Config{
		Spec: provider.SpecConfig{DefaultType: policyType, DefaultImage: policyImage}, Provider: Name,
	}, OrphanGrace: time.Minute, Now: l.clock.Now}
}

// pass runs one pass (a second later than the last, so backoffs pass).
func (l *life) pass() reconcile.PassResult {
	l.clock.Advance(time.Second)
	return l.rec.Pass(context.Background(), l.pods, true)
}

// converge runs passes until one converges with nothing left to do, and
// returns the cloud writes they made.
func (l *life) converge(what string) int {
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

// vms maps each pod UID to its live VM, as the cloud's tags say, failing
// on a pod with two.
func (l *life) vms() map[string]string {
	out := map[string]string{}
	for _, in := range l.f.cloud.Live() {
		uid := in.Tags[provider.TagPodUID]
		if old, dup := out[uid]; dup {
			l.t.Errorf("pod %s has two live VMs: %s and %s", uid, old, in.ID)
		}
		out[uid] = in.ID
	}
	return out
}

// records maps each pod UID to the VM its ledger record names.
func (l *life) records() map[string]string {
	rs, err := l.led.List(ledger.Filter{})
	require.NoError(l.t, err)
	out := map[string]string{}
	for _, r := range rs {
		out[r.PodUID] = r.VMID
	}
	return out
}

func (l *life) uids() []string {
	var out []string
	for _, p := range l.pods {
		out = append(out, p.UID)
	}
	return out
}

// orphan puts a VM tagged for this node but owned by no pod in the cloud.
func (l *life) orphan() string {
	s := provider.Spec{Key: "orphan-key", Cluster: lifeCluster, Node: lifeNode, PodUID: "uid-gone", PodNamespace: "team", PodName: "gone"}
	in, err := l.f.cloud.Create(cloud.CreateRequest{Token: "orphan", Image: policyImage, InstanceType: policyType, Tags: s.Tags()})
	require.NoError(l.t, err)
	return in.ID
}

// TestWholeLifeUnderTheShippedPolicy: start and create, restart and adopt,
// recreate a killed VM, delete a gone pod's VM, collect an orphan, and
// rebuild the ledger from the cloud, every call under exactly the policy
// in deploy/overlays/aws/iam-policy.json, none refused.
func TestWholeLifeUnderTheShippedPolicy(t *testing.T) {
	l := newLife(t, shippedPolicy(t))

	// start: one VM per pod.
	assert.Equal(t, 3, l.converge("start"))
	first := l.vms()
	assert.ElementsMatch(t, l.uids(), keys(first))
	assert.Equal(t, first, l.records())
	require.NoError(t, l.f.provider.Preflight(context.Background()), "preflight with caa's instances")

	// restart: adopted, no cloud write.
	l.open()
	assert.Zero(t, l.converge("adopt"), "adopting writes nothing")
	assert.Equal(t, first, l.vms())

	// recreate: a VM killed behind caa's back is replaced.
	require.NoError(t, l.f.cloud.Kill(first["uid-1"]))
	assert.Equal(t, 1, l.converge("recreate"))
	now := l.vms()
	assert.NotEqual(t, first["uid-1"], now["uid-1"])
	assert.Equal(t, first["uid-0"], now["uid-0"])

	// delete: a pod gone from the cache loses its VM.
	l.pods = l.pods[:2]
	assert.Equal(t, 1, l.converge("delete"))
	assert.ElementsMatch(t, []string{"uid-0", "uid-1"}, keys(l.vms()))

	// orphan GC: seen, then deleted after the grace period.
	orphan := l.orphan()
	res := l.pass()
	require.NoError(t, res.Err)
	require.Len(t, res.Orphans, 1, "the orphan waits out its grace")
	l.clock.Advance(2 * time.Minute)
	res = l.pass()
	require.NoError(t, res.Err)
	assert.Equal(t, 1, res.OrphansDeleted)
	_, err := l.f.cloud.Get(orphan)
	require.NoError(t, err)
	assert.NotContains(t, l.vms(), "uid-gone")

	// rebuild: a lost ledger rebuilt from the cloud's tags (what `caa
	// ledger rebuild` does: one listing, then adopt), then a pass with
	// nothing to do.
	before := l.vms()
	require.NoError(t, l.led.Close())
	l.led = nil
	l.path = filepath.Join(t.TempDir(), "rebuilt.db")
	l.open()
	vms, err := l.f.provider.List(context.Background(), provider.Selector{Cluster: lifeCluster, Node: lifeNode})
	require.NoError(t, err)
	for _, vm := range vms {
		if !vm.State.Alive() {
			continue
		}
		for _, p := range l.pods {
			if p.UID == vm.Owner().PodUID {
				_, err := l.rec.Exec.Apply(context.Background(), reconcile.Input{Pod: p, VM: &vm},
					reconcile.Action{Kind: reconcile.KindAdopt, Reason: reconcile.ReasonRebuilt})
				require.NoError(t, err)
			}
		}
	}
	assert.Equal(t, before, l.records())
	assert.Zero(t, l.converge("after rebuild"))
	assert.Equal(t, before, l.vms())
}

// TestEachMissingPermissionStopsTheNodeAndLosesNothing takes each action
// out of the policy in turn, at the step of the life that needs it: the
// pass fails with a daemon-blocking error that names the action, nothing
// crashes, no VM is deleted or made twice and no record lost; once the
// permission is given back, the same reconciler converges.
func TestEachMissingPermissionStopsTheNodeAndLosesNothing(t *testing.T) {
	full := shippedPolicy(t)
	for _, action := range full.Actions() {
		t.Run(action, func(t *testing.T) {
			l := newLife(t, full)
			// Two pods have their VMs; the third comes while the
			// permission is missing, and the second goes.
			third := l.pods[2]
			l.pods = l.pods[:2]
			l.converge("start")
			before := l.vms()
			l.pods = []*reconcile.Pod{l.pods[0], third}

			l.policy.Store(full.Without(action))
			res := l.pass()
			require.Error(t, res.Err, "a pass without %s fails", action)
			assert.ErrorIs(t, res.Err, reconcile.ErrDaemon, "a missing permission blocks the node")
			assert.ErrorIs(t, res.Err, provider.ErrAuth)
			assert.Contains(t, res.Err.Error(), action, "the error names the missing permission")
			assert.False(t, res.Converged())
			// Nothing lost: the VMs of the pods still there are the same,
			// each recorded; none was made twice.
			now := l.vms()
			assert.Equal(t, before["uid-0"], now["uid-0"])
			assert.Equal(t, before["uid-0"], l.records()["uid-0"])
			if action == "ec2:TerminateInstances" {
				assert.Equal(t, before["uid-1"], now["uid-1"], "the gone pod's VM is still there, to be deleted later")
			}

			l.policy.Store(full)
			l.converge("the permission given back")
			after := l.vms()
			assert.ElementsMatch(t, []string{"uid-0", "uid-2"}, keys(after))
			assert.Equal(t, before["uid-0"], after["uid-0"], "the kept pod's VM was never replaced")
			assert.Equal(t, after, l.records())
		})
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range maps.Keys(m) {
		out = append(out, k)
	}
	return out
}
