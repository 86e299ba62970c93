// Package lifetest drives caa's real reconciler (pkg/reconcile), in
// process, with a real ledger file, over one cloud's provider and its
// fake cloud: the whole life of a node's VMs under the shipped
// permissions, and what each missing permission does to it. The
// providers' tests call it with what differs per cloud.
package lifetest

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// Clock is a settable clock, shared by the reconciler, the ledger and,
// where the test wires it, the fake cloud.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock is a clock at now.
func NewClock(now time.Time) *Clock { return &Clock{now: now} }

// Now is the clock's time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

// Config is one node on one cloud: the provider under test, the fake
// cloud's core behind it, and what differs per cloud.
type Config struct {
	Provider provider.Provider
	Cloud    *cloud.Cloud
	// Clock drives the reconciler and the ledger (nil: a new one at
	// time.Now()); pass the fake cloud's clock when it has one.
	Clock *Clock
	// Name is the provider's name in the reconciler's config.
	Name           string
	Cluster, Node  string
	Type, Image    string
	ConfirmMissing time.Duration
	Events         reconcile.EventSink

	// OwnersByList: the pod that owns a live VM is read through the
	// provider's List (the fake's tags are not caa's); otherwise from
	// the core's tags.
	OwnersByList bool
	// RecordVM is the core id of the VM a record names (nil: its VMID).
	RecordVM func(r ledger.Record) string
	// Orphan puts a VM tagged for this node, owned by no pod ("uid-gone"),
	// in the cloud and returns its core id.
	Orphan func(t *testing.T) string
	// AfterOrphanGC checks what the cloud keeps of a collected orphan
	// (nil: nothing more).
	AfterOrphanGC func(t *testing.T, id string)
	// PreflightFirst: the preflight runs before the first VM; otherwise
	// once caa's VMs are there.
	PreflightFirst bool
	// Logs and Refused: the provider's logs must not contain Refused at
	// the end of the life (empty: not checked).
	Logs    func() string
	Refused string

	// Deny takes one permission away, Restore gives them all back and
	// Lift (nil: not needed) lets the test look at the cloud around the
	// checks.
	Deny    func(perm string)
	Restore func()
	Lift    func()
}

// Node is one node: a ledger, a reconciler and its three pods.
type Node struct {
	t     *testing.T
	cfg   Config
	clock *Clock
	path  string
	Led   *ledger.Ledger
	Rec   *reconcile.Reconciler
	Pods  []*reconcile.Pod
}

// New opens the node's ledger and reconciler, with pods uid-0..uid-2.
func New(t *testing.T, cfg Config) *Node {
	clk := cfg.Clock
	if clk == nil {
		clk = NewClock(time.Now())
	}
	n := &Node{t: t, cfg: cfg, clock: clk, path: filepath.Join(t.TempDir(), "ledger.db")}
	n.Open()
	for i := range 3 {
		n.Pods = append(n.Pods, &reconcile.Pod{UID: fmt.Sprintf("uid-%d", i), Namespace: "team", Name: fmt.Sprintf("pod-%d", i), RuntimeClass: "kata-remote"})
	}
	return n
}

// Open opens the ledger and makes a new reconciler on it: a restart of caa.
func (n *Node) Open() {
	if n.Led != nil {
		require.NoError(n.t, n.Led.Close())
	}
	led, err := ledger.Open(ledger.Options{Path: n.path, Node: n.cfg.Node, Cluster: n.cfg.Cluster, Timeout: time.Second, Now: n.clock.Now})
	require.NoError(n.t, err)
	n.t.Cleanup(func() { _ = led.Close() })
	n.Led = led
	ex := &reconcile.Executor{Ledger: led, Provider: n.cfg.Provider, Events: n.cfg.Events, Cluster: n.cfg.Cluster, Node: n.cfg.Node,
		RetryBase: time.Millisecond, RetryMax: time.Millisecond, Now: n.clock.Now}
	n.Rec = &reconcile.Reconciler{Exec: ex, Config: reconcile.Config{
		Spec:           provider.SpecConfig{DefaultType: n.cfg.Type, DefaultImage: n.cfg.Image},
		ConfirmMissing: n.cfg.ConfirmMissing, Provider: n.cfg.Name,
	}, OrphanGrace: time.Minute, Now: n.clock.Now}
}

// Pass runs one pass (a second later than the last, so backoffs pass).
func (n *Node) Pass() reconcile.PassResult {
	n.clock.Advance(time.Second)
	return n.Rec.Pass(context.Background(), n.Pods, true)
}

// Converge runs passes until one converges with nothing left to do, and
// returns the cloud writes they made.
func (n *Node) Converge(what string) int {
	n.t.Helper()
	writes := 0
	for range 10 {
		res := n.Pass()
		require.NoError(n.t, res.Err, "%s: pass error", what)
		writes += res.CloudWrites
		if res.Converged() && res.CloudWrites == 0 && len(res.Orphans) == 0 {
			return writes
		}
	}
	n.t.Fatalf("%s: no convergence in 10 passes", what)
	return 0
}

// VMs maps each pod UID to its live VM's core id, failing on a pod with
// two.
func (n *Node) VMs() map[string]string {
	n.t.Helper()
	var listed map[string]string
	if n.cfg.OwnersByList {
		vms, err := n.cfg.Provider.List(context.Background(), provider.Selector{Cluster: n.cfg.Cluster, Node: n.cfg.Node})
		require.NoError(n.t, err)
		listed = map[string]string{}
		for _, vm := range vms {
			listed[vm.ID] = vm.Owner().PodUID
		}
	}
	live := n.cfg.Cloud.Live()
	out := map[string]string{}
	for _, in := range live {
		uid := in.Tags[provider.TagPodUID]
		if listed != nil {
			var ok bool
			if uid, ok = listed[in.ID]; !ok {
				continue
			}
		}
		if old, dup := out[uid]; dup {
			n.t.Errorf("pod %s has two live VMs: %s and %s", uid, old, in.ID)
		}
		out[uid] = in.ID
	}
	require.Len(n.t, out, len(live), "every live VM is listed")
	return out
}

// Records maps each pod UID to the core id of the VM its record names.
func (n *Node) Records() map[string]string {
	rs, err := n.Led.List(ledger.Filter{})
	require.NoError(n.t, err)
	out := map[string]string{}
	for _, r := range rs {
		if n.cfg.RecordVM != nil {
			out[r.PodUID] = n.cfg.RecordVM(r)
		} else {
			out[r.PodUID] = r.VMID
		}
	}
	return out
}

func (n *Node) uids() []string {
	var out []string
	for _, p := range n.Pods {
		out = append(out, p.UID)
	}
	return out
}

// Keys is the keys of m.
func Keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// WholeLife: start and create, restart and adopt, recreate a killed VM,
// delete a gone pod's VM, collect an orphan, and rebuild a lost ledger
// from the cloud's tags, with the preflight, every call under the
// permissions the fake enforces, none refused.
func WholeLife(t *testing.T, cfg Config) {
	ctx := context.Background()
	n := New(t, cfg)
	if cfg.PreflightFirst {
		require.NoError(t, preflighter(t, cfg).Preflight(ctx))
	}

	// start: one VM per pod.
	assert.Equal(t, 3, n.Converge("start"))
	first := n.VMs()
	assert.Len(t, first, 3)
	assert.ElementsMatch(t, n.uids(), Keys(first))
	assert.Equal(t, first, n.Records())
	if !cfg.PreflightFirst {
		require.NoError(t, preflighter(t, cfg).Preflight(ctx), "preflight with caa's instances")
	}

	// restart: adopted, no cloud write.
	n.Open()
	assert.Zero(t, n.Converge("adopt"), "adopting writes nothing")
	assert.Equal(t, first, n.VMs())

	// recreate: a VM killed behind caa's back is replaced.
	require.NoError(t, cfg.Cloud.Kill(first["uid-1"]))
	assert.Equal(t, 1, n.Converge("recreate"))
	now := n.VMs()
	assert.NotEqual(t, first["uid-1"], now["uid-1"])
	assert.Equal(t, first["uid-0"], now["uid-0"])

	// delete: a pod gone from the cache loses its VM.
	n.Pods = n.Pods[:2]
	assert.Equal(t, 1, n.Converge("delete"))
	assert.Len(t, n.VMs(), 2)
	assert.ElementsMatch(t, []string{"uid-0", "uid-1"}, Keys(n.VMs()))

	// orphan GC: seen, then deleted after the grace period.
	orphan := cfg.Orphan(t)
	res := n.Pass()
	require.NoError(t, res.Err)
	require.Len(t, res.Orphans, 1, "the orphan waits out its grace")
	n.clock.Advance(2 * time.Minute)
	res = n.Pass()
	require.NoError(t, res.Err)
	assert.Equal(t, 1, res.OrphansDeleted)
	if cfg.AfterOrphanGC != nil {
		cfg.AfterOrphanGC(t, orphan)
	}
	assert.NotContains(t, n.VMs(), "uid-gone", "orphan %s deleted", orphan)
	assert.False(t, slices.ContainsFunc(cfg.Cloud.Live(), func(in cloud.Instance) bool { return in.ID == orphan }), "the orphan is gone")

	// rebuild: a lost ledger rebuilt from the cloud's tags (what `caa
	// ledger rebuild` does: one listing, then adopt), then a pass with
	// nothing to do.
	before := n.VMs()
	require.NoError(t, n.Led.Close())
	n.Led = nil
	n.path = filepath.Join(t.TempDir(), "rebuilt.db")
	n.Open()
	vms, err := cfg.Provider.List(ctx, provider.Selector{Cluster: cfg.Cluster, Node: cfg.Node})
	require.NoError(t, err)
	for _, vm := range vms {
		for _, p := range n.Pods {
			if vm.State.Alive() && p.UID == vm.Owner().PodUID {
				_, err := n.Rec.Exec.Apply(ctx, reconcile.Input{Pod: p, VM: &vm},
					reconcile.Action{Kind: reconcile.KindAdopt, Reason: reconcile.ReasonRebuilt})
				require.NoError(t, err)
			}
		}
	}
	assert.Equal(t, before, n.Records())
	assert.Zero(t, n.Converge("after rebuild"))
	assert.Equal(t, before, n.VMs())
	if cfg.Refused != "" {
		assert.NotContains(t, cfg.Logs(), cfg.Refused, "no call was refused")
	}
}

// preflighter is the provider's preflight, which every cloud's has.
func preflighter(t *testing.T, cfg Config) provider.Preflighter {
	t.Helper()
	p, ok := cfg.Provider.(provider.Preflighter)
	require.True(t, ok, "%s has a preflight", cfg.Name)
	return p
}

// Permission is one permission of the shipped set, as the test names it.
type Permission struct {
	// Name names the subtest and is what Config.Deny takes away.
	Name string
	// Named is what an error about it must contain (empty: Name).
	Named string
	// PreflightOnly: only the preflight needs it; no pass fails without it.
	PreflightOnly bool
}

// Missing is how the clouds differ when a permission is missing.
type Missing struct {
	// Noun is what the cloud calls a permission ("permission", "action",
	// "grant"), for the failure messages.
	Noun string
	// Passes is how many passes may run before one fails (a pass may end
	// on the first failure it meets, before the call that needs it).
	Passes int
	// Preflight: the preflight, too, names the missing permission, and
	// passes once it is back.
	Preflight bool
	// Mentions is what else each such error must contain.
	Mentions []string
	// Denied checks more, per cloud, once the pass failed (nil: nothing).
	Denied func(t *testing.T, perm string, before, now map[string]string)
}

// EachMissing takes each permission away in turn, at a step of the life
// that needs them all (a new pod to create, a gone pod's VM to delete, a
// kept pod's VM to read): the pass fails with a node-blocking error that
// names it, nothing crashes, no VM is deleted or made twice and no record
// lost; once the permission is back, the same reconciler converges. setup
// makes a new node's Config, under the full set, for each.
func EachMissing(t *testing.T, perms []Permission, m Missing, setup func(t *testing.T) Config) {
	for _, perm := range perms {
		t.Run(perm.Name, func(t *testing.T) {
			cfg := setup(t)
			named := perm.Named
			if named == "" {
				named = perm.Name
			}
			n := New(t, cfg)
			// Two pods have their VMs; the third comes while the
			// permission is missing, and the second goes.
			third := n.Pods[2]
			n.Pods = n.Pods[:2]
			n.Converge("start")
			before := n.VMs()
			n.Pods = []*reconcile.Pod{n.Pods[0], third}

			cfg.Deny(perm.Name)
			if m.Preflight {
				err := preflighter(t, cfg).Preflight(context.Background())
				require.ErrorIs(t, err, provider.ErrAuth, "the preflight without %s", perm.Name)
				assert.Contains(t, err.Error(), named)
			}
			if !perm.PreflightOnly {
				var res reconcile.PassResult
				for range max(m.Passes, 1) {
					if res = n.Pass(); res.Err != nil {
						break
					}
				}
				require.Error(t, res.Err, "a pass without %s fails", perm.Name)
				assert.ErrorIs(t, res.Err, reconcile.ErrDaemon, "a missing %s blocks the node", m.Noun)
				assert.ErrorIs(t, res.Err, provider.ErrAuth)
				assert.Contains(t, res.Err.Error(), named, "the error names the missing %s", m.Noun)
				for _, s := range m.Mentions {
					assert.Contains(t, res.Err.Error(), s)
				}
				assert.False(t, res.Converged())
				t.Logf("without %s: %v", perm.Name, res.Err)
			}
			// Nothing lost: the VMs of the pods still there are the same,
			// each recorded; none was made twice.
			if cfg.Lift != nil {
				cfg.Lift()
			}
			now := n.VMs()
			assert.Equal(t, before["uid-0"], now["uid-0"], "the kept pod's VM is untouched")
			assert.Equal(t, before["uid-0"], n.Records()["uid-0"], "and still recorded")
			assert.LessOrEqual(t, len(now), 3)
			if m.Denied != nil && !perm.PreflightOnly {
				m.Denied(t, perm.Name, before, now)
			}

			cfg.Restore()
			if m.Preflight {
				require.NoError(t, preflighter(t, cfg).Preflight(context.Background()))
			}
			n.Converge(fmt.Sprintf("the %s given back", m.Noun))
			if cfg.Lift != nil {
				cfg.Lift()
			}
			after := n.VMs()
			assert.ElementsMatch(t, []string{"uid-0", "uid-2"}, Keys(after))
			assert.Equal(t, before["uid-0"], after["uid-0"], "the kept pod's VM was never replaced")
			assert.Equal(t, after, n.Records())
		})
	}
}
