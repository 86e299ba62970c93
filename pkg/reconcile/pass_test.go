package reconcile

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
	"github.com/caa-project/caa/test/mocks/cloud"
	"github.com/caa-project/caa/test/mocks/memory"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

type passFixture struct {
	rec    *Reconciler
	cloud  *cloud.Cloud
	ledger *ledger.Ledger
	clock  *clock
	events *events
	path   string
}

func newPassFixture(t testing.TB, keepTerminated time.Duration) passFixture {
	t.Helper()
	clk := &clock{now: t0}
	c := cloud.New(cloud.Options{Images: []string{"img"}, KeepTerminated: keepTerminated, Now: clk.Now})
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, err := ledger.Open(ledger.Options{Path: path, Node: "n", Cluster: "c", Timeout: time.Second, Now: clk.Now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ev := &events{}
	ex := &Executor{Ledger: l, Provider: memory.New(c), Events: ev, Cluster: "c", Node: "n", RetryBase: time.Second, Now: clk.Now}
	return passFixture{
		rec:   &Reconciler{Exec: ex, Config: cfg, Concurrency: 4, OrphanGrace: 5 * time.Minute, Now: clk.Now},
		cloud: c, ledger: l, clock: clk, events: ev, path: path,
	}
}

func peerPods(n int) []*Pod {
	var pods []*Pod
	for i := range n {
		pods = append(pods, &Pod{UID: fmt.Sprintf("uid-%03d", i), Namespace: "ns", Name: fmt.Sprintf("pod-%03d", i), RuntimeClass: "kata-remote"})
	}
	return pods
}

func TestStartupPassCreatesThenAdoptsWithNoCloudWrites(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	pods := peerPods(20)

	res := f.rec.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	assert.True(t, res.Converged(), "pending: %v", res.Pending)
	assert.Equal(t, 20, res.Actions[KindCreate])
	assert.Len(t, f.cloud.Live(), 20)
	assert.Equal(t, 20, res.Records[ledger.PhaseRunning])

	// A restart: a new reconciler (no memory) on the same ledger and cloud.
	restarted := &Reconciler{Exec: f.rec.Exec, Config: cfg, Now: f.clock.Now}
	f.cloud.ResetCounters()
	res = restarted.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	assert.True(t, res.Converged())
	assert.Equal(t, 20, res.Actions[KindNone])
	assert.Zero(t, res.CloudWrites)
	c := f.cloud.Counters()
	assert.Zero(t, c[cloud.OpCreate]+c[cloud.OpDelete], "adopting makes no cloud write")
}

func TestKilledVMsAreRecreatedOnPositiveEvidence(t *testing.T) {
	f := newPassFixture(t, time.Hour) // terminated VMs stay visible: positive evidence
	ctx := context.Background()
	pods := peerPods(10)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())
	live := f.cloud.Live()
	for _, vm := range live[:3] {
		require.NoError(t, f.cloud.Kill(vm.ID))
	}
	res := f.rec.Pass(ctx, pods, true)
	assert.True(t, res.Converged())
	assert.Equal(t, 3, res.Actions[KindCreate])
	assert.Len(t, f.cloud.Live(), 10, "one live VM per pod again")
}

func TestNotFoundIsConfirmedBeforeARecreate(t *testing.T) {
	f := newPassFixture(t, 0) // a killed VM vanishes: only NotFound to go on
	ctx := context.Background()
	pods := peerPods(3)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())
	require.NoError(t, f.cloud.Kill(f.cloud.Live()[0].ID))

	res := f.rec.Pass(ctx, pods, true)
	assert.Zero(t, res.Actions[KindCreate], "one NotFound never recreates (I3)")
	assert.Equal(t, 1, res.Actions[KindWait])
	require.Len(t, res.Pending, 1)
	assert.Equal(t, ReasonVMMissing, res.Pending[0].Reason)
	assert.False(t, res.Converged(), "not ready while a VM is missing")

	f.clock.Advance(cfg.ConfirmMissing - time.Second)
	res = f.rec.Pass(ctx, pods, true)
	assert.Zero(t, res.Actions[KindCreate])

	f.clock.Advance(time.Second)
	res = f.rec.Pass(ctx, pods, true)
	assert.Equal(t, 1, res.Actions[KindCreate])
	assert.True(t, res.Converged())
	assert.Len(t, f.cloud.Live(), 3)
}

func TestGonePodsLoseTheirVMsOnlyFromASyncedCache(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	pods := peerPods(6)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())

	remaining := pods[:4]
	res := f.rec.Pass(ctx, remaining, false)
	assert.Zero(t, res.Actions[KindDelete], "nothing deleted from an unsynced cache (I3)")
	assert.Len(t, f.cloud.Live(), 6)

	res = f.rec.Pass(ctx, remaining, true)
	assert.Equal(t, 2, res.Actions[KindDelete])
	assert.Len(t, f.cloud.Live(), 4)
	recs, err := f.ledger.List(ledger.Filter{})
	require.NoError(t, err)
	assert.Len(t, recs, 4)

	// A terminal pod keeps no VM and does not block readiness.
	done := *remaining[0]
	done.Terminal = true
	res = f.rec.Pass(ctx, []*Pod{&done, remaining[1], remaining[2], remaining[3]}, true)
	assert.Equal(t, 1, res.Actions[KindDelete])
	assert.True(t, res.Converged())
}

func TestBadSpecFailsOnePodAndTheNodeConverges(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	pods := peerPods(3)
	pods[1].Annotations = map[string]string{provider.AnnotationMachineType: "huge"}
	res := f.rec.Pass(context.Background(), pods, true)
	assert.True(t, res.Converged(), "a bad annotation never blocks the node (I5)")
	require.Len(t, res.Failed, 1)
	assert.Equal(t, "ns/pod-001", res.Failed[0].Pod)
	assert.Contains(t, res.Failed[0].Message, provider.AnnotationMachineType)
	assert.Len(t, f.cloud.Live(), 2)
}

func TestOrphansWaitTheGracePeriod(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	pods := peerPods(2)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())
	stray := provider.Spec{Key: "uid-stray-a1", Cluster: "c", Node: "n", PodUID: "uid-stray", PodNamespace: "ns", PodName: "stray"}
	_, err := f.cloud.Create(cloud.CreateRequest{Token: stray.Key, Tags: stray.Tags(), Image: "img", InstanceType: "small"})
	require.NoError(t, err)

	res := f.rec.Pass(ctx, pods, true)
	assert.Zero(t, res.OrphansDeleted, "first sighting")
	f.clock.Advance(4 * time.Minute)
	res = f.rec.Pass(ctx, pods, true)
	assert.Zero(t, res.OrphansDeleted, "inside the grace period")
	f.clock.Advance(time.Minute)
	res = f.rec.Pass(ctx, pods, true)
	assert.Equal(t, 1, res.OrphansDeleted)
	assert.Len(t, f.cloud.Live(), 2)
}

func TestBadCredentialsMakeThePassFailForTheDaemon(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	f.cloud.SetFaults(cloud.Faults{DenyAuth: true})
	res := f.rec.Pass(context.Background(), peerPods(2), true)
	assert.ErrorIs(t, res.Err, ErrDaemon)
	assert.False(t, res.Converged())
	assert.Len(t, res.Pending, 2, "every pod is reported pending")
}

func TestLostLedgerIsRebuiltFromTags(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	pods := peerPods(5)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())
	before := f.cloud.Live()

	// The ledger is lost: a fresh file on the same node (invariant I6).
	require.NoError(t, f.ledger.Close())
	l, err := ledger.Open(ledger.Options{Path: filepath.Join(t.TempDir(), "new.db"), Node: "n", Cluster: "c", Timeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	f.rec.Exec.Ledger = l
	f.cloud.ResetCounters()

	res := f.rec.Pass(ctx, pods, true)
	assert.True(t, res.Converged())
	assert.Equal(t, 5, res.Actions[KindAdopt])
	assert.Zero(t, f.cloud.Counters()[cloud.OpCreate], "no VM recreated")
	assert.Equal(t, before, f.cloud.Live())
	recs, err := l.List(ledger.Filter{Phases: []ledger.Phase{ledger.PhaseRunning}})
	require.NoError(t, err)
	assert.Len(t, recs, 5)
}

func TestPickByTagIgnoresDeadVMsOfOtherAttempts(t *testing.T) {
	r := &ledger.Record{PodUID: "p", Key: "p-a2", VMID: "i-2"}
	dead1 := tagged("i-1", "p", "p-a1", provider.StateTerminated, t0)
	live1 := tagged("i-1b", "p", "p-a1", provider.StateRunning, t0)
	dead2 := tagged("i-2", "p", "p-a2", provider.StateTerminated, t0)
	live2 := tagged("i-2", "p", "p-a2", provider.StateRunning, t0)

	assert.Nil(t, pickByTag([]*provider.VM{&dead1}, r), "a dead VM of attempt 1 says nothing about attempt 2")
	assert.Equal(t, "i-2", pickByTag([]*provider.VM{&dead1, &dead2}, r).ID, "the record's own dead VM is evidence")
	assert.Equal(t, "i-2", pickByTag([]*provider.VM{&live1, &live2}, r).ID, "the record's key first")
	assert.Equal(t, "i-1b", pickByTag([]*provider.VM{&dead2, &live1}, r).ID, "else a live one")
	assert.Equal(t, "i-1", pickByTag([]*provider.VM{&dead1}, nil).ID, "without a record, any")
}

func TestBootingVMsHoldReadinessUntilTheyRun(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	f.cloud.SetFaults(cloud.Faults{BootDelay: 30 * time.Second})
	pods := peerPods(3)

	res := f.rec.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	assert.False(t, res.Converged(), "VMs still booting must hold the startup pass")
	assert.Equal(t, 3, res.Booting)
	require.Len(t, res.Pending, 3)
	for _, p := range res.Pending {
		assert.Equal(t, ReasonVMBooting, p.Reason, p.Pod)
	}
	assert.Equal(t, 3, res.Records[ledger.PhaseRunning], "the VMs are recorded at once; only readiness waits")

	f.clock.Advance(10 * time.Second)
	res = f.rec.Pass(ctx, pods, true)
	assert.Equal(t, 3, res.Booting, "still booting after 10s")
	assert.Zero(t, res.CloudWrites, "waiting for a boot writes nothing")

	f.clock.Advance(25 * time.Second)
	f.cloud.ResetCounters()
	res = f.rec.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	assert.True(t, res.Converged(), "pending: %v", res.Pending)
	assert.Zero(t, res.Booting)
	assert.Zero(t, res.CloudWrites)
}

func TestAVMStuckInBootStopsHoldingReadinessAfterTheBootTimeout(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	f.rec.BootTimeout = time.Minute
	ctx := context.Background()
	f.cloud.SetFaults(cloud.Faults{BootDelay: time.Hour})
	pods := peerPods(2)

	res := f.rec.Pass(ctx, pods, true)
	assert.Equal(t, 2, res.Booting)
	f.clock.Advance(50 * time.Second)
	res = f.rec.Pass(ctx, pods, true)
	assert.Equal(t, 2, res.Booting, "within the boot timeout")

	f.clock.Advance(20 * time.Second)
	res = f.rec.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	assert.True(t, res.Converged(), "past the boot timeout the node converges; pending: %v", res.Pending)
	assert.Zero(t, res.Booting)
	assert.Zero(t, res.CloudWrites, "a slow boot is never a reason to recreate")
	assert.Len(t, f.cloud.Live(), 2)
}
