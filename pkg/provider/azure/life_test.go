package azure_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/azure"
	"github.com/caa-project/caa/pkg/reconcile"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// These tests run caa's reconciler in-process, with this provider through
// the SDK, against a fake ARM that authorizes every call against the
// shipped role (deploy/overlays/azure/role.json): the whole life of a
// node's VMs under exactly that role, and what each missing action does.

const (
	lifeCluster = "cluster-life"
	lifeNode    = "node-a"
	lifeImage   = "Canonical:ubuntu-24_04-lts:server:latest"
	lifeSize    = "Standard_D2as_v5"
)

type lifeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *lifeClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *lifeClock) Advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

// life is one node: a ledger, a reconciler and its pods, on a fake ARM
// whose role the test can change.
type life struct {
	t     *testing.T
	f     *roleFake
	clock *lifeClock
	path  string
	led   *ledger.Ledger
	rec   *reconcile.Reconciler
	pods  []*reconcile.Pod
}

func newLife(t *testing.T, role *armfake.Role) *life {
	l := &life{t: t, clock: &lifeClock{now: time.Now()}, path: filepath.Join(t.TempDir(), "ledger.db")}
	l.f = newRoleFake(t, role, nil)
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
		Spec: provider.SpecConfig{DefaultType: lifeSize, DefaultImage: lifeImage}, Provider: azure.ProviderName,
	}, OrphanGrace: time.Minute, Now: l.clock.Now}
}

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

// vms maps each pod UID to its live VM, failing on a pod with two.
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

// records maps each pod UID to the core id of the VM its record names.
func (l *life) records() map[string]string {
	rs, err := l.led.List(ledger.Filter{})
	require.NoError(l.t, err)
	byName := map[string]string{}
	for _, in := range l.f.cloud.Instances() {
		byName[in.Name] = in.ID
	}
	out := map[string]string{}
	for _, r := range rs {
		out[r.PodUID] = byName[r.VMName]
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

// TestWholeLifeUnderTheShippedRole: preflight, start and create, restart
// and adopt, recreate a killed VM, delete a gone pod's VM, collect an
// orphan, and rebuild the ledger from the cloud, every call under exactly
// deploy/overlays/azure/role.json, none refused.
func TestWholeLifeUnderTheShippedRole(t *testing.T) {
	l := newLife(t, shippedRole(t))
	require.NoError(t, l.f.provider.Preflight(context.Background()))

	assert.Equal(t, 3, l.converge("start"))
	first := l.vms()
	assert.ElementsMatch(t, l.uids(), slices.Collect(maps.Keys(first)))
	assert.Equal(t, first, l.records())

	l.open()
	assert.Zero(t, l.converge("adopt"), "adopting writes nothing")
	assert.Equal(t, first, l.vms())

	require.NoError(t, l.f.cloud.Kill(first["uid-1"]))
	assert.Equal(t, 1, l.converge("recreate"))
	now := l.vms()
	assert.NotEqual(t, first["uid-1"], now["uid-1"])
	assert.Equal(t, first["uid-0"], now["uid-0"])

	l.pods = l.pods[:2]
	assert.Equal(t, 1, l.converge("delete"))
	assert.ElementsMatch(t, []string{"uid-0", "uid-1"}, slices.Collect(maps.Keys(l.vms())))

	// orphan GC: a VM tagged for this node that no pod owns.
	spec := provider.Spec{Key: "orphan-key", Cluster: lifeCluster, Node: lifeNode, PodUID: "uid-gone", PodNamespace: "team", PodName: "gone"}
	orphan, err := l.f.cloud.Create(cloud.CreateRequest{Name: "caa-orphan-0123456789ab", UniqueName: true, Tags: spec.Tags(),
		InstanceType: lifeSize, Image: lifeImage})
	require.NoError(t, err)
	res := l.pass()
	require.NoError(t, res.Err)
	require.Len(t, res.Orphans, 1, "the orphan waits out its grace")
	l.clock.Advance(2 * time.Minute)
	res = l.pass()
	require.NoError(t, res.Err)
	assert.Equal(t, 1, res.OrphansDeleted)
	assert.False(t, slices.ContainsFunc(l.f.cloud.Live(), func(in cloud.Instance) bool { return in.ID == orphan.ID }), "the orphan is gone")

	// rebuild: a lost ledger rebuilt from the cloud's tags.
	before := l.vms()
	require.NoError(t, l.led.Close())
	l.led = nil
	l.path = filepath.Join(t.TempDir(), "rebuilt.db")
	l.open()
	vms, err := l.f.provider.List(context.Background(), provider.Selector{Cluster: lifeCluster, Node: lifeNode})
	require.NoError(t, err)
	for _, vm := range vms {
		for _, p := range l.pods {
			if vm.State.Alive() && p.UID == vm.Owner().PodUID {
				_, err := l.rec.Exec.Apply(context.Background(), reconcile.Input{Pod: p, VM: &vm},
					reconcile.Action{Kind: reconcile.KindAdopt, Reason: reconcile.ReasonRebuilt})
				require.NoError(t, err)
			}
		}
	}
	assert.Equal(t, before, l.records())
	assert.Zero(t, l.converge("after rebuild"))
	assert.Equal(t, before, l.vms())
	assert.NotContains(t, l.f.logs(), "AuthorizationFailed", "no call was refused")
}

// TestEachMissingActionStopsTheNodeAndLosesNothing takes each action out
// of the role in turn. The preflight names it; and at the step of the life
// that needs it, the pass fails with a daemon-blocking error that names it
// (the two preflight-only actions are named by the preflight alone),
// nothing crashes, no VM is deleted or made twice and no record lost; once
// the action is given back, the same reconciler converges.
func TestEachMissingActionStopsTheNodeAndLosesNothing(t *testing.T) {
	full := shippedRole(t)
	preflightOnly := map[string]bool{
		"Microsoft.Resources/subscriptions/resourceGroups/read": true,
		"Microsoft.Authorization/permissions/read":              true,
		"Microsoft.Network/virtualNetworks/subnets/read":        true,
	}
	for _, action := range full.Actions {
		t.Run(action, func(t *testing.T) {
			l := newLife(t, full)
			third := l.pods[2]
			l.pods = l.pods[:2]
			l.converge("start")
			before := l.vms()
			// A new pod and a gone one, and the audit: every call of the
			// life is asked for.
			l.pods = []*reconcile.Pod{l.pods[0], third}

			l.f.role.Store(full.Without(action))
			err := l.f.provider.Preflight(context.Background())
			require.ErrorIs(t, err, provider.ErrAuth, "the preflight without %s", action)
			assert.Contains(t, err.Error(), action)

			if !preflightOnly[action] {
				var res reconcile.PassResult
				for range 3 { // a pass may end on the first failure it meets
					if res = l.pass(); res.Err != nil {
						break
					}
				}
				require.Error(t, res.Err, "a pass without %s fails", action)
				assert.ErrorIs(t, res.Err, reconcile.ErrDaemon, "a missing action blocks the node")
				assert.ErrorIs(t, res.Err, provider.ErrAuth)
				assert.Contains(t, res.Err.Error(), action, "the error names the missing action")
				assert.Contains(t, res.Err.Error(), azure.RoleFile)
				assert.False(t, res.Converged())
			}
			now := l.vms()
			assert.Equal(t, before["uid-0"], now["uid-0"], "the kept pod's VM is untouched")
			assert.Equal(t, before["uid-0"], l.records()["uid-0"], "and still recorded")

			l.f.role.Store(full)
			require.NoError(t, l.f.provider.Preflight(context.Background()))
			l.converge("the action given back")
			after := l.vms()
			assert.ElementsMatch(t, []string{"uid-0", "uid-2"}, slices.Collect(maps.Keys(after)))
			assert.Equal(t, before["uid-0"], after["uid-0"], "the kept pod's VM was never replaced")
			assert.Equal(t, after, l.records())
		})
	}
}
