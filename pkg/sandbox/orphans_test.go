package sandbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/test/mocks/cloud"
)

func tagged(id, podUID, key, sandbox string, st provider.State) provider.VM {
	tags := map[string]string{provider.TagManagedBy: provider.ManagedByValue, provider.TagCluster: "c1", provider.TagNode: "node-1",
		provider.TagPodUID: podUID, provider.TagKey: key}
	if sandbox != "" {
		tags[TagSandbox] = sandbox
	}
	return provider.VM{ID: id, State: st, Tags: tags}
}

func TestOrphansInHypervisorMode(t *testing.T) {
	sandboxes := []ledger.Sandbox{
		{ID: "sb-run", PodUID: "uid-live", VMID: "vm-run", Key: Key("sb-run", 1), Phase: ledger.SandboxRunning},
		{ID: "sb-crash", PodUID: "uid-live", Key: Key("sb-crash", 1), Phase: ledger.SandboxCreating},
		{ID: "sb-del", PodUID: "uid-gone", Key: Key("sb-del", 1), Phase: ledger.SandboxDeleting},
	}
	records := []ledger.Record{
		{PodUID: "uid-informer", VMID: "vm-informer", Key: "uid-informer-a2", ReplacesVMID: "vm-informer-dead", Phase: ledger.PhaseRunning},
	}
	alive := map[string]bool{"uid-live": true, "uid-informer": true, "uid-plain": true}
	run := provider.StateRunning
	for _, tc := range []struct {
		name   string
		vm     provider.VM
		orphan bool
	}{
		{"a running sandbox's VM", tagged("vm-run", "uid-live", Key("sb-run", 1), "sb-run", run), false},
		{"a VM a crashed create made, found by the record's key", tagged("vm-x", "uid-live", Key("sb-crash", 1), "sb-crash", run), false},
		{"a VM with a recorded sandbox's key and no sandbox tag", tagged("vm-y", "uid-gone", Key("sb-crash", 1), "", run), false},
		{"a Deleting sandbox's VM, its own delete finds it", tagged("vm-d", "uid-gone", Key("sb-del", 1), "sb-del", run), false},
		{"a VM of a sandbox no record holds, its pod alive", tagged("vm-o1", "uid-live", Key("sb-old", 1), "sb-old", run), true},
		{"a VM of a sandbox no record holds, its pod gone", tagged("vm-o2", "uid-gone", Key("sb-old2", 1), "sb-old2", provider.StateStopped), true},
		{"an informer-mode record's VM", tagged("vm-informer", "uid-informer", "uid-informer-a2", "", run), false},
		{"the dead VM an informer-mode record replaces", tagged("vm-informer-dead", "uid-informer", "uid-informer-a1", "", provider.StateStopped), false},
		{"an informer-mode VM superseded by the record's later attempt", tagged("vm-informer-old", "uid-informer", "uid-informer-a1", "", run), true},
		{"an unrecorded informer-mode VM of a live pod", tagged("vm-plain", "uid-plain", "uid-plain-a1", "", run), false},
		{"an unrecorded informer-mode VM of a gone pod", tagged("vm-plain-gone", "uid-nobody", "uid-nobody-a1", "", run), true},
		{"a terminated VM", tagged("vm-t", "uid-gone", Key("sb-t", 1), "sb-t", provider.StateTerminated), false},
		{"a VM without a pod UID", tagged("vm-nouid", "", "k", "sb-n", run), false},
		{"a VM without the managed-by marker", func() provider.VM {
			vm := tagged("vm-foreign", "uid-gone", "k", "sb-f", run)
			delete(vm.Tags, provider.TagManagedBy)
			return vm
		}(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Orphans([]provider.VM{tc.vm}, sandboxes, records, alive)
			if tc.orphan {
				assert.Len(t, got, 1)
			} else {
				assert.Empty(t, got)
			}
		})
	}
}

// clock is a settable time for the manager (the orphan grace, the
// informer executor).
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func (r *rig) useClock() *clock {
	c := &clock{t: time.Now()}
	r.m.cfg.Now, r.m.exec.Now = c.now, c.now
	return c
}

// A VM tagged for this node with a sandbox id no record holds is deleted
// only once caa has seen it as an orphan in listings the grace apart; a
// live sandbox's VM, another node's VM and the VM of a create cut short are
// never touched, however long they stay.
func TestOrphanIsCollectedOnlyAfterItsGraceAndNeverALiveSandboxsVM(t *testing.T) {
	r := newRig(t)
	clk := r.useClock()
	ctx := context.Background()
	r.pod("uid-1", "web")
	r.pod("uid-2", "api")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns-1")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	live := r.sandbox(sbA).VMID

	// A create cut short: the record has the key, the VM exists, its
	// answer was never recorded.
	crashed := sbID(7)
	_, err = r.m.CreateVM(ctx, crashed, shimAnnotations("api"), "/run/netns/ns-2")
	require.NoError(t, err)
	s := r.sandbox(crashed)
	s.Phase, s.Attempt, s.Key = ledger.SandboxCreating, 1, Key(crashed, 1)
	_, err = r.led.PutSandbox(s)
	require.NoError(t, err)
	spec := func(key, node, sandbox string) provider.Spec {
		return provider.Spec{Key: key, Cluster: "c1", Node: node, PodUID: "uid-1", PodNamespace: "team", PodName: "web",
			InstanceType: "small", Image: "podvm-image", ExtraTags: map[string]string{TagSandbox: sandbox}}
	}
	inFlight, err := r.prov.Create(ctx, spec(s.Key, "node-1", crashed))
	require.NoError(t, err)
	// The orphan: a sandbox of this node no record holds (its pod alive).
	orphan, err := r.prov.Create(ctx, spec(Key(sbID(9), 1), "node-1", sbID(9)))
	require.NoError(t, err)
	// Another node's VM: not this caa's to judge.
	other, err := r.prov.Create(ctx, spec(Key(sbID(10), 1), "node-2", sbID(10)))
	require.NoError(t, err)
	r.cloud.ResetCounters()

	syncNow := func() Report {
		t.Helper()
		rep, err := r.m.Sync(ctx, time.Second)
		require.NoError(t, err)
		return rep
	}
	rep := syncNow()
	require.Len(t, rep.Orphans, 1, "the orphan waits out its grace")
	assert.Equal(t, orphan.ID, rep.Orphans[0].ID)
	assert.Zero(t, r.writes(), "first sighting: no delete")

	clk.add(orphanGrace - time.Second)
	rep = syncNow()
	assert.Zero(t, r.writes(), "seen again inside the grace: no delete")
	assert.Zero(t, rep.OrphansDeleted)

	clk.add(time.Second)
	rep = syncNow()
	assert.Equal(t, 1, rep.OrphansDeleted)
	assert.Equal(t, int64(1), r.cloud.Counters()[cloud.OpDelete], "one delete, the orphan's")
	in, err := r.cloud.Get(orphan.ID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateTerminated, in.State)

	for range 3 {
		clk.add(2 * orphanGrace)
		rep = syncNow()
		assert.Empty(t, rep.Orphans)
	}
	for _, id := range []string{live, inFlight.ID, other.ID} {
		in, err := r.cloud.Get(id)
		require.NoError(t, err)
		assert.Equal(t, provider.StateRunning, in.State, "VM %s is never collected", id)
	}
	assert.Equal(t, int64(1), r.cloud.Counters()[cloud.OpDelete])
}

// An orphan is seen twice by this process before it is deleted: a restart
// starts its grace again (caa's own clock, never the cloud's).
func TestOrphanGraceStartsAgainAfterARestart(t *testing.T) {
	r := newRig(t)
	clk := r.useClock()
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.prov.Create(ctx, provider.Spec{Key: Key(sbID(9), 1), Cluster: "c1", Node: "node-1", PodUID: "uid-1", PodNamespace: "team",
		PodName: "web", InstanceType: "small", Image: "podvm-image", ExtraTags: map[string]string{TagSandbox: sbID(9)}})
	require.NoError(t, err)
	_, err = r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	r.crash()
	r.start()
	clk2 := r.useClock()
	clk2.t = clk.now().Add(orphanGrace)
	rep, err := r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.Zero(t, rep.OrphansDeleted, "the new process has seen it once")
	assert.Len(t, rep.Orphans, 1)
	assert.Len(t, r.live(), 1)
}

// A node switched from the informer mode keeps its pod records working:
// their VMs are adopted with no cloud write, never taken for orphans and
// never recreated; each goes only when the synced pod cache shows its pod
// gone, by the informer mode's own delete.
func TestInformerModeRecordsSurviveTheSwitchToHypervisorMode(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	cfg := reconcile.Config{Spec: r.m.cfg.Spec, Provider: r.prov.Name()}
	exec := &reconcile.Executor{Ledger: r.led, Provider: r.prov, Cluster: "c1", Node: "node-1"}
	for _, uid := range []string{"uid-a", "uid-b", "uid-c"} {
		p := r.pod(uid, "old-"+uid)
		in := reconcile.Input{Pod: p, CacheSynced: true, Now: time.Now()}
		a := reconcile.Decide(in, cfg)
		require.Equal(t, reconcile.KindCreate, a.Kind)
		_, err := exec.Apply(ctx, in, a)
		require.NoError(t, err)
	}
	require.Len(t, r.live(), 3)
	recA, err := r.led.Get("uid-a")
	require.NoError(t, err)
	recB, err := r.led.Get("uid-b")
	require.NoError(t, err)
	recC, err := r.led.Get("uid-c")
	require.NoError(t, err)

	// The restart in the remote hypervisor mode.
	r.crash()
	r.start()
	clk := r.useClock()
	r.cloud.ResetCounters()
	rep, err := r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.True(t, rep.Ready())
	assert.Zero(t, r.writes(), "adopted with no cloud write")
	assert.Equal(t, 3, rep.Records)
	assert.Empty(t, rep.Orphans, "an informer-mode record's VM is no orphan")

	// Its VM dies: only StartVM makes VMs in this mode, so no recreate.
	require.NoError(t, r.cloud.Kill(recB.VMID))
	for range 3 {
		clk.add(2 * orphanGrace)
		rep, err = r.m.Sync(ctx, time.Second)
		require.NoError(t, err)
	}
	assert.Zero(t, r.writes(), "nothing created or deleted while the pods live")
	assert.Len(t, r.live(), 2)
	_, err = r.led.Get("uid-b")
	require.NoError(t, err, "the record stays while its pod lives")

	// An unsynced cache proves nothing: no delete.
	r.pods.remove("uid-a")
	r.pods.setSynced(false)
	rep, err = r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.Zero(t, r.writes(), "no delete on an unsynced pod cache")
	_, err = r.led.Get("uid-a")
	require.NoError(t, err)

	// Synced, the pod gone: its VM is deleted and its record goes.
	r.pods.setSynced(true)
	rep, err = r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.RecordsRetired)
	assert.Equal(t, int64(1), r.cloud.Counters()[cloud.OpDelete])
	in, err := r.cloud.Get(recA.VMID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateTerminated, in.State)
	_, err = r.led.Get("uid-a")
	require.ErrorIs(t, err, ledger.ErrNotFound)
	hist, err := r.led.History("uid-a")
	require.NoError(t, err)
	assert.Equal(t, ledger.PhaseDeleting, hist[len(hist)-2].Record.Phase, "Deleting was durable before the delete")

	// A terminal pod is positive evidence too.
	r.pod("uid-c", "old-uid-c").Terminal = true
	_, err = r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	in, err = r.cloud.Get(recC.VMID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateTerminated, in.State)
	assert.Len(t, r.live(), 0)
}

// A pod record that does not decode may own a VM: the orphan collection
// stands down (no delete) while the sandboxes are still served and the
// sync reports no error (readiness is not held by an unrelated record).
func TestUndecodablePodRecordStopsTheOrphanCollectionOnly(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns-1")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	_, err = r.prov.Create(ctx, provider.Spec{Key: Key(sbID(9), 1), Cluster: "c1", Node: "node-1", PodUID: "uid-gone", PodNamespace: "team",
		PodName: "gone", InstanceType: "small", Image: "podvm-image", ExtraTags: map[string]string{TagSandbox: sbID(9)}})
	require.NoError(t, err)
	r.crash()
	db, err := bolt.Open(r.path, 0o600, &bolt.Options{Timeout: time.Second})
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("records")).Put([]byte("uid-bad"), []byte{0x7f, 1}) }))
	require.NoError(t, db.Close())
	r.start()
	clk := r.useClock()
	r.cloud.ResetCounters()

	for range 3 {
		rep, err := r.m.Sync(ctx, time.Second)
		require.NoError(t, err)
		assert.Equal(t, []string{sbA}, rep.Served)
		assert.Empty(t, rep.Orphans)
		clk.add(2 * orphanGrace)
	}
	assert.Zero(t, r.writes(), "nothing deleted while a record cannot be read")
	assert.Len(t, r.live(), 2)
}
