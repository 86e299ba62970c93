package cluster

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is one server the harness runs, its output appended to a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFrom int64         // size of the log when this process started
	done    chan struct{} // closed once the process has been reaped
	waitErr error         // set before done is closed
}

func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	return StartProcess(name, bin, args, nil, nil, logPath)
}

// Process is a program started by StartProcess, for harnesses beside this
// one (the real node's containerd and kubelet).
type Process = process

// StartProcess starts bin with args, its output appended to logPath under
// a header line, env (if any) added to this process's environment, and
// start (nil: cmd.Start) to start it, for example in another network
// namespace. The kernel kills it if the test binary dies first.
func StartProcess(name, bin string, args, env []string, start func(*exec.Cmd) error, logPath string) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	// A header per start, so a restart is visible in the one log file.
	fmt.Fprintf(f, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = f
	cmd.Stderr = f
	// If the test binary dies without running its cleanups (a panic, a
	// timeout, SIGKILL), the kernel kills the server too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if start == nil {
		start = (*exec.Cmd).Start
	}
	if err := start(cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFrom: info.Size(), done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited returns why the process ended, or nil while it runs.
func (p *process) Exited() error { return p.exitErr() }

// Stop ends it: SIGTERM, then SIGKILL after grace.
func (p *process) Stop(grace time.Duration) { p.stop(grace) }

// Tail returns the last n lines it wrote to its log.
func (p *process) Tail(n int) string { return p.tail(n) }

// LogPath is its log file.
func (p *process) LogPath() string { return p.logPath }

// exitErr returns why the process ended, or nil while it runs.
func (p *process) exitErr() error {
	select {
	case <-p.done:
		if p.waitErr != nil {
			return fmt.Errorf("%s exited: %w", p.name, p.waitErr)
		}
		return fmt.Errorf("%s exited with status 0", p.name)
	default:
		return nil
	}
}

// stop sends SIGTERM and waits up to grace, then SIGKILLs and waits for the
// kill to land. It reports whether the kill was needed.
func (p *process) stop(grace time.Duration) (killed bool) {
	return Stop(p.cmd, p.done, grace)
}

// Stop ends the started cmd, whose waiter closes done once it is reaped:
// SIGTERM, up to grace to exit, then SIGKILL, and it waits for done. It
// reports whether the kill was needed (false, too, when cmd had exited).
func Stop(cmd *exec.Cmd, done <-chan struct{}, grace time.Duration) (killed bool) {
	select {
	case <-done:
		return false
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-done:
		return false
	case <-timer.C:
	}
	_ = cmd.Process.Kill()
	<-done
	return true
}

// tail returns the last n lines this process wrote to its log, leaving out
// earlier runs that share the file.
func (p *process) tail(n int) string {
	return fileTail(p.logPath, p.logFrom, n)
}

// fileTail returns at most n trailing lines from the last 64 KiB of a file,
// starting no earlier than offset from.
func fileTail(path string, from int64, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const window = 64 << 10
	if info, err := f.Stat(); err == nil {
		from = max(from, info.Size()-window)
	}
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return fmt.Sprintf("(read log: %v)", err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(read log: %v)", err)
	}
	return LastLines(b, n)
}
