package azure_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
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

// These tests hold the provider, and caa's reconciler on top of it, to
// what the real Azure does where the fake once agreed with caa and Azure
// did not (test/mocks/azure/fidelity.go names the sources).

const (
	fidSize  = "Standard_D2as_v5"
	fidImage = "Canonical:ubuntu-24_04-lts:server:latest"
	fidNode  = "node-f"
)

// calls records the requests that reach the fake, as "METHOD last-segment"
// for VMs and NICs.
type calls struct {
	mu  sync.Mutex
	log []string
}

func (c *calls) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, kind := range []string{"/virtualMachines/", "/networkInterfaces/"} {
			if strings.Contains(r.URL.Path, kind) {
				c.mu.Lock()
				c.log = append(c.log, r.Method+" "+strings.Trim(kind, "/")+" "+r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:])
				c.mu.Unlock()
			}
		}
		next.ServeHTTP(w, r)
	})
}

// take returns the calls since the last take whose text starts with prefix.
func (c *calls) take(prefix string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.log {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	c.log = nil
	return out
}

// events records the events the reconciler raises.
type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) Event(p *reconcile.Pod, warning bool, reason, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, p.UID+" "+reason+" "+msg)
}

func (e *events) with(reason string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, g := range e.got {
		if strings.Contains(g, " "+reason+" ") {
			out = append(out, g)
		}
	}
	return out
}

// fidRig is the real reconciler on a real ledger file, with the real Azure
// provider against the fake ARM made with the given options, all on one
// test clock.
type fidRig struct {
	t      *testing.T
	clock  *testClock
	cloud  *cloud.Cloud
	prov   *azure.Provider
	rec    *reconcile.Reconciler
	ledger *ledger.Ledger
	calls  *calls
	events *events
	url    string
	ctx    context.Context
}

func newFidRig(t *testing.T, edit func(*azure.Config), opts ...armfake.Option) *fidRig {
	t.Helper()
	clock := newTestClock()
	c := cloud.New(cloud.Options{Images: []string{fidImage}, Types: []string{fidSize}, Now: clock.Now, PageSize: 50})
	cl := &calls{}
	srv := httptest.NewServer(cl.wrap(armfake.NewServer(c, append([]armfake.Option{armfake.WithBearerToken(testToken),
		armfake.WithClock(clock.Now)}, opts...)...)))
	t.Cleanup(srv.Close)
	cfg := testConfig(srv.URL)
	if edit != nil {
		edit(&cfg)
	}
	p, err := azure.New(context.Background(), cfg, azure.WithCredential(staticToken(testToken)), azure.WithClock(clock.Now))
	require.NoError(t, err)
	l, err := ledger.Open(ledger.Options{Path: filepath.Join(t.TempDir(), "ledger.db"), Node: fidNode, Cluster: "cluster-f",
		Timeout: time.Second, Now: clock.Now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ev := &events{}
	ex := &reconcile.Executor{Ledger: l, Provider: p, Events: ev, Cluster: "cluster-f", Node: fidNode,
		RetryBase: time.Second, Now: clock.Now}
	rcfg := reconcile.Config{
		Spec:           provider.SpecConfig{DefaultType: fidSize, DefaultImage: fidImage},
		ConfirmMissing: 30 * time.Second, Provider: azure.ProviderName,
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return &fidRig{t: t, clock: clock, cloud: c, prov: p, ledger: l, calls: cl, events: ev, url: srv.URL, ctx: ctx,
		rec: &reconcile.Reconciler{Exec: ex, Config: rcfg, Concurrency: 4, OrphanGrace: 5 * time.Minute, Now: clock.Now}}
}

func (r *fidRig) pass(pods []*reconcile.Pod) reconcile.PassResult {
	r.t.Helper()
	res := r.rec.Pass(r.ctx, pods, true)
	require.NoError(r.t, res.Err)
	return res
}

func fidPods(uids ...string) []*reconcile.Pod {
	var pods []*reconcile.Pod
	for _, uid := range uids {
		pods = append(pods, &reconcile.Pod{UID: uid, Namespace: "team", Name: "pod-" + uid, RuntimeClass: "kata-remote"})
	}
	return pods
}

func fidSpec(key string) provider.Spec {
	return provider.Spec{Key: key, Cluster: "cluster-f", Node: fidNode, PodUID: "uid-" + key, PodNamespace: "team", PodName: "p-" + key,
		InstanceType: fidSize, Image: fidImage}
}

// TestAVMWhoseExtensionFailedIsKeptAndReported: every new VM gets an
// extension that fails (as one Azure Policy pushes does), so each VM runs
// with provisioning state Failed. The provider reads it as running and
// degraded; the reconciler keeps it through passes (no second VM, no
// delete), reports the pod as degraded in every pass and raises one
// warning event. Before, Failed read as dead and every pass replaced the
// VM, whose replacement failed the same way.
func TestAVMWhoseExtensionFailedIsKeptAndReported(t *testing.T) {
	r := newFidRig(t, nil, armfake.WithFailingPolicyExtension())
	pods := fidPods("u1")
	r.pass(pods)
	require.Len(t, r.cloud.Live(), 1)
	r.calls.take("")

	var res reconcile.PassResult
	for range 3 {
		r.clock.Advance(time.Minute)
		res = r.pass(pods)
	}
	assert.Empty(t, r.calls.take("PUT"), "no VM or NIC written after the first pass")
	assert.Empty(t, r.calls.take("DELETE"), "no VM deleted")
	require.Len(t, r.cloud.Live(), 1, "one VM, the first")
	require.Len(t, res.Degraded, 1)
	assert.Equal(t, reconcile.ReasonVMDegraded, res.Degraded[0].Reason)
	assert.Contains(t, res.Degraded[0].Message, "provisioning state Failed")
	assert.Empty(t, res.Pending, "a degraded VM holds no pod pending")
	assert.Len(t, r.events.with(reconcile.EventVMDegraded), 1, "one event per degraded VM")

	rec, err := r.ledger.Get("u1")
	require.NoError(t, err)
	vm, err := r.prov.Get(r.ctx, rec.VMID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, vm.State)
	assert.Contains(t, vm.Degraded, armfake.ExtensionFailedCode)
	listed, err := r.prov.List(r.ctx, provider.Selector{Cluster: "cluster-f", Node: fidNode})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	assert.Equal(t, provider.StateRunning, listed[0].State)
	assert.NotEmpty(t, listed[0].Degraded)

	// A Failed VM that is not running is still dead, and replaced.
	require.NoError(t, r.cloud.Fail(r.cloud.Live()[0].ID))
	r.clock.Advance(time.Minute)
	r.pass(pods)
	assert.NotEmpty(t, r.calls.take("PUT virtualMachines"), "a failed, deallocated VM is replaced")
}

// TestIDsAndSizesEchoedInAnotherCase: the compute API echoes the resource
// group of a VM id in upper case and the size's version suffix in another
// case. A retried create of the same key finds its VM (before, the size's
// case made it a conflict), and passes over a recorded VM read no VM by
// itself and adopt nothing (before, the listing's id and the record's
// differed in case, so each pass read every VM again).
func TestIDsAndSizesEchoedInAnotherCase(t *testing.T) {
	r := newFidRig(t, nil, armfake.WithEchoedCase())
	first, err := r.prov.Create(r.ctx, fidSpec("k1"))
	require.NoError(t, err)
	assert.NotEqual(t, fidSize, first.InstanceType, "the fake echoes another case")
	again, err := r.prov.Create(r.ctx, fidSpec("k1"))
	require.NoError(t, err, "the same key's VM, whatever case Azure echoes")
	assert.True(t, provider.SameVM(first.ID, again.ID))

	pods := fidPods("u1", "u2")
	r.pass(pods)
	r.clock.Advance(time.Minute)
	r.pass(pods)
	r.calls.take("")
	r.clock.Advance(time.Minute)
	res := r.pass(pods)
	assert.Empty(t, r.calls.take("GET virtualMachines"), "the listing showed every recorded VM: no read of its own")
	assert.Zero(t, res.Actions[reconcile.KindAdopt], "nothing to adopt")
	assert.Zero(t, res.CloudWrites)
	for _, uid := range []string{"u1", "u2"} {
		rec, err := r.ledger.Get(uid)
		require.NoError(t, err)
		assert.Equal(t, ledger.PhaseRunning, rec.Phase)
	}
}

// TestACreateLongerThanTheWriteTimeoutIsNoFailure: the fake's create takes
// longer than the write timeout. Create returns the VM as Pending without
// an error; the reconciler records it, raises no CreateFailed event and
// writes nothing more; once the create is done the VM reads Running.
// Before, the create failed with a deadline, the pod backed off, and a
// retry found the VM by name.
func TestACreateLongerThanTheWriteTimeoutIsNoFailure(t *testing.T) {
	const createTakes = 3 * time.Minute // on the fake's clock
	r := newFidRig(t, func(c *azure.Config) { c.WriteTimeout = 300 * time.Millisecond },
		armfake.WithCreateDuration(createTakes))
	vm, err := r.prov.Create(r.ctx, fidSpec("k1"))
	require.NoError(t, err, "a create still running at the write timeout is not a failure")
	assert.Equal(t, provider.StatePending, vm.State)
	got, err := r.prov.Get(r.ctx, vm.ID)
	require.NoError(t, err)
	assert.Equal(t, provider.StatePending, got.State, "still being created")
	r.clock.Advance(createTakes)
	got, err = r.prov.Get(r.ctx, vm.ID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, got.State)

	// Through the reconciler: one create, recorded, no failure reported.
	pods := fidPods("u1")
	r.calls.take("")
	r.pass(pods)
	assert.Len(t, r.calls.take("PUT virtualMachines"), 1)
	assert.Empty(t, r.events.with(reconcile.EventCreateFailed))
	rec, err := r.ledger.Get("u1")
	require.NoError(t, err)
	assert.Equal(t, ledger.PhaseRunning, rec.Phase)
	assert.NotEmpty(t, rec.VMID)
	r.clock.Advance(createTakes)
	r.pass(pods)
	assert.Empty(t, r.calls.take("PUT"), "no second create")

	// The caller's own deadline is still a failure: nothing is made up.
	ctx, cancel := context.WithTimeout(r.ctx, 200*time.Millisecond)
	defer cancel()
	r2 := newFidRig(t, func(c *azure.Config) { c.WriteTimeout = time.Minute }, armfake.WithCreateDuration(createTakes))
	_, err = r2.prov.Create(ctx, fidSpec("k2"))
	require.Error(t, err)
}

// TestALeftoverNICIsCollected: a create fails for capacity, and Azure keeps
// the VM's NIC reserved for the failed VM, refusing its delete
// (NicReservedForAnotherVm). The pod goes away. The NIC, tagged as its VM
// would have been, is collected by the orphan rule: seen in two listings a
// grace period apart, and its delete, refused while the reservation lasts,
// is tried again at a later pass. Before, it stayed for ever.
func TestALeftoverNICIsCollected(t *testing.T) {
	const reservation = 8 * time.Minute // longer than the grace, to see a refusal
	r := newFidRig(t, nil, armfake.WithNICReservation(reservation))
	r.cloud.SetFaults(cloud.Faults{CapacityFailures: 1})
	r.pass(fidPods("u1"))
	require.Empty(t, r.cloud.Live())
	nics := r.cloud.Resources("Microsoft.Network/networkInterfaces")
	require.Len(t, nics, 1, "the refused create's NIC stays: its delete was refused")
	nic := nics[0]
	for k, v := range map[string]string{provider.TagCluster: "cluster-f", provider.TagNode: fidNode, provider.TagPodUID: "u1",
		provider.TagManagedBy: provider.ManagedByValue} {
		assert.Equal(t, v, nic.Tags[k], "the NIC is tagged as its VM: %s", k)
	}

	// The pod is gone; the NIC is a leftover, first seen now.
	r.clock.Advance(time.Minute)
	res := r.pass(nil)
	require.Len(t, res.Orphans, 1)
	assert.True(t, strings.EqualFold(res.Orphans[0].ID, nic.ID), "%s pending", res.Orphans[0].ID)
	r.calls.take("")

	// Past the grace, still reserved: the delete is refused and retried.
	r.clock.Advance(5 * time.Minute)
	res = r.pass(nil)
	assert.Len(t, r.calls.take("DELETE networkInterfaces"), 1)
	require.Len(t, r.cloud.Resources("Microsoft.Network/networkInterfaces"), 1)
	assert.Len(t, res.Orphans, 1, "still pending after the refusal")

	// Past the reservation: deleted.
	r.clock.Advance(reservation)
	res = r.pass(nil)
	assert.Empty(t, r.cloud.Resources("Microsoft.Network/networkInterfaces"), "the leftover NIC is deleted")
	assert.Equal(t, 1, res.OrphansDeleted)
	assert.Empty(t, r.calls.take("DELETE virtualMachines"), "no VM delete")
}

// TestANICInUseIsNeverALeftover: a live VM's NIC, and the NIC of a create
// whose VM exists, are never collected, however long they are seen.
func TestANICInUseIsNeverALeftover(t *testing.T) {
	r := newFidRig(t, nil)
	pods := fidPods("u1")
	r.pass(pods)
	for range 3 {
		r.clock.Advance(6 * time.Minute)
		res := r.pass(pods)
		assert.Empty(t, res.Orphans)
	}
	assert.Empty(t, r.calls.take("DELETE"))
	assert.Len(t, r.cloud.Resources("Microsoft.Network/networkInterfaces"), 1)
	assert.Empty(t, r.prov.Leftovers(provider.Selector{Cluster: "cluster-f", Node: fidNode}))
}
