package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// readyPoll is how often WaitReady asks /readyz: the resolution of every
// time to ready this program reports.
const readyPoll = 5 * time.Millisecond

// Daemon is one `caa run` process.
type Daemon struct {
	cmd     *exec.Cmd
	health  string
	logPath string
	started time.Time
	done    chan error
	client  *http.Client
}

// StartCaa runs `bin run args... --health-addr <free port>` in env, output
// to logPath. The clock for time to ready starts just before the exec.
func StartCaa(bin string, args, env []string, logPath string) (*Daemon, error) {
	return startCaaCommand(bin, "run", args, env, logPath)
}

// startCaaCommand is StartCaa for any caa subcommand with a health
// endpoint (run, cluster).
func startCaaCommand(bin, sub string, args, env []string, logPath string) (*Daemon, error) {
	port, err := cluster.FreePort()
	if err != nil {
		return nil, fmt.Errorf("find a health port: %w", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("caa log: %w", err)
	}
	cmd := exec.Command(bin, append(append([]string{sub}, args...), "--health-addr", addr)...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	// A dying bench must not leave caa running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	d := &Daemon{cmd: cmd, health: "http://" + addr, logPath: logPath, done: make(chan error, 1),
		client: &http.Client{Timeout: 5 * time.Second}}
	d.started = time.Now()
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("start caa: %w", err)
	}
	go func() { d.done <- cmd.Wait(); _ = out.Close() }()
	return d, nil
}

// exited reports whether the process has ended.
func (d *Daemon) exited() bool {
	select {
	case err := <-d.done:
		d.done <- err
		return true
	default:
		return false
	}
}

// Pid is the process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// WaitReady polls /readyz every readyPoll and returns the time from just
// before the exec to the first 200.
func (d *Daemon) WaitReady(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		if code := d.get(ctx, "/readyz"); code == http.StatusOK {
			return time.Since(d.started), nil
		}
		select {
		case err := <-d.done:
			d.done <- err
			return 0, fmt.Errorf("caa exited before ready (%v); last lines of %s:\n%s", err, d.logPath, tail(d.logPath, 15))
		case <-ctx.Done():
			return 0, fmt.Errorf("caa not ready after %s; last lines of %s:\n%s", timeout, d.logPath, tail(d.logPath, 15))
		case <-tick.C:
		}
	}
}

func (d *Daemon) get(ctx context.Context, path string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.health+path, nil)
	if err != nil {
		return 0
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// Metrics scrapes /metrics into "name{labels}" -> value.
func (d *Daemon) Metrics(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.health+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape caa metrics: %w", err)
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format's sample lines.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// PeakRSS is the process's high-water resident set (VmHWM), in KiB.
func (d *Daemon) PeakRSS() (int64, error) {
	return procStatusKiB(d.Pid(), "VmHWM:")
}

func procStatusKiB(pid int, field string) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb := strings.TrimSuffix(strings.TrimSpace(rest), " kB")
			return strconv.ParseInt(strings.TrimSpace(kb), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// Stop sends SIGTERM and waits for a clean exit (SIGKILL after a minute).
// Stopping a daemon again returns at once.
func (d *Daemon) Stop() error {
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case err := <-d.done:
		d.done <- err
		if err != nil {
			return fmt.Errorf("caa exited with %v on SIGTERM; see %s", err, d.logPath)
		}
		return nil
	case <-time.After(time.Minute):
		_ = d.cmd.Process.Kill()
		d.done <- <-d.done
		return fmt.Errorf("caa ignored SIGTERM for a minute; see %s", d.logPath)
	}
}

// tail returns the last n lines of a file, for an error message.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// CPUTime is the user plus system CPU the process has used so far.
func (d *Daemon) CPUTime() (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(d.Pid()) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after its
	// closing parenthesis are plain. utime and stime are fields 14 and 15.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", d.Pid())
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat: %v %v", d.Pid(), err1, err2)
	}
	// Linux reports in USER_HZ, 100 per second on every supported arch.
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// saveHeapProfile writes caa's heap profile, taken after a garbage
// collection (gc=1), from its --pprof-addr listener at addr to path.
func (d *Daemon) saveHeapProfile(ctx context.Context, addr, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return fmt.Errorf("caa's heap profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("caa's heap profile: %s", resp.Status)
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("caa's heap profile: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("caa's heap profile: %w", err)
	}
	return os.WriteFile(path, data, 0o644)
}
