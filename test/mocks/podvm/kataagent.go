package podvmfake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// KataAgent is the test kata agent (test/kataagent, built by
// test/e2e/upstream against kata's own agent protocol) running as a VM's
// agent: a process of the VM in its pod network namespace, so that what it
// holds (the sandbox, the containers' processes) lives as long as the VM,
// whatever happens to caa.
type KataAgent struct {
	// Socket is the agent's unix socket, which the forwarder dials.
	Socket string
	calls  string
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{}
}

// KataCalls is what the agent counted, per method: answered, failed
// (an error the method chose, such as the end of a stream) and
// Unimplemented (a call the stand-in does not serve).
type KataCalls struct {
	Served        map[string]int `json:"served"`
	Failed        map[string]int `json:"failed"`
	Unimplemented map[string]int `json:"unimplemented"`
}

// startKataAgent starts bin in the namespace podNS with its socket, counts
// and files under dir, and returns once it listens.
func startKataAgent(ctx context.Context, bin, dir, podNS string) (*KataAgent, error) {
	if err := os.MkdirAll(filepath.Join(dir, "root"), 0o700); err != nil {
		return nil, err
	}
	k := &KataAgent{Socket: filepath.Join(dir, "agent.sock"), calls: filepath.Join(dir, "calls.json"), out: &syncBuffer{}, exited: make(chan struct{})}
	k.cmd = exec.Command(bin, "-socket", k.Socket, "-calls", k.calls, "-root", filepath.Join(dir, "root"))
	k.cmd.Stdout, k.cmd.Stderr = k.out, k.out
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := InNetNS(podNS, k.cmd.Start); err != nil {
		return nil, fmt.Errorf("start kata agent %s: %w", bin, err)
	}
	go func() { _ = k.cmd.Wait(); close(k.exited) }()
	for {
		if _, err := os.Stat(k.Socket); err == nil {
			return k, nil
		}
		select {
		case <-k.exited:
			return nil, fmt.Errorf("kata agent %s exited before it listened:\n%s", bin, k.out.String())
		case <-ctx.Done():
			k.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop ends the agent (which ends its containers' processes) as the VM's
// power-off would.
func (k *KataAgent) stop() {
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.exited:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		<-k.exited
	}
}

// Calls reads what the agent has counted so far.
func (k *KataAgent) Calls() (KataCalls, error) {
	var c KataCalls
	b, err := os.ReadFile(k.calls)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil // no call yet
	}
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("kata agent counts %s: %w", k.calls, err)
	}
	return c, nil
}

// Output is what the agent logged.
func (k *KataAgent) Output() string { return k.out.String() }
