// Command demo-kata is `make demo-kata`: caa as kata's remote hypervisor on
// one node, upgraded under running peer pods. It starts etcd and a real
// kube-apiserver, a node made of network namespaces with the fake EC2 and
// fake pod VMs (test/e2e/katanode), the caa binary in the remote hypervisor
// mode and `caa relay`; a fake kata shim starts three sandboxes (CreateVM,
// StartVM) and health-checks their agents through the relay while a second
// caa binary takes the node's ledger over by the surge hand-over and the
// first one ends. It then stops the sandboxes (StopVM) and shows their VMs
// gone. It narrates each step, checks each claim it prints (exit 1 when one
// does not hold) and stops everything it started. It needs root.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/relayd"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/katanode"
	katafake "github.com/caa-project/caa/test/mocks/kata"
)

// config is one run of the demo.
type config struct {
	// caa and caaNext are the binaries before and after the upgrade; empty
	// caa builds one (as `go build` of ./cmd/caa), empty caaNext is caa.
	caa, caaNext string
	// sandboxes is how many peer pods the shim starts.
	sandboxes int
	// period is the shim's health-check period (kata's is 5 s; shorter
	// here, so that a cut of a fraction of a second shows) and timeout
	// how long a check may go unanswered before it is a miss.
	period, timeout time.Duration
	// duringUpgrade, if set, runs while both caa processes are up (the
	// test's faults: the demo must then fail).
	duringUpgrade func(ctx context.Context, node *katanode.Node, ids []string) error
}

func main() {
	cfg := config{sandboxes: 3, period: 100 * time.Millisecond, timeout: time.Second}
	flag.StringVar(&cfg.caa, "caa", "", "the caa binary to start with (make demo-kata passes bin/caa from make build); empty: build one")
	flag.StringVar(&cfg.caaNext, "caa-next", "", "the caa binary to upgrade to; empty: the same as -caa")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "\ndemo-kata FAILED:", err)
		os.Exit(1)
	}
}

// narrator prints the demo's steps.
type narrator struct{ w io.Writer }

func (n narrator) step(format string, args ...any) { fmt.Fprintf(n.w, "\n==> "+format+"\n", args...) }
func (n narrator) line(format string, args ...any) { fmt.Fprintf(n.w, "    "+format+"\n", args...) }

func run(ctx context.Context, w io.Writer, cfg config) (err error) {
	say := narrator{w}
	if os.Geteuid() != 0 {
		return errors.New("the demo builds network namespaces (a node, its pods and pod VMs) and needs root: run `sudo make demo-kata`")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	// Only etcd and kube-apiserver: the e2e tests' other binaries would add
	// minutes to a first run for nothing.
	if err := os.Setenv(cluster.OnlyEnv, "etcd,kube-apiserver"); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "caa-demo-kata-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if cfg.caa == "" {
		say.step("Building caa (go build -tags caa_aws ./cmd/caa: the demo's cloud is the fake EC2)")
		cfg.caa = filepath.Join(work, "caa")
		if err := cluster.BuildCaa(ctx, cfg.caa, "demo", "caa_aws"); err != nil {
			return err
		}
	}
	if cfg.caaNext == "" {
		cfg.caaNext = cfg.caa
	}
	for _, b := range []*string{&cfg.caa, &cfg.caaNext} {
		if *b, err = filepath.Abs(*b); err != nil {
			return err
		}
	}

	say.step("Starting etcd and a real kube-apiserver on 127.0.0.1 (built once from the Go module proxy, then cached in ~/.cache/caa-e2e)")
	c, err := cluster.Launch(ctx, cluster.Options{})
	if err != nil {
		return err
	}
	defer func() { _ = c.Stop() }()

	say.step("Building node demo-node: network namespaces for the node, its pods and the pod VMs; the fake EC2 on the node's loopback")
	node, err := katanode.New(ctx, c, cfg.caa, "demo-node")
	if err != nil {
		return err
	}
	defer node.Close()
	say.line("node namespace %s, cloud network %s", node.Net.NodeNS, node.Net.NodeIP)
	say.line("every instance the fake EC2 runs boots a fake pod VM (agent-protocol-forwarder and kata agent) from its user data")

	var procs []*katanode.Process
	defer func() {
		for _, p := range procs {
			_ = p.Kill()
		}
	}()
	say.step("Starting %s in the remote hypervisor mode (pod caa-v1), then `caa relay`, which will hold the agent sockets", version(ctx, cfg.caa))
	v1, err := node.StartCaa("caa-v1")
	if err != nil {
		return err
	}
	procs = append(procs, v1)
	if _, err := v1.WaitReady(ctx, 2*time.Minute); err != nil {
		return withLogs(err, "caa v1", v1)
	}
	relay, err := node.StartRelay(ctx)
	if err != nil {
		return err
	}
	procs = append(procs, relay)
	say.line("caa ready; kata's remote_hypervisor_socket is %s", node.HypervisorSocket)

	say.step("The kata shim starts %d peer pods: CreateVM then StartVM on caa's hypervisor socket, each", cfg.sandboxes)
	ids, socks, firstVMs, err := startSandboxes(ctx, say, node, cfg.sandboxes)
	if err != nil {
		return withLogs(err, "caa v1", v1)
	}

	say.step("Their agents answer through `caa relay` (the sockets are the relay's: they outlive any caa process)")
	entries, _, err := (&relayd.Client{Socket: node.RelaySocket}).List(ctx)
	if err != nil {
		return fmt.Errorf("caa relay's list: %w", err)
	}
	served := map[string]relayd.Entry{}
	for _, e := range entries {
		served[e.Sandbox] = e
	}
	var shims katafake.Shims
	defer shims.Close()
	for i, id := range ids {
		e, ok := served[id]
		if !ok || e.Socket != socks[i] {
			return fmt.Errorf("sandbox %s: caa relay does not serve its agent socket %s (it serves %+v)", short(id), socks[i], entries)
		}
		if err := katafake.CheckAgent(ctx, socks[i]); err != nil {
			return fmt.Errorf("sandbox %s: the agent through the relay: %w", short(id), err)
		}
		say.line("sandbox %s: relay socket %s -> VM %s: agent SERVING", short(id), shortPath(node, socks[i]), e.Addr)
		a, err := katafake.DialAgent(ctx, socks[i])
		if err != nil {
			return err
		}
		shims.Agents = append(shims.Agents, a)
	}

	say.step("The shim health-checks every agent every %s on one connection per sandbox, opened once and kept (a check unanswered within %s is a miss; kata fails the sandbox on one)", cfg.period, cfg.timeout)
	checkCtx, stopChecks := context.WithCancel(ctx)
	defer stopChecks()
	shims.Check(checkCtx, cfg.period, cfg.timeout)
	if err := awaitChecks(ctx, &shims, 3); err != nil {
		return err
	}
	checks, misses := shims.Counts()
	say.line("%d checks so far, %d missed", checks, misses)

	runs0, terms0 := node.Calls.Writes()
	checks0, _ := shims.Counts()
	say.step("Upgrading caa by the surge hand-over: %s starts beside the running one (pod caa-v2) on the same ledger", version(ctx, cfg.caaNext))
	say.line("as a DaemonSet update with maxSurge 1 does; the cloud so far saw %d RunInstances and %d TerminateInstances", runs0, terms0)
	v2, err := node.StartCaaBin(cfg.caaNext, "caa-v2")
	if err != nil {
		return err
	}
	procs = append(procs, v2)
	if cfg.duringUpgrade != nil {
		if err := cfg.duringUpgrade(ctx, node, ids); err != nil {
			return err
		}
	}
	if _, err := v2.WaitReady(ctx, 2*time.Minute); err != nil {
		return withLogs(err, "caa v2", v2)
	}
	took, err := v2.WaitHandover(ctx, health.HandoverDone, 30*time.Second)
	if err != nil {
		return withLogs(err, "caa v2", v2)
	}
	gave, err := v1.WaitHandover(ctx, health.HandoverDone, 30*time.Second)
	if err != nil {
		return withLogs(err, "caa v1", v1)
	}
	say.line("caa-v2 %s from %s in %s (no reconciler on the node for %s); caa-v1 %s to %s",
		took.Role, took.Peer, time.Duration(took.Took).Round(time.Millisecond), time.Duration(took.Gap).Round(time.Millisecond), gave.Role, gave.Peer)
	say.line("the DaemonSet controller deletes the old pod: SIGTERM to caa-v1 (shutdown deletes nothing)")
	if err := v1.Stop(time.Minute); err != nil {
		return withLogs(fmt.Errorf("caa v1: %w", err), "caa v1", v1)
	}
	// A few more checks on every sandbox with caa-v2 alone on the node.
	if err := awaitChecks(ctx, &shims, 3); err != nil {
		return err
	}
	stopChecks()
	shims.Wait()
	runs1, terms1 := node.Calls.Writes()
	checks, misses = shims.Counts()

	say.step("What the upgrade cost the peer pods and the cloud")
	say.line("health checks since the upgrade began: %d (of %d in all), missed: %d", checks-checks0, checks, misses)
	say.line("cloud writes during the upgrade: %d (RunInstances %d, TerminateInstances %d)", runs1-runs0+terms1-terms0, runs1-runs0, terms1-terms0)
	var failed []string
	if misses != 0 {
		for i, a := range shims.Agents {
			for _, m := range a.Misses() {
				failed = append(failed, fmt.Sprintf("sandbox %s: %s", short(ids[i]), m))
			}
		}
	}
	if runs1 != runs0 || terms1 != terms0 {
		failed = append(failed, fmt.Sprintf("the upgrade wrote to the cloud: %d RunInstances, %d TerminateInstances", runs1-runs0, terms1-terms0))
	}
	if len(failed) > 0 {
		return fmt.Errorf("the upgrade was not seamless:\n  %s", strings.Join(failed, "\n  "))
	}

	say.step("caa ledger ls (answered by the running caa-v2 over its unix socket): the kata mode records sandboxes, not pods")
	out, err := exec.CommandContext(ctx, cfg.caaNext, "ledger", "ls", "--ledger", node.Ledger).CombinedOutput()
	if err != nil {
		return fmt.Errorf("caa ledger ls: %w: %s", err, out)
	}
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		say.line("%s", l)
	}
	for i, id := range ids {
		row := slices.IndexFunc(strings.Split(string(out), "\n"), func(l string) bool {
			f := strings.Fields(l)
			return len(f) > 4 && f[0] == id[:12] && f[3] == "Running" && f[4] == firstVMs[i]
		})
		if row < 0 {
			return fmt.Errorf("caa ledger ls does not list sandbox %s Running on its first VM %s", short(id), firstVMs[i])
		}
	}

	say.step("The shim stops every sandbox (StopVM): caa deletes its VM")
	for i, id := range ids {
		vms := node.LiveSandboxVMs(id)
		if err := node.Shim.StopVM(ctx, id); err != nil {
			return withLogs(fmt.Errorf("StopVM %s: %w", short(id), err), "caa v2", v2)
		}
		if err := vmsGone(ctx, node, id); err != nil {
			return withLogs(err, "caa v2", v2)
		}
		if err := socketClosed(ctx, node, id, socks[i]); err != nil {
			return withLogs(err, "caa v2", v2)
		}
		for _, vm := range vms {
			say.line("sandbox %s: StopVM answered; instance %s %s in the fake EC2, its pod VM gone from the cloud network, its relay socket refuses connections",
				short(id), vm.ID, stateOf(node, vm.ID))
		}
	}
	if left := node.Core.Live(); len(left) != 0 {
		return fmt.Errorf("%d VMs still run after every StopVM", len(left))
	}
	say.line("the cloud has no live VM; the ledger keeps each sandbox's history (caa ledger history <id>)")

	say.step("Stopping caa, caa relay, the node's namespaces, kube-apiserver and etcd")
	if err := v2.Stop(time.Minute); err != nil {
		return withLogs(fmt.Errorf("caa v2: %w", err), "caa v2", v2)
	}
	if err := relay.Stop(30 * time.Second); err != nil {
		return fmt.Errorf("caa relay: %w", err)
	}
	say.line("done: %d peer pods kept every health check through caa's upgrade, with no cloud write", len(ids))
	return nil
}

// startSandboxes creates the pods on the apiserver and on the node and
// starts their sandboxes as kata's shim does, side by side.
func startSandboxes(ctx context.Context, say narrator, node *katanode.Node, count int) (ids, socks, vmIDs []string, err error) {
	type result struct {
		sock string
		err  error
	}
	results := make([]chan result, count)
	for i := range count {
		id := sandboxID(fmt.Sprintf("web-%d", i))
		pod, err := node.NewPod(ctx, "demo", fmt.Sprintf("web-%d", i))
		if err != nil {
			return nil, nil, nil, err
		}
		ids = append(ids, id)
		results[i] = make(chan result, 1)
		go func() {
			sock, err := node.Shim.CreateVM(ctx, id, pod.Annotations(), pod.Net.NSPath)
			if err == nil {
				err = node.Shim.StartVM(ctx, id)
			}
			results[i] <- result{sock, err}
		}()
	}
	for i, id := range ids {
		r := <-results[i]
		if r.err != nil {
			return nil, nil, nil, fmt.Errorf("sandbox %s (pod demo/web-%d): %w (VMs that did not boot: %v)", short(id), i, r.err, node.Fleet.Failed())
		}
		vms := node.LiveSandboxVMs(id)
		if len(vms) != 1 {
			return nil, nil, nil, fmt.Errorf("sandbox %s: %d live VMs, want 1", short(id), len(vms))
		}
		say.line("pod demo/web-%d: sandbox %s running on VM %s (%s)", i, short(id), vms[0].ID, vms[0].IPs[0])
		socks = append(socks, r.sock)
		vmIDs = append(vmIDs, vms[0].ID)
	}
	return ids, socks, vmIDs, nil
}

// awaitChecks waits until every shim made n more checks.
func awaitChecks(ctx context.Context, shims *katafake.Shims, n int) error {
	from := make([]int, len(shims.Agents))
	for i, a := range shims.Agents {
		from[i] = a.Checks()
	}
	return katanode.Poll(ctx, time.Minute, func() (bool, error) {
		for i, a := range shims.Agents {
			if a.Checks() < from[i]+n {
				return false, nil
			}
		}
		return true, nil
	})
}

// vmsGone waits until the sandbox has no live VM in the fake EC2 and no
// pod VM on the cloud network.
func vmsGone(ctx context.Context, node *katanode.Node, id string) error {
	all := node.SandboxVMs(id)
	err := katanode.Poll(ctx, time.Minute, func() (bool, error) {
		if len(node.LiveSandboxVMs(id)) > 0 {
			return false, nil
		}
		for _, vm := range all {
			if node.Fleet.VM(vm.ID) != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("sandbox %s: its VM is still there after StopVM: %w", short(id), err)
	}
	return nil
}

// socketClosed waits until caa relay no longer serves the sandbox and its
// agent socket refuses a new connection.
func socketClosed(ctx context.Context, node *katanode.Node, id, socket string) error {
	cl := &relayd.Client{Socket: node.RelaySocket}
	err := katanode.Poll(ctx, time.Minute, func() (bool, error) {
		entries, _, err := cl.List(ctx)
		if err != nil {
			return false, fmt.Errorf("caa relay's list: %w", err)
		}
		for _, e := range entries {
			if e.Sandbox == id {
				return false, nil
			}
		}
		c, err := net.DialTimeout("unix", socket, time.Second)
		if err == nil {
			_ = c.Close()
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("sandbox %s: caa relay still serves its agent socket after StopVM: %w", short(id), err)
	}
	return nil
}

func stateOf(node *katanode.Node, instanceID string) string {
	for _, in := range node.Core.Instances() {
		if in.ID == instanceID {
			return string(in.State)
		}
	}
	return "gone"
}

// version is the binary's `caa version`, for the narrative.
func version(ctx context.Context, bin string) string {
	out, err := exec.CommandContext(ctx, bin, "version").Output()
	if err != nil {
		return "caa (version unknown)"
	}
	return strings.TrimSpace(string(out))
}

// sandboxID is a sandbox id as kata makes them, 64 hex digits, derived
// from the pod's name so that each reads apart from the others in its
// first 12 (which caa ledger ls prints).
func sandboxID(pod string) string {
	sum := sha256.Sum256([]byte("demo-kata/" + pod))
	return hex.EncodeToString(sum[:])
}

func short(id string) string { return id[:12] + "…" }

// shortPath is a path under the node's directory, shortened for the
// narrative.
func shortPath(node *katanode.Node, p string) string {
	if rel, err := filepath.Rel(node.Dir, p); err == nil && !strings.HasPrefix(rel, "..") {
		parts := strings.Split(rel, "/")
		for i, s := range parts {
			if len(s) == 64 {
				parts[i] = s[:12] + "…"
			}
		}
		return "<node>/" + strings.Join(parts, "/")
	}
	return p
}

// withLogs adds the tail of a caa's output to err.
func withLogs(err error, label string, p *katanode.Process) error {
	lines := strings.Split(strings.TrimRight(p.Logs.String(), "\n"), "\n")
	return fmt.Errorf("%w\n%s output (last lines):\n%s", err, label, strings.Join(lines[max(0, len(lines)-30):], "\n"))
}
