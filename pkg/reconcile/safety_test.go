package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// The tests in this file are the fence of the invariants through events that
// are not the quiet path: a configuration change, a shutdown, dead VMs whose
// replacement cannot be made, a cloud that keeps failing.

// TestAConfigurationChangeDeletesNoVM: caa restarted with a runtime class
// that no longer matches its pods (a typo, a rename) keeps every VM, reports
// the records, and deletes a VM only once its pod is terminal or gone.
func TestAConfigurationChangeDeletesNoVM(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	pods := peerPods(4)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())
	before := f.cloud.Live()
	f.cloud.ResetCounters()

	// The same pods, now outside the watched classes.
	renamed := make([]*Pod, len(pods))
	for i, p := range pods {
		c := *p
		c.RuntimeClass, c.NotPeer = "kata-remote-renamed", true
		renamed[i] = &c
	}
	for range 3 {
		f.clock.Advance(10 * time.Minute) // past every grace: orphan GC gets its chance too
		res := f.rec.Pass(ctx, renamed, true)
		require.NoError(t, res.Err)
		assert.Zero(t, res.Actions[KindDelete], "a configuration change deletes nothing (I3)")
		assert.Zero(t, res.OrphansDeleted, "nor does orphan GC")
		assert.Len(t, res.NotWatched, 4, "each record is reported")
		assert.True(t, res.Converged(), "pods caa does not watch do not hold readiness")
	}
	assert.Equal(t, before, f.cloud.Live())
	c := f.cloud.Counters()
	assert.Zero(t, c[cloud.OpDelete]+c[cloud.OpCreate], "no cloud write")
	assert.Equal(t, []string{EventNotWatched, EventNotWatched, EventNotWatched, EventNotWatched},
		f.events.reasons()[len(f.events.reasons())-4:], "one event per pod, not one per pass")
	recs, err := f.ledger.List(ledger.Filter{})
	require.NoError(t, err)
	assert.Len(t, recs, 4, "records kept")

	// Positive evidence still deletes: one pod terminal, one gone.
	done := *renamed[0]
	done.Terminal = true
	res := f.rec.Pass(ctx, []*Pod{&done, renamed[2], renamed[3]}, true)
	assert.Equal(t, 2, res.Actions[KindDelete])
	assert.Len(t, f.cloud.Live(), 2)

	// Back to the right flag: the remaining VMs are adopted as they are.
	f.cloud.ResetCounters()
	res = f.rec.Pass(ctx, pods[2:], true)
	require.NoError(t, res.Err)
	assert.True(t, res.Converged())
	assert.Empty(t, res.NotWatched)
	c = f.cloud.Counters()
	assert.Zero(t, c[cloud.OpDelete]+c[cloud.OpCreate])
}

// TestNoWorkStartsAfterStop: a stop that lands once a pass has listed the
// cloud (so it has creates, deletes and a recreate to do) lets no cloud
// call and no ledger write start after it. The pass's own guard stops its
// loop (no action is even counted); the executor's guard stops an Apply
// handed an action after the stop (TestApplyAfterStopWritesNothing).
func TestNoWorkStartsAfterStop(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	pods := peerPods(6)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())
	require.NoError(t, f.cloud.Kill(f.cloud.Live()[0].ID))
	stats, err := f.ledger.Stats()
	require.NoError(t, err)

	stop, cancel := context.WithCancel(ctx)
	f.rec.Exec.Stop = stop
	f.rec.Exec.Provider = &stopOnList{Provider: f.rec.Exec.Provider, stop: cancel}
	f.cloud.ResetCounters()
	// New pods to create, pods gone to delete, a dead VM to recreate.
	res := f.rec.Pass(ctx, append(peerPods(3)[1:], &Pod{UID: "uid-new", Namespace: "ns", Name: "new"}), true)
	assert.Equal(t, map[string]int64{cloud.OpList: 1, "total": 1}, f.cloud.Counters(), "the listing, and no cloud call after the stop")
	for _, k := range []Kind{KindCreate, KindDelete, KindAdopt, KindForget, KindFail} {
		assert.Zero(t, res.Actions[k], "no %s applied after the stop", k)
	}
	after, err := f.ledger.Stats()
	require.NoError(t, err)
	assert.Equal(t, stats, after, "no ledger write after stop")
	assert.False(t, res.Converged())
}

// stopOnList stops caa (as SIGTERM would) right after the pass's listing.
type stopOnList struct {
	provider.Provider
	stop func()
}

func (p *stopOnList) List(ctx context.Context, sel provider.Selector) ([]provider.VM, error) {
	vms, err := p.Provider.List(ctx, sel)
	p.stop()
	return vms, err
}

// TestApplyAfterStopWritesNothing: an action handed to the executor after
// the stop starts neither its ledger intent nor its cloud call.
func TestApplyAfterStopWritesNothing(t *testing.T) {
	f := memoryFixture(t)
	stop, cancel := context.WithCancel(context.Background())
	cancel()
	f.ex.Stop = stop
	before, err := f.ledger.Stats()
	require.NoError(t, err)
	in := Input{Pod: pod, CacheSynced: true, Now: t0}
	_, err = f.ex.Apply(f.ctx, in, Decide(in, cfg))
	require.ErrorIs(t, err, ErrStopping)
	after, err := f.ledger.Stats()
	require.NoError(t, err)
	assert.Equal(t, before, after, "no intent written after stop")
	assert.Empty(t, f.cloud.Counters())
}

// TestStopMidPassStartsNothingMore: a stop that lands while a pass is busy
// lets the calls in flight finish (and their outcome be recorded) and
// starts none after it: no other cloud call, no other ledger intent.
func TestStopMidPassStartsNothingMore(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	stop, cancel := context.WithCancel(context.Background())
	f.rec.Exec.Stop = stop
	f.rec.Concurrency = 1
	gate := &gatedCreates{Provider: f.rec.Exec.Provider, entered: make(chan struct{}, 1), release: make(chan struct{})}
	f.rec.Exec.Provider = gate

	done := make(chan PassResult)
	go func() { done <- f.rec.Pass(context.Background(), peerPods(10), true) }()
	<-gate.entered // the first create is in flight
	cancel()       // SIGTERM
	close(gate.release)
	res := <-done
	assert.Equal(t, 1, gate.count(), "the create in flight finished; no other started")
	assert.Len(t, f.cloud.Live(), 1)
	assert.False(t, res.Converged())
	stats, err := f.ledger.Stats()
	require.NoError(t, err)
	assert.Equal(t, 1, stats.Records, "only the pod whose create was in flight has a record")
	assert.Equal(t, 2, stats.HistoryEntries, "its intent and its outcome; no intent after the stop")
}

type gatedCreates struct {
	provider.Provider
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	n       int
}

func (g *gatedCreates) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	g.mu.Lock()
	g.n++
	g.mu.Unlock()
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.release
	return g.Provider.Create(ctx, spec)
}

func (g *gatedCreates) count() int { g.mu.Lock(); defer g.mu.Unlock(); return g.n }

// failing makes chosen calls fail until healed.
type failing struct {
	provider.Provider
	mu             sync.Mutex
	create, delete error
	creates        int
}

func (p *failing) set(create, del error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.create, p.delete = create, del
}

func (p *failing) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	p.mu.Lock()
	err := p.create
	p.creates++
	p.mu.Unlock()
	if err != nil {
		return provider.VM{}, err
	}
	return p.Provider.Create(ctx, spec)
}

func (p *failing) Delete(ctx context.Context, id string) error {
	p.mu.Lock()
	err := p.delete
	p.mu.Unlock()
	if err != nil {
		return err
	}
	return p.Provider.Delete(ctx, id)
}

func quotaErr() error {
	return &provider.Error{Kind: provider.ErrQuota, Provider: "memory", Op: "create", Code: "QuotaExceeded"}
}

// TestAStoppedVMIsNeverStrandedByAFailingReplacement: the stopped VM stays
// recorded (ReplacesVMID) while its delete fails and the replacement's
// create fails, across restarts, until it is deleted; orphan GC leaves it to
// its record.
func TestAStoppedVMIsNeverStrandedByAFailingReplacement(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	pods := peerPods(1)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())
	old := f.cloud.Live()[0].ID
	require.NoError(t, f.cloud.Stop(old))

	fp := &failing{Provider: f.rec.Exec.Provider}
	fp.set(quotaErr(), errors.New("connection reset"))
	f.rec.Exec.Provider = fp
	for range 4 {
		res := f.rec.Pass(ctx, pods, true)
		assert.False(t, res.Converged())
		r, err := f.ledger.Get(pods[0].UID)
		require.NoError(t, err)
		assert.Equal(t, old, r.ReplacesVMID, "the stopped VM is recorded until it is deleted")
		f.clock.Advance(10 * time.Minute)
	}
	// The delete gets through, the create still does not.
	fp.set(quotaErr(), nil)
	f.rec.Pass(ctx, pods, true)
	f.clock.Advance(10 * time.Minute)

	// A restart (no memory), and the quota is lifted.
	fp.set(nil, nil)
	restarted := &Reconciler{Exec: f.rec.Exec, Config: cfg, Now: f.clock.Now}
	res := restarted.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	assert.True(t, res.Converged(), "pending: %v", res.Pending)
	r, err := f.ledger.Get(pods[0].UID)
	require.NoError(t, err)
	assert.Empty(t, r.ReplacesVMID)
	assert.Equal(t, ledger.PhaseRunning, r.Phase)
	live := f.cloud.Live()
	require.Len(t, live, 1, "one live VM per pod")
	assert.Equal(t, r.VMID, live[0].ID)
	for _, in := range f.cloud.Instances() {
		if in.ID == old {
			assert.Equal(t, provider.StateTerminated, in.State, "the stopped VM was deleted")
		}
	}
}

// TestFailuresBackOffPerPodWithOneEvent: a create that keeps failing on
// quota is retried with a growing backoff, raises one event for the streak,
// and does not rewrite its record on every retry.
func TestFailuresBackOffPerPodWithOneEvent(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	fp := &failing{Provider: f.rec.Exec.Provider}
	fp.set(quotaErr(), nil)
	f.rec.Exec.Provider = fp
	pods := peerPods(1)

	res := f.rec.Pass(ctx, pods, true)
	assert.Equal(t, 1, fp.creates)
	first := res.RequeueAfter
	assert.GreaterOrEqual(t, first, time.Minute, "quota starts at a minute, not the 5s transient retry")
	rec1, err := f.ledger.Get(pods[0].UID)
	require.NoError(t, err)

	// Passes inside the backoff make no call.
	for range 5 {
		f.clock.Advance(time.Second)
		res = f.rec.Pass(ctx, pods, true)
		require.Len(t, res.Pending, 1)
		assert.Equal(t, ReasonBackoff, res.Pending[0].Reason)
	}
	assert.Equal(t, 1, fp.creates, "no retry inside the backoff")

	// After it, one retry, and the next backoff is longer.
	f.clock.Advance(first)
	res = f.rec.Pass(ctx, pods, true)
	assert.Equal(t, 2, fp.creates)
	assert.Greater(t, res.RequeueAfter, first)
	f.clock.Advance(res.RequeueAfter)
	f.rec.Pass(ctx, pods, true)
	assert.Equal(t, 3, fp.creates)

	rec3, err := f.ledger.Get(pods[0].UID)
	require.NoError(t, err)
	assert.Equal(t, rec1.Revision, rec3.Revision, "retrying the same intent does not churn the ledger")
	assert.Equal(t, []string{EventCreateFailed}, f.events.reasons(), "one event for the streak")

	// Once it gets through, the streak ends.
	fp.set(nil, nil)
	f.clock.Advance(time.Hour)
	res = f.rec.Pass(ctx, pods, true)
	assert.True(t, res.Converged(), "pending: %v", res.Pending)
}

func TestBackoffGrowsByKindAndIsCapped(t *testing.T) {
	e := &Executor{RetryBase: 5 * time.Second, RetryMax: 5 * time.Minute}
	transient := errors.New("connection reset")
	capacity := &provider.Error{Kind: provider.ErrCapacity}
	throttled := &provider.Error{Kind: provider.ErrThrottled, RetryAfter: 40 * time.Second}
	tests := []struct {
		err     error
		retries int
		want    time.Duration
	}{
		{transient, 0, 5 * time.Second},
		{transient, 1, 10 * time.Second},
		{transient, 3, 40 * time.Second},
		{transient, 50, 5 * time.Minute},
		{quotaErr(), 0, time.Minute},
		{quotaErr(), 2, 4 * time.Minute},
		{quotaErr(), 3, 5 * time.Minute},
		{capacity, 0, 30 * time.Second},
		{throttled, 0, 40 * time.Second},
		{throttled, 4, 40 * time.Second},
		{&provider.Error{Kind: provider.ErrThrottled, RetryAfter: time.Second}, 0, time.Second},
		{&provider.Error{Kind: provider.ErrThrottled, RetryAfter: time.Second}, 2, 4 * time.Second},
		{&provider.Error{Kind: provider.ErrThrottled}, 10, 30 * time.Second},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%v/%d", tc.err, tc.retries), func(t *testing.T) {
			assert.Equal(t, tc.want, e.Backoff(tc.err, tc.retries))
		})
	}
}

// unknownGets reads every VM as unreadable (not NotFound).
type unknownGets struct{ provider.Provider }

func (u unknownGets) Get(context.Context, string) (provider.VM, error) {
	return provider.VM{}, errors.New("503 service unavailable")
}

func (u unknownGets) List(context.Context, provider.Selector) ([]provider.VM, error) { return nil, nil }

// TestAnUnreadableVMIsNotConverged: a Running record whose VM reads Unknown
// is reported as unknown, not as converged.
func TestAnUnreadableVMIsNotConverged(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	pods := peerPods(2)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())
	f.rec.Exec.Provider = unknownGets{f.rec.Exec.Provider}
	res := f.rec.Pass(ctx, pods, true)
	assert.False(t, res.Converged())
	require.Len(t, res.Pending, 2)
	assert.Equal(t, ReasonVMUnknown, res.Pending[0].Reason)
	assert.Zero(t, res.CloudWrites)
}

// TestMemoryStaysBoundedOnAChurningNode: per-pod memory (missing VMs,
// backoffs, notices) is forgotten once a pod and its record are gone.
func TestMemoryStaysBoundedOnAChurningNode(t *testing.T) {
	f := newPassFixture(t, 0) // a deleted VM vanishes at once: NotFound only
	ctx := context.Background()
	for round := range 20 {
		pods := make([]*Pod, 10)
		for i := range pods {
			pods[i] = &Pod{UID: fmt.Sprintf("r%d-%d", round, i), Namespace: "ns", Name: fmt.Sprintf("p%d-%d", round, i)}
		}
		require.True(t, f.rec.Pass(ctx, pods, true).Converged())
		// Kill every VM behind caa's back: each pod now has a missing VM...
		for _, in := range f.cloud.Live() {
			require.NoError(t, f.cloud.Kill(in.ID))
		}
		f.rec.Pass(ctx, pods, true)
		// ...and the pods are deleted before the confirmation ends.
		f.rec.Pass(ctx, nil, true)
		f.rec.Pass(ctx, nil, true)
	}
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	assert.Empty(t, f.rec.missing, "no memory of pods long gone")
	assert.Empty(t, f.rec.retries)
	recs, err := f.ledger.List(ledger.Filter{})
	require.NoError(t, err)
	assert.Empty(t, recs)
}

// TestARestartWithAnotherProviderTouchesNothing: records made on another
// cloud are neither replaced nor deleted by a caa started with the wrong
// --provider (this cloud cannot see their VMs: its NotFound proves
// nothing), and the node does not report ready.
func TestARestartWithAnotherProviderTouchesNothing(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	pods := peerPods(3)
	for _, p := range pods {
		_, err := f.ledger.Put(ledger.Record{PodUID: p.UID, Namespace: p.Namespace, Name: p.Name, Provider: "aws",
			VMID: "i-0" + p.UID, Key: Key(p.UID, 1), Attempt: 1, Phase: ledger.PhaseRunning})
		require.NoError(t, err)
	}
	f.rec.Config.Provider = "memory"
	for range 3 {
		f.clock.Advance(time.Hour) // past every confirmation and grace
		res := f.rec.Pass(ctx, pods[1:], true)
		require.NoError(t, res.Err)
		assert.False(t, res.Converged(), "a wrong --provider holds readiness")
		require.Len(t, res.Pending, 2)
		assert.Equal(t, ReasonOtherProvider, res.Pending[0].Reason)
		assert.Contains(t, res.Pending[0].Message, "--provider aws")
	}
	c := f.cloud.Counters()
	assert.Zero(t, c[cloud.OpCreate]+c[cloud.OpDelete]+c[cloud.OpGet], "nothing created, deleted or read by id")
	recs, err := f.ledger.List(ledger.Filter{})
	require.NoError(t, err)
	assert.Len(t, recs, 3, "even the gone pod's record stays for the right provider to finish")

	// Between passes too.
	res := f.rec.ReconcilePod(ctx, pods[0].UID, nil, true)
	assert.Equal(t, ReasonOtherProvider, res.Action.Reason)
	assert.Zero(t, res.CloudWrites+res.CloudReads)
}
