package cluster

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/caa-project/caa/pkg/provider"
)

// fakeCloud is a ClusterLister and deleter over a fixed set of VMs.
type fakeCloud struct {
	mu      sync.Mutex
	vms     []provider.VM
	lists   int
	deleted []string
	listErr error
}

func (f *fakeCloud) ListCluster(_ context.Context, cluster string) ([]provider.VM, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	if f.listErr != nil {
		return nil, f.listErr
	}
	var out []provider.VM
	for _, vm := range f.vms {
		if vm.Tags[provider.TagCluster] == cluster && !slices.Contains(f.deleted, vm.ID) {
			out = append(out, vm)
		}
	}
	return out, nil
}

func (f *fakeCloud) Delete(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, id)
	return nil
}

type sweepEnv struct {
	client *fake.Clientset
	cloud  *fakeCloud
	nodes  *Nodes
	s      *Sweeper
	mu     sync.Mutex // now is read by the informer's handlers too
	now    time.Time
	events []string
	fence  error
}

func newSweepEnv(t *testing.T, nodes ...string) *sweepEnv {
	t.Helper()
	return newSweepEnvWith(t, nil, nodes...)
}

// newSweepEnvWith lets prepare install the fake clientset's reactors
// before the Node informer starts: a reactor added while the informer
// lists races with it.
func newSweepEnvWith(t *testing.T, prepare func(*fake.Clientset), nodes ...string) *sweepEnv {
	t.Helper()
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, UID: types.UID("uid-" + n)}})
	}
	// The cluster has had a node "gone" (a leader before this one saw it).
	objs = append(objs, hadNodes("gone"))
	e := &sweepEnv{client: fake.NewClientset(objs...), cloud: &fakeCloud{}, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if prepare != nil {
		prepare(e.client)
	}
	var err error
	e.nodes, err = NewNodes(e.client, e.clock)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go e.nodes.Run(ctx)
	e.s = &Sweeper{
		Cloud: e.cloud, Client: e.client, Cluster: "c1", Nodes: e.nodes,
		Departed: &Departed{Cluster: "c1", Grace: 10 * time.Minute}, Interval: 5 * time.Minute,
		Known: &KnownNodes{Client: e.client, Namespace: "caa-system", Name: "caa-cluster-nodes"},
		Fence: func(context.Context) error { return e.fence },
		Event: func(_ bool, reason, msg string) { e.events = append(e.events, reason+": "+msg) },
		Log:   slog.New(slog.DiscardHandler), Metrics: NewMetrics(nil), Now: e.clock,
	}
	return e
}

func (e *sweepEnv) waitSynced(t *testing.T) {
	t.Helper()
	require.NoError(t, wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return e.nodes.Synced(), nil }))
}

// clock is the test's time, for the Sweeper and the Node informer's handlers.
func (e *sweepEnv) clock() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.now
}

func (e *sweepEnv) sweepAfter(d time.Duration) SweepResult {
	e.mu.Lock()
	e.now = e.now.Add(d)
	e.mu.Unlock()
	return e.s.Sweep(context.Background())
}

// hadNodes is the ConfigMap a leader before this one left: the cluster
// has had these nodes.
func hadNodes(names ...string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "caa-system", Name: "caa-cluster-nodes"},
		Data: map[string]string{KnownNodesKey: strings.Join(names, "\n")}}
}

func TestSweepDeletesOnlyTheDepartedNodesVMsAfterTheGrace(t *testing.T) {
	e := newSweepEnv(t, "here")
	e.cloud.vms = []provider.VM{vmOf("a", "gone", provider.StateRunning), vmOf("b", "gone", provider.StateRunning), vmOf("c", "here", provider.StateRunning)}
	e.waitSynced(t)

	res := e.sweepAfter(0)
	require.NoError(t, res.Err)
	assert.Empty(t, res.Deleted)
	assert.Equal(t, 2, res.Waiting)
	assert.Equal(t, 1, res.Published, "one view, for the node that exists")
	res = e.sweepAfter(5 * time.Minute)
	require.NoError(t, res.Err)
	assert.Empty(t, res.Deleted, "not before the grace")
	res = e.sweepAfter(5 * time.Minute)
	require.NoError(t, res.Err)
	assert.ElementsMatch(t, []string{"a", "b"}, res.Deleted)
	assert.ElementsMatch(t, []string{"a", "b"}, e.cloud.deleted, "the other node's VM untouched")
	assert.Len(t, e.events, 2)
	assert.Contains(t, e.events[0], "DepartedNodeVMDeleted")
	assert.InDelta(t, 2, testutil.ToFloat64(e.s.Metrics.Deletes.WithLabelValues("ok")), 0)

	n, err := e.client.CoreV1().Nodes().Get(context.Background(), "here", metav1.GetOptions{})
	require.NoError(t, err)
	v, err := ParseView(n.Annotations[ViewAnnotation])
	require.NoError(t, err)
	assert.Equal(t, []ViewVM{{ID: "c", State: provider.StateRunning, PodUID: "c-uid", Key: "c-k"}}, v.VMs)
}

func TestSweepDeletesNothingWithoutEvidence(t *testing.T) {
	vms := []provider.VM{vmOf("a", "gone", provider.StateRunning)}
	t.Run("unsynced Node cache: no listing either", func(t *testing.T) {
		e := newSweepEnvWith(t, func(c *fake.Clientset) {
			c.PrependReactor("list", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
				return true, nil, errors.New("apiserver down")
			})
		})
		e.cloud.vms = vms
		for range 4 {
			res := e.sweepAfter(10 * time.Minute)
			assert.ErrorIs(t, res.Err, errNotSynced)
		}
		assert.Zero(t, e.cloud.lists)
		assert.Empty(t, e.cloud.deleted)
	})
	t.Run("the apiserver cannot confirm the node is gone", func(t *testing.T) {
		e := newSweepEnvWith(t, func(c *fake.Clientset) {
			c.PrependReactor("get", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
				return true, nil, errors.New("apiserver down")
			})
		})
		e.cloud.vms = vms
		e.waitSynced(t)
		for range 4 {
			e.sweepAfter(10 * time.Minute)
		}
		assert.Empty(t, e.cloud.deleted)
	})
	t.Run("the cache lags: the node exists", func(t *testing.T) {
		e := newSweepEnvWith(t, func(c *fake.Clientset) {
			c.PrependReactor("get", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
				return true, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gone", UID: "new"}}, nil
			})
		})
		e.cloud.vms = vms
		e.waitSynced(t)
		for range 4 {
			e.sweepAfter(10 * time.Minute)
		}
		assert.Empty(t, e.cloud.deleted)
	})
	t.Run("the Lease is no longer held", func(t *testing.T) {
		e := newSweepEnv(t)
		e.cloud.vms = vms
		e.waitSynced(t)
		e.fence = errors.New("lease held by another replica")
		var res SweepResult
		for range 4 {
			res = e.sweepAfter(10 * time.Minute)
		}
		assert.ErrorContains(t, res.Err, "lease held by another")
		assert.Empty(t, e.cloud.deleted)
	})
	t.Run("the known node names cannot be read", func(t *testing.T) {
		e := newSweepEnvWith(t, func(c *fake.Clientset) {
			c.PrependReactor("get", "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) {
				return true, nil, errors.New("apiserver down")
			})
		})
		e.cloud.vms = vms
		e.waitSynced(t)
		for range 4 {
			assert.ErrorContains(t, e.sweepAfter(10*time.Minute).Err, "known node names")
		}
		assert.Empty(t, e.cloud.deleted)
	})
	t.Run("the listing fails", func(t *testing.T) {
		e := newSweepEnv(t)
		e.cloud.vms = vms
		e.cloud.listErr = errors.New("throttled")
		e.waitSynced(t)
		for range 4 {
			assert.Error(t, e.sweepAfter(10*time.Minute).Err)
		}
		assert.Empty(t, e.cloud.deleted)
	})
}

// TestSweepNeverCollectsANodeThisClusterNeverHad (issue 30.11): a cluster
// restored from a snapshot keeps the cluster id; the VMs the other cluster
// makes for its own nodes carry it too. The leader collects the VMs of the
// nodes this cluster has had (seen as Nodes, kept in a ConfigMap across
// leaders), and reports the others, with an event and a metric, but never
// deletes them.
func TestSweepNeverCollectsANodeThisClusterNeverHad(t *testing.T) {
	e := newSweepEnv(t, "here", "leaving")
	e.cloud.vms = []provider.VM{vmOf("h", "here", provider.StateRunning), vmOf("l", "leaving", provider.StateRunning),
		vmOf("s1", "elsewhere", provider.StateRunning), vmOf("s2", "elsewhere", provider.StateStopped)}
	e.waitSynced(t)
	require.NoError(t, e.sweepAfter(0).Err)

	cm, err := e.client.CoreV1().ConfigMaps("caa-system").Get(context.Background(), "caa-cluster-nodes", metav1.GetOptions{})
	require.NoError(t, err, "the names seen as Nodes are kept")
	assert.Equal(t, "here\nleaving", cm.Data[KnownNodesKey])

	require.NoError(t, e.client.CoreV1().Nodes().Delete(context.Background(), "leaving", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { p, _ := e.nodes.Presence("leaving"); return !p }, 10*time.Second, time.Millisecond)
	var res SweepResult
	for range 6 {
		res = e.sweepAfter(5 * time.Minute)
		require.NoError(t, res.Err)
	}
	assert.Equal(t, []string{"l"}, e.cloud.deleted, "the departed node's VM, and never the other cluster's")
	assert.Equal(t, 2, res.Strangers)
	assert.InDelta(t, 2, testutil.ToFloat64(e.s.Metrics.Strangers), 0)
	var warned []string
	for _, ev := range e.events {
		if strings.HasPrefix(ev, EventForeignNode) {
			warned = append(warned, ev)
		}
	}
	require.Len(t, warned, 1, "one event per node name: %v", e.events)
	assert.Contains(t, warned[0], "elsewhere")
	assert.Contains(t, warned[0], "--cluster-id")

	// A new leader (a new sweeper, the same ConfigMap) reads the set; a name
	// with no Node and no VM left has been dropped from it.
	k := &KnownNodes{Client: e.client, Namespace: "caa-system", Name: "caa-cluster-nodes"}
	require.NoError(t, k.Load(context.Background()))
	assert.True(t, k.Has("here"))
	assert.False(t, k.Has("elsewhere"))
	assert.False(t, k.Has("leaving"), "its VM deleted, the name is forgotten")
}
