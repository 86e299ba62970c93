package reconcile

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

func kubePod(uid, name, rc string, phase corev1.PodPhase) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: "ns", Name: name,
			Annotations: map[string]string{"io.katacontainers.config.hypervisor.machine_type": "small"}},
		Spec:   corev1.PodSpec{NodeName: "n"},
		Status: corev1.PodStatus{Phase: phase},
	}
	if rc != "" {
		p.Spec.RuntimeClassName = &rc
	}
	return p
}

func TestPodSourceMarksThePodsItDoesNotWatch(t *testing.T) {
	client := fake.NewClientset(
		kubePod("u1", "peer", "kata-remote", corev1.PodRunning),
		kubePod("u2", "done", "kata-remote", corev1.PodSucceeded),
		kubePod("u3", "plain", "", corev1.PodRunning),
		kubePod("u4", "other-rc", "runc", corev1.PodRunning),
		kubePod("u5", "second-rc", "kata-remote-tdx", corev1.PodPending),
	)
	src, err := NewPodSource(client, "n", []string{"kata-remote", "kata-remote-tdx"}, 0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Run(ctx)
	require.True(t, cache.WaitForCacheSync(ctx.Done(), src.Synced))

	byName := map[string]*Pod{}
	for _, p := range src.Pods() {
		byName[p.Name] = p
	}
	// Every pod of the node is there: a record whose pod is outside the
	// runtime classes must still find its pod (never a delete for that).
	require.Len(t, byName, 5)
	for name, notPeer := range map[string]bool{"peer": false, "done": false, "second-rc": false, "plain": true, "other-rc": true} {
		assert.Equal(t, notPeer, byName[name].NotPeer, name)
	}
	assert.False(t, byName["peer"].Terminal)
	assert.True(t, byName["done"].Terminal)
	assert.Equal(t, "kata-remote-tdx", byName["second-rc"].RuntimeClass)
	assert.Equal(t, "small", byName["peer"].Annotations["io.katacontainers.config.hypervisor.machine_type"])

	// A change pokes the loop.
	select {
	case <-src.Changes():
	default:
	}
	_, err = client.CoreV1().Pods("ns").Create(ctx, kubePod("u6", "new", "kata-remote", corev1.PodPending), metav1.CreateOptions{})
	require.NoError(t, err)
	select {
	case <-src.Changes():
	case <-time.After(10 * time.Second):
		t.Fatal("no change delivered for a new pod")
	}
	require.Eventually(t, func() bool { return len(src.Pods()) == 6 }, 10*time.Second, 10*time.Millisecond)
}

// TestPodSourceSignalsItsSync: on a node with no peer pod no handler ever
// pokes, yet the loop must start its startup pass as soon as the cache is
// complete, not at its next retry.
func TestPodSourceSignalsItsSync(t *testing.T) {
	client := fake.NewClientset(kubePod("u1", "caa-xyz", "", corev1.PodRunning))
	src, err := NewPodSource(client, "n", []string{"kata-remote"}, 0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Run(ctx)
	select {
	case <-src.Changes():
		assert.True(t, src.Synced(), "the change comes once the cache is complete")
	case <-time.After(10 * time.Second):
		t.Fatal("no change delivered when the cache synced")
	}
	require.Len(t, src.Pods(), 1)
	assert.True(t, src.Pods()[0].NotPeer)
}

func TestPodSourceKeepsNoManagedFields(t *testing.T) {
	p := kubePod("u1", "peer", "kata-remote", corev1.PodRunning)
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:phase":{}}}`)}}
	client := fake.NewClientset(p)
	src, err := NewPodSource(client, "n", []string{"kata-remote"}, 0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Run(ctx)
	require.True(t, src.WaitSynced(ctx))
	objs := src.informer.GetStore().List()
	require.Len(t, objs, 1)
	cached := objs[0].(*corev1.Pod)
	assert.Nil(t, cached.ManagedFields, "the cache drops managed fields")
	assert.Equal(t, "kata-remote", *cached.Spec.RuntimeClassName, "and keeps what caa reads")
	require.NotNil(t, src.Pod("u1"))
	assert.False(t, src.Pod("u1").NotPeer)
}

func TestPodSourceNeedsNodeAndRuntimeClass(t *testing.T) {
	_, err := NewPodSource(fake.NewClientset(), "", []string{"kata-remote"}, 0)
	assert.ErrorContains(t, err, "NODE_NAME")
	_, err = NewPodSource(fake.NewClientset(), "n", nil, 0)
	assert.ErrorContains(t, err, "--runtime-class")
}

func TestNodeLedgerGuard(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})

	require.NoError(t, CheckNodeLedger(ctx, client, "n", "/var/lib/caa/ledger.db", false, "id-1"), "a first start on a fresh node")
	require.NoError(t, RecordNodeLedger(ctx, client, "n", "id-1"))
	require.NoError(t, CheckNodeLedger(ctx, client, "n", "/var/lib/caa/ledger.db", true, "id-1"), "the same ledger again")

	err := CheckNodeLedger(ctx, client, "n", "/var/lib/caa/ledger.db", false, "id-2")
	assert.ErrorIs(t, err, ErrLedgerReplaced)
	assert.ErrorContains(t, err, "hostPath")
	assert.ErrorContains(t, err, "/var/lib/caa/ledger.db")

	err = CheckNodeLedger(ctx, client, "n", "/var/lib/caa/ledger.db", true, "id-2")
	assert.ErrorIs(t, err, ErrLedgerReplaced)
	assert.ErrorContains(t, err, LedgerAnnotation)

	assert.Error(t, CheckNodeLedger(ctx, client, "missing-node", "/x", true, "id-1"))
}

// TestLoopConvergesThenFollowsPodChangesWithoutListing: after the startup
// pass, a pod change costs only its own VM's calls: a create and one read
// to see it boot, a delete and no read. No listing per pod change.
func TestLoopConvergesThenFollowsPodChangesWithoutListing(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	f.rec.BootCheck = 100 * time.Millisecond
	client := fake.NewClientset(kubePod("u1", "a", "kata-remote", corev1.PodRunning), kubePod("u2", "b", "kata-remote", corev1.PodRunning))
	src, err := NewPodSource(client, "n", []string{"kata-remote"}, 0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Run(ctx)

	converged := make(chan struct{})
	var once sync.Once
	loop := &Loop{Reconciler: f.rec, Pods: src, Resync: time.Hour, Audit: time.Hour,
		Report: func(r PassResult, c bool) {
			if c {
				once.Do(func() { close(converged) })
			}
		}}
	done := make(chan struct{})
	go func() { loop.Run(ctx); close(done) }()
	select {
	case <-converged:
	case <-time.After(20 * time.Second):
		t.Fatal("the startup pass never converged")
	}
	assert.Len(t, f.cloud.Live(), 2)
	f.cloud.ResetCounters()
	f.cloud.SetFaults(cloud.Faults{BootDelay: time.Hour}) // new VMs answer the create as booting

	_, err = client.CoreV1().Pods("ns").Create(ctx, kubePod("u3", "c", "kata-remote", corev1.PodPending), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(f.cloud.Live()) == 3 }, 20*time.Second, 10*time.Millisecond, "the new pod's VM")
	require.Eventually(t, func() bool { return f.cloud.Counters()[cloud.OpGet] == 1 }, 20*time.Second, 10*time.Millisecond,
		"one read to see the new VM boot")

	require.NoError(t, client.CoreV1().Pods("ns").Delete(ctx, "a", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return len(f.cloud.Live()) == 2 }, 20*time.Second, 10*time.Millisecond, "the deleted pod's VM gone")

	// A status-only update and an unrelated pod cost nothing.
	_, err = client.CoreV1().Pods("ns").Create(ctx, kubePod("u9", "plain", "", corev1.PodRunning), metav1.CreateOptions{})
	require.NoError(t, err)
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("loop did not stop on cancel")
	}
	c := f.cloud.Counters()
	assert.Zero(t, c[cloud.OpList], "no listing per pod change")
	assert.EqualValues(t, 1, c[cloud.OpCreate])
	assert.EqualValues(t, 1, c[cloud.OpDelete])
	assert.EqualValues(t, 1, c[cloud.OpGet], "the delete read nothing")
}

func TestAuditJitterStaysWithinHalfAPeriod(t *testing.T) {
	p := 10 * time.Minute
	assert.Equal(t, 5*time.Minute, AuditJitter(p, 0))
	assert.Equal(t, 10*time.Minute, AuditJitter(p, 0.5))
	for _, u := range []float64{0, 0.1, 0.5, 0.9, 0.999999} {
		d := AuditJitter(p, u)
		assert.GreaterOrEqual(t, d, p/2)
		assert.Less(t, d, 3*p/2)
	}
}

// TestTheAuditFindsAVMKilledBehindCaasBack: between audits nothing reads
// the cloud; the audit lists the node's VMs once and the pod gets a new VM.
func TestTheAuditFindsAVMKilledBehindCaasBack(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	client := fake.NewClientset(kubePod("u1", "a", "kata-remote", corev1.PodRunning))
	src, ctx := runSource(t, client)
	loop := &Loop{Reconciler: f.rec, Pods: src, Resync: time.Hour, Audit: 400 * time.Millisecond}
	go loop.Run(ctx)
	require.Eventually(t, func() bool { return len(f.cloud.Live()) == 1 }, 20*time.Second, 10*time.Millisecond)
	first := f.cloud.Live()[0].ID
	require.NoError(t, f.cloud.Kill(first))
	require.Eventually(t, func() bool {
		live := f.cloud.Live()
		return len(live) == 1 && live[0].ID != first
	}, 20*time.Second, 10*time.Millisecond, "recreated at an audit")
}

func TestOnlyRelevantUpdatesPokeTheLoop(t *testing.T) {
	base := kubePod("u1", "a", "kata-remote", corev1.PodPending)
	statusOnly := base.DeepCopy()
	statusOnly.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	phase := base.DeepCopy()
	phase.Status.Phase = corev1.PodSucceeded
	ann := base.DeepCopy()
	ann.Annotations["io.katacontainers.config.hypervisor.machine_type"] = "large"
	deleting := base.DeepCopy()
	now := metav1.Now()
	deleting.DeletionTimestamp = &now

	assert.False(t, changed(base, statusOnly), "a status rewrite is noise")
	assert.True(t, changed(base, phase))
	assert.True(t, changed(base, ann))
	assert.True(t, changed(base, deleting))
	assert.True(t, changed(base, "not a pod"))
}

func TestOnlyPeerPodsPokeTheLoop(t *testing.T) {
	classes := []string{"kata-remote"}
	peer := kubePod("u1", "a", "kata-remote", corev1.PodRunning)
	plain := kubePod("u2", "caa-x", "", corev1.PodRunning)
	runc := kubePod("u3", "b", "runc", corev1.PodRunning)
	assert.True(t, isPeer(classes, peer))
	assert.False(t, isPeer(classes, plain), "caa's own pod, or any pod without a runtime class")
	assert.False(t, isPeer(classes, runc))
	assert.True(t, isPeer(classes, cache.DeletedFinalStateUnknown{Key: "ns/a"}), "a missed delete pokes, to be safe")
}

// TestLoopStartsNoPassAfterStop: a change pending when the loop is told to
// stop starts no pass (Go's select would otherwise pick it half the time).
func TestLoopStartsNoPassAfterStop(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	client := fake.NewClientset(kubePod("u1", "a", "kata-remote", corev1.PodRunning))
	src, err := NewPodSource(client, "n", []string{"kata-remote"}, 0)
	require.NoError(t, err)
	srcCtx, stopSrc := context.WithCancel(context.Background())
	defer stopSrc()
	go src.Run(srcCtx)
	require.True(t, cache.WaitForCacheSync(srcCtx.Done(), src.Synced))
	for range 50 {
		src.poke()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		passes := 0
		loop := &Loop{Reconciler: f.rec, Pods: src, Resync: time.Hour, Report: func(PassResult, bool) { passes++ }}
		loop.Run(ctx)
		require.Zero(t, passes, "a pass ran after the stop")
	}
	assert.Empty(t, f.cloud.Live(), "no VM created by a stopped loop")
}

// slowList holds every listing for a while, like a cloud that takes its
// time under throttling.
type slowList struct {
	provider.Provider
	d time.Duration
}

func (s slowList) List(ctx context.Context, sel provider.Selector) ([]provider.VM, error) {
	select {
	case <-time.After(s.d):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Provider.List(ctx, sel)
}

// TestTheHeartbeatOutlivesASlowPass: a pass that takes seconds still beats
// every second, so /healthz does not fail a long startup.
func TestTheHeartbeatOutlivesASlowPass(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	f.rec.Exec.Provider = slowList{Provider: f.rec.Exec.Provider, d: 3500 * time.Millisecond}
	client := fake.NewClientset(kubePod("u1", "a", "kata-remote", corev1.PodRunning))
	src, ctx := runSource(t, client)

	var mu sync.Mutex
	var beats []time.Time
	passDone := make(chan struct{}, 1)
	loop := &Loop{Reconciler: f.rec, Pods: src, Resync: time.Hour,
		Beat: func() { mu.Lock(); beats = append(beats, time.Now()); mu.Unlock() },
		Report: func(PassResult, bool) {
			select {
			case passDone <- struct{}{}:
			default:
			}
		}}
	go loop.Run(ctx)
	select {
	case <-passDone:
	case <-time.After(30 * time.Second):
		t.Fatal("no pass")
	}
	mu.Lock()
	defer mu.Unlock()
	assert.GreaterOrEqual(t, len(beats), 3, "beats during a 3.5s pass")
	for i := 1; i < len(beats); i++ {
		assert.Less(t, beats[i].Sub(beats[i-1]), 2*time.Second, "no gap of 2s between beats")
	}
}

// TestNodeEventsNameTheNode: a failure of the whole node is an event on the
// Node object, where `kubectl describe node` shows it.
func TestNodeEventsNameTheNode(t *testing.T) {
	client := fake.NewClientset()
	ev := NewKubeEvents(client, "worker-1")
	ev.NodeEvent("worker-1", true, "CaaBlocked", "daemon cannot proceed: list VMs: aws list: not authorized")
	defer ev.Shutdown()
	require.Eventually(t, func() bool {
		list, err := client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
		if err != nil || len(list.Items) == 0 {
			return false
		}
		e := list.Items[0]
		return e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == "worker-1" && e.Type == corev1.EventTypeWarning &&
			e.Reason == "CaaBlocked"
	}, 10*time.Second, 10*time.Millisecond)
}

// runSource starts a pod source on node n for kata-remote pods of client,
// stopped when the test ends, and waits for its first list.
func runSource(t *testing.T, client *fake.Clientset) (*PodSource, context.Context) {
	t.Helper()
	src, err := NewPodSource(client, "n", []string{"kata-remote"}, 0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go src.Run(ctx)
	require.True(t, cache.WaitForCacheSync(ctx.Done(), src.Synced))
	return src, ctx
}

// TestChangesOfARunningPodReadNothing: the kubelet moving a pod to Running,
// or an annotation change, costs no cloud call once its VM is recorded
// Running.
func TestChangesOfARunningPodReadNothing(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	client := fake.NewClientset(kubePod("u1", "a", "kata-remote", corev1.PodPending))
	src, ctx := runSource(t, client)
	converged := make(chan struct{})
	var once sync.Once
	loop := &Loop{Reconciler: f.rec, Pods: src, Resync: time.Hour, Audit: time.Hour, Workers: 1,
		Report: func(_ PassResult, c bool) {
			if c {
				once.Do(func() { close(converged) })
			}
		}}
	go loop.Run(ctx)
	select {
	case <-converged:
	case <-time.After(20 * time.Second):
		t.Fatal("no convergence")
	}
	f.cloud.ResetCounters()
	p, err := client.CoreV1().Pods("ns").Get(ctx, "a", metav1.GetOptions{})
	require.NoError(t, err)
	p.Status.Phase = corev1.PodRunning
	p.Annotations["team"] = "blue"
	_, err = client.CoreV1().Pods("ns").Update(ctx, p, metav1.UpdateOptions{})
	require.NoError(t, err)
	// A marker pod created after the update: with one worker, once its VM
	// exists the update before it has been handled too.
	_, err = client.CoreV1().Pods("ns").Create(ctx, kubePod("u2", "marker", "kata-remote", corev1.PodPending), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(f.cloud.Live()) == 2 }, 20*time.Second, 10*time.Millisecond)
	c := f.cloud.Counters()
	assert.Zero(t, c[cloud.OpGet]+c[cloud.OpList], "no read for the running pod's change")
}
