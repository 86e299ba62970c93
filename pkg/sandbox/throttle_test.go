package sandbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// A burst of StartVM calls on an account whose create limit other nodes
// share (bench S10) meets the cloud's throttling. Throttling is caa's to
// absorb, as in the informer mode: each StartVM waits and creates again with
// the same key, and kata sees neither an error nor a second VM.
func TestThrottledCreatesAreRetriedNotSurfacedToKata(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	const n = 6
	ids := make([]string, n)
	for i := range n {
		name := fmt.Sprintf("web-%d", i)
		r.pod(fmt.Sprintf("uid-%d", i), name)
		ids[i] = sbID(100 + i)
		_, err := r.m.CreateVM(ctx, ids[i], shimAnnotations(name), fmt.Sprintf("/var/run/netns/cni-%d", i))
		require.NoError(t, err)
	}
	// One create at once, one more every 20 ms: most of the burst is refused.
	r.cloud.SetFaults(cloud.Faults{ThrottleRate: 50, ThrottleBurst: 1, ThrottleWriteOnly: true})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = r.m.StartVM(ctx, ids[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "StartVM %d: kata must not see the cloud's throttling", i)
		assert.Equal(t, ledger.SandboxRunning, r.sandbox(ids[i]).Phase)
	}
	assert.Positive(t, r.cloud.Counters()["throttled"], "the cloud refused some creates")
	per := map[string]int{}
	for _, in := range r.cloud.Instances() {
		per[in.Tags[TagSandbox]]++
	}
	for _, id := range ids {
		assert.Equal(t, 1, per[id], "sandbox %s has exactly one VM", id[:8])
	}
}

// A throttled create is retried only while the StartVM lasts: past its
// deadline the sandbox keeps its intent (the same key on the next try) and
// kata gets an error naming the throttling.
func TestThrottledCreateGivesUpAtTheStartTimeout(t *testing.T) {
	r := newRig(t)
	r.crash()
	r.tweak = func(c *Config) { c.StartTimeout = 300 * time.Millisecond }
	r.start()
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/var/run/netns/cni-1")
	require.NoError(t, err)
	r.cloud.SetFaults(cloud.Faults{ThrottleEvery: 1, ThrottleWriteOnly: true})
	err = r.m.StartVM(ctx, sbA)
	require.ErrorIs(t, err, provider.ErrThrottled)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	s := r.sandbox(sbA)
	assert.Equal(t, ledger.SandboxCreating, s.Phase, "the intent stays for the next StartVM")
	assert.Empty(t, r.live())
}

// caa stopping (SIGTERM, a hand-over) starts no cloud write, even for a
// StartVM it is still answering: one waiting for the create budget when
// StopWrites ends fails with ErrStopping, and no VM is created; the
// intent stays for the next caa.
func TestNoCreateStartsOnceWritesStop(t *testing.T) {
	r := newRig(t)
	r.crash()
	stopWrites, stop := context.WithCancel(context.Background())
	r.tweak = func(c *Config) {
		c.StopWrites = stopWrites
		c.StartTimeout = time.Minute
		c.Writes = rate.NewLimiter(rate.Every(30*time.Second), 1)
		c.Writes.Allow() // the budget is spent: the next create waits 30 s
	}
	r.start()
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/var/run/netns/cni-1")
	require.NoError(t, err)
	started := make(chan error, 1)
	go func() { started <- r.m.StartVM(ctx, sbA) }()
	select {
	case err := <-started:
		t.Fatalf("StartVM returned before the stop: %v", err)
	case <-time.After(200 * time.Millisecond): // waiting for its budget
	}
	stop()
	select {
	case err := <-started:
		require.ErrorIs(t, err, ErrStopping)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting StartVM was not released by the stop")
	}
	assert.Empty(t, r.cloud.Instances(), "no VM created after the stop")
	assert.Equal(t, ledger.SandboxCreating, r.sandbox(sbA).Phase, "the intent stays")
}
