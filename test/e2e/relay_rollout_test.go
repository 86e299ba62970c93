package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/relayd"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/mocks/cloud"
	katafake "github.com/caa-project/caa/test/mocks/kata"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// The shim's view in these tests: kata checks its agent every 5 s and
// fails the sandbox at the first miss; here every 150 ms, so a cut of a
// fraction of a second shows. A check unanswered within a second is a miss
// (a cut connection fails a call at once).
const (
	rollCheckPeriod  = 150 * time.Millisecond
	rollCheckTimeout = time.Second
)

// rollNode is a node for the relay rollout: its hvEnv (node namespace,
// cloud network, fake EC2, pod VM fleet), its `caa relay` process, the
// caa binary of the moment (generation gen), and the shims' side of its
// sandboxes.
type rollNode struct {
	*hvEnv
	relaySock string
	relay     *exec.Cmd
	relayLogs *cluster.SyncBuffer
	caa       *daemon
	gen       int

	ids   []string
	socks []string
	shims katafake.Shims // each sandbox's shim connection, in order
	vms   []*podvmfake.FleetVM
	// waited answers the node's long call (WaitProcess on its first
	// sandbox); stream runs through its second sandbox's socket.
	waited chan error
	stream *katafake.Stream
}

func newRollNode(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) *rollNode {
	t.Helper()
	n := &rollNode{hvEnv: newHVEnvOn(ctx, t, c, podvmfake.NewCloudNetwork(t), name), waited: make(chan error, 1)}
	n.relaySock = filepath.Join(n.dir, "relay.sock")
	return n
}

// startCaa starts the next generation of caa on the node (a new pod of
// the DaemonSet: its own pod name), with its agent sockets in the relay.
func (n *rollNode) startCaa(t *testing.T, extra ...string) *daemon {
	t.Helper()
	n.gen++
	args := append([]string{"--pod-name", fmt.Sprintf("caa-%s-v%d", n.node, n.gen), "--relay-socket", n.relaySock}, extra...)
	return n.start(t, args...)
}

// startRelay runs `caa relay` in the node's namespace (it dials the VMs
// there) once caa wrote its client file, and waits for its control socket.
func (n *rollNode) startRelay(ctx context.Context, t *testing.T) {
	t.Helper()
	n.relayLogs = &cluster.SyncBuffer{}
	n.relay = exec.Command(caaBin, "relay", "--socket", n.relaySock, "--log-format", "json") // caa writes its client file beside the socket
	n.relay.Stdout, n.relay.Stderr = n.relayLogs, n.relayLogs
	require.NoError(t, podvmfake.InNetNS(n.cn.NodeNS, n.relay.Start))
	t.Cleanup(func() {
		_ = n.relay.Process.Kill()
		_ = n.relay.Wait()
		if t.Failed() {
			t.Logf("caa relay on %s (last 40 lines):\n%s", n.node, tailLines(n.relayLogs.String(), 40))
		}
	})
	cl := &relayd.Client{Socket: n.relaySock}
	require.Eventually(t, func() bool { _, _, err := cl.List(ctx); return err == nil }, time.Minute, condPoll,
		"caa relay on %s serves its control socket", n.node)
}

// runSandboxes creates count pods and starts their sandboxes as kata's
// shim does (CreateVM, StartVM), all at once, and opens each shim's one
// agent connection.
func (n *rollNode) runSandboxes(ctx context.Context, t *testing.T, count int) {
	t.Helper()
	n.beginSandboxes(ctx, t, count)()
}

// beginSandboxes creates the pods and sends the shim's calls; the function
// it returns waits for the answers, checks them and opens the shims'
// connections (on the test's goroutine, so the nodes' sandboxes can start
// side by side).
func (n *rollNode) beginSandboxes(ctx context.Context, t *testing.T, count int) (finish func()) {
	t.Helper()
	base := len(n.ids)
	socks := make([]string, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := range count {
		id := sandboxID(base + i)
		n.ids = append(n.ids, id)
		pod := n.newPod(ctx, t, "roll", fmt.Sprintf("%s-p%d", n.node, base+i), nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			socks[i], errs[i] = n.shim.CreateVM(ctx, id, pod.annotations(nil), pod.net.NSPath)
			if errs[i] == nil {
				errs[i] = n.shim.StartVM(ctx, id)
			}
		}()
	}
	return func() {
		t.Helper()
		wg.Wait()
		n.openShims(ctx, t, base, socks, errs)
	}
}

// openShims checks the answers to the shim's calls for sandboxes base...
// and opens each one's shim connection.
func (n *rollNode) openShims(ctx context.Context, t *testing.T, base int, socks []string, errs []error) {
	t.Helper()
	for i := range socks {
		id := n.ids[base+i]
		require.NoError(t, errs[i], "sandbox %s on %s (failed boots: %v)", id, n.node, n.fleet.Failed())
		vms := n.liveSandboxVMs(id)
		require.Len(t, instanceIDs(vms), 1, "one VM for sandbox %s", id)
		vm := n.fleet.VM(vms[0].ID)
		require.NotNil(t, vm)
		n.vms = append(n.vms, vm)
		a, err := katafake.DialAgent(ctx, socks[i])
		require.NoError(t, err)
		t.Cleanup(func() { _ = a.Close() })
		n.shims.Agents = append(n.shims.Agents, a)
		n.socks = append(n.socks, socks[i])
	}
}

// load starts what the shims do while caa is upgraded: every sandbox's
// health check, one WaitProcess in flight (first sandbox) and one byte
// stream (second sandbox's socket), until ctx ends.
func (n *rollNode) load(ctx, checkCtx context.Context, t *testing.T) {
	t.Helper()
	n.shims.Check(checkCtx, rollCheckPeriod, rollCheckTimeout)
	cid := "c-" + n.node
	go func() {
		st, err := n.shims.Agents[0].WaitProcess(ctx, cid)
		if err == nil && st != 42 {
			err = fmt.Errorf("WaitProcess answered %d, want 42", st)
		}
		n.waited <- err
	}()
	require.NoError(t, n.vms[0].Agent.AwaitWaiting(ctx, cid), "%s: the long call reached the agent", n.node)
	s, err := katafake.StartStream(ctx, n.socks[1], podvmfake.StreamMagic, 4096, 2*time.Millisecond)
	require.NoError(t, err)
	n.stream = s
}

// surge is one node's step of a DaemonSet update with maxSurge 1: the new
// caa pod starts beside the old one, takes the ledger over and turns
// ready; then the controller deletes the old pod (SIGTERM).
func (n *rollNode) surge(t *testing.T) {
	t.Helper()
	old := n.caa
	next := n.startCaa(t)
	next.waitReady(t, func() {})
	next.waitHandover(t, health.HandoverDone, 30*time.Second)
	old.waitHandover(t, health.HandoverDone, 30*time.Second)
	old.stop(t)
	n.caa = next
}

// writes counts the cloud's creates and deletes so far.
func (n *rollNode) writes() (creates, deletes int) {
	c := n.core.Counters()
	return int(c[cloud.OpCreate]), int(c[cloud.OpDelete])
}

// settle ends the load and checks what the shims saw: no missed check,
// the long call completes once released, the stream loses no byte.
func (n *rollNode) settle(t *testing.T) (checks, misses int, streamed int64) {
	t.Helper()
	n.shims.Wait()
	checks, misses = n.shims.Counts()
	for i, a := range n.shims.Agents {
		m := a.Misses()
		assert.Zero(t, len(m), "%s sandbox %d: kata's health check never misses; the first misses: %v", n.node, i, m[:min(len(m), 3)])
	}
	require.True(t, n.vms[0].Agent.Release("c-"+n.node, 42), "%s: the long call is still in flight at the agent", n.node)
	require.NoError(t, <-n.waited, "%s: the long call completes", n.node)
	written, lost, err := n.stream.Finish(10 * time.Second)
	assert.NoError(t, err, "%s: the stream", n.node)
	assert.Zero(t, lost, "%s: stream bytes lost", n.node)
	assert.Positive(t, written)
	return checks, misses, written
}

// requireAdopted stops the node's caa and checks the ledger: every
// sandbox Running on its first VM, the file verifies, one live VM each.
func (n *rollNode) requireAdopted(t *testing.T) {
	t.Helper()
	n.caa.stop(t)
	for i, id := range n.ids {
		s, _, err := n.readLedger(t, id)
		require.NoError(t, err, "%s: sandbox %s recorded", n.node, id)
		assert.Equal(t, ledger.SandboxRunning, s.Phase, "%s: sandbox %s", n.node, id)
		vms := n.liveSandboxVMs(id)
		if assert.Len(t, instanceIDs(vms), 1, "%s: sandbox %s has its one VM", n.node, id) {
			assert.Equal(t, n.vms[i].InstanceID, vms[0].ID, "%s: sandbox %s keeps its first VM", n.node, id)
		}
	}
	assert.Len(t, n.core.Live(), len(n.ids), "%s: no other VM", n.node)
	assert.Contains(t, runCaa(t, "ledger", "verify", "--ledger", n.ledger), "ok")
}

// stallSpan runs during (if any) while the shims check, and returns the
// longest check-to-answer time any shim saw in it, with the span's length.
func stallSpan(nodes []*rollNode, during func()) (time.Duration, time.Duration) {
	for _, n := range nodes {
		n.shims.Longest() // a new window
	}
	start := time.Now()
	during()
	took := time.Since(start)
	var longest time.Duration
	for _, n := range nodes {
		longest = max(longest, n.shims.Longest())
	}
	return longest, took
}

// TestRelayRolloutKeepsEverySandbox (issue 21): a surge rolling update of
// the caa binary across three nodes with ten running sandboxes each, their
// agent sockets in `caa relay`. Each node's new caa starts beside the old,
// takes its ledger over and turns ready, then the old one ends; next node.
// Every shim health-checks its agent throughout, one WaitProcess per node
// is in flight and one byte stream per node runs. No check misses, no
// sandbox fails, every long call completes, no stream byte is lost, the
// cloud sees no create or delete, and every VM is adopted.
func TestRelayRolloutKeepsEverySandbox(t *testing.T) {
	t.Parallel()
	const nodes, perNode = 3, 10
	ctx := testContext(t, 4*time.Minute)
	c := cluster.Start(ctx, t)
	all := make([]*rollNode, nodes)
	for i := range all {
		all[i] = newRollNode(ctx, t, c, fmt.Sprintf("worker-%d", i+1))
	}
	for _, n := range all {
		n.caa = n.startCaa(t)
	}
	for _, n := range all {
		n.caa.waitReady(t, func() {})
		n.startRelay(ctx, t)
	}
	// The nodes' sandboxes start side by side, as a cluster's do.
	var finish []func()
	for _, n := range all {
		finish = append(finish, n.beginSandboxes(ctx, t, perNode))
	}
	for _, f := range finish {
		f()
	}
	checkCtx, stopChecks := context.WithCancel(ctx)
	defer stopChecks()
	for _, n := range all {
		n.load(ctx, checkCtx, t)
	}
	type counts struct{ creates, deletes int }
	before := make([]counts, nodes)
	for i, n := range all {
		before[i].creates, before[i].deletes = n.writes()
		assert.Equal(t, perNode, before[i].creates, "%s: one create per sandbox", n.node)
	}

	rollout, took := stallSpan(all, func() {
		for _, n := range all {
			n.surge(t)
		}
	})
	base, _ := stallSpan(all, func() { time.Sleep(took) }) // the same span's length with no hand-over
	stopChecks()

	var checks, misses int
	var streamed int64
	for i, n := range all {
		c, m, s := n.settle(t)
		checks, misses, streamed = checks+c, misses+m, streamed+s
		cr, de := n.writes()
		assert.Equal(t, before[i].creates, cr, "%s: no VM created during the rollout", n.node)
		assert.Equal(t, before[i].deletes, de, "%s: no VM deleted during the rollout", n.node)
		assert.Equal(t, 2, n.gen, "%s: one new caa", n.node)
	}
	for _, n := range all {
		n.requireAdopted(t)
	}
	t.Logf("%d nodes x %d sandboxes, surge rollout of caa in %s: %d checks, %d misses, %d stream bytes; "+
		"longest stall seen by a shim %s against %s over the same span without a hand-over (x%.2f; issue 21's bound x1.25)",
		nodes, perNode, took.Round(time.Millisecond), checks, misses, streamed, rollout, base, float64(rollout)/float64(base))
}

// TestRelayRolloutFaults (issue 21): on a node whose sandboxes' agent
// sockets are in `caa relay`, a broken new caa (its startup pass never
// finishes: the old caa takes the ledger back) and then a SIGKILL of the
// old caa in the middle of the next hand-over. The shims never miss a
// check, the long call completes, the stream loses no byte; the caa after
// the kill adopts every VM, with no cloud write and no VM leaked.
func TestRelayRolloutFaults(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	n := newRollNode(ctx, t, cluster.Start(ctx, t), "worker-1")
	n.caa = n.startCaa(t, "--handover-ready-timeout", "4s", "--sandbox-ready-timeout", "2s", "--boot-timeout", "3s")
	n.caa.waitReady(t, func() {})
	n.startRelay(ctx, t)
	n.runSandboxes(ctx, t, 3)
	checkCtx, stopChecks := context.WithCancel(ctx)
	defer stopChecks()
	n.load(ctx, checkCtx, t)
	creates, deletes := n.writes()

	// A broken new version: its listing of the node hangs (a door of its
	// own to the same fake EC2), so it never turns ready after the old
	// caa released the ledger to it; the old caa takes it back.
	broken := newFront(t, n.ec2)
	broken.hangList.Store(true)
	door := forward(t, n.cn.NodeNS, "127.0.0.1:0", "", strings.TrimPrefix(broken.url, "http://"))
	old := n.caa
	v2 := n.startCaa(t, "--aws-endpoint", "http://"+door, "--shutdown-grace", "1s")
	back := old.waitHandover(t, health.HandoverHandedBack, time.Minute)
	t.Logf("the broken caa: %s", back.Reason)
	old.waitReady(t, func() {})
	v2.stop(t)

	// The next version starts; the old caa is SIGKILLed once it released
	// the ledger: the new one finishes its start alone and adopts. Its
	// listing is held (a door of its own again) so that the kill falls
	// between the release and its readiness, however fast the hand-over;
	// the held call ends at its --cloud-timeout and is made again.
	slow := newFront(t, n.ec2)
	slow.hangList.Store(true)
	slowDoor := forward(t, n.cn.NodeNS, "127.0.0.1:0", "", strings.TrimPrefix(slow.url, "http://"))
	v3 := n.startCaa(t, "--aws-endpoint", "http://"+slowDoor, "--cloud-timeout", "2s")
	old.waitHandoverWith(t, health.HandoverUnderway, "v3", time.Minute, "the old caa released the ledger to the new one")
	old.kill(t)
	slow.hangList.Store(false)
	v3.waitReady(t, func() {})
	n.caa = v3
	assert.Equal(t, http.StatusOK, v3.readyz())
	// A few more checks per sandbox on the adopted relays.
	from := make([]int, len(n.shims.Agents))
	for i, a := range n.shims.Agents {
		from[i] = a.Checks()
	}
	require.Eventually(t, func() bool {
		for i, a := range n.shims.Agents {
			if a.Checks() < from[i]+3 {
				return false
			}
		}
		return true
	}, time.Minute, condPoll, "the shims go on checking")
	stopChecks()
	n.settle(t)
	cr, de := n.writes()
	assert.Equal(t, creates, cr, "no VM created by the broken caa, the kill or the adoption")
	assert.Equal(t, deletes, de, "no VM deleted")
	n.requireAdopted(t)
}
