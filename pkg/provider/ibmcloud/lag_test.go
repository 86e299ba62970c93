package ibmcloud_test

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"sync"
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

// testClock is a hand-moved clock shared by the fake cloud, the ledger
// and the reconciler.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

type noEvents struct{}

func (noEvents) Event(*reconcile.Pod, bool, string, string) {}

// lagRig is the real reconciler, with a real ledger file, driving the
// real IBM Cloud provider against the fake whose search index lags.
type lagRig struct {
	clock *testClock
	cloud *cloud.Cloud
	p     *ibmcloud.Provider
	dir   string
}

const (
	lagNode = "node-lag"
	// searchLag is longer than ConfirmMissing, so that a VM the index
	// does not show yet outlives the reconciler's confirmation window.
	searchLag = 5 * time.Minute
)

func newLagRig(t *testing.T) lagRig {
	t.Helper()
	clk := &testClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	opts := conformance.Options(nil)
	opts.Now = clk.Now
	c := cloud.New(opts)
	srv := httptest.NewServer(vpcfake.NewServer(c, vpcfake.WithAPIKey(testAPIKey), vpcfake.WithSearchLag(searchLag)))
	t.Cleanup(srv.Close)
	t.Setenv(ibmcloud.EnvAPIKey, testAPIKey)
	p, err := ibmcloud.New(context.Background(), testConfig(srv.URL))
	require.NoError(t, err)
	return lagRig{clock: clk, cloud: c, p: p, dir: t.TempDir()}
}

// reconciler opens the ledger file name (a new one is an empty ledger, as
// after the node lost its disk) and returns a fresh reconciler on it.
func (r lagRig) reconciler(t *testing.T, name string) *reconcile.Reconciler {
	t.Helper()
	l, err := ledger.Open(ledger.Options{Path: filepath.Join(r.dir, name), Node: lagNode, Cluster: conformance.Cluster,
		Timeout: time.Second, Now: r.clock.Now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ex := &reconcile.Executor{Ledger: l, Provider: r.p, Events: noEvents{}, Cluster: conformance.Cluster, Node: lagNode,
		RetryBase: time.Second, Now: r.clock.Now}
	cfg := reconcile.Config{
		Spec: provider.SpecConfig{DefaultType: conformance.TypeSmall, DefaultImage: conformance.ImageGood,
			Types: []provider.InstanceType{{Name: conformance.TypeSmall, VCPUs: 2, MemoryMiB: 8192}}},
		ConfirmMissing: 30 * time.Second,
		Provider:       "ibmcloud",
	}
	return &reconcile.Reconciler{Exec: ex, Config: cfg, Concurrency: 4, OrphanGrace: time.Minute, Now: r.clock.Now}
}

// listed is what the provider's listing shows now.
func (r lagRig) listed(t *testing.T) []provider.VM {
	t.Helper()
	vms, err := r.p.List(context.Background(), provider.Selector{Cluster: conformance.Cluster, Node: lagNode})
	require.NoError(t, err)
	return vms
}

// TestLaggingSearchIndexNeverDuplicatesNorDeletes drives the reconciler
// through a create, passes while the new VMs are missing from the search
// index (past the reconciler's ConfirmMissing, and again from an empty
// ledger), and passes while a deleted VM is still in the index. Only the
// first create of each pod and the delete of the gone pod's VM reach the
// cloud.
func TestLaggingSearchIndexNeverDuplicatesNorDeletes(t *testing.T) {
	r := newLagRig(t)
	ctx := context.Background()
	rec := r.reconciler(t, "ledger.db")
	pods := []*reconcile.Pod{
		{UID: "uid-a", Namespace: "ns", Name: "a", RuntimeClass: "kata-remote"},
		{UID: "uid-b", Namespace: "ns", Name: "b", RuntimeClass: "kata-remote"},
	}
	// creates counts the VMs made, not the create calls: a refused create
	// (a name taken) makes none.
	writes := func() (creates, deletes int64) {
		c := r.cloud.Counters()
		return c["created"], c[cloud.OpDelete]
	}

	res := rec.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	assert.Equal(t, 2, res.Actions[reconcile.KindCreate])
	require.Len(t, r.cloud.Live(), 2)
	creates, deletes := writes()
	require.Equal(t, [2]int64{2, 0}, [2]int64{creates, deletes})
	assert.Empty(t, r.listed(t), "the index does not show the new VMs yet")

	// Passes past ConfirmMissing, the new VMs still missing from the
	// index: each is confirmed by id, nothing is recreated.
	for range 3 {
		r.clock.Advance(40 * time.Second)
		res = rec.Pass(ctx, pods, true)
		require.NoError(t, res.Err)
		assert.Zero(t, res.Actions[reconcile.KindCreate]+res.Actions[reconcile.KindDelete])
		assert.Zero(t, res.CloudWrites)
		assert.True(t, res.Converged(), "pending: %v", res.Pending)
	}
	require.Empty(t, r.listed(t), "still inside the lag")

	// The ledger is lost while the index lags: the pods' creates run again
	// with the same keys. An empty ledger cannot say the keys were sent
	// (Spec.MaybeSent is false), so each create goes to VPC, which
	// refuses the name already taken; the create then finds that VM by
	// name through VPC, not the index, and adopts it. One refused create
	// per pod is what losing the ledger costs.
	fresh := r.reconciler(t, "empty-ledger.db")
	before := r.cloud.Counters()[cloud.OpCreate]
	res = fresh.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	assert.True(t, res.Converged(), "pending: %v", res.Pending)
	assert.Len(t, r.cloud.Live(), 2, "no VM was made twice")
	assert.Equal(t, [2]int64{2, 0}, func() [2]int64 { c, d := writes(); return [2]int64{c, d} }())
	assert.Equal(t, int64(2), r.cloud.Counters()[cloud.OpCreate]-before, "one create call per pod, refused for its taken name")

	// Past the lag the index shows both.
	r.clock.Advance(searchLag)
	require.Len(t, r.listed(t), 2)
	res = fresh.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	assert.Zero(t, res.CloudWrites)

	// Pod b is gone: its VM is deleted once, on the pod's absence.
	res = fresh.Pass(ctx, pods[:1], true)
	require.NoError(t, res.Err)
	assert.Equal(t, 1, res.Actions[reconcile.KindDelete])
	require.Len(t, r.cloud.Live(), 1)
	creates, deletes = writes()
	require.Equal(t, [2]int64{2, 1}, [2]int64{creates, deletes})

	// The index still holds b's VM for a while: the provider drops it on
	// VPC's 404, and passes through the lag write nothing.
	for range 3 {
		r.clock.Advance(40 * time.Second)
		vms := r.listed(t)
		require.Len(t, vms, 1, "the deleted VM is not listed")
		assert.Equal(t, "uid-a", vms[0].Owner().PodUID)
		res = fresh.Pass(ctx, pods[:1], true)
		require.NoError(t, res.Err)
		assert.Zero(t, res.CloudWrites)
		assert.True(t, res.Converged())
	}
	creates, deletes = writes()
	assert.Equal(t, [2]int64{2, 1}, [2]int64{creates, deletes}, "no create nor delete on lagging evidence")
	assert.Len(t, r.cloud.Live(), 1)
}
