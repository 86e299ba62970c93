package nodeagent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// process is one run of a pod's container.
type process struct {
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{} // closed once reaped
	waitErr error         // set before done is closed
	ended   time.Time
}

// startProcess runs l with its output appended to logPath, under a header
// line per start so restarts show in the one file.
func startProcess(l launch, dir, logPath string, start func(*exec.Cmd) error) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open container log: %w", err)
	}
	fmt.Fprintf(f, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), l.binary, strings.Join(l.args, " "))
	cmd := exec.Command(l.binary, l.args...)
	cmd.Env = l.env
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	// The processes die with the test binary even if it never runs its
	// cleanups (a panic, a timeout).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if start == nil {
		start = (*exec.Cmd).Start
	}
	if err := start(cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", l.binary, err)
	}
	p := &process{cmd: cmd, started: time.Now(), done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		p.ended = time.Now()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM, waits up to grace, then SIGKILLs and waits for the
// process to be reaped. It reports whether the kill was needed.
func (p *process) stop(grace time.Duration) (killed bool) {
	return cluster.Stop(p.cmd, p.done, grace)
}

// terminated describes the ended process as a container state; only call
// it once done is closed.
func (p *process) terminated(containerID string) *corev1.ContainerStateTerminated {
	t := &corev1.ContainerStateTerminated{
		StartedAt:   metav1.NewTime(p.started),
		FinishedAt:  metav1.NewTime(p.ended),
		ContainerID: containerID,
		Reason:      "Completed",
	}
	var exit *exec.ExitError
	if errors.As(p.waitErr, &exit) {
		t.Reason = "Error"
		t.ExitCode = int32(exit.ExitCode())
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.ExitCode = 128 + int32(ws.Signal())
			t.Signal = int32(ws.Signal())
		}
	} else if p.waitErr != nil {
		t.Reason, t.Message = "Error", p.waitErr.Error()
	}
	return t
}
