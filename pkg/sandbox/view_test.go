package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
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

// fakeView is the cluster caa's view as a node reads it: the VMs it shows
// for this node with their state, pod UID and key, matched against the
// records as pkg/cluster's NodeAudit does.
type fakeView struct {
	mu    sync.Mutex
	shown map[string]viewVM // VM id -> what the view says
	none  bool              // no fresh view: the node lists
	asked int
}

type viewVM struct {
	state       provider.State
	podUID, key string
}

func (v *fakeView) set(shown map[string]viewVM) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.shown = shown
}

func (v *fakeView) AuditVMs(_ context.Context, _ provider.Selector, records []ledger.Record) (map[string]provider.State, []string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.asked++
	if v.none {
		return nil, nil, false
	}
	byVM := map[string]ledger.Record{}
	for _, r := range records {
		byVM[r.VMID] = r
	}
	vouched := map[string]provider.State{}
	var unknown []string
	for id, s := range v.shown {
		r, ok := byVM[id]
		switch {
		case !ok:
			unknown = append(unknown, id)
		case s.state.Alive() && s.podUID == r.PodUID && s.key == r.Key:
			vouched[id] = s.state
		}
	}
	return vouched, unknown, true
}

// viewOf is a faithful view of the cloud now (the cluster caa's listing).
func viewOf(r *rig) map[string]viewVM {
	out := map[string]viewVM{}
	for _, in := range r.cloud.Instances() {
		out[in.ID] = viewVM{state: in.State, podUID: in.Tags[provider.TagPodUID], key: in.Tags[provider.TagKey]}
	}
	return out
}

func (r *rig) reads() (lists, gets int64) {
	c := r.cloud.Counters()
	return c[cloud.OpList], c[cloud.OpGet]
}

// The remote hypervisor mode's periodic sync uses the cluster caa's view
// as the informer mode's audit does: past the startup sync, a view that
// vouches for every sandbox's VM spares the listing (an idle node reads
// nothing from the cloud), and what the view cannot vouch for is read by
// id, so a VM that dies is still found, at the first sync after a view
// shows it dead. A view that lies about a live VM costs one read and
// changes nothing.
func TestSyncUsesTheClusterViewAndStillFindsADeadVM(t *testing.T) {
	view := &fakeView{}
	r := newRigWith(t, func(c *Config) { c.Audit = view })
	ctx := context.Background()
	ids := []string{sbID(1), sbID(2), sbID(3)}
	for i, id := range ids {
		name := []string{"web", "db", "cache"}[i]
		r.pod("uid-"+name, name)
		_, err := r.m.CreateVM(ctx, id, shimAnnotations(name), "/run/netns/ns-"+name)
		require.NoError(t, err)
		require.NoError(t, r.m.StartVM(ctx, id))
	}
	sync := func() Report {
		t.Helper()
		r.cloud.ResetCounters()
		rep, err := r.m.Sync(ctx, time.Second)
		require.NoError(t, err)
		return rep
	}

	view.set(viewOf(r))
	rep := sync()
	lists, gets := r.reads()
	assert.Equal(t, int64(1), lists, "the startup sync lists the cloud itself, view or not")
	assert.Zero(t, gets, "every VM listed alive")
	assert.False(t, rep.FromView)

	rep = sync()
	lists, gets = r.reads()
	assert.True(t, rep.FromView)
	assert.Zero(t, lists+gets, "a view vouching for every VM: the idle sync reads nothing")
	assert.ElementsMatch(t, ids, rep.Served)

	// A VM dies. The view, listed before, still shows it alive: this sync
	// cannot know (the view's age bounds that).
	dead := r.sandbox(ids[0]).VMID
	require.NoError(t, r.cloud.Kill(dead))
	rep = sync()
	assert.Empty(t, rep.Lost)
	// The cluster caa's next listing shows it terminated: the node reads it
	// by id and the sandbox is Lost.
	view.set(viewOf(r))
	rep = sync()
	lists, gets = r.reads()
	assert.Zero(t, lists)
	assert.Equal(t, int64(1), gets, "the one VM the view does not vouch for is read by id")
	assert.Equal(t, []string{ids[0]}, rep.Lost)
	assert.Equal(t, ledger.SandboxLost, r.sandbox(ids[0]).Phase)

	// A view that says a live VM is gone is checked, not believed.
	lie := viewOf(r)
	lie[r.sandbox(ids[1]).VMID] = viewVM{state: provider.StateTerminated}
	view.set(lie)
	rep = sync()
	_, gets = r.reads()
	assert.Equal(t, int64(1), gets)
	assert.NotContains(t, rep.Lost, ids[1])
	assert.Equal(t, ledger.SandboxRunning, r.sandbox(ids[1]).Phase)

	// No fresh view: the sync lists, as it always did.
	view.mu.Lock()
	view.none = true
	view.mu.Unlock()
	rep = sync()
	lists, _ = r.reads()
	assert.Equal(t, int64(1), lists)
	assert.False(t, rep.FromView)
}

// VMs a view shows that the ledger does not know are read by id (the
// cloud's own tags decide), at most reconcile.MaxViewReads of them; a view
// naming more makes the node list once instead. A VM the view invents
// (another node's, or none at all) is never taken for this node's orphan.
func TestUnknownVMsInTheViewAreReadNotBelieved(t *testing.T) {
	view := &fakeView{}
	r := newRigWith(t, func(c *Config) { c.Audit = view; c.OrphanGrace = time.Millisecond })
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	_, err = r.m.Sync(ctx, time.Second) // startup: lists
	require.NoError(t, err)

	spec := func(key, node, sandbox string) provider.Spec {
		return provider.Spec{Key: key, Cluster: "c1", Node: node, PodUID: "uid-1", PodNamespace: "team", PodName: "web",
			InstanceType: "small", Image: "podvm-image", ExtraTags: map[string]string{TagSandbox: sandbox}}
	}
	orphan, err := r.prov.Create(ctx, spec(Key(sbID(9), 1), "node-1", sbID(9)))
	require.NoError(t, err)
	other, err := r.prov.Create(ctx, spec(Key(sbID(10), 1), "node-2", sbID(10)))
	require.NoError(t, err)
	shown := viewOf(r)
	shown["i-invented"] = viewVM{state: provider.StateRunning, podUID: "uid-1", key: "k"}
	view.set(shown)

	r.cloud.ResetCounters()
	rep, err := r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	lists, gets := r.reads()
	assert.True(t, rep.FromView)
	assert.Zero(t, lists)
	assert.Equal(t, int64(3), gets, "the three unknown ids are read, each once")
	require.Len(t, rep.Orphans, 1, "only the VM the cloud tags for this node is an orphan")
	assert.Equal(t, orphan.ID, rep.Orphans[0].ID)
	// Seen again past the grace (1 ms), on the cloud's word: collected.
	eventually(t, func() bool {
		rep, err := r.m.Sync(ctx, time.Second)
		require.NoError(t, err)
		return rep.OrphansDeleted == 1
	}, "the orphan is collected")
	for _, in := range r.cloud.Live() {
		assert.NotEqual(t, orphan.ID, in.ID)
	}
	assert.Contains(t, liveIDs(r), other.ID, "another node's VM is never this node's orphan")

	// More unknown VMs than a sync reads by id: one listing instead.
	many := viewOf(r)
	for i := range 17 {
		many[fmt.Sprintf("i-x%d", i)] = viewVM{state: provider.StateRunning}
	}
	view.set(many)
	r.cloud.ResetCounters()
	rep, err = r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	lists, gets = r.reads()
	assert.False(t, rep.FromView)
	assert.Equal(t, int64(1), lists)
	assert.Zero(t, gets)
}

// While an informer-mode pod record may need a delete (its pod gone), the
// sync lists the cloud: a view never takes part in a decision to write.
func TestAnInformerRecordToActOnMakesTheSyncList(t *testing.T) {
	view := &fakeView{}
	r := newRigWith(t, func(c *Config) { c.Audit = view })
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	r.pod("uid-gone", "old") // alive at the startup sync
	vm, err := r.prov.Create(ctx, provider.Spec{Key: "k-old", Cluster: "c1", Node: "node-1", PodUID: "uid-gone", PodNamespace: "team",
		PodName: "old", InstanceType: "small", Image: "podvm-image"})
	require.NoError(t, err)
	_, err = r.led.Put(ledger.Record{Provider: r.prov.Name(), PodUID: "uid-gone", Namespace: "team", Name: "old", VMID: vm.ID, Key: "k-old", Phase: ledger.PhaseRunning})
	require.NoError(t, err)
	_, err = r.m.Sync(ctx, time.Second) // startup
	require.NoError(t, err)
	view.set(viewOf(r))
	r.cloud.ResetCounters()
	rep, err := r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.True(t, rep.FromView, "the pod lives: its record is adopted as it is, the view serves")
	r.pods.remove("uid-gone")
	rep, err = r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	lists, _ := r.reads()
	assert.False(t, rep.FromView)
	assert.Equal(t, int64(1), lists, "the pod is gone: the sync lists before its record's VM is deleted")
	assert.Equal(t, 1, rep.RecordsRetired)
}

func liveIDs(r *rig) []string {
	var out []string
	for _, in := range r.cloud.Live() {
		out = append(out, in.ID)
	}
	return out
}

// newRigWith is newRig with tweak applied to the manager's configuration.
func newRigWith(t *testing.T, tweak func(*Config)) *rig {
	t.Helper()
	r := &rig{t: t, cloud: cloud.New(cloud.Options{IDPrefix: "vm-", KeepTerminated: time.Hour}),
		pods: &fakePods{pods: map[string]*reconcile.Pod{}}, side: newFakeSide(), events: &eventLog{},
		path: filepath.Join(t.TempDir(), "ledger.db"), tweak: tweak}
	r.prov = newMemory(r.cloud)
	r.start()
	return r
}
