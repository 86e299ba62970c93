package sandbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// tunnelGate holds a fakeSide's calls of the stages it is told to hold
// (userdata, tunnel, teardown) until the test lets one go, and counts those
// inside at once.
type tunnelGate struct {
	mu           sync.Mutex
	held         map[string]bool
	inside, peak int
	done         int
	release      chan struct{}
	open         chan struct{} // closed at the test's end: nothing is held any more
}

// newTunnelGate gates side's calls; the test's end lets every one go.
func newTunnelGate(t *testing.T, side *fakeSide) *tunnelGate {
	g := &tunnelGate{held: map[string]bool{}, release: make(chan struct{}), open: make(chan struct{})}
	t.Cleanup(func() { close(g.open) }) // before the rig's cleanup, which waits for the manager
	side.mu.Lock()
	defer side.mu.Unlock()
	side.gate = func(stage string) {
		g.mu.Lock()
		if !g.held[stage] {
			g.mu.Unlock()
			return
		}
		g.inside++
		g.peak = max(g.peak, g.inside)
		g.mu.Unlock()
		select {
		case <-g.release:
		case <-g.open:
		}
		g.mu.Lock()
		g.inside--
		g.done++
		g.mu.Unlock()
	}
	return g
}

// hold makes the gate hold the calls of these stages only, from now on,
// and starts a new peak.
func (g *tunnelGate) hold(stages ...string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.held)
	for _, s := range stages {
		g.held[s] = true
	}
	g.peak = g.inside
}

func (g *tunnelGate) counts() (inside, peak, done int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inside, g.peak, g.done
}

// drain lets n held calls go one at a time, each once as many as the cap
// allows are inside (so that an unbounded manager has more than the cap
// inside before the first one goes), and returns the peak.
func (g *tunnelGate) drain(t *testing.T, n, limit int) int {
	t.Helper()
	_, _, done0 := g.counts()
	for i := range n {
		want := min(limit, n-i)
		eventually(t, func() bool { in, _, _ := g.counts(); return in == want },
			fmt.Sprintf("%d tunnel operations are under way (%d of %d let go)", want, i, n))
		g.release <- struct{}{}
		eventually(t, func() bool { _, _, d := g.counts(); return d == done0+i+1 }, "the tunnel operation let go finishes")
	}
	_, peak, _ := g.counts()
	return peak
}

// A node's burst of sandboxes (bench S10: 100 StartVM at once, then 100
// StopVM) runs no more tunnel operations at once than TunnelOps allows, by
// default DefaultTunnelOps: the reading of the pod network for the user
// data, the tunnel's setup and its teardown. Each one waiting in the kernel
// holds an OS thread, which the Go runtime keeps (bench S11). The others
// wait for a turn; every StartVM still succeeds and every teardown runs.
func TestTunnelOperationsAtOnceAreBounded(t *testing.T) {
	r := newRig(t)
	g := newTunnelGate(t, r.side)
	ctx := context.Background()
	const n = 3*DefaultTunnelOps + 1
	create := func(first int) []string {
		ids := make([]string, n)
		for i := range n {
			name := fmt.Sprintf("web-%d", first+i)
			r.pod(fmt.Sprintf("uid-%d", first+i), name)
			ids[i] = sbID(200 + first + i)
			_, err := r.m.CreateVM(ctx, ids[i], shimAnnotations(name), fmt.Sprintf("/var/run/netns/cni-%d", first+i))
			require.NoError(t, err)
		}
		return ids
	}
	startAll := func(ids []string) func() {
		errs := make([]error, len(ids))
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Go(func() { errs[i] = r.m.StartVM(ctx, id) })
		}
		return func() {
			wg.Wait()
			for i, err := range errs {
				require.NoError(t, err, "StartVM %d", i)
				assert.Equal(t, ledger.SandboxRunning, r.sandbox(ids[i]).Phase)
			}
		}
	}

	// The user data of n sandboxes at once.
	g.hold("userdata")
	first := create(0)
	wait := startAll(first)
	assert.Equal(t, DefaultTunnelOps, g.drain(t, n, DefaultTunnelOps), "user data built at once")
	wait()

	// Their tunnels' teardowns, after StopVM answered.
	g.hold("teardown")
	for _, id := range first {
		require.NoError(t, r.m.StopVM(ctx, id))
	}
	assert.Equal(t, DefaultTunnelOps, g.drain(t, n, DefaultTunnelOps), "tunnel teardowns at once")

	// The tunnel setups of n more, once each has its VM's address (the
	// step before the tunnel).
	g.hold("tunnel")
	second := create(n)
	wait = startAll(second)
	eventually(t, func() bool {
		for _, id := range second {
			if s, err := r.led.GetSandbox(id); err != nil || s.RelayAddr == "" {
				return false
			}
		}
		return true
	}, "every sandbox's VM runs")
	assert.Equal(t, DefaultTunnelOps, g.drain(t, n, DefaultTunnelOps), "tunnel setups at once")
	wait()
}

// A StartVM waiting for a turn among the tunnel operations is one StopVM
// can cut short, and answers at once; the sandbox's teardown runs once a
// turn frees.
func TestStartVMWaitingForATunnelTurnIsCancelledByStopVM(t *testing.T) {
	r := newRig(t)
	r.crash()
	r.tweak = func(c *Config) { c.TunnelOps = 1 }
	r.start()
	g := newTunnelGate(t, r.side)
	ctx := context.Background()
	for i, id := range []string{sbID(1), sbID(2)} {
		name := fmt.Sprintf("web-%d", i)
		r.pod(fmt.Sprintf("uid-%d", i), name)
		_, err := r.m.CreateVM(ctx, id, shimAnnotations(name), fmt.Sprintf("/var/run/netns/cni-%d", i))
		require.NoError(t, err)
	}
	require.NoError(t, r.m.StartVM(ctx, sbID(1)))
	// The second sandbox's VM boots until the test says so: its StartVM
	// waits for it with its user data built.
	r.cloud.SetFaults(cloud.Faults{BootDelay: time.Hour})
	second := make(chan error, 1)
	go func() { second <- r.m.StartVM(ctx, sbID(2)) }()
	eventually(t, func() bool { s, err := r.led.GetSandbox(sbID(2)); return err == nil && s.VMID != "" }, "the second sandbox's VM is created")
	// The first sandbox's teardown holds the only turn.
	g.hold("tunnel", "teardown")
	require.NoError(t, r.m.StopVM(ctx, sbID(1)))
	eventually(t, func() bool { in, _, _ := g.counts(); return in == 1 }, "the first sandbox's teardown holds the only turn")
	require.NoError(t, r.cloud.Backdate(r.sandbox(sbID(2)).VMID, time.Now().Add(-2*time.Hour)))
	eventually(t, func() bool { return r.sandbox(sbID(2)).RelayAddr != "" }, "the second sandbox's VM runs")

	require.NoError(t, r.m.StopVM(ctx, sbID(2)))
	var err error
	select {
	case err = <-second:
	case <-time.After(5 * time.Second): // a deadline for the failure, not a synchronisation
		t.Fatal("the StartVM cut short by StopVM did not answer: it is held in a tunnel operation")
	}
	require.Error(t, err, "the StartVM cut short by StopVM fails")
	in, _, done := g.counts()
	assert.Equal(t, 1, in, "the cancelled StartVM set up no tunnel")
	assert.Zero(t, done)
	assert.False(t, r.side.tunnelUp("/var/run/netns/cni-1"))

	g.drain(t, 2, 1) // the first sandbox's teardown, then the second's
	_, peak, _ := g.counts()
	assert.Equal(t, 1, peak)
	eventually(t, func() bool { _, err := r.led.GetSandbox(sbID(2)); return err != nil }, "the stopped sandbox's record goes")
}

// A StartVM whose turn for its user data does not come before StopVM fails
// without marking the sandbox Failed: nothing about the sandbox is wrong.
func TestStartVMWaitingForAUserDataTurnDoesNotFailTheSandbox(t *testing.T) {
	r := newRig(t)
	r.crash()
	r.tweak = func(c *Config) { c.TunnelOps = 1 }
	r.start()
	g := newTunnelGate(t, r.side)
	g.hold("userdata")
	ctx := context.Background()
	for i, id := range []string{sbID(1), sbID(2)} {
		name := fmt.Sprintf("web-%d", i)
		r.pod(fmt.Sprintf("uid-%d", i), name)
		_, err := r.m.CreateVM(ctx, id, shimAnnotations(name), fmt.Sprintf("/var/run/netns/cni-%d", i))
		require.NoError(t, err)
	}
	first := make(chan error, 1)
	go func() { first <- r.m.StartVM(ctx, sbID(1)) }()
	eventually(t, func() bool { in, _, _ := g.counts(); return in == 1 }, "the first sandbox's user data holds the only turn")
	sctx, cancel := context.WithCancel(ctx)
	second := make(chan error, 1)
	go func() { second <- r.m.StartVM(sctx, sbID(2)) }()
	cancel() // kata gave up on the call
	var err error
	select {
	case err = <-second:
	case <-time.After(5 * time.Second): // a deadline for the failure, not a synchronisation
		t.Fatal("the StartVM given up did not answer")
	}
	require.ErrorIs(t, err, context.Canceled)
	s := r.sandbox(sbID(2))
	assert.Equal(t, ledger.SandboxCreated, s.Phase, "no intent was written, nothing failed")
	assert.Equal(t, "CreateVM", s.Reason, "no failure recorded")

	g.drain(t, 1, 1)
	require.NoError(t, <-first)
	go func() { second <- r.m.StartVM(ctx, sbID(2)) }() // kata's next try
	g.drain(t, 1, 1)
	require.NoError(t, <-second)
	assert.Equal(t, ledger.SandboxRunning, r.sandbox(sbID(2)).Phase)
}
