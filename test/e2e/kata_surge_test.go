package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/test/e2e/cluster"
)

// shimLoop is kata's Go shim running pods through caa's hypervisor socket
// without pause: CreateVM, StartVM, StopVM, one connection per call, on
// `lanes` pods at a time. Every call's error is kept.
type shimLoop struct {
	done   atomic.Int64 // sandboxes through their whole life
	calls  atomic.Int64
	mu     sync.Mutex
	errs   []string
	ids    []string
	stop   context.CancelFunc
	wg     sync.WaitGroup
	serial atomic.Int32
}

func (n *hvEnv) shimLoop(ctx context.Context, t *testing.T, lanes int) *shimLoop {
	t.Helper()
	lctx, stop := context.WithCancel(ctx)
	l := &shimLoop{stop: stop}
	for lane := range lanes {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for lctx.Err() == nil {
				k := int(l.serial.Add(1))
				id := sandboxID(1000 + k)
				pod := n.newPod(ctx, t, "churn", fmt.Sprintf("%s-l%d-%d", n.node, lane, k), nil)
				l.mu.Lock()
				l.ids = append(l.ids, id)
				l.mu.Unlock()
				// Each call gets kata's own bound; the loop's end never
				// cuts a call it made.
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				_, err := n.shim.CreateVM(cctx, id, pod.annotations(nil), pod.net.NSPath)
				l.note("CreateVM", id, err)
				if err == nil {
					err = n.shim.StartVM(cctx, id)
					l.note("StartVM", id, err)
				}
				err = n.shim.StopVM(cctx, id)
				l.note("StopVM", id, err)
				cancel()
				if err == nil {
					l.done.Add(1)
				}
			}
		}()
	}
	return l
}

func (l *shimLoop) note(call, id string, err error) {
	l.calls.Add(1)
	if err != nil {
		l.mu.Lock()
		l.errs = append(l.errs, fmt.Sprintf("%s %s: %v", call, id[len(id)-6:], err))
		l.mu.Unlock()
	}
}

// finish stops the loop after the calls under way and returns the errors.
func (l *shimLoop) finish() []string {
	l.stop()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errs
}

// throughout waits until the loop completed at least k more sandboxes.
func (l *shimLoop) throughout(t *testing.T, k int64) {
	t.Helper()
	from := l.done.Load()
	require.Eventually(t, func() bool { return l.done.Load() >= from+k }, 2*time.Minute, condPoll,
		"the shim completes %d more sandboxes", k)
}

// TestKataCallsSurviveSurgeHandOvers (issue 31): kata's shim calls
// CreateVM, StartVM and StopVM without pause while caa is upgraded by the
// surge hand-over, twice, and once by a new caa that never turns ready
// (the old caa takes the ledger back). The old caa passes kata's socket
// itself to the new one with the ledger, so no call is refused: a call
// made during the hand-over waits in the socket's backlog for the new caa,
// and a call in flight at the old caa is answered before it releases the
// ledger. Every sandbox gets exactly one VM, which StopVM deletes; the
// running sandboxes' shims never miss a health check.
func TestKataCallsSurviveSurgeHandOvers(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	n := newRollNode(ctx, t, cluster.Start(ctx, t), "worker-1")
	// Every generation aborts a hand-over whose new caa is not ready
	// within 6 s (the broken one below).
	limits := []string{"--handover-ready-timeout", "6s", "--sandbox-ready-timeout", "3s", "--boot-timeout", "4s"}
	n.caa = n.startCaa(t, limits...)
	n.caa.waitReady(t, func() {})
	n.startRelay(ctx, t)
	n.runSandboxes(ctx, t, 2)
	checkCtx, stopChecks := context.WithCancel(ctx)
	defer stopChecks()
	n.shims.Check(checkCtx, rollCheckPeriod, rollCheckTimeout)

	loop := n.shimLoop(ctx, t, 2)
	loop.throughout(t, 2)
	for range 2 {
		old := n.caa
		next := n.startCaa(t, limits...)
		next.waitReady(t, func() {})
		next.waitHandover(t, health.HandoverDone, 30*time.Second)
		old.waitHandover(t, health.HandoverDone, 30*time.Second)
		old.stop(t)
		n.caa = next
		loop.throughout(t, 2)
	}

	// A new caa whose startup pass never ends (its listing of the cloud
	// hangs, through a door of its own to the same fake EC2): it holds the
	// ledger and the passed socket, serves neither, and the old caa takes
	// both back after the ready timeout. Calls made meanwhile wait.
	broken := newFront(t, n.ec2)
	broken.hangList.Store(true)
	door := forward(t, n.cn.NodeNS, "127.0.0.1:0", "", strings.TrimPrefix(broken.url, "http://"))
	v := n.startCaa(t, append(limits, "--aws-endpoint", "http://"+door, "--shutdown-grace", "1s")...)
	n.caa.waitHandover(t, health.HandoverHandedBack, time.Minute)
	n.caa.waitReady(t, func() {})
	loop.throughout(t, 2)
	v.stop(t)
	loop.throughout(t, 1)

	stopChecks()
	n.shims.Wait()
	errs := loop.finish()
	assert.Zero(t, len(errs), "no hypervisor call fails across the hand-overs; the first failures: %v", errs[:min(len(errs), 8)])
	for i, a := range n.shims.Agents {
		assert.Empty(t, a.Misses(), "running sandbox %d: no missed health check", i)
	}
	t.Logf("%d calls, %d sandboxes through their whole life across two surge hand-overs and one taken back",
		loop.calls.Load(), loop.done.Load())

	// Every churned sandbox had exactly one VM, and StopVM deleted it.
	require.Eventually(t, func() bool { return len(n.core.Live()) == len(n.ids) }, time.Minute, condPoll,
		"only the running sandboxes' VMs are left")
	for _, id := range loop.ids {
		assert.LessOrEqual(t, len(instanceIDs(n.sandboxVMs(id))), 1, "sandbox %s: at most one VM", id)
	}
}
