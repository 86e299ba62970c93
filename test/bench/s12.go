package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/sandbox"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
	katafake "github.com/caa-project/caa/test/mocks/kata"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// S12 runs caa and upstream's cloud-api-adaptor through the same rig (the
// one of S8-S11): the same fake kata shim's calls, the same fake EC2 with
// its published request limits, the same pod VMs, which run upstream's own
// process-user-data and agent-protocol-forwarder for both programs, and
// sets each figure of one against the other's, measured in the same run.
const (
	s12Restart = 20 // sandboxes running across the SIGKILL
	s12Rolling = 10 // sandboxes running across the rolling update
	// s12Rounds of StopVM and StartVM over the s12Rolling slots make the
	// memory growth's cycles.
	s12Rounds = 5
	// s12IdleWindow is the idle window; caa syncs every s12IdleAudit in it
	// and its count is scaled to its default --audit-interval (10 min).
	s12IdleWindow, s12IdleAudit = time.Minute, 15 * time.Second
	// s12Served bounds how long a sandbox may take to be served again
	// after the restart, s12Gone how long VMs may take to go after StopVM
	// (caa's write budget deletes 100 in 20 s); a VM live after it is
	// counted as left behind.
	s12Served, s12Gone = 30 * time.Second, time.Minute
	// s12Settle is the time after the rolling update's new process is
	// ready during which the shims keep checking.
	s12Settle = 3 * time.Second
)

// s12Side is one program in its own rig.
type s12Side struct {
	name   string
	b      *bench
	r      *kataRig
	budget *cloud.Budget
	clock  *restClock
	upBin  string  // upstream's cloud-api-adaptor; empty for caa
	up     *upProc // upstream's running process
	round  int     // sandbox ids are s12ID(round, slot)
}

// s12ID is a sandbox id whose first 8 hex digits (all upstream puts in an
// instance's name) differ for every round and slot.
func s12ID(round, slot int) string { return fmt.Sprintf("%02x%06x%056x", round&0xff, slot+1, 0) }

func (s *s12Side) start(ctx context.Context, extra ...string) error {
	if s.upBin == "" {
		return s.r.start(ctx, extra...)
	}
	up, err := startUpstream(ctx, s.upBin, s.r, s.b.logPath(s.r.label))
	if err != nil {
		return err
	}
	s.up = up
	s.r.cleanups = append(s.r.cleanups, func() { _ = up.stop() })
	return nil
}

// kill is SIGKILL, as a node's OOM killer or a crash.
func (s *s12Side) kill() error {
	if s.up != nil {
		return s.up.kill()
	}
	return s.r.d.kill()
}

// stop is SIGTERM and the wait, as the kubelet stops a pod.
func (s *s12Side) stop() error {
	if s.up != nil {
		return s.up.stop()
	}
	return s.r.d.Stop()
}

// rssKiB is the program's resident memory: caa and its relay (the
// relay holds the shims' connections in the deployment a user coming from
// upstream runs), or upstream's one process.
func (s *s12Side) rssKiB() (float64, error) {
	pids := []int{}
	if s.up != nil {
		pids = append(pids, s.up.cmd.Process.Pid)
	} else {
		pids = append(pids, s.r.d.Pid())
		if s.r.relay != nil {
			pids = append(pids, s.r.relay.Process.Pid)
		}
	}
	var sum float64
	for _, p := range pids {
		v, err := procStatusKiB(p, "VmRSS:")
		if err != nil {
			return 0, err
		}
		sum += float64(v)
	}
	return sum, nil
}

// vmsOf counts the cloud's instances (any state) by sandbox: by caa's
// sandbox tag, or by the name upstream gives (podvm-<pod>-<first 8 hex
// digits of the sandbox id>).
func (s *s12Side) vmsOf(ids []string) map[string]int {
	out := map[string]int{}
	for _, in := range s.r.f.core.Instances() {
		if id := s12SandboxOf(in, ids); id != "" {
			out[id]++
		}
	}
	return out
}

func (s *s12Side) liveOf(ids []string) int {
	n := 0
	for _, in := range s.r.f.core.Instances() {
		if in.State != provider.StateTerminated && s12SandboxOf(in, ids) != "" {
			n++
		}
	}
	return n
}

func s12SandboxOf(in cloud.Instance, ids []string) string {
	if sb := in.Tags[sandbox.TagSandbox]; sb != "" && slices.Contains(ids, sb) {
		return sb
	}
	name := in.Tags["Name"]
	if i := strings.LastIndexByte(name, '-'); i >= 0 && strings.HasPrefix(name, "podvm-") {
		for _, id := range ids {
			if name[i+1:] == id[:8] {
				return id
			}
		}
	}
	return ""
}

// waitGone polls until no VM of ids is live or limit passes, and returns
// how many are still live.
func (s *s12Side) waitGone(ctx context.Context, ids []string, limit time.Duration) (int, error) {
	deadline := time.Now().Add(limit)
	for {
		n := s.liveOf(ids)
		if n == 0 || time.Now().After(deadline) {
			return n, nil
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return n, err
		}
	}
}

// startOne is the shim's CreateVM and StartVM of a new sandbox in slot;
// it returns the id, the agent socket, the time StartVM took and its error.
func (s *s12Side) startOne(ctx context.Context, slot int) (id, sock string, took time.Duration, err error) {
	id = s12ID(s.round, slot)
	if sock, err = s.r.createVM(ctx, id, slot); err != nil {
		return id, "", 0, err
	}
	t0 := time.Now()
	err = s.r.startVM(ctx, id)
	return id, sock, time.Since(t0), err
}

// stopAll is the shim's StopVM of every id at once; it returns the
// errors' count.
func (s *s12Side) stopAll(ctx context.Context, ids []string) int {
	_, _, errs := each(len(ids), func(i int) error { return s.r.stopVM(ctx, ids[i]) })
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	return n
}

// s12Figures is what one side measured.
type s12Figures struct {
	startVM                                         []float64
	burstOK, burstFailed, burstSurfaced, burstNoOne float64
	burstAll, throttled                             float64
	burstLeaked, burstStopErrs                      float64
	callsCreated, callsDeleted                      float64
	createdCalls, deletedCalls                      map[string]int64
	served, leaked, duplicated, writes              float64
	restartStopErrs                                 float64
	misses, lost, checks                            float64
	perSandbox, growth                              float64
	idleHour                                        float64
	idleCalls                                       map[string]int64
	strays                                          float64
	failedBoots                                     int
	errText                                         string
}

func (b *bench) s12(ctx context.Context) (sc Scenario, err error) {
	n := b.s10N
	sc = Scenario{ID: "S12", Title: "caa and upstream's cloud-api-adaptor side by side, on EC2", Compare: true,
		Setup: fmt.Sprintf("Each program in the rig of S8-S11, one after the other in the same run: a node's network namespace, a real apiserver, "+
			"the fake kata shim calling CreateVM/StartVM/StopVM on the program's hypervisor socket, the fake EC2 with EC2's published request limits "+
			"(RunInstances: 50 requests, 5 a second back; DescribeInstances 100, 20 a second; TerminateInstances 50, 5 a second) and %s on every "+
			"call during StartVM and the burst, and a pod VM per running instance that runs upstream's own process-user-data (fetching the user data "+
			"from the instance's metadata service) and agent-protocol-forwarder, for both programs. caa: the EC2 build with its flags "+
			"and its defaults, with `caa relay` holding the shims' connections (the chart's values-adaptor.yaml, what a user coming from upstream "+
			"installs). Upstream: `cloud-api-adaptor aws` built from the pinned source, configured through its peer-pods-cm keys as environment "+
			"(CLOUD_PROVIDER, PODVM_AMI_ID, AWS_REGION, AWS_SUBNET_ID, AWS_SG_IDS, PODVM_INSTANCE_TYPE, REMOTE_HYPERVISOR_ENDPOINT, PODS_DIR) and "+
			"the SDK's AWS_ENDPOINT_URL_EC2 for the fake, everything else its defaults (TLS with its own CA, root volume 30 GiB, SEV-SNP). "+
			"Rows: one StartVM (%d runs); %d CreateVM then %d StartVM at once, then %d StopVM at once; %d sandboxes, SIGKILL, start, each agent socket "+
			"checked for %s, then the shim's StopVM of each (a VM still live %s after its StopVM is counted as left); %d sandboxes, %d rounds of StopVM/StartVM over them (memory); an idle window of %s; "+
			"a rolling update as the DaemonSet with maxUnavailable 1 does it (SIGTERM, then the same binary started) while every shim checks "+
			"its agent every %s on its one connection (a check unanswered within %s, or failed, is missed; kata fails the sandbox at the first).",
			s10Latency, b.count, n, n, n, s12Restart, s12Served, s12Gone, s12Rolling, s12Rounds, b.s12Idle, s9CheckPeriod, s9CheckTimeout)}
	if b.notRoot(&sc, "S12") {
		return sc, nil
	}
	adaptorBin, podvmDir, err := b.s12Upstream(ctx)
	if err != nil {
		return sc, err
	}
	h := &nsHarness{}
	defer h.cleanup()
	defer recoverHarness(&err)
	// The restart's slots are not reused: upstream leaves their pods' tunnels
	// behind (a real cluster gives the next pods new namespaces).
	slots := max(n, s12Restart+s12Rolling, b.count)
	var figs [2]s12Figures
	for i, name := range []string{"caa", "upstream"} {
		bin := ""
		if name == "upstream" {
			bin = adaptorBin
		}
		b.logf("S12: %s", name)
		f, err := b.s12Side(ctx, h, name, bin, podvmDir, slots, n)
		if err != nil {
			return sc, fmt.Errorf("%s: %w", name, err)
		}
		figs[i] = f
	}
	sc.Rows = s12Rows(n, b.count, figs[0], figs[1])
	for i, name := range []string{"caa", "upstream"} {
		f := figs[i]
		sc.Details = append(sc.Details, fmt.Sprintf("%s: calls while the burst started %s; while it stopped %s; idle %s; StartVM errors in the burst: %s; "+
			"health checks during the rolling update %d; failed pod VM boots %d.",
			name, CountsLine(f.createdCalls), CountsLine(f.deletedCalls), CountsLine(f.idleCalls), f.errText, int(f.checks), f.failedBoots))
	}
	return sc, nil
}

// s12Side measures one program in a rig of its own.
func (b *bench) s12Side(ctx context.Context, h *nsHarness, name, upBin, podvmDir string, slots, n int) (f s12Figures, err error) {
	clock := &restClock{}
	budget := ec2fake.NewBudget(clock.now)
	up := podvmfake.Upstream{Dir: podvmDir}
	boot := func(fl *podvmfake.Fleet, core *cloud.Cloud) {
		imds := func(id string) http.Handler { return ec2fake.IMDS(core, id, nil) }
		up.EC2IMDS = imds
		fl.ReadingFrom(podvmfake.EC2IMDS{IMDS: imds}).Booting(up.Boot)
	}
	// A short label: upstream's agent sockets are <dir>/<64 hex digits>/
	// agent.ttrpc under a directory named after it, within a unix socket
	// path's 108 bytes.
	label := "s12c"
	if upBin != "" {
		label = "s12u"
	}
	r, err := b.newKataRig(ctx, h, label, slots, budget, upBin == "", boot)
	defer r.close()
	if err != nil {
		return f, err
	}
	if err := s12DefaultRoute(r.cn.NodeNS); err != nil {
		return f, err
	}
	s := &s12Side{name: name, b: b, r: r, budget: budget, clock: clock, upBin: upBin, round: 1}
	if err := s.start(ctx); err != nil {
		return f, err
	}
	defer func() { f.failedBoots = len(r.fleet.Failed()) }()

	// One StartVM at a time.
	r.f.core.SetFaults(cloud.Faults{Latency: s10Latency})
	var ids []string
	for i := range b.count {
		id, sock, took, err := s.startOne(ctx, i)
		if err != nil {
			return f, fmt.Errorf("StartVM run %d: %w (log %s)", i+1, err, b.logPath(r.label))
		}
		if err := katafake.CheckAgent(ctx, sock); err != nil {
			return f, fmt.Errorf("agent after StartVM run %d: %w", i+1, err)
		}
		f.startVM = append(f.startVM, ms(took))
		ids = append(ids, id)
	}
	s.stopAll(ctx, ids)
	if _, err := s.waitGone(ctx, ids, s12Gone); err != nil {
		return f, err
	}

	// The burst.
	if err := s.burst(ctx, n, &f); err != nil {
		return f, err
	}
	r.f.core.SetFaults(cloud.Faults{})

	// SIGKILL with sandboxes running.
	if err := s.restart(ctx, &f); err != nil {
		return f, err
	}

	// Memory per sandbox and its growth, then idle, then the rolling
	// update, over the same sandboxes.
	socks, ids, err := s.memory(ctx, &f)
	if err != nil {
		return f, err
	}
	if err := s.idle(ctx, &f); err != nil {
		return f, err
	}
	if err := s.rolling(ctx, socks, &f); err != nil {
		return f, err
	}
	s.stopAll(ctx, ids)
	_, err = s.waitGone(ctx, ids, s12Gone)
	return f, err
}

func (s *s12Side) burst(ctx context.Context, n int, f *s12Figures) error {
	s.round++
	s.clock.rest()
	// caa's own buckets refill too.
	if err := sleepCtx(ctx, restTime(s10WriteRate, s10WriteBurst)); err != nil {
		return err
	}
	ids := make([]string, n)
	for i := range n {
		ids[i] = s12ID(s.round, i)
		if _, err := s.r.createVM(ctx, ids[i], i); err != nil {
			return err
		}
	}
	s.r.f.resetCounters()
	s.budget.ResetCounts()
	start, done, errs := each(n, func(i int) error { return s.r.startVM(ctx, ids[i]) })
	var last time.Duration
	seen := map[string]int{}
	for i, err := range errs {
		last = max(last, done[i].Sub(start))
		if err == nil {
			f.burstOK++
			continue
		}
		f.burstFailed++
		if throttleText(err) {
			f.burstSurfaced++
		}
		seen[firstLine(err.Error())]++
	}
	f.errText = "none"
	if len(seen) > 0 {
		var parts []string
		for k, v := range seen {
			parts = append(parts, fmt.Sprintf("%dx %q", v, k))
		}
		slices.Sort(parts)
		f.errText = strings.Join(parts[:min(3, len(parts))], "; ")
	}
	f.burstAll = ms(last)
	f.throttled = float64(s.budget.Throttled())
	f.createdCalls = callsByOp(s.r.f.counters())
	f.callsCreated = float64(sumCalls(f.createdCalls)) / float64(n)
	vms := s.vmsOf(ids)
	for _, id := range ids {
		if vms[id] != 1 {
			f.burstNoOne++
		}
	}
	if err := sleepCtx(ctx, restTime(s10WriteRate, s10WriteBurst)); err != nil {
		return err
	}
	s.r.f.resetCounters()
	f.burstStopErrs = float64(s.stopAll(ctx, ids))
	left, err := s.waitGone(ctx, ids, s12Gone)
	if err != nil {
		return err
	}
	f.burstLeaked = float64(left)
	// Tunnel devices the burst left in the node's namespace (a program's
	// tunnels live in the pods' namespaces once set up): counted, then
	// removed, as an operator would have to, so that the next rows can
	// start sandboxes.
	strays, err := s12DropStrays(s.r.cn.NodeNS)
	if err != nil {
		return err
	}
	f.strays = float64(strays)
	f.deletedCalls = callsByOp(s.r.f.counters())
	f.callsDeleted = float64(sumCalls(f.deletedCalls)) / float64(n)
	return nil
}

// sumCalls is every call the fake counted (throttled ones are counted as
// calls under their operation too; "throttled" itself is left out).
func sumCalls(m map[string]int64) int64 {
	var n int64
	for k, v := range m {
		if k != "throttled" && k != "serverErrors" {
			n += v
		}
	}
	return n
}

func (s *s12Side) restart(ctx context.Context, f *s12Figures) error {
	s.round++
	s.clock.rest()
	ids := make([]string, s12Restart)
	socks := make([]string, s12Restart)
	for i := range s12Restart {
		id, sock, _, err := s.startOne(ctx, i)
		if err != nil {
			return fmt.Errorf("restart: set up sandbox %d: %w", i, err)
		}
		ids[i], socks[i] = id, sock
	}
	before := cloudWrites(s.r.f.core.Counters())
	if err := s.kill(); err != nil {
		return err
	}
	if err := s.start(ctx); err != nil {
		return err
	}
	var mu sync.Mutex
	_, _, _ = each(len(socks), func(i int) error {
		deadline := time.Now().Add(s12Served)
		for time.Now().Before(deadline) {
			if katafake.CheckAgent(ctx, socks[i]) == nil {
				mu.Lock()
				f.served++
				mu.Unlock()
				return nil
			}
			if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
				return err
			}
		}
		return nil
	})
	f.writes = float64(cloudWrites(s.r.f.core.Counters()) - before)
	vms := s.vmsOf(ids)
	for _, id := range ids {
		if vms[id] > 1 {
			f.duplicated += float64(vms[id] - 1)
		}
	}
	f.restartStopErrs = float64(s.stopAll(ctx, ids))
	left, err := s.waitGone(ctx, ids, s12Gone)
	if err != nil {
		return err
	}
	f.leaked = float64(left)
	if _, err := s12DropStrays(s.r.cn.NodeNS); err != nil {
		return err
	}
	// Kata fails the sandboxes whose StopVM failed and their pods go: a
	// pod's namespace, with any tunnel left in it, goes with it. The rig
	// keeps the namespaces, so the tunnels are removed here.
	for i := range s12Restart {
		if err := s12DropTunnels(s.r.pods[i].NSPath); err != nil {
			return err
		}
	}
	if left > 0 {
		// What a leak costs is measured; the VMs are cleared so that the
		// next rows start alike.
		for _, in := range s.r.f.core.Instances() {
			if in.State != provider.StateTerminated && s12SandboxOf(in, ids) != "" {
				_ = s.r.f.core.Delete(in.ID)
			}
		}
	}
	return nil
}

// memory restarts the program clean (SIGTERM, start), samples it idle,
// with s12Rolling sandboxes, and after s12Rounds rounds of StopVM and
// StartVM over them; it returns the last round's sockets and ids.
func (s *s12Side) memory(ctx context.Context, f *s12Figures) (socks, ids []string, err error) {
	if err := s.stop(); err != nil {
		return nil, nil, err
	}
	if err := s.start(ctx); err != nil {
		return nil, nil, err
	}
	sample := func() (float64, error) {
		if err := sleepCtx(ctx, time.Second); err != nil {
			return 0, err
		}
		return s.rssKiB()
	}
	m0, err := sample()
	if err != nil {
		return nil, nil, err
	}
	startRound := func() error {
		s.round++
		socks, ids = make([]string, s12Rolling), make([]string, s12Rolling)
		for i := range s12Rolling {
			id, sock, _, err := s.startOne(ctx, s12Restart+i)
			if err != nil {
				return fmt.Errorf("memory round %d, sandbox %d: %w", s.round, i, err)
			}
			ids[i], socks[i] = id, sock
		}
		return nil
	}
	if err := startRound(); err != nil {
		return nil, nil, err
	}
	m1, err := sample()
	if err != nil {
		return nil, nil, err
	}
	f.perSandbox = (m1 - m0) / s12Rolling
	for range s12Rounds {
		s.stopAll(ctx, ids)
		if _, err := s.waitGone(ctx, ids, s12Gone); err != nil {
			return nil, nil, err
		}
		if err := startRound(); err != nil {
			return nil, nil, err
		}
	}
	m2, err := sample()
	if err != nil {
		return nil, nil, err
	}
	f.growth = m2 - m1
	return socks, ids, nil
}

// idle counts the cloud calls over s12IdleWindow with the sandboxes
// running, as calls per node-hour. caa is restarted (its relay keeps the
// sandboxes) with --audit-interval s12IdleAudit so that the window holds
// several syncs, and its count is scaled to the default interval.
func (s *s12Side) idle(ctx context.Context, f *s12Figures) error {
	if s.up == nil {
		if err := s.stop(); err != nil {
			return err
		}
		if err := s.start(ctx, "--audit-interval", s12IdleAudit.String()); err != nil {
			return err
		}
		// The startup sync is not idle work.
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return err
		}
	}
	s.r.f.resetCounters()
	if err := sleepCtx(ctx, s.b.s12Idle); err != nil {
		return err
	}
	f.idleCalls = callsByOp(s.r.f.counters())
	calls := float64(sumCalls(f.idleCalls))
	if s.up == nil {
		f.idleHour = ScaleToInterval(calls, s.b.s12Idle, s12IdleAudit, s6Audit)
	} else {
		f.idleHour = calls * float64(time.Hour) / float64(s.b.s12Idle)
	}
	return nil
}

// rolling is the DaemonSet's update with maxUnavailable 1 while every
// shim checks its agent on its one connection.
func (s *s12Side) rolling(ctx context.Context, socks []string, f *s12Figures) error {
	var shims katafake.Shims
	for _, sock := range socks {
		a, err := katafake.DialAgent(ctx, sock)
		if err != nil {
			return err
		}
		shims.Agents = append(shims.Agents, a)
	}
	cctx, stopChecks := context.WithCancel(ctx)
	shims.Check(cctx, s9CheckPeriod, s9CheckTimeout)
	defer func() { stopChecks(); shims.Wait(); shims.Close() }()
	if err := sleepCtx(ctx, time.Second); err != nil {
		return err
	}
	c0, m0 := shims.Counts()
	if err := s.stop(); err != nil {
		return err
	}
	// The new version: caa with its defaults (the idle row's interval
	// goes with the old pod).
	if err := s.start(ctx); err != nil {
		return err
	}
	if err := sleepCtx(ctx, s12Settle); err != nil {
		return err
	}
	stopChecks()
	shims.Wait()
	c1, m1 := shims.Counts()
	f.checks, f.misses = float64(c1-c0), float64(m1-m0)
	for i, a := range shims.Agents {
		if len(a.Misses()) > 0 || katafake.CheckAgent(ctx, socks[i]) != nil {
			f.lost++
		}
	}
	return nil
}

// kill sends SIGKILL and reaps the process.
func (d *Daemon) kill() error {
	if err := d.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	err := <-d.done
	d.done <- err
	return nil
}

// s12DefaultRoute gives the node's namespace a default route through its
// cloud network, as a worker has one through its primary interface:
// upstream's adaptor finds the worker's interface and address by it (caa
// is given --node-ip). Nothing in the rig is reached through it.
func s12DefaultRoute(nodeNS string) error {
	return podvmfake.InNetNS(nodeNS, func() error {
		br, err := netlink.LinkByName("cloud0")
		if err != nil {
			return fmt.Errorf("the node's cloud network: %w", err)
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: br.Attrs().Index, Scope: netlink.SCOPE_LINK,
			Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("the node's default route: %w", err)
		}
		return nil
	})
}

// s12DropTunnels removes the VXLAN devices in a pod's namespace.
func s12DropTunnels(nsPath string) error {
	_, err := s12DropVXLAN(nsPath)
	return err
}

// s12DropVXLAN removes the VXLAN devices in a namespace and counts them.
func s12DropVXLAN(nsPath string) (n int, err error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return 0, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return 0, err
	}
	for _, l := range links {
		if l.Type() == "vxlan" {
			if err := h.LinkDel(l); err != nil {
				return n, fmt.Errorf("remove %s from %s: %w", l.Attrs().Name, nsPath, err)
			}
			n++
		}
	}
	return n, nil
}

// s12DropStrays removes the VXLAN devices in the node's namespace and
// returns how many there were.
func s12DropStrays(nodeNS string) (int, error) {
	return s12DropVXLAN(nodeNS)
}
