package nodeagent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// prober runs one probe of a container on the kubelet's schedule: first
// after initialDelaySeconds, then every periodSeconds, flipping its result
// after successThreshold successes or failureThreshold failures in a row.
type prober struct {
	kind      string   // startup, readiness or liveness
	url       string   // empty: the probe cannot reach anything (always fails)
	exec      []string // an exec probe's command, the binary resolved
	env       []string // the container's environment, for an exec probe
	dir       string   // and its working directory
	urlErr    error
	timeout   time.Duration
	period    time.Duration
	successes int32 // thresholds
	failures  int32

	next     time.Time
	okRun    int32 // consecutive successes
	failRun  int32 // consecutive failures
	result   bool
	lastFail string
}

// newProber returns nil when p is nil (no such probe). httpGet probes and
// exec probes of the caa binary are supported; others fail, and say why.
func newProber(kind string, p *corev1.Probe, c *corev1.Container, l launch, start time.Time) *prober {
	if p == nil {
		return nil
	}
	pr := &prober{
		kind:      kind,
		timeout:   seconds(p.TimeoutSeconds, 1),
		period:    seconds(p.PeriodSeconds, 10),
		successes: max(p.SuccessThreshold, 1),
		failures:  max(p.FailureThreshold, 1),
		next:      start.Add(seconds(p.InitialDelaySeconds, 0)),
	}
	switch {
	case p.HTTPGet != nil:
		pr.url, pr.urlErr = probeURL(c, p.HTTPGet, l)
	case p.Exec != nil && len(p.Exec.Command) > 0 && path.Base(p.Exec.Command[0]) == "caa":
		// The image's binary is the tag's binary here; the command runs
		// with the container's environment, as the kubelet runs it.
		pr.exec = append([]string{l.binary}, p.Exec.Command[1:]...)
		pr.env, pr.dir = l.env, l.dir
	case p.Exec != nil:
		pr.urlErr = fmt.Errorf("%s probe: an exec probe runs only the caa binary here, not %q", kind, p.Exec.Command)
	default:
		pr.urlErr = fmt.Errorf("%s probe: only httpGet and exec are supported", kind)
	}
	return pr
}

// execProbe runs the command within timeout; exit 0 is success.
func execProbe(ctx context.Context, argv, env []string, dir string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = env, dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("exec %v: %w: %s", argv[1:], err, strings.TrimSpace(string(out)))
	}
	return nil
}

func seconds(n int32, def int32) time.Duration {
	if n <= 0 {
		n = def
	}
	return time.Duration(n) * time.Second
}

// due reports whether the probe should run at now.
func (p *prober) due(now time.Time) bool { return p != nil && !now.Before(p.next) }

// run probes once and updates the result. changed reports a flip of the
// result; exhausted reports failureThreshold failures in a row (for
// startup and liveness, the container is then restarted).
func (p *prober) run(ctx context.Context, client *http.Client, now time.Time) (changed, exhausted bool) {
	p.next = now.Add(p.period)
	err := p.urlErr
	switch {
	case err != nil:
	case p.exec != nil:
		err = execProbe(ctx, p.exec, p.env, p.dir, p.timeout)
	default:
		err = httpProbe(ctx, client, p.url, p.timeout)
	}
	before := p.result
	if err == nil {
		p.failRun = 0
		p.okRun++
		if p.okRun >= p.successes {
			p.result = true
		}
	} else {
		p.lastFail = err.Error()
		p.okRun = 0
		p.failRun++
		if p.failRun >= p.failures {
			p.result = false
			exhausted = true
		}
	}
	return p.result != before, exhausted
}

// httpProbe succeeds on a 2xx or 3xx answer within timeout, as the
// kubelet's HTTP prober does.
func httpProbe(ctx context.Context, client *http.Client, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
