package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/relayd"
	"github.com/caa-project/caa/pkg/sandbox"
	katafake "github.com/caa-project/caa/test/mocks/kata"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// S9 is issue 21's rollout, measured: a surge rolling update of the caa
// binary across three nodes with ten running sandboxes each, their agent
// sockets in `caa relay`, while every sandbox's shim health-checks its
// agent on its one connection. The stall a shim sees (the longest time
// between a health check and its answer) across the rollout is set against
// the same figure over a span of the same length with no hand-over.
const (
	s9Nodes, s9PerNode = 3, 10
	// kata checks every 5 s; the bench every 150 ms, so that a rollout of
	// a few seconds holds many checks per shim. A check unanswered within
	// a second counts as a miss (kata fails the sandbox at the first).
	s9CheckPeriod, s9CheckTimeout = 150 * time.Millisecond, time.Second
	// s9StreamChunk bytes are written to each node's stream every
	// s9StreamEvery.
	s9StreamChunk, s9StreamEvery = 4096, 2 * time.Millisecond
	s9MaxRatio                   = 1.25 // issue 21's target for the stall
)

// s9Node is one node: its cloud network, fake EC2, pod VM fleet, relay
// daemon and caa of the moment (an s8Node, whose shim starts sandboxes).
type s9Node struct {
	*s8Node
	fleet     *podvmfake.Fleet
	relaySock string
	relay     *exec.Cmd
	relayDone chan error
	gen       int
	sbs       []s8Sandbox
	shims     katafake.Shims // each sandbox's shim connection, in order
	vms       []*podvmfake.FleetVM
}

func (b *bench) s9(ctx context.Context) (sc Scenario, err error) {
	sc = Scenario{ID: "S9", Title: "surge rolling update of caa with the agent sockets in caa relay: what kata's shims see",
		Setup: fmt.Sprintf("%d nodes, each a network namespace with its own cloud network, fake EC2 (behind caa's EC2 provider, no injected latency) and fake pod VMs "+
			"(test/mocks/podvm), one real apiserver; per node a `caa relay` process and the caa binary in the remote hypervisor mode with `--relay-socket`, "+
			"%d sandboxes started by a fake kata shim (CreateVM, StartVM). Each sandbox's shim keeps one connection to its agent socket and health-checks "+
			"the agent every %s (kata: 5 s; a check unanswered in %s is a miss); each node has one WaitProcess in flight and one byte stream "+
			"(%d bytes every %s, echoed by the fake forwarder). A run is one rolling update as the DaemonSet does it with maxSurge 1: node by node, a "+
			"new caa pod (same binary: the EC2-only build an AWS node runs, when the bench builds caa; another pod name) starts beside the old one, takes the ledger over, turns ready, and the old one is stopped (SIGTERM). "+
			"The stall is the longest check-to-answer time any shim saw during the rollout; the bound is the same figure over a span of the same "+
			"length right after it, with no hand-over (median over the runs). %d run(s).",
			s9Nodes, s9PerNode, s9CheckPeriod, s9CheckTimeout, s9StreamChunk, s9StreamEvery, b.count)}
	if b.notRoot(&sc, "S9") {
		return sc, nil
	}
	h := &nsHarness{}
	defer h.cleanup()
	defer recoverHarness(&err)
	e, err := newEnv(ctx, filepath.Join(b.dir, "s9"), b.logf)
	if err != nil {
		return sc, err
	}
	defer e.close()
	fctx, stopFleets := context.WithCancel(ctx)
	defer stopFleets()

	nodes := make([]*s9Node, s9Nodes)
	for i := range nodes {
		n, cleanup, err := b.s9Node(fctx, h, e, i)
		defer cleanup()
		if err != nil {
			return sc, err
		}
		nodes[i] = n
	}
	// The sandboxes of the nodes start side by side.
	errs := make(chan error, s9Nodes)
	for _, n := range nodes {
		go func() { errs <- n.startSandboxes(ctx, h) }()
	}
	for range nodes {
		if err := <-errs; err != nil {
			return sc, err
		}
	}
	checkCtx, stopChecks := context.WithCancel(ctx)
	defer func() {
		stopChecks()
		for _, n := range nodes {
			n.shims.Wait()
			n.shims.Close()
		}
	}()
	for _, n := range nodes {
		n.shims.Check(checkCtx, s9CheckPeriod, s9CheckTimeout)
	}

	c := fmt.Sprintf("%d nodes x %d sandboxes", s9Nodes, s9PerNode)
	stall := Row{Case: c, Metric: "longest stall seen by a shim, across the rollout", Unit: "ms", MaxRatio: s9MaxRatio}
	base := Row{Case: c, Metric: "longest stall, same span without a hand-over", Unit: "ms"}
	bare := Row{Case: c, Metric: "longest stall, same span with a bare start of the same binary per node (`caa version`) and no hand-over", Unit: "ms"}
	took := Row{Case: c, Metric: "rollout (3 hand-overs, the old caa stopped)", Unit: "ms"}
	misses := Row{Case: c, Metric: "missed health checks", Unit: "checks", HasLimit: true, AtMost: true, EveryRun: true}
	failed := Row{Case: c, Metric: "failed sandboxes", Unit: "sandboxes", HasLimit: true, AtMost: true, EveryRun: true}
	waits := Row{Case: c, Metric: "long calls (WaitProcess) completed", Unit: "calls", HasLimit: true, Limit: s9Nodes, EveryRun: true}
	lost := Row{Case: c, Metric: "stream bytes lost", Unit: "bytes", HasLimit: true, AtMost: true, EveryRun: true}
	writes := Row{Case: c, Metric: "cloud creates and deletes during the rollout", Unit: "calls", HasLimit: true, AtMost: true, EveryRun: true}
	var streamed, checked int64
	for run := range b.count {
		r, err := b.s9Run(ctx, nodes, run)
		if err != nil {
			return sc, fmt.Errorf("run %d: %w", run+1, err)
		}
		stall.Runs = append(stall.Runs, ms(r.stall))
		base.Runs = append(base.Runs, ms(r.base))
		bare.Runs = append(bare.Runs, ms(r.exec))
		took.Runs = append(took.Runs, ms(r.took))
		misses.Runs = append(misses.Runs, float64(r.misses))
		failed.Runs = append(failed.Runs, float64(r.failed))
		waits.Runs = append(waits.Runs, float64(r.waits))
		lost.Runs = append(lost.Runs, float64(r.lost))
		writes.Runs = append(writes.Runs, float64(r.writes))
		streamed += r.streamed
		checked += int64(r.checks)
	}
	stall.Bound = Median(base.Runs)
	stall.BoundNote = "the longest check-to-answer time any shim saw over a span of the rollout's length right after it, with no hand-over " +
		"(median over the runs): the same shims, connections and machine, without caa being replaced"
	sc.Rows = []Row{stall, base, bare, took, misses, failed, waits, lost, writes}
	sc.Details = append(sc.Details, fmt.Sprintf("Over all runs: %d health checks, %d stream bytes echoed. A failed sandbox is one whose shim missed a check "+
		"(kata tears it down at the first) or whose socket the relay no longer serves with the shim's connection open. The figures are the shim's view: "+
		"what the new caa costs the shims is its own start (process, ledger, the relay daemon's list) on the cores the shims and "+
		"relays share; it probes no relay whose VM answered its shim within the last 10 s, which every relay here did. "+
		"Both ends of every connection run on this machine (the fake VMs are in the bench's process).", checked, streamed))
	return sc, nil
}

// s9Node builds node i: cloud network, fake EC2, fleet, forwarders, its
// first caa and its relay daemon.
func (b *bench) s9Node(ctx context.Context, h *nsHarness, e *env, i int) (*s9Node, func(), error) {
	var cleanups []func()
	cleanup := func() {
		for j := len(cleanups) - 1; j >= 0; j-- {
			cleanups[j]()
		}
	}
	cn := podvmfake.NewCloudNetwork(h)
	f, err := newFakeCloud("aws")
	if err != nil {
		return nil, cleanup, err
	}
	cleanups = append(cleanups, f.close)
	fleet := podvmfake.NewFleet(cn, f.core, nil)
	cleanups = append(cleanups, fleet.Close)
	go fleet.Run(ctx, s8FleetTick)
	for _, raw := range []string{e.proxy.URL, cloudURL(f)} {
		stop, err := forwardInto(cn.NodeNS, raw)
		if err != nil {
			return nil, cleanup, err
		}
		cleanups = append(cleanups, stop)
	}
	node := fmt.Sprintf("bench-s9-%d", i+1)
	if _, err := e.c.CreateNode(ctx, node); err != nil {
		return nil, cleanup, err
	}
	if err := createPods(ctx, e, "s9", node, node, 0, s9PerNode, true); err != nil {
		return nil, cleanup, err
	}
	dir := filepath.Join(b.dir, "s9", node)
	if err := mkdir(dir); err != nil {
		return nil, cleanup, err
	}
	sockDir, err := os.MkdirTemp("", "s9")
	if err != nil {
		return nil, cleanup, err
	}
	cleanups = append(cleanups, func() { _ = os.RemoveAll(sockDir) })
	n := &s9Node{s8Node: &s8Node{b: b, f: f, e: e, cn: cn, node: node, ledger: filepath.Join(dir, "ledger.db"),
		socket: filepath.Join(sockDir, "hv.sock"), agents: filepath.Join(sockDir, "pods")},
		fleet: fleet, relaySock: filepath.Join(sockDir, "relay.sock")}
	d, err := n.startCaa()
	if err != nil {
		return nil, cleanup, err
	}
	n.d = d
	cleanups = append(cleanups, func() { _ = n.d.Stop() })
	if _, err := d.WaitReady(ctx, 5*time.Minute); err != nil {
		return nil, cleanup, err
	}
	// The relay reads the client file caa wrote at start.
	stop, err := n.startRelay(ctx)
	if err != nil {
		return nil, cleanup, err
	}
	cleanups = append(cleanups, stop)
	return n, cleanup, nil
}

// startCaa starts the node's next caa generation (a new DaemonSet pod).
func (n *s9Node) startCaa() (*Daemon, error) {
	n.gen++
	args := n.b.caaArgs(n.f, n.node, n.e.kubeconfig, n.ledger, "--hypervisor-socket", n.socket,
		"--agent-socket-dir", n.agents, "--node-ip", n.cn.NodeIP.Addr().String(),
		"--relay-socket", n.relaySock, "--pod-name", fmt.Sprintf("caa-%s-v%d", n.node, n.gen))
	var d *Daemon
	err := podvmfake.InNetNS(n.cn.NodeNS, func() error {
		var err error
		d, err = StartCaa(n.b.s9Binary(), args, hermeticEnv(n.f.env...), n.b.logPath("s9-"+n.node))
		return err
	})
	if err != nil {
		return nil, err
	}
	d.client.Transport = &http.Transport{DialContext: podvmfake.DialIn(n.cn.NodeNS)}
	return d, nil
}

// startRelay runs `caa relay` in the node's namespace and waits for its
// control socket; stop ends it. caa writes the client file beside its
// --relay-socket, which is where the relay is told to read it.
func (n *s9Node) startRelay(ctx context.Context) (stop func(), err error) {
	out, err := os.OpenFile(n.b.logPath("s9-relay-"+n.node), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(n.b.s9Binary(), "relay", "--socket", n.relaySock, "--agent-ca-dir", filepath.Dir(n.relaySock), "--log-format", "json")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := podvmfake.InNetNS(n.cn.NodeNS, cmd.Start); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("start caa relay: %w", err)
	}
	n.relay, n.relayDone = cmd, make(chan error, 1)
	go func() { n.relayDone <- cmd.Wait(); _ = out.Close() }()
	stop = func() { _ = cmd.Process.Signal(syscall.SIGTERM); <-n.relayDone }
	cl := &relayd.Client{Socket: n.relaySock}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if _, _, err := cl.List(wctx); err == nil {
			return stop, nil
		}
		select {
		case err := <-n.relayDone:
			n.relayDone <- err
			return stop, fmt.Errorf("caa relay exited (%v); see %s", err, n.b.logPath("s9-relay-"+n.node))
		case <-wctx.Done():
			return stop, fmt.Errorf("caa relay never served its control socket; see %s", n.b.logPath("s9-relay-"+n.node))
		case <-time.After(readyPoll):
		}
	}
}

// startSandboxes starts the node's sandboxes through its caa and opens
// each shim's one agent connection.
func (n *s9Node) startSandboxes(ctx context.Context, h *nsHarness) (err error) {
	defer func() {
		if r := recover(); r != nil { // the harness fails by panicking
			f, ok := r.(harnessFailure)
			if !ok {
				panic(r)
			}
			err = errors.New(string(f))
		}
	}()
	for i := range s9PerNode {
		pod := n.cn.NewPod(h, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 5}), 24))
		sb, _, err := n.startSandbox(ctx, "s9", fmt.Sprintf("%s-%05d", n.node, i), pod, i)
		if err != nil {
			return fmt.Errorf("%s: %w", n.node, err)
		}
		var vm *podvmfake.FleetVM
		for _, in := range n.f.core.Instances() {
			if in.Tags[sandbox.TagSandbox] == sb.id && in.State != provider.StateTerminated {
				vm = n.fleet.VM(in.ID)
			}
		}
		if vm == nil {
			return fmt.Errorf("%s: no fake pod VM for sandbox %s", n.node, sb.id[:12])
		}
		a, err := katafake.DialAgent(ctx, sb.socket)
		if err != nil {
			return err
		}
		n.sbs, n.vms, n.shims.Agents = append(n.sbs, sb), append(n.vms, vm), append(n.shims.Agents, a)
	}
	return nil
}

// s9Result is one rollout's figures.
type s9Result struct {
	stall, base, exec, took       time.Duration
	misses, failed, waits, checks int
	lost, streamed, writes        int64
}

// s9Run is one rolling update across the nodes, with a long call and a
// stream per node in flight throughout, then the same span without one.
func (b *bench) s9Run(ctx context.Context, nodes []*s9Node, run int) (s9Result, error) {
	var r s9Result
	type inflight struct {
		cid    string
		waited chan error
		stream *katafake.Stream
	}
	fl := make([]inflight, len(nodes))
	missesBefore, checksBefore := 0, 0
	var writesBefore int64
	for i, n := range nodes {
		cid := fmt.Sprintf("c-%s-%d", n.node, run)
		waited := make(chan error, 1)
		go func() {
			st, err := n.shims.Agents[0].WaitProcess(ctx, cid)
			if err == nil && st != 42 {
				err = fmt.Errorf("WaitProcess answered %d, want 42", st)
			}
			waited <- err
		}()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := n.vms[0].Agent.AwaitWaiting(wctx, cid)
		cancel()
		if err != nil {
			return r, fmt.Errorf("%s: the long call: %w", n.node, err)
		}
		s, err := katafake.StartStream(ctx, n.sbs[1].socket, podvmfake.StreamMagic, s9StreamChunk, s9StreamEvery)
		if err != nil {
			return r, fmt.Errorf("%s: %w", n.node, err)
		}
		fl[i] = inflight{cid: cid, waited: waited, stream: s}
		c, m := n.shims.Counts()
		checksBefore, missesBefore = checksBefore+c, missesBefore+m
		writesBefore += cloudWrites(n.f.core.Counters())
	}
	longest := func() time.Duration {
		var d time.Duration
		for _, n := range nodes {
			d = max(d, n.shims.Longest())
		}
		return d
	}

	longest() // a new window
	t0 := time.Now()
	starts := make([]time.Duration, len(nodes))
	for i, n := range nodes {
		starts[i] = time.Since(t0)
		if err := n.surge(ctx); err != nil {
			return r, err
		}
	}
	r.took = time.Since(t0)
	r.stall = longest()
	time.Sleep(r.took) // the same span's length, with no hand-over: a measurement window, not a synchronisation
	r.base = longest()
	// The same span again, with only a bare start of the same binary
	// (`caa version`) where each node's new caa started: what any process
	// start costs the shims on this machine.
	t1 := time.Now()
	for _, at := range starts {
		time.Sleep(time.Until(t1.Add(at))) // pacing the window like the rollout, not a synchronisation
		if out, err := exec.CommandContext(ctx, b.s9Binary(), "version").CombinedOutput(); err != nil {
			return r, fmt.Errorf("caa version: %w: %s", err, out)
		}
	}
	time.Sleep(time.Until(t1.Add(r.took)))
	r.exec = longest()

	for i, n := range nodes {
		if !n.vms[0].Agent.Release(fl[i].cid, 42) {
			return r, fmt.Errorf("%s: the long call is no longer in flight at the agent", n.node)
		}
		select {
		case err := <-fl[i].waited:
			if err == nil {
				r.waits++
			} else {
				b.logf("S9 %s: the long call failed: %v", n.node, err)
			}
		case <-time.After(10 * time.Second):
			b.logf("S9 %s: the long call got no answer", n.node)
		}
		written, lost, err := fl[i].stream.Finish(10 * time.Second)
		if err != nil {
			b.logf("S9 %s: stream: %v", n.node, err)
		}
		r.streamed += written - lost
		r.lost += lost
		c, m := n.shims.Counts()
		r.checks, r.misses = r.checks+c, r.misses+m
		r.writes += cloudWrites(n.f.core.Counters())
		served, err := n.servedWithShim(ctx)
		if err != nil {
			return r, err
		}
		for j, a := range n.shims.Agents {
			if len(a.Misses()) > 0 || !served[n.sbs[j].id] {
				r.failed++
			}
		}
	}
	r.misses -= missesBefore
	r.checks -= checksBefore
	r.writes -= writesBefore
	return r, nil
}

// surge is one node's step of the DaemonSet's update with maxSurge 1.
func (n *s9Node) surge(ctx context.Context) error {
	old := n.d
	next, err := n.startCaa()
	if err != nil {
		return err
	}
	n.d = next
	if _, err := next.WaitReady(ctx, 2*time.Minute); err != nil {
		return fmt.Errorf("%s: the new caa: %w", n.node, err)
	}
	for _, d := range []*Daemon{next, old} {
		if err := waitStatus(ctx, d, 30*time.Second, func(s health.Snapshot) bool {
			return s.Handover != nil && s.Handover.Outcome == health.HandoverDone
		}); err != nil {
			return fmt.Errorf("%s: no finished hand-over: %w", n.node, err)
		}
	}
	return old.Stop()
}

// servedWithShim are the node's sandboxes the relay serves with at least
// one connection open.
func (n *s9Node) servedWithShim(ctx context.Context) (map[string]bool, error) {
	entries, _, err := (&relayd.Client{Socket: n.relaySock}).List(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: relay list: %w", n.node, err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		out[e.Sandbox] = e.Open > 0
	}
	return out, nil
}

// s9Binary is the caa S9 runs: the EC2-only build when the bench built one
// (an AWS node runs the image of its cloud, `make image CLOUDS=aws`, whose
// start does not initialise the other clouds' SDKs), else -caa's.
func (b *bench) s9Binary() string {
	if b.caaAWS != "" {
		return b.caaAWS
	}
	return b.caa
}
