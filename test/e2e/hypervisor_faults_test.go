package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/sandbox"
	katafake "github.com/caa-project/caa/test/mocks/kata"
)

// TestHypervisorSigkillMidStartVM: caa is SIGKILLed while a StartVM's
// create has landed in the cloud but its answer has not come back (the
// fake EC2 holds it). The ledger file, read after the kill, tells what
// happened: the intent (Creating, attempt 1, its idempotency key) and no
// VM recorded. The restarted caa serves the shim's repeated StartVM with
// the VM the first create made, never a second one (I1), and StopVM then
// deletes it. Killed so again, and answered with kata's StopVM instead,
// caa finds the VM by its key and deletes it: nothing leaks.
func TestHypervisorSigkillMidStartVM(t *testing.T) {
	t.Parallel()
	ctx, e := newHVEnv(t, 3*time.Minute)
	pod := e.newPod(ctx, t, "shop", "web-0", nil)
	d := e.startReady(t)
	id := sandboxID(2)
	sock, err := e.shim.CreateVM(ctx, id, pod.annotations(nil), pod.net.NSPath)
	require.NoError(t, err)

	started := e.startVMUntilCreateLands(ctx, t, id)
	require.NoError(t, d.cmd.Process.Kill())
	<-d.done
	require.Error(t, <-started, "the shim's StartVM breaks with caa")
	e.hold.on.Store(false)
	require.Len(t, instanceIDs(e.sandboxVMs(id)), 1, "the create landed: one VM exists, its answer lost")
	first := e.sandboxVMs(id)[0].ID

	rec, hist, err := e.readLedger(t, id)
	require.NoError(t, err)
	assert.Equal(t, ledger.SandboxCreating, rec.Phase, "the intent was durable before the create (I2)")
	assert.Equal(t, 1, rec.Attempt)
	assert.Equal(t, sandbox.Key(id, 1), rec.Key)
	assert.Empty(t, rec.VMID, "the answer never came back")
	assert.Len(t, rec.CertSerials, 1, "the serial of the certificate sent in the user data")
	var phases []ledger.SandboxPhase
	for _, h := range hist {
		phases = append(phases, h.Sandbox.Phase)
	}
	assert.Equal(t, []ledger.SandboxPhase{ledger.SandboxCreated, ledger.SandboxCreating}, phases)
	t.Logf("record after the kill: phase %s, reason %s, message %q, key %s", rec.Phase, rec.Reason, rec.Message, rec.Key)

	d = e.startReady(t)
	require.NoError(t, e.shim.StartVM(ctx, id), "failed boots: %v", e.fleet.Failed())
	assert.Equal(t, []string{first}, instanceIDs(e.sandboxVMs(id)),
		"no duplicate VM for the sandbox (I1): the repeated create, same key, returned the VM the first made")
	require.NoError(t, katafake.CheckAgent(ctx, sock))

	require.NoError(t, e.shim.StopVM(ctx, id))
	require.Eventually(t, func() bool { return len(e.liveSandboxVMs(id)) == 0 }, 30*time.Second, 20*time.Millisecond,
		"StopVM deletes the VM")

	// The same kill, but kata then does what a failed start makes it do:
	// StopVM. The VM whose create answer was lost is found by its key and
	// deleted, not leaked.
	id2 := sandboxID(22)
	_, err = e.shim.CreateVM(ctx, id2, pod.annotations(nil), pod.net.NSPath)
	require.NoError(t, err)
	started = e.startVMUntilCreateLands(ctx, t, id2)
	require.NoError(t, d.cmd.Process.Kill())
	<-d.done
	require.Error(t, <-started)
	e.hold.on.Store(false)
	leaked := instanceIDs(e.sandboxVMs(id2))
	require.Len(t, leaked, 1)
	d = e.startReady(t)
	require.NoError(t, e.shim.StopVM(ctx, id2))
	require.Eventually(t, func() bool { return len(e.liveSandboxVMs(id2)) == 0 }, 30*time.Second, 20*time.Millisecond,
		"the VM made by the create whose answer was lost is deleted (no leak)")
	assert.Equal(t, leaked, instanceIDs(e.sandboxVMs(id2)), "and nothing else was created for it")
	d.stop(t)
	_, hist, err = e.readLedger(t, id2)
	assert.ErrorIs(t, err, ledger.ErrNotFound, "the record goes with the VM")
	var last ledger.Sandbox
	if len(hist) > 0 {
		last = hist[len(hist)-1].Sandbox
	}
	t.Logf("the second sandbox's story: %d history entries, the last %s (%s), VM %s", len(hist), last.Phase, last.Reason, last.VMID)
	assert.Equal(t, leaked[0], last.VMID, "its history names the VM that was deleted")
}

// TestHypervisorRestartWith20Sandboxes: 20 running sandboxes; caa stops
// (SIGTERM) and starts again over the same ledger, then is SIGKILLed and
// starts again. Each new process adopts them all with no cloud write at the
// fake EC2's door, and every agent socket is served (a health check answers
// through it) by the moment /readyz first says 200.
func TestHypervisorRestartWith20Sandboxes(t *testing.T) {
	t.Parallel()
	ctx, e := newHVEnv(t, 3*time.Minute)
	const n = 20
	pods := make([]*peerPod, n)
	for i := range n {
		pods[i] = e.newPod(ctx, t, "shop", fmt.Sprintf("web-%02d", i), nil)
	}
	d := e.startReady(t)
	socks := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	turn := make(chan struct{}, 4) // four shims at a time
	t0 := time.Now()
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			turn <- struct{}{}
			defer func() { <-turn }()
			id := sandboxID(100 + i)
			if socks[i], errs[i] = e.shim.CreateVM(ctx, id, p.annotations(nil), p.net.NSPath); errs[i] == nil {
				errs[i] = e.shim.StartVM(ctx, id)
			}
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...), "failed boots: %v", e.fleet.Failed())
	t.Logf("%d sandboxes started in %s", n, time.Since(t0).Round(time.Millisecond))
	require.Len(t, instanceIDs(e.core.Live()), n)
	vmsBefore := liveVMs(e.core)
	d.stop(t)
	for _, s := range socks {
		_, err := net.Dial("unix", s)
		require.Error(t, err, "no agent socket is served between the processes")
	}

	// A restart after SIGTERM (an upgrade), then one after SIGKILL (the
	// sockets' files stay behind, served by no one).
	for _, how := range []string{"SIGTERM", "SIGKILL"} {
		e.door.reset()
		t1 := time.Now()
		d = e.start(t)
		var failed []string
		d.waitReadyFast(t, func() {
			// Right as /readyz flips: every socket answers.
			for i, s := range socks {
				if err := katafake.CheckAgent(ctx, s); err != nil {
					failed = append(failed, fmt.Sprintf("sandbox %d: %v", i, err))
				}
			}
		})
		t.Logf("restart after %s: ready, with %d sandboxes served again, %s after the start", how, n, time.Since(t1).Round(time.Millisecond))
		assert.Empty(t, failed, "agent sockets not served when /readyz said 200 (restart after %s)", how)
		t.Logf("calls at the fake EC2 during the restart: %v", e.door.counts())
		for kind, k := range e.door.counts() {
			assert.False(t, isEC2Write(kind), "cloud write at restart: %s x%d (all calls: %v)", kind, k, e.door.counts())
		}
		assert.Equal(t, vmsBefore, liveVMs(e.core), "every VM adopted")
		if how == "SIGTERM" {
			require.NoError(t, d.cmd.Process.Kill())
			<-d.done
			stale := 0
			for _, s := range socks {
				if _, err := os.Stat(s); err == nil {
					stale++
				}
				_, err := net.Dial("unix", s)
				require.Error(t, err, "no agent socket is served after the kill")
			}
			t.Logf("after SIGKILL: %d of %d agent socket files left behind, served by no one", stale, n)
			continue
		}
		d.stop(t)
	}
}

// TestHypervisorPodGoneRetiresItsSandbox: a pod is deleted from the
// apiserver while its sandbox runs and kata never calls StopVM (the kubelet
// went away with the node's runtime). The pod's absence from the synced pod
// cache is the positive evidence (I3): the sandbox's socket closes and its VM
// is deleted; the other pod's sandbox keeps its VM and its agent.
func TestHypervisorPodGoneRetiresItsSandbox(t *testing.T) {
	t.Parallel()
	ctx, e := newHVEnv(t, 3*time.Minute)
	gone := e.newPod(ctx, t, "team", "gone", nil)
	stays := e.newPod(ctx, t, "team", "stays", nil)
	d := e.startReady(t)
	a, b := sandboxID(9), sandboxID(10)
	sockA, err := e.shim.CreateVM(ctx, a, gone.annotations(nil), gone.net.NSPath)
	require.NoError(t, err)
	require.NoError(t, e.shim.StartVM(ctx, a), "failed boots: %v", e.fleet.Failed())
	sockB, err := e.shim.CreateVM(ctx, b, stays.annotations(nil), stays.net.NSPath)
	require.NoError(t, err)
	require.NoError(t, e.shim.StartVM(ctx, b), "failed boots: %v", e.fleet.Failed())
	vmB := instanceIDs(e.liveSandboxVMs(b))
	require.Len(t, vmB, 1)

	require.NoError(t, e.c.DeletePod(ctx, "team", "gone"))
	require.Eventually(t, func() bool { return len(e.liveSandboxVMs(a)) == 0 }, 30*time.Second, 20*time.Millisecond,
		"the gone pod's VM is deleted")
	_, err = net.Dial("unix", sockA)
	assert.Error(t, err, "the gone pod's agent socket is closed")
	assert.Equal(t, vmB, instanceIDs(e.liveSandboxVMs(b)), "the other pod's VM stays")
	require.NoError(t, katafake.CheckAgent(ctx, sockB), "the other pod's agent is still served")
	d.stop(t)
	_, hist, err := e.readLedger(t, a)
	assert.ErrorIs(t, err, ledger.ErrNotFound, "the record goes with the VM")
	require.NotEmpty(t, hist)
	assert.Equal(t, "PodGone", hist[len(hist)-1].Sandbox.Reason, "its history says why")
}

// isEC2Write tells whether a call kind (ec2CallKind) changes the cloud.
func isEC2Write(kind string) bool {
	switch {
	case strings.HasSuffix(kind, "(dry run)"), kind == "get", kind == "list", kind == "lookup", strings.HasPrefix(kind, "Describe"):
		return false
	}
	return true
}

// waitReadyFast is waitReady polling every few milliseconds, so that check
// runs right as /readyz flips.
func (d *daemon) waitReadyFast(t *testing.T, check func()) {
	t.Helper()
	d.waitReadyPolling(t, 5*time.Millisecond, check)
}

// TestHypervisorVMKilledBehindCaasBack: a running sandbox's VM fails in the
// cloud behind caa's back (it stays listed, Failed, until deleted). The
// shim's connection to the agent breaks; caa's sync declares the sandbox
// lost, closes its agent socket and raises an event on the pod; the lost
// sandbox gets no new VM (its containers' state was in the old one); the
// kubelet's next sandbox for the pod gets a new VM through StartVM; and the
// old VM is deleted, once the new sandbox runs.
func TestHypervisorVMKilledBehindCaasBack(t *testing.T) {
	t.Parallel()
	ctx, e := newHVEnv(t, 3*time.Minute)
	pod := e.newPod(ctx, t, "team", "web-0", nil)
	d := e.startReady(t)
	a := sandboxID(3)
	sockA, err := e.shim.CreateVM(ctx, a, pod.annotations(nil), pod.net.NSPath)
	require.NoError(t, err)
	require.NoError(t, e.shim.StartVM(ctx, a), "failed boots: %v", e.fleet.Failed())
	vmsA := e.liveSandboxVMs(a)
	require.Len(t, instanceIDs(vmsA), 1)
	old := vmsA[0].ID
	conn, err := net.Dial("unix", sockA)
	require.NoError(t, err)
	agent := ttrpc.NewClient(conn)
	defer agent.Close()
	_, err = agentproto.Check(ctx, agent)
	require.NoError(t, err)

	t0 := time.Now()
	require.NoError(t, e.core.Fail(old))
	require.Eventually(t, func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := agentproto.Check(cctx, agent)
		return err != nil
	}, 30*time.Second, 20*time.Millisecond, "the shim's connection to the dead VM's agent breaks")
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", sockA)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	}, 60*time.Second, 20*time.Millisecond, "the lost sandbox's agent socket closes")
	t.Logf("sandbox declared lost, socket closed, %s after its VM failed", time.Since(t0).Round(time.Millisecond))
	require.Eventually(t, func() bool { return hasEvent(ctx, t, e.c, "web-0", "Warning", sandbox.EventVMLost) },
		30*time.Second, 100*time.Millisecond, "the loss is reported on the pod")
	err = e.shim.StartVM(ctx, a)
	require.Error(t, err, "a lost sandbox gets no new VM")
	assert.Contains(t, err.Error(), "Lost")
	assert.Equal(t, []string{old}, instanceIDs(e.sandboxVMs(a)), "nothing was created for the lost sandbox")
	assert.Equal(t, []string{old}, instanceIDs(e.core.Live()), "the failed VM is not deleted while nothing supersedes its sandbox")

	// The kubelet's next sandbox for the pod.
	b := sandboxID(4)
	sockB, err := e.shim.CreateVM(ctx, b, pod.annotations(nil), pod.net.NSPath)
	require.NoError(t, err)
	require.NoError(t, e.shim.StartVM(ctx, b), "failed boots: %v", e.fleet.Failed())
	vmsB := e.liveSandboxVMs(b)
	require.Len(t, instanceIDs(vmsB), 1)
	assert.NotEqual(t, old, vmsB[0].ID, "the next sandbox has its own VM")
	require.NoError(t, katafake.CheckAgent(ctx, sockB))
	require.Eventually(t, func() bool {
		in, err := e.core.Get(old)
		return err == nil && in.State == provider.StateTerminated
	}, 30*time.Second, 20*time.Millisecond, "the old sandbox's VM is deleted once the next one runs")
	assert.Equal(t, []string{vmsB[0].ID}, instanceIDs(e.core.Live()), "the running sandbox keeps its VM")
	require.NoError(t, katafake.CheckAgent(ctx, sockB), "the running sandbox is still served")
	d.stop(t)
}

// TestHypervisorSigtermMidStartVM: SIGTERM lands while a StartVM's create
// is in the cloud (landed, its answer held). caa exits 0 within its
// shutdown grace; the shutdown deletes nothing and starts nothing (I4); the
// intent stays recorded; the next caa gives the shim's repeated StartVM the
// VM that create made, and no other.
func TestHypervisorSigtermMidStartVM(t *testing.T) {
	t.Parallel()
	ctx, e := newHVEnv(t, 3*time.Minute)
	pod := e.newPod(ctx, t, "shop", "web-0", nil)
	const grace = 2 * time.Second
	d := e.startReady(t, "--shutdown-grace", grace.String())
	id := sandboxID(11)
	sock, err := e.shim.CreateVM(ctx, id, pod.annotations(nil), pod.net.NSPath)
	require.NoError(t, err)

	started := e.startVMUntilCreateLands(ctx, t, id)
	e.door.reset()
	t0 := time.Now()
	d.stop(t) // SIGTERM; exit 0 required
	took := time.Since(t0)
	t.Logf("caa exited %s after SIGTERM (grace %s)", took.Round(time.Millisecond), grace)
	assert.Less(t, took, grace+10*time.Second, "the create in flight was abandoned within the grace")
	require.Error(t, <-started, "the shim's StartVM ends with caa")
	e.hold.on.Store(false)
	for kind, k := range e.door.counts() {
		assert.False(t, isEC2Write(kind), "cloud write after SIGTERM: %s x%d", kind, k)
	}
	first := instanceIDs(e.liveSandboxVMs(id))
	require.Len(t, first, 1, "the landed VM is left as it is")
	rec, _, err := e.readLedger(t, id)
	require.NoError(t, err)
	assert.Equal(t, ledger.SandboxCreating, rec.Phase, "the intent stays; the shutdown retired nothing")

	d = e.startReady(t)
	require.NoError(t, e.shim.StartVM(ctx, id), "failed boots: %v", e.fleet.Failed())
	assert.Equal(t, first, instanceIDs(e.sandboxVMs(id)), "the repeated StartVM got the VM the first create made (I1)")
	require.NoError(t, katafake.CheckAgent(ctx, sock))
	d.stop(t)
}

// startVMUntilCreateLands sends StartVM for id with the fake EC2's answer
// to the create held, and returns once the create has landed (the VM
// exists, caa has not heard so); the channel gets StartVM's outcome.
func (e *hvEnv) startVMUntilCreateLands(ctx context.Context, t *testing.T, id string) <-chan error {
	t.Helper()
	landed := e.hold.arm()
	started := make(chan error, 1)
	go func() { started <- e.shim.StartVM(ctx, id) }()
	select {
	case <-landed:
	case err := <-started:
		t.Fatalf("StartVM returned before its create landed: %v", err)
	case <-ctx.Done():
		t.Fatal("the create never reached the fake EC2")
	}
	return started
}
