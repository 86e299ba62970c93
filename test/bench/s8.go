package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/pkg/hypervisor/hypervisorpb"
	"github.com/caa-project/caa/pkg/ledger/ledgerapi"
	"github.com/caa-project/caa/pkg/sandbox"
	"github.com/caa-project/caa/pkg/tunnel"
	"github.com/caa-project/caa/test/mocks/cloud"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// S8 measures the remote hypervisor mode: kata's shim (a fake, speaking
// kata's ttrpc API on caa's hypervisor socket) starts sandboxes on a node
// whose caa is the real binary; the cloud is the fake EC2 behind caa's real
// SDK provider, and each VM boots a fake pod VM (test/mocks/podvm) in its
// own network namespace on a "cloud network" with the node's, so the
// tunnel, the relay and its mutual TLS are real. caa runs inside the node's
// namespace; the apiserver's proxy and the fake EC2 stay outside, reached
// through forwarders the bench runs in the node's namespace on their ports.
const (
	// s8Latency is injected into every cloud call, as in S1.
	s8Latency = s1Latency
	// s8Sizes are the restart cases: sandboxes running on the node.
	s8Small, s8Large = 20, 100
	// s8FleetTick is how often the fake fleet boots the VMs the cloud runs.
	s8FleetTick = 5 * time.Millisecond
)

func (b *bench) s8(ctx context.Context) (sc Scenario, err error) {
	sc = Scenario{ID: "S8", Title: "remote hypervisor: StartVM, and restart with every sandbox running",
		Setup: fmt.Sprintf("The real caa binary in the remote hypervisor mode (`--hypervisor-socket`) inside a node's network namespace; a fake kata shim "+
			"calls CreateVM and StartVM on its socket as the kubelet drives kata, for pods of the real apiserver. The cloud is the fake EC2 behind caa's EC2 "+
			"provider, %s injected into every call, no boot delay; each instance it runs boots a fake pod VM (test/mocks/podvm) from caa's user data in a network "+
			"namespace of its own, joined to the node's by a bridge, so caa's VXLAN tunnel, its agent relay and the mutual TLS to the forwarder are real. "+
			"StartVM: %d run(s), one new sandbox each, timed at the shim. Restart: caa is stopped (SIGTERM) with %d and then %d sandboxes running and "+
			"started again, %d run(s) each; timed from the exec to the moment every sandbox's agent socket answers a health check through caa "+
			"(the shim's view), the cloud's counters read across it.", s8Latency, b.count, s8Small, s8Large, b.count)}
	if b.notRoot(&sc, "S8") {
		return sc, nil
	}
	h := &nsHarness{}
	defer h.cleanup()
	defer recoverHarness(&err)
	cn := podvmfake.NewCloudNetwork(h)

	e, err := newEnv(ctx, filepath.Join(b.dir, "s8"), b.logf)
	if err != nil {
		return sc, err
	}
	defer e.close()
	f, err := newFakeCloud("aws")
	if err != nil {
		return sc, err
	}
	defer f.close()
	fleet := podvmfake.NewFleet(cn, f.core, nil)
	defer fleet.Close()
	fctx, stopFleet := context.WithCancel(ctx)
	defer stopFleet()
	go fleet.Run(fctx, s8FleetTick)
	for _, raw := range []string{e.proxy.URL, cloudURL(f)} {
		stop, err := forwardInto(cn.NodeNS, raw)
		if err != nil {
			return sc, err
		}
		defer stop()
	}

	const node, ns = "bench-s8", "s8"
	if _, err := e.c.CreateNode(ctx, node); err != nil {
		return sc, err
	}
	listClient, err := proxyClient(e.proxy, e.c.RestConfig().BearerToken)
	if err != nil {
		return sc, err
	}
	total := max(s8Large, b.count)
	if err := createPods(ctx, e, ns, "s8", node, 0, total, true); err != nil {
		return sc, err
	}
	podList, err := podListTime(ctx, listClient, node, total, 5)
	if err != nil {
		return sc, err
	}
	exec, err := execTime(ctx, b.caa, 5)
	if err != nil {
		return sc, err
	}
	pods := make([]*podvmfake.Pod, total)
	for i := range pods {
		pods[i] = cn.NewPod(h, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 5}), 24))
	}

	dir := filepath.Join(b.dir, "s8", "node")
	if err := mkdir(dir); err != nil {
		return sc, err
	}
	// Agent sockets are <dir>/<64 hex digits>/agent.ttrpc: a short
	// directory keeps them under the 108 bytes of a unix socket path.
	sockDir, err := os.MkdirTemp("", "s8")
	if err != nil {
		return sc, err
	}
	defer os.RemoveAll(sockDir)
	hv := &s8Node{b: b, f: f, e: e, cn: cn, node: node, ledger: filepath.Join(dir, "ledger.db"),
		socket: filepath.Join(sockDir, "hv.sock"), agents: filepath.Join(sockDir, "pods")}
	if err := hv.start(ctx); err != nil {
		return sc, err
	}
	defer func() { _ = hv.d.Stop() }()

	// StartVM: the first count sandboxes, one at a time, latency injected.
	start := Row{Case: "StartVM", Metric: "StartVM at the shim", Unit: "ms", MaxRatio: 1.5}
	f.core.SetFaults(cloud.Faults{Latency: s8Latency})
	var sandboxes []s8Sandbox
	for i := range b.count {
		sb, took, err := hv.startSandbox(ctx, ns, fmt.Sprintf("s8-%05d", i), pods[i], i)
		if err != nil {
			return sc, fmt.Errorf("StartVM run %d: %w", i+1, err)
		}
		start.Runs = append(start.Runs, ms(took))
		sandboxes = append(sandboxes, sb)
	}
	hs, err := relayedCallTime(ctx, sandboxes[0].socket, 5)
	if err != nil {
		return sc, err
	}
	start.Bound = ms(2*s8Latency + hs)
	start.BoundNote = fmt.Sprintf("the cloud's create and the read that shows the VM running (2 x %s) + one agent call relayed over a new mutual-TLS connection "+
		"(%s, the median of fresh health checks through a served socket); no boot delay, so the rest is caa's own work (durable intent, "+
		"certificate, user data, tunnel, relay; the relay's first probe usually meets a VM still starting and waits its first 10 ms back-off) "+
		"and the fake VM's start", s8Latency, round(hs))

	var rows []Row
	for _, n := range []int{s8Small, s8Large} {
		f.core.SetFaults(cloud.Faults{}) // the setup is not measured
		for len(sandboxes) < n {
			i := len(sandboxes)
			sb, _, err := hv.startSandbox(ctx, ns, fmt.Sprintf("s8-%05d", i), pods[i], i)
			if err != nil {
				return sc, fmt.Errorf("set up %d sandboxes: %w", n, err)
			}
			sandboxes = append(sandboxes, sb)
		}
		f.core.SetFaults(cloud.Faults{Latency: s8Latency})
		tunnels, err := hv.tunnelCheckTime(ctx, 3)
		if err != nil {
			return sc, err
		}
		c := fmt.Sprintf("restart, %d sandboxes", n)
		cpus := runtime.NumCPU()
		served := Row{Case: c, Metric: "every agent socket served again", Unit: "ms", MaxRatio: 1.5,
			Bound: ms(SandboxRestartBound(exec, podList, s8Latency, tunnels, hs, n, cpus)),
			BoundNote: fmt.Sprintf("process start %s + the node's pod list %s + one listing of the node's VMs %s + the kernel's check of the %d "+
				"tunnels, %d at once as caa runs them (%s: tunnel.Setup on each surviving tunnel, from the bench while caa is stopped; "+
				"it changes nothing) + %d relayed agent calls in a row (%d calls of %s each, both ends of every mutual-TLS handshake on %d CPUs)",
				round(exec), round(podList), s8Latency, n, sandbox.DefaultTunnelOps, round(tunnels), (n+cpus-1)/cpus, n, round(hs), cpus)}
		ready := Row{Case: c, Metric: "ready (/readyz 200)", Unit: "ms"}
		writes := Row{Case: c, Metric: "cloud writes at restart", Unit: "calls", HasLimit: true, AtMost: true, EveryRun: true}
		for range b.count {
			took, toReady, w, err := hv.restart(ctx, sandboxes)
			if err != nil {
				return sc, fmt.Errorf("%s: %w", c, err)
			}
			served.Runs = append(served.Runs, ms(took))
			ready.Runs = append(ready.Runs, ms(toReady))
			writes.Runs = append(writes.Runs, float64(w))
		}
		rows = append(rows, served, ready, writes)
	}
	sc.Rows = append([]Row{start}, rows...)
	sc.Details = append(sc.Details, fmt.Sprintf("caa polls a booting VM every 2 s (the daemon's default): a cloud whose VMs boot in B seconds makes "+
		"StartVM take the boot rounded up to that period, beyond the figures here, which have no boot delay. Failed fake VM boots: %d.", len(fleet.Failed())))
	return sc, nil
}

// s8Node is the node's caa and the shim's view of it.
type s8Node struct {
	b      *bench
	f      *fakeCloud
	e      *env
	cn     *podvmfake.CloudNetwork
	node   string
	ledger string
	socket string
	agents string
	d      *Daemon
}

// s8Sandbox is one sandbox the shim started.
type s8Sandbox struct {
	id, socket string
}

func (n *s8Node) start(ctx context.Context) error {
	args := n.b.caaArgs(n.f, n.node, n.e.kubeconfig, n.ledger, "--hypervisor-socket", n.socket,
		"--agent-socket-dir", n.agents, "--node-ip", n.cn.NodeIP.Addr().String())
	var d *Daemon
	err := podvmfake.InNetNS(n.cn.NodeNS, func() error {
		var err error
		d, err = StartCaa(n.b.caa, args, hermeticEnv(n.f.env...), n.b.logPath("s8"))
		return err
	})
	if err != nil {
		return err
	}
	// Its health port is in the node's namespace.
	d.client.Transport = &http.Transport{DialContext: podvmfake.DialIn(n.cn.NodeNS)}
	n.d = d
	_, err = d.WaitReady(ctx, 5*time.Minute)
	return err
}

// shim dials caa's hypervisor socket as kata's shim does, one connection
// per call.
func (n *s8Node) shim(ctx context.Context) (hypervisorpb.HypervisorService, func(), error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", n.socket)
	if err != nil {
		return nil, nil, fmt.Errorf("dial the hypervisor socket: %w", err)
	}
	c := ttrpc.NewClient(conn)
	return hypervisorpb.NewHypervisorClient(c), func() { _ = c.Close() }, nil
}

// startSandbox is the shim's CreateVM and StartVM for pod name; it returns
// the time StartVM took and checks the agent answers through caa.
func (n *s8Node) startSandbox(ctx context.Context, ns, name string, pod *podvmfake.Pod, i int) (s8Sandbox, time.Duration, error) {
	id := fmt.Sprintf("5b%062x", i+1)
	cl, done, err := n.shim(ctx)
	if err != nil {
		return s8Sandbox{}, 0, err
	}
	res, err := cl.CreateVM(ctx, &hypervisorpb.CreateVMRequest{Id: id, NetworkNamespacePath: pod.NSPath,
		Annotations: map[string]string{sandbox.AnnotationSandboxName: name, sandbox.AnnotationSandboxNamespace: ns}})
	done()
	if err != nil {
		return s8Sandbox{}, 0, fmt.Errorf("CreateVM %s: %w", name, err)
	}
	cl, done, err = n.shim(ctx)
	if err != nil {
		return s8Sandbox{}, 0, err
	}
	t0 := time.Now()
	_, err = cl.StartVM(ctx, &hypervisorpb.StartVMRequest{Id: id})
	took := time.Since(t0)
	done()
	if err != nil {
		return s8Sandbox{}, 0, fmt.Errorf("StartVM %s: %w (caa log %s)", name, err, n.b.logPath("s8"))
	}
	sb := s8Sandbox{id: id, socket: res.GetAgentSocketPath()}
	if err := checkAgent(ctx, sb.socket); err != nil {
		return sb, 0, fmt.Errorf("agent of %s after StartVM: %w", name, err)
	}
	return sb, took, nil
}

// restart stops caa and starts it again; it returns the time from the exec
// until every sandbox's agent answered through caa, the time to ready and
// the cloud writes across the restart.
func (n *s8Node) restart(ctx context.Context, sandboxes []s8Sandbox) (served, ready time.Duration, writes int64, err error) {
	if err := n.d.Stop(); err != nil {
		return 0, 0, 0, err
	}
	before := cloudWrites(n.f.core.Counters())
	var started time.Time
	var wg sync.WaitGroup
	errs := make(chan error, len(sandboxes))
	var mu sync.Mutex
	var last time.Time
	actx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	launched := make(chan struct{})
	for _, sb := range sandboxes {
		wg.Go(func() {
			<-launched
			for {
				if checkAgent(actx, sb.socket) == nil {
					now := time.Now()
					mu.Lock()
					if now.After(last) {
						last = now
					}
					mu.Unlock()
					return
				}
				select {
				case <-actx.Done():
					errs <- fmt.Errorf("sandbox %s: agent socket %s not served again: %w", sb.id[:12], sb.socket, actx.Err())
					return
				case <-time.After(readyPoll):
				}
			}
		})
	}
	args := n.b.caaArgs(n.f, n.node, n.e.kubeconfig, n.ledger, "--hypervisor-socket", n.socket,
		"--agent-socket-dir", n.agents, "--node-ip", n.cn.NodeIP.Addr().String())
	err = podvmfake.InNetNS(n.cn.NodeNS, func() error {
		var err error
		n.d, err = StartCaa(n.b.caa, args, hermeticEnv(n.f.env...), n.b.logPath("s8"))
		return err
	})
	if err != nil {
		cancel()
		close(launched)
		wg.Wait()
		return 0, 0, 0, err
	}
	started = n.d.started
	n.d.client.Transport = &http.Transport{DialContext: podvmfake.DialIn(n.cn.NodeNS)}
	close(launched)
	toReady, rerr := n.d.WaitReady(ctx, 5*time.Minute)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, 0, err
	}
	if rerr != nil {
		return 0, 0, 0, rerr
	}
	return last.Sub(started), toReady, cloudWrites(n.f.core.Counters()) - before, nil
}

// tunnelCheckTime is the median of runs passes of tunnel.Setup over every
// recorded sandbox's tunnel, sandbox.DefaultTunnelOps at once, from the
// node's namespace, as caa's restart runs them: the kernel's share of
// serving the sandboxes again.
// caa must be stopped (the ledger is read from the file); the tunnels
// exist, so Setup only inspects them.
func (n *s8Node) tunnelCheckTime(ctx context.Context, runs int) (time.Duration, error) {
	if err := n.d.Stop(); err != nil {
		return 0, err
	}
	r, err := ledgerapi.Open(ctx, n.ledger, 10*time.Second)
	if err != nil {
		return 0, err
	}
	ss, err := r.Sandboxes(ctx)
	_ = r.Close()
	if err != nil {
		return 0, err
	}
	var ds []float64
	for range runs {
		errs := make(chan error, len(ss))
		var wg sync.WaitGroup
		turns := make(chan struct{}, sandbox.DefaultTunnelOps)
		t0 := time.Now()
		for _, s := range ss {
			wg.Go(func() {
				turns <- struct{}{}
				defer func() { <-turns }()
				errs <- tunnel.Setup(tunnel.Config{NetNSPath: s.NetNS, VXLANID: s.Tunnel.VXLANID, Port: s.Tunnel.Port,
					RemoteIP: net.ParseIP(s.Tunnel.RemoteIP), LocalIP: net.ParseIP(s.Tunnel.LocalIP), HostNetNSPath: n.cn.NodeNS})
			})
		}
		wg.Wait()
		ds = append(ds, float64(time.Since(t0)))
		close(errs)
		for err := range errs {
			if err != nil {
				return 0, fmt.Errorf("check a tunnel: %w", err)
			}
		}
	}
	return time.Duration(Median(ds)), n.start(ctx)
}

// checkAgent makes one health check through an agent socket, as the shim's
// first call after connecting.
func checkAgent(ctx context.Context, socket string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
	if err != nil {
		return err
	}
	c := ttrpc.NewClient(conn)
	defer c.Close()
	st, err := agentproto.Check(ctx, c)
	if err != nil {
		return err
	}
	if st != agentproto.Serving {
		return fmt.Errorf("agent answers status %d", st)
	}
	return nil
}

// relayedCallTime is the median of runs fresh health checks through a
// served agent socket: the relay's new mutual-TLS connection to the
// forwarder and one agent call.
func relayedCallTime(ctx context.Context, socket string, runs int) (time.Duration, error) {
	var ds []float64
	for range runs {
		t0 := time.Now()
		if err := checkAgent(ctx, socket); err != nil {
			return 0, err
		}
		ds = append(ds, float64(time.Since(t0)))
	}
	return time.Duration(Median(ds)), nil
}

// cloudURL is where the fake cloud serves (its --aws-endpoint).
func cloudURL(f *fakeCloud) string {
	for i, a := range f.flags {
		if a == "--aws-endpoint" && i+1 < len(f.flags) {
			return f.flags[i+1]
		}
	}
	return ""
}

// forwardInto serves raw's host and port inside the network namespace ns
// and forwards each connection to the same address outside it, so that a
// process in ns reaches a loopback server of the bench under its own URL.
func forwardInto(ns, raw string) (func(), error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	addr := u.Host
	var ln net.Listener
	if err := podvmfake.InNetNS(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return nil, fmt.Errorf("forward %s into the node's namespace: %w", addr, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer in.Close()
				out, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { _, _ = io.Copy(out, in); _ = out.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(in, out)
			})
		}
	})
	return func() { _ = ln.Close() }, nil
}

// nsHarness lets the bench use test/mocks/podvm's namespace helpers, which
// take a testing.TB: a failure panics with harnessFailure (s8 recovers it
// into its error) and cleanups run when the scenario ends.
type nsHarness struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
}

type harnessFailure string

// recoverHarness, deferred, turns the harness's failure (a panic of
// harnessFailure, raised where a test would fail) into the scenario's error.
func recoverHarness(err *error) {
	if r := recover(); r != nil {
		f, ok := r.(harnessFailure)
		if !ok {
			panic(r)
		}
		*err = errors.New(string(f))
	}
}

// notRoot reports, and says in sc, that the scenario (S8, S9) cannot run
// here: it builds network namespaces, VXLAN and veth devices, which needs
// root. It is reported as not run rather than failing the other scenarios.
func (b *bench) notRoot(sc *Scenario, name string) bool {
	if os.Geteuid() == 0 {
		return false
	}
	b.logf("%s not run: it builds network namespaces, VXLAN and veth devices, which needs root", name)
	sc.Setup += " Not run here: this run was not root (network namespaces, VXLAN and veth need it)."
	return true
}

func (h *nsHarness) Helper()             {}
func (h *nsHarness) Name() string        { return "s8" }
func (h *nsHarness) Logf(string, ...any) {}
func (h *nsHarness) Fatal(a ...any)      { panic(harnessFailure(fmt.Sprint(a...))) }
func (h *nsHarness) Fatalf(f string, a ...any) {
	panic(harnessFailure(fmt.Sprintf(f, a...)))
}
func (h *nsHarness) Skipf(f string, a ...any) {
	panic(harnessFailure("cannot run: " + fmt.Sprintf(f, a...)))
}
func (h *nsHarness) Cleanup(fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cleanups = append(h.cleanups, fn)
}

func (h *nsHarness) cleanup() {
	h.mu.Lock()
	fns := h.cleanups
	h.cleanups = nil
	h.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}
