package azure_test

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/caa-project/caa/test/conformance"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// vmWrites counts the VM writes (PUT, DELETE) that reach the fake.
type vmWrites struct {
	mu  sync.Mutex
	log []string
}

func (v *vmWrites) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.Method == http.MethodPut || r.Method == http.MethodDelete) && strings.Contains(r.URL.Path, "/virtualMachines/") {
			v.mu.Lock()
			v.log = append(v.log, r.Method+" "+r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:])
			v.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

// take returns the writes since the last take.
func (v *vmWrites) take() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := v.log
	v.log = nil
	return out
}

type noEvents struct{}

func (noEvents) Event(*reconcile.Pod, bool, string, string) {}

// lagRig is the real reconciler, on a real ledger file, with the real Azure
// provider against the fake ARM whose Resource Graph index lags.
type lagRig struct {
	t      *testing.T
	clock  *testClock
	cloud  *cloud.Cloud
	rec    *reconcile.Reconciler
	ledger *ledger.Ledger
	writes *vmWrites
	url    string
	ctx    context.Context
}

const searchLag = 2 * time.Minute

func newLagRig(t *testing.T) *lagRig {
	t.Helper()
	clock := newTestClock()
	c := cloud.New(cloud.Options{Images: []string{conformance.ImageGood}, Types: []string{conformance.TypeSmall}, Now: clock.Now, PageSize: 50})
	writes := &vmWrites{}
	srv := httptest.NewServer(writes.wrap(armfake.NewServer(c, armfake.WithBearerToken(testToken),
		armfake.WithSearchLag(searchLag), armfake.WithClock(clock.Now))))
	t.Cleanup(srv.Close)
	p, err := azure.New(context.Background(), testConfig(srv.URL), azure.WithCredential(staticToken(testToken)), azure.WithClock(clock.Now))
	require.NoError(t, err)
	l, err := ledger.Open(ledger.Options{Path: filepath.Join(t.TempDir(), "ledger.db"), Node: "node-a", Cluster: conformance.Cluster,
		Timeout: time.Second, Now: clock.Now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ex := &reconcile.Executor{Ledger: l, Provider: p, Events: noEvents{}, Cluster: conformance.Cluster, Node: "node-a",
		RetryBase: time.Second, Now: clock.Now}
	cfg := reconcile.Config{
		Spec:           provider.SpecConfig{DefaultType: conformance.TypeSmall, DefaultImage: conformance.ImageGood},
		ConfirmMissing: 30 * time.Second, Provider: azure.ProviderName,
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return &lagRig{t: t, clock: clock, cloud: c, ledger: l, writes: writes, url: srv.URL, ctx: ctx,
		rec: &reconcile.Reconciler{Exec: ex, Config: cfg, Concurrency: 4, OrphanGrace: 5 * time.Minute, Now: clock.Now}}
}

func (r *lagRig) pass(pods []*reconcile.Pod) reconcile.PassResult {
	r.t.Helper()
	res := r.rec.Pass(r.ctx, pods, true)
	require.NoError(r.t, res.Err)
	return res
}

// touch makes the fake serve a request now, so that a change made on the
// core directly enters the lagging index at this moment.
func (r *lagRig) touch() {
	r.t.Helper()
	resp, err := http.Get(r.url + cloud.ControlPrefix + "counters")
	require.NoError(r.t, err)
	require.NoError(r.t, resp.Body.Close())
}

// indexed is what a Resource Graph query shows for the node right now.
func (r *lagRig) indexed() map[string]bool {
	r.t.Helper()
	raw := r.query()
	out := map[string]bool{}
	for _, name := range raw {
		out[name] = true
	}
	return out
}

func (r *lagRig) query() []string {
	r.t.Helper()
	body := fmt.Sprintf(`{"subscriptions":[%q],"query":"Resources | where type =~ 'microsoft.compute/virtualmachines' | where tags['caa-node'] == 'node-a' | project name"}`,
		armfake.DefaultSubscription)
	req, err := http.NewRequest(http.MethodPost, r.url+armfake.GraphPath+"?api-version="+armfake.GraphAPIVersion, strings.NewReader(body))
	require.NoError(r.t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(r.t, err)
	defer resp.Body.Close()
	require.Equal(r.t, http.StatusOK, resp.StatusCode)
	var out struct {
		Data []struct {
			Name string `json:"name"`
		} `json:"data"`
	}
	require.NoError(r.t, decodeJSON(resp, &out))
	names := make([]string, 0, len(out.Data))
	for _, d := range out.Data {
		names = append(names, d.Name)
	}
	return names
}

func (r *lagRig) live() map[string]string {
	out := map[string]string{}
	for _, in := range r.cloud.Live() {
		out[in.Tags[provider.TagPodUID]] = in.Name
	}
	return out
}

func (r *lagRig) record(uid string) ledger.Record {
	r.t.Helper()
	rec, err := r.ledger.Get(uid)
	require.NoError(r.t, err)
	return rec
}

func lagPods(uids ...string) []*reconcile.Pod {
	var pods []*reconcile.Pod
	for _, uid := range uids {
		pods = append(pods, &reconcile.Pod{UID: uid, Namespace: "team", Name: "pod-" + uid, RuntimeClass: "kata-remote"})
	}
	return pods
}

// TestLaggingSearchIndexNeverDuplicatesOrDeletes drives the reconciler
// through the index's lag in both directions: VMs just created are absent
// from the listing, a deleted VM is still in it, a VM killed behind caa's
// back still shows running, and a failed VM still shows failed after ARM
// has a live VM under that id. No VM is duplicated, and no pod's VM is
// deleted or replaced on the index's word alone.
func TestLaggingSearchIndexNeverDuplicatesOrDeletes(t *testing.T) {
	r := newLagRig(t)
	pods := lagPods("p0", "p1", "p2")

	// 1. Creates: the index shows nothing yet, the creates go by key.
	r.pass(pods)
	assert.Len(t, r.take(), 3, "three creates")
	vms := r.live()
	require.Len(t, vms, 3)

	// 2. A VM made for a new pod's key by an earlier caa that died before
	// recording it, and the pod: neither the VM nor the three above are in
	// the index yet. The recorded VMs are read by id, the new pod's create
	// finds its VM by name: nothing is made twice.
	r.clock.Advance(5 * time.Second)
	p, err := azure.New(r.ctx, testConfig(r.url), azure.WithCredential(staticToken(testToken)))
	require.NoError(t, err)
	early, err := p.Create(r.ctx, provider.Spec{Key: reconcile.Key("p3", 1), Cluster: conformance.Cluster, Node: "node-a",
		PodUID: "p3", PodNamespace: "team", PodName: "pod-p3", InstanceType: conformance.TypeSmall, Image: conformance.ImageGood})
	require.NoError(t, err)
	r.writes.take()
	pods = lagPods("p0", "p1", "p2", "p3")
	for _, at := range []time.Duration{5 * time.Second, 60 * time.Second} { // before and past --confirm-missing
		r.clock.Advance(at)
		assert.Empty(t, r.indexed(), "the index lags: no VM of the node is in it yet")
		res := r.pass(pods)
		assert.True(t, res.Converged(), "pending: %v", res.Pending)
		assert.Empty(t, r.take(), "no VM written while the index lags")
		assert.Len(t, r.live(), 4)
	}
	assert.Equal(t, early.ID, r.record("p3").VMID, "the early VM is adopted")
	assert.EqualValues(t, 4, r.cloud.Counters()["created"], "four VMs made in all")

	// 3. The index catches up; p2's pod goes: its VM is deleted (the pod's
	// absence is the evidence). The index still shows that VM, running, for
	// the lag: it is no pod's and nobody's record's, and nothing is written
	// for it.
	r.clock.Advance(searchLag)
	require.Len(t, r.indexed(), 4)
	pods = lagPods("p0", "p1", "p3")
	r.pass(pods)
	assert.Equal(t, []string{"DELETE " + vms["p2"]}, r.take(), "the gone pod's VM, once")
	for range 3 {
		r.clock.Advance(30 * time.Second)
		assert.True(t, r.indexed()[vms["p2"]], "the deleted VM is still in the index")
		res := r.pass(pods)
		assert.True(t, res.Converged())
		assert.Empty(t, r.take(), "nothing written on the index's stale word")
	}
	r.clock.Advance(searchLag)
	assert.False(t, r.indexed()[vms["p2"]], "the index forgets it after the lag")

	// 4. p1's VM is killed behind caa's back: the index still shows it
	// running for the lag, and caa waits for positive evidence; once the
	// index drops it and a read by id confirms it gone for
	// --confirm-missing, it is recreated, once.
	require.NoError(t, r.cloud.Kill(coreIDOf(t, r.cloud, vms["p1"])))
	r.touch()
	for range 3 {
		r.clock.Advance(30 * time.Second)
		r.pass(pods)
		assert.Empty(t, r.take(), "the index says running: nothing is done")
	}
	var recreated []string
	for range 6 {
		r.clock.Advance(20 * time.Second)
		r.pass(pods)
		recreated = append(recreated, r.take()...)
	}
	require.Len(t, recreated, 1, "one recreate: %v", recreated)
	assert.True(t, strings.HasPrefix(recreated[0], "PUT "), recreated[0])
	assert.Len(t, r.live(), 3)
	assert.Equal(t, 2, r.record("p1").Attempt)

	// 5. p0's VM fails, and the index learns it. Then ARM has a live VM
	// under the same id again (a redeploy of that name) while the index
	// still says failed: List reads it directly, and the pod keeps it.
	r.clock.Advance(searchLag)
	r.pass(pods)
	r.take()
	old := coreIDOf(t, r.cloud, vms["p0"])
	require.NoError(t, r.cloud.Fail(old))
	r.touch()
	r.clock.Advance(searchLag + 10*time.Second)
	failed := r.cloud.Instances()
	require.NoError(t, r.cloud.Kill(old))
	for _, in := range failed {
		if in.ID == old {
			_, err := r.cloud.Create(cloud.CreateRequest{Name: in.Name, UniqueName: true, Tags: in.Tags, InstanceType: in.InstanceType, Image: in.Image})
			require.NoError(t, err)
		}
	}
	vms0 := r.record("p0")
	res := r.pass(pods)
	assert.True(t, res.Converged(), "pending: %v", res.Pending)
	assert.Empty(t, r.take(), "a VM the index calls failed but ARM shows running is neither replaced nor deleted")
	assert.Equal(t, vms0.VMID, r.record("p0").VMID)
	assert.Equal(t, 1, r.record("p0").Attempt)

	// 6. p3's VM really fails: it is replaced once (the read confirms the
	// index). The stale index keeps showing the failed VM, now deleted, and
	// not the new one, for the lag: nothing more is written.
	require.NoError(t, r.cloud.Fail(coreIDOf(t, r.cloud, r.record("p3").VMName)))
	r.touch()
	r.clock.Advance(searchLag + time.Second)
	r.pass(pods)
	w := r.take()
	assert.Len(t, w, 2, "the replacement and the failed VM's delete: %v", w)
	for range 4 {
		r.clock.Advance(25 * time.Second)
		res = r.pass(pods)
		assert.Empty(t, r.take(), "nothing written on the index's stale word")
	}
	assert.True(t, res.Converged(), "pending: %v", res.Pending)
	assert.Len(t, r.live(), 3)
	assert.Equal(t, 2, r.record("p3").Attempt)
}

func (r *lagRig) take() []string { return r.writes.take() }

func coreIDOf(t *testing.T, c *cloud.Cloud, name string) string {
	t.Helper()
	for _, in := range c.Live() {
		if in.Name == name {
			return in.ID
		}
	}
	t.Fatalf("no live instance named %s", name)
	return ""
}

func decodeJSON(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }
