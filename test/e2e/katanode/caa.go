package katanode

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"syscall"
	"time"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/relayd"
	"github.com/caa-project/caa/test/e2e/cluster"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// RunArgs are the flags of `caa run` in the remote hypervisor mode on a
// node: its apiserver, ledger, health address, hypervisor socket, agent
// socket directory and address on the cloud network, with short passes so
// that a test or demo sees them. The cloud's flags and any others follow.
func RunArgs(node, kubeconfig, ledgerPath, healthAddr, hypervisorSocket, agentDir, nodeIP string) []string {
	return []string{"run", "--node-name", node, "--kubeconfig", kubeconfig, "--ledger", ledgerPath,
		"--health-addr", healthAddr, "--resync", "2s", "--audit-interval", "2s", "--confirm-missing", "2s", "--log-format", "json",
		"--hypervisor-socket", hypervisorSocket, "--agent-socket-dir", agentDir,
		"--node-ip", nodeIP, "--start-vm-timeout", "60s"}
}

// HandoverEnv opts a caa run outside a pod into the surge hand-over: with
// no pod around it nothing can verify the asker, so it is taken at its
// word (the e2e tests do the same).
const HandoverEnv = "CAA_HANDOVER_ALLOW_UNVERIFIED=true"

// Process is a caa process (`caa run` or `caa relay`) started on the node.
type Process struct {
	Cmd  *exec.Cmd
	Logs *cluster.SyncBuffer
	// Health is `caa run`'s health server, forwarded to this process's
	// loopback (http://127.0.0.1:port); empty for the relay.
	Health string

	done    chan struct{}
	waitErr error
	stopFwd func()
}

// start runs bin with args in the node's namespace: a child forked from a
// thread inside it is born there.
func (n *Node) start(bin string, env, args []string) (*Process, error) {
	p := &Process{Logs: &cluster.SyncBuffer{}, done: make(chan struct{})}
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Env = env
	p.Cmd.Stdout, p.Cmd.Stderr = p.Logs, p.Logs
	if err := podvmfake.InNetNS(n.Net.NodeNS, p.Cmd.Start); err != nil {
		return nil, fmt.Errorf("start %s %s on node %s: %w", bin, args[0], n.Name, err)
	}
	go func() { p.waitErr = p.Cmd.Wait(); close(p.done) }()
	return p, nil
}

// StartCaa runs `caa run` in the remote hypervisor mode on the node as
// DaemonSet pod podName, its agent sockets served by `caa relay` on
// RelaySocket, with the surge hand-over on; extra flags come last (a flag
// given twice keeps its last value).
func (n *Node) StartCaa(podName string, extra ...string) (*Process, error) {
	return n.StartCaaBin(n.caaBin, podName, extra...)
}

// StartCaaBin is StartCaa with another caa build (the new version of an
// upgrade).
func (n *Node) StartCaaBin(bin, podName string, extra ...string) (*Process, error) {
	// A port free in the node's namespace, forwarded to this one's loopback.
	var inner string
	if err := podvmfake.InNetNS(n.Net.NodeNS, func() error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		inner = l.Addr().String()
		return l.Close()
	}); err != nil {
		return nil, fmt.Errorf("a health port on node %s: %w", n.Name, err)
	}
	outer, stopFwd, err := Forward("", "127.0.0.1:0", n.Net.NodeNS, inner)
	if err != nil {
		return nil, err
	}
	args := RunArgs(n.Name, n.Cluster.Kubeconfig(), n.Ledger, inner, n.HypervisorSocket, n.AgentDir, n.Net.NodeIP.Addr().String())
	args = append(args, n.CloudArgs()...)
	args = append(args, "--pod-name", podName, "--relay-socket", n.RelaySocket)
	p, err := n.start(bin, append(n.CloudEnv(), HandoverEnv), append(args, extra...))
	if err != nil {
		stopFwd()
		return nil, err
	}
	p.Health, p.stopFwd = "http://"+outer, stopFwd
	return p, nil
}

// StartRelay runs `caa relay` on the node (it dials the VMs from there) and
// waits until its control socket answers. caa writes the relay's client
// file beside RelaySocket, so the relay starts once a caa did.
func (n *Node) StartRelay(ctx context.Context) (*Process, error) {
	p, err := n.start(n.caaBin, HermeticEnv(), []string{"relay", "--socket", n.RelaySocket, "--log-format", "json"})
	if err != nil {
		return nil, err
	}
	cl := &relayd.Client{Socket: n.RelaySocket}
	err = poll(ctx, time.Minute, func() (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("caa relay %w: %v", errExited, p.waitErr)
		}
		_, _, err := cl.List(ctx)
		return err == nil, nil
	})
	if err != nil {
		_ = p.Kill()
		return nil, fmt.Errorf("caa relay on node %s: %w", n.Name, err)
	}
	return p, nil
}

// Exited says whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Status is `caa run`'s /status.
func (p *Process) Status(ctx context.Context) (health.Snapshot, error) {
	return ReadStatus(ctx, p.Health)
}

// WaitReady waits until caa reports ready, for up to within.
func (p *Process) WaitReady(ctx context.Context, within time.Duration) (health.Snapshot, error) {
	var snap health.Snapshot
	err := poll(ctx, within, func() (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("caa %w before it was ready: %v", errExited, p.waitErr)
		}
		s, err := p.Status(ctx)
		snap = s
		return err == nil && s.Ready, nil
	})
	if err != nil {
		return snap, fmt.Errorf("caa ready: %w (last reason: %q)", err, snap.Reason)
	}
	return snap, nil
}

// WaitHandover waits until caa's last hand-over has outcome, for up to
// within, and returns it.
func (p *Process) WaitHandover(ctx context.Context, outcome string, within time.Duration) (health.Handover, error) {
	var h health.Handover
	err := poll(ctx, within, func() (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("caa %w: %v", errExited, p.waitErr)
		}
		s, err := p.Status(ctx)
		if err != nil || s.Handover == nil {
			return false, nil
		}
		h = *s.Handover
		return h.Outcome == outcome, nil
	})
	if err != nil {
		return h, fmt.Errorf("hand-over %q: %w (last seen: %+v)", outcome, err, h)
	}
	return h, nil
}

// Stop sends SIGTERM and waits up to within for the process to exit 0.
func (p *Process) Stop(within time.Duration) error {
	defer p.closeForward()
	if p.Exited() {
		return fmt.Errorf("already %w: %v", errExited, p.waitErr)
	}
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM: %w", err)
	}
	select {
	case <-p.done:
		if p.waitErr != nil {
			return fmt.Errorf("exit on SIGTERM: %w", p.waitErr)
		}
		return nil
	case <-time.After(within):
		_ = p.Kill()
		return fmt.Errorf("not stopped within %s of SIGTERM (killed)", within)
	}
}

// Kill ends the process with SIGKILL, if it runs, and waits for it.
func (p *Process) Kill() error {
	defer p.closeForward()
	if p.Exited() {
		return nil
	}
	err := p.Cmd.Process.Kill()
	<-p.done
	return err
}

func (p *Process) closeForward() {
	if p.stopFwd != nil {
		p.stopFwd()
		p.stopFwd = nil
	}
}

// poll calls cond every 50 ms (a poll interval, not a synchronisation)
// until it holds, fails, ctx ends or within passes.
func poll(ctx context.Context, within time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %s: %w", within, ctx.Err())
		case <-tick.C:
		}
	}
}

// Poll is poll for the package's users.
func Poll(ctx context.Context, within time.Duration, cond func() (bool, error)) error {
	return poll(ctx, within, cond)
}

// ReadStatus reads the /status of the caa whose health endpoint is the
// URL healthURL.
func ReadStatus(ctx context.Context, healthURL string) (health.Snapshot, error) {
	var snap health.Snapshot
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, healthURL+"/status", nil)
	if err != nil {
		return snap, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return snap, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return snap, fmt.Errorf("/status answered %s", resp.Status)
	}
	return snap, json.NewDecoder(resp.Body).Decode(&snap)
}
