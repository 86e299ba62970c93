package main

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/sandbox"
	"github.com/caa-project/caa/test/mocks/cloud"
	katafake "github.com/caa-project/caa/test/mocks/kata"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// kataRig is one node in the remote hypervisor mode, as S8 builds it, for
// S10, S11 and S6's kata rows: the node's network namespace and cloud
// network, a fake EC2 (with a budget when one is given) whose instances
// boot fake pod VMs, a pod (and its network namespace) per slot, and,
// with relay, a `caa relay` process serving the agent sockets. caa itself
// is started by start, with the scenario's extra flags.
type kataRig struct {
	*s9Node
	label    string
	ns       string
	pods     []*podvmfake.Pod
	podNames []string
	withRly  bool
	cleanups []func()
	// boots: how long each fake VM took to boot, as the fleet's syncs
	// measured it (a sync boots the VMs it finds one after another).
	bootMu sync.Mutex
	boots  []time.Duration
}

// runFleet is the fleet's Run, timing each sync that booted VMs.
func (r *kataRig) runFleet(ctx context.Context, fleet *podvmfake.Fleet, f *fakeCloud) {
	t := time.NewTicker(s8FleetTick)
	defer t.Stop()
	for {
		before := fleet.Boots()
		t0 := time.Now()
		fleet.Sync(ctx)
		if n := fleet.Boots() - before; n > 0 {
			d := time.Since(t0) / time.Duration(n)
			r.bootMu.Lock()
			for range n {
				r.boots = append(r.boots, d)
			}
			r.bootMu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// bootTimes returns the boots measured since the last call.
func (r *kataRig) bootTimes() []float64 {
	r.bootMu.Lock()
	defer r.bootMu.Unlock()
	out := durs(r.boots)
	r.boots = nil
	return out
}

// budgetClock is the clock of a fake's budget: real time plus an offset
// that rest moves an hour on, which fills every bucket.
type restClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *restClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *restClock) rest() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += time.Hour
}

// newKataRig builds the rig for slots pods on a fresh apiserver; budget
// (nil: none) meters the fake EC2; each fleetOpt is applied to the fleet
// before it runs (S12 boots upstream's pod VM programs). The caller runs
// close.
func (b *bench) newKataRig(ctx context.Context, h *nsHarness, label string, slots int, budget *cloud.Budget, relay bool,
	fleetOpts ...func(*podvmfake.Fleet, *cloud.Cloud)) (r *kataRig, err error) {
	r = &kataRig{label: label, ns: label, withRly: relay}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	e, err := newEnv(ctx, filepath.Join(b.dir, label), b.logf)
	if err != nil {
		return r, err
	}
	r.cleanups = append(r.cleanups, e.close)
	cn := podvmfake.NewCloudNetwork(h)
	f, err := newBudgetedFake("aws", budget)
	if err != nil {
		return r, err
	}
	r.cleanups = append(r.cleanups, f.close)
	fleet := podvmfake.NewFleet(cn, f.core, nil)
	for _, o := range fleetOpts {
		o(fleet, f.core)
	}
	fctx, stopFleet := context.WithCancel(context.WithoutCancel(ctx))
	r.cleanups = append(r.cleanups, fleet.Close, stopFleet)
	go r.runFleet(fctx, fleet, f)
	for _, raw := range []string{e.proxy.URL, cloudURL(f)} {
		stop, err := forwardInto(cn.NodeNS, raw)
		if err != nil {
			return r, err
		}
		r.cleanups = append(r.cleanups, stop)
	}
	node := "bench-" + label
	if _, err := e.c.CreateNode(ctx, node); err != nil {
		return r, err
	}
	if err := createPods(ctx, e, r.ns, label, node, 0, slots, true); err != nil {
		return r, err
	}
	for i := range slots {
		r.pods = append(r.pods, cn.NewPod(h, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 5}), 24)))
		r.podNames = append(r.podNames, fmt.Sprintf("%s-%05d", label, i))
	}
	dir := filepath.Join(b.dir, label, "node")
	if err := mkdir(dir); err != nil {
		return r, err
	}
	// Agent sockets are <dir>/<64 hex digits>/agent.ttrpc: a short
	// directory keeps them under the 108 bytes of a unix socket path.
	sockDir, err := os.MkdirTemp("", label)
	if err != nil {
		return r, err
	}
	r.cleanups = append(r.cleanups, func() { _ = os.RemoveAll(sockDir) })
	r.s9Node = &s9Node{s8Node: &s8Node{b: b, f: f, e: e, cn: cn, node: node, ledger: filepath.Join(dir, "ledger.db"),
		socket: filepath.Join(sockDir, "hv.sock"), agents: filepath.Join(sockDir, "pods")},
		fleet: fleet, relaySock: filepath.Join(sockDir, "relay.sock")}
	return r, nil
}

// start runs caa (the EC2-only build when the bench built one, as an AWS
// node runs) with extra flags and waits for it to be ready; with the rig's
// relay, `caa relay` is started after it (it reads the client file caa
// writes).
func (r *kataRig) start(ctx context.Context, extra ...string) error {
	args := r.b.caaArgs(r.f, r.node, r.e.kubeconfig, r.ledger, "--hypervisor-socket", r.socket,
		"--agent-socket-dir", r.agents, "--node-ip", r.cn.NodeIP.Addr().String())
	if r.withRly {
		args = append(args, "--relay-socket", r.relaySock)
	}
	args = append(args, extra...)
	err := podvmfake.InNetNS(r.cn.NodeNS, func() error {
		var err error
		r.d, err = StartCaa(r.b.s9Binary(), args, hermeticEnv(r.f.env...), r.b.logPath(r.label))
		return err
	})
	if err != nil {
		return err
	}
	r.d.client.Transport = &http.Transport{DialContext: podvmfake.DialIn(r.cn.NodeNS)}
	d := r.d
	r.cleanups = append(r.cleanups, func() { _ = d.Stop() })
	if _, err := r.d.WaitReady(ctx, 5*time.Minute); err != nil {
		return err
	}
	if r.withRly && r.relay == nil {
		stop, err := r.startRelay(ctx)
		if err != nil {
			return err
		}
		r.cleanups = append(r.cleanups, stop)
	}
	return nil
}

func (r *kataRig) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

// sandboxID is the 64-hex-digit id of slot i's sandbox in round run.
func sandboxID(run, i int) string { return fmt.Sprintf("%02x%062x", run&0xff, i+1) }

func (r *kataRig) shimOf() katafake.Shim { return katafake.Shim{Socket: r.socket} }

// createVM is the shim's CreateVM of sandbox id for slot i.
func (r *kataRig) createVM(ctx context.Context, id string, i int) (string, error) {
	sock, err := r.shimOf().CreateVM(ctx, id, map[string]string{sandbox.AnnotationSandboxName: r.podNames[i],
		sandbox.AnnotationSandboxNamespace: r.ns}, r.pods[i].NSPath)
	if err != nil {
		return "", fmt.Errorf("CreateVM %s: %w", id[:12], err)
	}
	return sock, nil
}

func (r *kataRig) startVM(ctx context.Context, id string) error { return r.shimOf().StartVM(ctx, id) }

func (r *kataRig) stopVM(ctx context.Context, id string) error { return r.shimOf().StopVM(ctx, id) }

// vmsOf counts the cloud's instances (any state) by sandbox tag, for ids.
func (r *kataRig) vmsOf(ids []string) map[string]int {
	out := map[string]int{}
	for _, in := range r.f.core.Instances() {
		if sb := in.Tags[sandbox.TagSandbox]; slices.Contains(ids, sb) {
			out[sb]++
		}
	}
	return out
}

// liveVMsOf counts the instances of ids not yet terminated.
func (r *kataRig) liveVMsOf(ids []string) int {
	n := 0
	for _, in := range r.f.core.Instances() {
		if in.State != provider.StateTerminated && slices.Contains(ids, in.Tags[sandbox.TagSandbox]) {
			n++
		}
	}
	return n
}

// waitVMsGone polls until no instance of ids is live and returns when
// that was first seen.
func (r *kataRig) waitVMsGone(ctx context.Context, ids []string, limit time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		if n := r.liveVMsOf(ids); n == 0 {
			return time.Now(), nil
		} else if ctx.Err() != nil {
			return time.Time{}, fmt.Errorf("%d VMs of stopped sandboxes still live after %s; see %s", n, limit, r.b.logPath(r.label))
		}
		select {
		case <-ctx.Done():
		case <-time.After(readyPoll):
		}
	}
}

// each runs fn for every i in [0, n) at once, after a common start, and
// returns when each returned and the error of each.
func each(n int, fn func(i int) error) (start time.Time, done []time.Time, errs []error) {
	done, errs = make([]time.Time, n), make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-gate
			errs[i] = fn(i)
			done[i] = time.Now()
		})
	}
	start = time.Now()
	close(gate)
	wg.Wait()
	return start, done, errs
}
