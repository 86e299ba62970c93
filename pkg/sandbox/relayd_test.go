package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/pkg/relayd"
	"github.com/caa-project/caa/pkg/relayd/relaydtest"
	"github.com/caa-project/caa/test/mocks/cloud"
	katafake "github.com/caa-project/caa/test/mocks/kata"
)

// daemonRig is caa (a Manager over a real ledger file and the memory
// cloud) with its agent sockets in a relay daemon (relayd.Server on its
// control socket) that reaches a fake forwarder over real mutual TLS.
type daemonRig struct {
	t       *testing.T
	path    string
	cloud   *cloud.Cloud
	prov    provider.Provider
	pods    *fakePods
	fake    *fakeSide
	ca      *pki.CA
	caDir   string
	sockDir string
	client  *relayd.Client
	fw      *relaydtest.Forwarder

	daemonStop func()        // ends the relay daemon (its own shutdown)
	fresh      time.Duration // RelaydSide.Fresh of each caa started

	led  *ledger.Ledger
	m    *Manager
	side *RelaydSide
	stop context.CancelFunc
}

const (
	sbHealth = "sb-health"
	sbStream = "sb-stream"
)

func newDaemonRig(t *testing.T) *daemonRig {
	t.Helper()
	return newDaemonRigFor(t, VMName("web", sbHealth), VMName("feed", sbStream))
}

// newDaemonRigFor is a daemonRig whose forwarder's certificate names the
// given VMs.
func newDaemonRigFor(t *testing.T, vmNames ...string) *daemonRig {
	t.Helper()
	r := &daemonRig{t: t, path: filepath.Join(t.TempDir(), "ledger.db"), caDir: t.TempDir(),
		cloud: cloud.New(cloud.Options{IDPrefix: "vm-", KeepTerminated: time.Hour}),
		pods:  &fakePods{pods: map[string]*reconcile.Pod{}}, fake: newFakeSide()}
	r.prov = newMemory(r.cloud)
	var err error
	r.ca, err = pki.LoadOrCreateCA(r.caDir)
	require.NoError(t, err)
	require.NoError(t, relayd.WriteClientFile(r.caDir, r.ca))
	// Unix socket paths are capped at 108 bytes: a short directory.
	r.sockDir, err = os.MkdirTemp("", "sb")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(r.sockDir) })
	// One forwarder plays every VM: its certificate names each VM.
	r.fw = relaydtest.StartForwarder(t, r.ca, vmNames...)
	r.startDaemon()
	t.Cleanup(func() { r.stopDaemon() })
	ctl := filepath.Join(r.sockDir, "relay.sock")
	r.client = &relayd.Client{Socket: ctl}
	r.start(r.prov)
	t.Cleanup(func() { r.kill() })
	return r
}

// startDaemon starts a relay daemon on the control socket.
func (r *daemonRig) startDaemon() {
	r.t.Helper()
	srv, err := relayd.NewServer(relayd.Config{
		ClientFile: filepath.Join(r.caDir, relayd.ClientFile), DialTimeout: 2 * time.Second,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", r.fw.Addr())
		},
	})
	require.NoError(r.t, err)
	ln, err := relayd.Listen(filepath.Join(r.sockDir, "relay.sock"))
	require.NoError(r.t, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, ln) }()
	r.daemonStop = func() { stop(); <-done }
}

func (r *daemonRig) stopDaemon() {
	if r.daemonStop != nil {
		r.daemonStop()
		r.daemonStop = nil
	}
}

// start is a caa process starting on the ledger: a new manager, a new
// RelaydSide, and the startup Sync.
func (r *daemonRig) start(prov provider.Provider) {
	r.t.Helper()
	led, err := ledger.Open(ledger.Options{Path: r.path, Node: "node-1", Cluster: "c1", Timeout: time.Second})
	require.NoError(r.t, err)
	ctx, stop := context.WithCancel(context.Background())
	r.led, r.stop = led, stop
	r.side = &RelaydSide{PodSide: r.fake, Client: r.client, Fresh: r.fresh}
	r.m = New(Config{
		Ledger: led, Provider: prov, Pods: r.pods, Side: r.side,
		Spec:    provider.SpecConfig{DefaultType: "small", DefaultImage: "podvm-image", Types: []provider.InstanceType{{Name: "small", VCPUs: 1, MemoryMiB: 2048}}},
		Cluster: "c1", Node: "node-1", NodeIP: net.ParseIP("192.0.2.10"), SocketDir: r.sockDir,
		Poll: 5 * time.Millisecond, StartTimeout: 5 * time.Second, PodWait: 200 * time.Millisecond,
		ConfirmMissing: time.Hour, Stop: ctx,
	})
}

// shutdown is caa's graceful exit (SIGTERM): Close, which must leave the
// daemon's relays serving.
func (r *daemonRig) shutdown() {
	if r.m == nil {
		return
	}
	r.stop()
	r.m.Wait()
	r.m.Close()
	_ = r.led.Close()
	r.m = nil
}

// kill is SIGKILL: nothing runs on the way out (the bbolt file is closed
// only so the next process of this test can open it).
func (r *daemonRig) kill() {
	if r.m == nil {
		return
	}
	r.stop()
	r.m.Wait()
	_ = r.led.Close()
	r.m = nil
}

// adopt is the restarted caa's startup: Sync serves every running sandbox
// again (through the daemon: same arguments, connections kept), then the
// daemon's List is reconciled against the ledger.
func (r *daemonRig) adopt(ctx context.Context) Report {
	r.t.Helper()
	rep, err := r.m.Sync(ctx, 5*time.Second)
	require.NoError(r.t, err)
	_, err = r.side.Reconcile(ctx, r.led)
	require.NoError(r.t, err)
	return rep
}

func (r *daemonRig) run(ctx context.Context, id, pod string) string {
	r.t.Helper()
	r.pods.add(&reconcile.Pod{UID: "uid-" + pod, Namespace: "team", Name: pod, RuntimeClass: "kata-remote", Annotations: map[string]string{}})
	sock, err := r.m.CreateVM(ctx, id, shimAnnotations(pod), "/var/run/netns/"+pod)
	require.NoError(r.t, err)
	require.NoError(r.t, r.m.StartVM(ctx, id))
	return sock
}

// TestRelayDaemonCarriesShimsThroughCaaRestarts: with the agent sockets in
// the relay daemon, a graceful restart of caa, a SIGKILL of caa and a new
// caa that fails at start all leave the shim's connection working: kata's
// health check never misses, a WaitProcess in flight throughout completes,
// a byte stream loses no byte. It reports the longest stall the shim sees
// in a window with a restart against a window without.
func TestRelayDaemonCarriesShimsThroughCaaRestarts(t *testing.T) {
	r := newDaemonRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sock := r.run(ctx, sbHealth, "web")
	streamSock := r.run(ctx, sbStream, "feed")

	conn, err := net.Dial("unix", sock)
	require.NoError(t, err)
	agent := katafake.NewAgent(conn)
	defer agent.Close()
	waited := make(chan error, 1)
	go func() {
		st, err := agent.WaitProcess(ctx, "c1")
		if err == nil && st != 137 {
			err = fmt.Errorf("WaitProcess answered %d, want 137", st)
		}
		waited <- err
	}()
	require.NoError(t, r.fw.Agent.AwaitWaiting(ctx, "c1"))
	stream, err := katafake.StartStream(ctx, streamSock, relaydtest.StreamMagic, 4096, time.Millisecond)
	require.NoError(t, err)

	// kata checks every 5 s; here every 20 ms. The timeout is generous
	// for a loaded test machine: a cut connection fails a call at once.
	const period, timeout = 20 * time.Millisecond, time.Second
	hctx, hstop := context.WithCancel(ctx)
	hdone := make(chan struct{})
	go func() { defer close(hdone); agent.HealthCheck(hctx, period, timeout) }()
	// Windows of the same length, each of at least a few checks.
	window := func(what string, during func()) time.Duration {
		start := time.Now()
		agent.Longest() // a new window
		before := agent.Checks()
		during()
		eventually(t, func() bool { return agent.Checks() >= before+10 }, what+": ten more checks")
		if rest := 400*time.Millisecond - time.Since(start); rest > 0 {
			time.Sleep(rest) // the window's length, not a synchronisation
		}
		return agent.Longest()
	}

	// Three rounds of four windows: the per-kind median of the longest
	// stall evens out a loaded machine's scheduling noise.
	stalls := map[string][]time.Duration{}
	for range 3 {
		stalls["no restart"] = append(stalls["no restart"], window("no restart", func() {}))
		stalls["graceful restart"] = append(stalls["graceful restart"], window("graceful restart", func() {
			r.shutdown()
			r.start(r.prov)
			rep := r.adopt(ctx)
			assert.ElementsMatch(t, []string{sbHealth, sbStream}, rep.Served)
		}))
		stalls["SIGKILL"] = append(stalls["SIGKILL"], window("SIGKILL", func() {
			r.kill()
			r.start(r.prov)
			rep := r.adopt(ctx)
			assert.ElementsMatch(t, []string{sbHealth, sbStream}, rep.Served)
		}))
		stalls["broken new caa"] = append(stalls["broken new caa"], window("broken new caa", func() {
			r.kill()
			r.start(failingList{r.prov})
			_, err := r.m.Sync(ctx, time.Second)
			require.Error(t, err, "the broken caa fails at start")
			r.shutdown() // and exits
			r.start(r.prov)
			r.adopt(ctx)
		}))
	}
	hstop()
	<-hdone
	checks, misses := agent.Checks(), agent.Misses()
	assert.Zero(t, len(misses), "kata's health check must never miss; the first misses: %v", misses[:min(len(misses), 3)])
	assert.Greater(t, checks, 120)

	require.True(t, r.fw.Agent.Release("c1", 137), "the WaitProcess is still in flight at the agent")
	require.NoError(t, <-waited)
	total, lost, err := stream.Finish(10 * time.Second)
	require.NoError(t, err)
	assert.Zero(t, lost, "stream bytes lost")
	assert.Greater(t, total, int64(0))

	entries, _, err := r.client.List(ctx)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	assert.Equal(t, 1, entries[0].Open, "the shim's one connection, never reconnected")
	assert.Zero(t, r.cloud.Counters()[cloud.OpCreate]-2, "no VM was created by the restarts")
	base := median(stalls["no restart"])
	msg := fmt.Sprintf("longest stall seen by the shim (median of 3 windows): no restart %s", base)
	for _, kind := range []string{"graceful restart", "SIGKILL", "broken new caa"} {
		d := median(stalls[kind])
		msg += fmt.Sprintf("; %s %s (x%.2f)", kind, d, float64(d)/float64(base))
	}
	t.Logf("%s; %d checks, %d stream bytes", msg, checks, total)
}

// failingList is a cloud that cannot list: a new caa that fails at start.
type failingList struct{ provider.Provider }

func (failingList) List(context.Context, provider.Selector) ([]provider.VM, error) {
	return nil, errors.New("listing refused (a broken new caa)")
}

// StopVM, a VM that dies and a sandbox that ended while caa was down all
// close the daemon's socket, so kata fails that sandbox.
func TestRelayDaemonSocketClosesWhenTheSandboxEnds(t *testing.T) {
	r := newDaemonRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sock := r.run(ctx, sbHealth, "web")
	streamSock := r.run(ctx, sbStream, "feed")

	// The VM dies behind caa's back: the next sync loses the sandbox.
	shim := mustDial(t, streamSock)
	_, err := shim.Write(relaydtest.StreamMagic)
	require.NoError(t, err)
	require.NoError(t, r.cloud.Kill(r.sandbox(sbStream).VMID))
	rep, err := r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.Equal(t, []string{sbStream}, rep.Lost)
	_, err = os.Stat(streamSock)
	assert.ErrorIs(t, err, os.ErrNotExist, "a lost VM's socket is closed")
	require.NoError(t, shim.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = io.Copy(io.Discard, shim)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the shim's connection ends (EOF or reset), it does not hang: %v", err)

	// StopVM.
	cl := ttrpc.NewClient(mustDial(t, sock))
	defer cl.Close()
	_, err = agentproto.Check(ctx, cl)
	require.NoError(t, err)
	require.NoError(t, r.m.StopVM(ctx, sbHealth))
	// The relay goes after StopVM's answer, in the background.
	eventually(t, func() bool { _, err := agentproto.Check(ctx, cl); return err != nil }, "StopVM's release closes the shim's connection")
	eventually(t, func() bool { entries, _, err := r.client.List(ctx); return err == nil && len(entries) == 0 }, "the daemon serves no socket")

	// A sandbox whose StopVM completed while caa was down keeps its socket
	// in the daemon until the next caa reconciles: simulate the crash after
	// the ledger moved on by serving it behind caa's back.
	eventually(t, func() bool { _, err := r.led.GetSandbox(sbHealth); return err != nil }, "the stopped sandbox's record goes")
	_, err = r.client.Serve(ctx, sbHealth, sock, "192.0.2.99:15150", "x")
	require.NoError(t, err)
	_, err = r.client.Serve(ctx, sbStream, streamSock, "192.0.2.97:15150", "z") // Lost in the ledger
	require.NoError(t, err)
	_, err = r.client.Serve(ctx, "sb-unknown", filepath.Join(r.sockDir, "sb-unknown", "agent.ttrpc"), "192.0.2.98:15150", "y")
	require.NoError(t, err)
	r.kill()
	r.start(r.prov)
	r.adopt(ctx)
	entries, _, err := r.client.List(ctx)
	require.NoError(t, err)
	var left []string
	for _, e := range entries {
		left = append(left, e.Sandbox)
	}
	assert.Equal(t, []string{"sb-unknown"}, left, "the sockets of the stopped and the lost sandbox are stopped; one the ledger never knew is left (no evidence)")
}

func (r *daemonRig) sandbox(id string) ledger.Sandbox {
	r.t.Helper()
	s, err := r.led.GetSandbox(id)
	require.NoError(r.t, err)
	return s
}

func mustDial(t *testing.T, sock string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", sock)
	require.NoError(t, err)
	return c
}

// A restart of the daemon itself loses the connections of that moment
// (said in the docs), and caa serves every socket again (Keep sees the new
// boot id): the socket comes back and a new connection works.
func TestDaemonRestartIsServedAgain(t *testing.T) {
	r := newDaemonRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sock := r.run(ctx, sbHealth, "web")
	_, boot, err := r.client.List(ctx)
	require.NoError(t, err)
	cl := ttrpc.NewClient(mustDial(t, sock))
	defer cl.Close()
	_, err = agentproto.Check(ctx, cl)
	require.NoError(t, err)

	r.stopDaemon()
	_, err = agentproto.Check(ctx, cl)
	require.Error(t, err, "the daemon's restart cuts the shim's connection")
	_, err = os.Stat(sock)
	require.ErrorIs(t, err, os.ErrNotExist)
	r.startDaemon()

	r.side.keepOnce(ctx)
	entries, boot2, err := r.client.List(ctx)
	require.NoError(t, err)
	assert.NotEqual(t, boot, boot2, "a new daemon run")
	require.Len(t, entries, 1, "caa served the sandbox again")
	assert.Equal(t, sbHealth, entries[0].Sandbox)
	_, err = agentproto.Check(ctx, ttrpc.NewClient(mustDial(t, sock)))
	require.NoError(t, err, "a new shim connection reaches the agent")
}

// A StopVM in a new caa of a sandbox whose relay an earlier caa registered
// (the new caa holds no relay for it yet) still stops the daemon's socket,
// within one Keep period.
func TestStopVMAfterRestartStopsTheDaemonsSocket(t *testing.T) {
	r := newDaemonRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sock := r.run(ctx, sbHealth, "web")
	r.kill()
	r.start(r.prov) // no Sync yet: this caa holds no relay of the sandbox
	kctx, kstop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.side.Keep(kctx, 10*time.Millisecond, r.led) }()
	defer func() { kstop(); <-done }()
	eventually(t, func() bool { return r.side.rounds.Load() >= 2 }, "Keep's first rounds (the startup reconciliation) are done")
	require.NoError(t, r.m.StopVM(ctx, sbHealth)) // this caa had no relay to close
	eventually(t, func() bool { _, err := os.Stat(sock); return errors.Is(err, os.ErrNotExist) }, "Keep stops the socket of the stopped sandbox")
}

// TestRollingRestartKeepsEverySandbox is the rollout in process:
// three nodes (each its own ledger, relay daemon and forwarder) with ten
// running sandboxes each; caa is restarted node by node (one graceful, one
// SIGKILL, one graceful) while every sandbox's shim health-checks its agent
// and has a WaitProcess in flight. No check misses, no sandbox fails, every
// wait completes, no VM is created; the longest stall in the rollout is
// logged against the same span without it.
func TestRollingRestartKeepsEverySandbox(t *testing.T) {
	const nodes, perNode = 3, 10
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type shim struct {
		node   int
		id     string
		agent  *katafake.Agent
		waited chan error
	}
	rigs := make([]*daemonRig, nodes)
	var shims []*shim
	hctx, hstop := context.WithCancel(ctx)
	var hwg sync.WaitGroup
	for n := range nodes {
		var names []string
		for i := range perNode {
			names = append(names, VMName(fmt.Sprintf("p%d", i), fmt.Sprintf("sb-%d-%d", n, i)))
		}
		r := newDaemonRigFor(t, names...)
		rigs[n] = r
		for i := range perNode {
			id := fmt.Sprintf("sb-%d-%d", n, i)
			sock := r.run(ctx, id, fmt.Sprintf("p%d", i))
			s := &shim{node: n, id: id, agent: katafake.NewAgent(mustDial(t, sock)), waited: make(chan error, 1)}
			t.Cleanup(func() { s.agent.Close() })
			go func() {
				st, err := s.agent.WaitProcess(ctx, "c-"+id)
				if err == nil && st != 3 {
					err = fmt.Errorf("WaitProcess answered %d", st)
				}
				s.waited <- err
			}()
			require.NoError(t, r.fw.Agent.AwaitWaiting(ctx, "c-"+id))
			hwg.Add(1)
			go func() { defer hwg.Done(); s.agent.HealthCheck(hctx, 50*time.Millisecond, time.Second) }()
			shims = append(shims, s)
		}
	}
	longest := func() time.Duration {
		var d time.Duration
		for _, s := range shims {
			d = max(d, s.agent.Longest())
		}
		return d
	}
	checks := func() int {
		n := 0
		for _, s := range shims {
			n += s.agent.Checks()
		}
		return n
	}
	accepted := func() int {
		n := 0
		for _, r := range rigs {
			n += r.fw.Accepted()
		}
		return n
	}
	// span returns the longest stall in a span of a second and the CPU the
	// test process used in it.
	span := func(what string, during func()) (time.Duration, time.Duration) {
		start, cpu0 := time.Now(), cpuTime(t)
		longest() // reset
		before := checks()
		during()
		eventually(t, func() bool { return checks() >= before+3*len(shims) }, what+": three more checks per sandbox")
		if rest := time.Second - time.Since(start); rest > 0 {
			time.Sleep(rest) // the span's length, not a synchronisation
		}
		return longest(), cpuTime(t) - cpu0
	}
	// Spans with and without a rollout alternate, so the machine's other
	// load weighs on both alike; the medians are compared.
	var bases, rollouts, baseCPU, rolloutCPU []time.Duration
	probes := 0
	for round := range 3 {
		d, cpu := span("no rollout", func() {})
		bases, baseCPU = append(bases, d), append(baseCPU, cpu)
		d, cpu = span("rollout", func() {
			before := accepted()
			for n, r := range rigs {
				if (n+round)%3 == 1 {
					r.kill()
				} else {
					r.shutdown()
				}
				r.start(r.prov)
				rep := r.adopt(ctx)
				assert.Len(t, rep.Served, perNode, "node %d: every sandbox served again", n)
				assert.Empty(t, rep.Lost)
			}
			probes += accepted() - before
		})
		rollouts, rolloutCPU = append(rollouts, d), append(rolloutCPU, cpu)
	}
	assert.Zero(t, probes, "the restarted caa counts the shims' live traffic as reach: no handshake of its own")
	hstop()
	hwg.Wait()
	misses := 0
	for _, s := range shims {
		m := s.agent.Misses()
		misses += len(m)
		assert.Empty(t, m, "sandbox %s: kata's health check never misses", s.id)
		require.True(t, rigs[s.node].fw.Agent.Release("c-"+s.id, 3), "sandbox %s: its WaitProcess is still in flight", s.id)
		require.NoError(t, <-s.waited, "sandbox %s", s.id)
	}
	for n, r := range rigs {
		all, err := r.led.ListSandboxes()
		require.NoError(t, err)
		for _, sb := range all {
			assert.Equal(t, ledger.SandboxRunning, sb.Phase, "node %d sandbox %s", n, sb.ID)
		}
		assert.EqualValues(t, perNode, r.cloud.Counters()[cloud.OpCreate], "node %d: no VM created by the rollout", n)
	}
	base, rollout := median(bases), median(rollouts)
	t.Logf("%d nodes x %d sandboxes, rollout one node at a time: %d misses, %d checks; longest stall (median of 3 spans of 1 s) %s against %s without the rollout (x%.2f); spans %v against %v; CPU used per span %v against %v",
		nodes, perNode, misses, checks(), rollout, base, float64(rollout)/float64(base), rollouts, bases, rolloutCPU, baseCPU)
}

func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// cpuTime is the CPU (user and system) the test process used so far.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// entry is the daemon's List entry of a sandbox.
func (r *daemonRig) entry(ctx context.Context, id string) relayd.Entry {
	r.t.Helper()
	entries, _, err := r.client.List(ctx)
	require.NoError(r.t, err)
	for _, e := range entries {
		if e.Sandbox == id {
			return e
		}
	}
	r.t.Fatalf("the relay daemon does not serve sandbox %s", id)
	return relayd.Entry{}
}

// A restarted caa counts a kept relay reachable with no probe when its VM
// answered the shim lately; it never does on stale evidence: a VM that went
// silent is probed once its last word is older than the window, and a
// killed VM's closed connection is no evidence at all. Either way the probe
// finds it unreachable and the sandbox stays pending.
func TestKeptRelayIsReachableOnRecentTrafficOnly(t *testing.T) {
	setup := func(t *testing.T, fresh time.Duration) (*daemonRig, context.Context, *ttrpc.Client) {
		r := newDaemonRigFor(t, VMName("web", sbHealth))
		r.fresh = fresh
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		r.kill()
		r.start(r.prov)
		sock := r.run(ctx, sbHealth, "web")
		cl := ttrpc.NewClient(mustDial(t, sock))
		t.Cleanup(func() { cl.Close() })
		_, err := agentproto.Check(ctx, cl)
		require.NoError(t, err)
		return r, ctx, cl
	}
	restart := func(r *daemonRig, ctx context.Context) Report {
		r.kill()
		r.start(r.prov)
		rep, err := r.m.Sync(ctx, 300*time.Millisecond)
		require.NoError(t, err)
		return rep
	}

	t.Run("recent traffic, no probe", func(t *testing.T) {
		r, ctx, cl := setup(t, FreshWindow)
		_, err := agentproto.Check(ctx, cl)
		require.NoError(t, err)
		accepted := r.fw.Accepted()
		rep := restart(r, ctx)
		assert.Equal(t, []string{sbHealth}, rep.Served)
		assert.Equal(t, accepted, r.fw.Accepted(), "no handshake of caa's own: the shim's traffic was the proof")
		_, err = agentproto.Check(ctx, cl)
		require.NoError(t, err)
	})
	t.Run("a silent VM is probed once its word is stale", func(t *testing.T) {
		const fresh = 200 * time.Millisecond
		r, ctx, _ := setup(t, fresh)
		r.fw.Silence()
		eventually(t, func() bool { return r.entry(ctx, sbHealth).HeardAgo > fresh }, "the VM's last word ages past the window")
		require.Equal(t, 1, r.entry(ctx, sbHealth).Open, "the shim's connection is still open, only silent")
		accepted := r.fw.Accepted()
		rep := restart(r, ctx)
		assert.Empty(t, rep.Served)
		assert.Contains(t, rep.Pending, sbHealth, "probed and found unreachable")
		assert.Equal(t, accepted, r.fw.Accepted(), "the silent VM took no new connection")
	})
	t.Run("a killed VM's closed connection is no evidence", func(t *testing.T) {
		r, ctx, _ := setup(t, time.Hour)
		r.fw.Close()
		eventually(t, func() bool { return r.entry(ctx, sbHealth).Open == 0 }, "the relay sees the VM's connection end")
		rep := restart(r, ctx)
		assert.Empty(t, rep.Served)
		assert.Contains(t, rep.Pending, sbHealth, "probed and found unreachable, however recent its last word")
	})
}

// The same race with the relay daemon: a StopVM during StartVM's tunnel
// step must not leave the daemon serving the sandbox, and Keep must not
// serve it again (before the fix: stopped by Reconcile and served again by
// keepOnce every period, for ever).
func TestStopVMDuringStartVMLeavesNothingInTheDaemon(t *testing.T) {
	r := newDaemonRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.pods.add(&reconcile.Pod{UID: "uid-web", Namespace: "team", Name: "web", RuntimeClass: "kata-remote", Annotations: map[string]string{}})
	sock, err := r.m.CreateVM(ctx, sbHealth, shimAnnotations("web"), "/var/run/netns/web")
	require.NoError(t, err)
	reached, release := holdAt(r.fake, "tunnel")
	started := make(chan error, 1)
	go func() { started <- r.m.StartVM(ctx, sbHealth) }()
	<-reached
	require.NoError(t, r.m.StopVM(ctx, sbHealth))
	close(release)
	require.Error(t, <-started)

	served := func() []string {
		entries, _, err := r.client.List(ctx)
		require.NoError(t, err)
		var ids []string
		for _, e := range entries {
			ids = append(ids, e.Sandbox)
		}
		return ids
	}
	assert.Empty(t, served(), "the daemon serves nothing for the stopped sandbox")
	kctx, kstop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.side.Keep(kctx, time.Millisecond, r.led) }()
	eventually(t, func() bool { return r.side.rounds.Load() >= 5 }, "five Keep rounds")
	kstop()
	<-done
	assert.Empty(t, served(), "Keep does not serve it again")
	_, err = os.Stat(sock)
	assert.ErrorIs(t, err, os.ErrNotExist, "no agent socket for the stopped sandbox")
}

// dirs lists the sandbox directories under the socket directory.
func (r *daemonRig) dirs() []string {
	r.t.Helper()
	ents, err := os.ReadDir(r.sockDir)
	require.NoError(r.t, err)
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// Each sandbox's socket directory goes with the sandbox: StopVM, a lost
// VM, a pod gone.
func TestSocketDirectoriesGoWithTheirSandboxes(t *testing.T) {
	r := newDaemonRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.run(ctx, sbHealth, "web")
	r.run(ctx, sbStream, "feed")
	assert.ElementsMatch(t, []string{sbHealth, sbStream}, r.dirs())

	require.NoError(t, r.m.StopVM(ctx, sbHealth))
	eventually(t, func() bool { return slices.Equal([]string{sbStream}, r.dirs()) }, "StopVM's release removes the stopped sandbox's directory")
	require.NoError(t, r.cloud.Kill(r.sandbox(sbStream).VMID))
	rep, err := r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	require.Equal(t, []string{sbStream}, rep.Lost)
	assert.Empty(t, r.dirs(), "a lost sandbox's directory goes with its socket")
	eventually(t, func() bool { _, err := r.led.GetSandbox(sbHealth); return err != nil }, "the stopped record goes")
	assert.Empty(t, r.dirs())
}

// countWarnings counts the warnings logged through it.
type countWarnings struct {
	slog.Handler
	n *atomic.Int64
}

func (c countWarnings) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Level == slog.LevelWarn {
		c.n.Add(1)
	}
	return nil
}

func (c countWarnings) Enabled(context.Context, slog.Level) bool { return true }

// A socket the ledger never had is warned about once, not every round of
// Keep (every 5 s for ever before), and again only if it comes back.
func TestReconcileWarnsOnceAboutAStrangeSocket(t *testing.T) {
	r := newDaemonRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var warned atomic.Int64
	r.side.Log = slog.New(countWarnings{Handler: slog.DiscardHandler, n: &warned})
	stranger := filepath.Join(r.sockDir, "sb-stranger", "agent.ttrpc")
	_, err := r.client.Serve(ctx, "sb-stranger", stranger, "192.0.2.98:15150", "y")
	require.NoError(t, err)
	for range 5 {
		stopped, err := r.side.Reconcile(ctx, r.led)
		require.NoError(t, err)
		assert.Empty(t, stopped, "no evidence: left serving")
	}
	assert.EqualValues(t, 1, warned.Load(), "one warning for five rounds")

	require.NoError(t, r.client.Stop(ctx, "sb-stranger"))
	_, err = r.side.Reconcile(ctx, r.led)
	require.NoError(t, err)
	_, err = r.client.Serve(ctx, "sb-stranger", stranger, "192.0.2.98:15150", "y")
	require.NoError(t, err)
	_, err = r.side.Reconcile(ctx, r.led)
	require.NoError(t, err)
	assert.EqualValues(t, 2, warned.Load(), "warned again when it is served again")
}
