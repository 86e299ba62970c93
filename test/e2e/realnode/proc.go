package realnode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/caa-project/caa/test/e2e/cluster"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// proc is one long-running program of the node (containerd, the kubelet),
// its output appended to a log file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	waitErr error
}

// startProc starts bin in the network namespace at netns (empty: this
// process's), with env added to this process's environment.
func startProc(name, bin string, args, env []string, netns, logPath string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	fmt.Fprintf(f, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	// The kernel ends it if the test binary dies without its cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if netns != "" {
		// Born in the namespace: a child inherits its forking thread's.
		err = podvmfake.InNetNS(netns, cmd.Start)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited returns why the program ended, or nil while it runs.
func (p *proc) exited() error {
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

// stop sends SIGTERM, and SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	cluster.Stop(p.cmd, p.done, grace)
}

// tail returns the last n lines of the program's log.
func (p *proc) tail(n int) string { return fileTail(p.logPath, n) }

func fileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const window = 64 << 10
	if info, err := f.Stat(); err == nil && info.Size() > window {
		_, _ = f.Seek(info.Size()-window, io.SeekStart)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(read log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// killReferencing SIGKILLs every process whose command line holds needle
// (the shims a containerd started name its socket), and returns their pids.
// A shim outlives containerd by design; a test's node must not.
func killReferencing(needle string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var killed []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte(needle)) {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil || !errors.Is(err, syscall.ESRCH) {
			killed = append(killed, pid)
		}
	}
	return killed
}

// unmountUnder lazily unmounts every mount point under dir, deepest first
// (overlay snapshots, shm and netns bind mounts containerd left behind).
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}
