package nodeagent

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// A liveness probe failing failureThreshold times in a row restarts the
// process (SIGTERM first), bumps restartCount and keeps the old run as
// the last termination state; a healthy new process becomes Ready again.
func TestLivenessFailureRestartsTheProcess(t *testing.T) {
	t.Parallel()
	const threshold = 3
	pod := fakePod(t, "caa-live", func(c *corev1.Container) {
		c.ReadinessProbe = probeOn("/readyz", 1)
		c.LivenessProbe = probeOn("/healthz", threshold)
	})
	h := startAgent(t, pod, 0)
	first := h.waitForKind(Ready, 1)[0]
	h.waitForPod("the pod Ready", PodReady)

	failingSince := time.Now()
	h.control("healthz", "500")
	restarted := h.waitForKind(Restarted, 1)[0]
	h.control("healthz", "") // the next process is healthy
	assert.Equal(t, int32(1), restarted.Restarts)
	require.Error(t, restarted.Err)
	assert.Contains(t, restarted.Err.Error(), "liveness probe")
	assert.Contains(t, restarted.Err.Error(), "500")
	// threshold failures a period apart: never sooner than this.
	assert.GreaterOrEqual(t, restarted.At.Sub(failingSince), (threshold-1)*time.Second,
		"restarted before failureThreshold failures in a row")
	assert.GreaterOrEqual(t, h.requests("/healthz", 500), threshold)
	assert.Contains(t, h.log(), "fake-caa: SIGTERM, exiting", "the failed process was asked to stop first")

	second := h.waitForKind(Ready, 2)[1]
	assert.NotEqual(t, first.PID, second.PID, "a new process")
	assert.Equal(t, int32(1), second.Restarts)
	p := h.waitForPod("Ready again with one restart", func(p *corev1.Pod) bool {
		return PodReady(p) && containerStatus(p).RestartCount == 1
	})
	cs := containerStatus(p)
	require.NotNil(t, cs.State.Running)
	require.NotNil(t, cs.LastTerminationState.Terminated, "the restarted run is kept")
	assert.Equal(t, int32(0), cs.LastTerminationState.Terminated.ExitCode, "it exited on SIGTERM")
	assert.True(t, strings.HasSuffix(cs.ContainerID, "/1"), "the second container: %s", cs.ContainerID)
	assert.Len(t, h.observed(Restarted), 1, "a healthy process is left alone")
	assert.Empty(t, h.agent.Errors())
}

// Until the startup probe passes neither readiness nor liveness runs:
// the pod stays not ready, and a failing liveness endpoint kills nothing.
// Once it passes, it runs no more and the other two take over.
func TestStartupProbeGatesReadinessAndLiveness(t *testing.T) {
	t.Parallel()
	pod := fakePod(t, "caa-startup", func(c *corev1.Container) {
		c.StartupProbe = probeOn("/startz", 60)
		c.ReadinessProbe = probeOn("/readyz", 1)
		c.LivenessProbe = probeOn("/healthz", 1) // one failure would restart it
	})
	// Written before the agent starts, so every startup probe fails.
	require.NoError(t, writeFile(controlDir(pod), "startz", "500"))
	require.NoError(t, writeFile(controlDir(pod), "healthz", "500"))
	h := startAgent(t, pod, 0)
	h.waitFor("three failed startup probes", func() bool { return h.requests("/startz", 500) >= 3 })
	log := h.log()
	assert.NotContains(t, log, "GET /readyz", "a readiness probe ran before the startup probe passed")
	assert.NotContains(t, log, "GET /healthz", "a liveness probe ran before the startup probe passed")
	assert.Empty(t, h.observed(Ready, Restarted))
	p := h.waitForPod("the container running", func(p *corev1.Pod) bool { return containerStatus(p).State.Running != nil })
	cs := containerStatus(p)
	assert.False(t, *cs.Started, "not started while the startup probe fails")
	assert.False(t, cs.Ready)
	assert.False(t, PodReady(p))

	h.control("healthz", "") // before startz: liveness runs as soon as startup passes
	h.control("startz", "")
	h.waitForKind(Ready, 1)
	p = h.waitForPod("the pod Ready", PodReady)
	cs = containerStatus(p)
	assert.True(t, *cs.Started)
	assert.Equal(t, int32(0), cs.RestartCount)
	h.waitFor("a liveness probe", func() bool { return h.requests("/healthz", 200) > 0 })
	assert.Equal(t, 1, h.requests("/startz", 200), "the startup probe stops once it passed")
	assert.Empty(t, h.observed(Restarted))
	assert.Empty(t, h.agent.Errors())
}

// A startup probe that fails failureThreshold times restarts the process.
func TestStartupProbeExhaustedRestarts(t *testing.T) {
	t.Parallel()
	pod := fakePod(t, "caa-slow", func(c *corev1.Container) {
		c.StartupProbe = probeOn("/startz", 2)
		c.ReadinessProbe = probeOn("/readyz", 1)
	})
	// Written before the agent starts, so every startup probe fails.
	require.NoError(t, writeFile(controlDir(pod), "startz", "500"))
	h := startAgent(t, pod, 0)
	started := h.waitForKind(Started, 1)[0]
	restarted := h.waitForKind(Restarted, 1)[0]
	h.control("startz", "")
	require.Error(t, restarted.Err)
	assert.Contains(t, restarted.Err.Error(), "startup probe")
	assert.Equal(t, int32(1), restarted.Restarts)
	assert.GreaterOrEqual(t, restarted.At.Sub(started.At), time.Second, "two failures a period apart")
	assert.Empty(t, h.observed(Ready))
	assert.Zero(t, h.requests("/readyz", 200), "no readiness probe before startup passed")

	ready := h.waitForKind(Ready, 1)[0]
	assert.Equal(t, int32(1), ready.Restarts)
	assert.True(t, ready.At.After(restarted.At))
	h.waitForPod("Ready with one restart", func(p *corev1.Pod) bool {
		return PodReady(p) && containerStatus(p).RestartCount == 1
	})
}

// An exec probe of the caa binary runs the tag's binary in the pod's
// directory with the container's environment, and succeeds on exit 0; an
// exec probe of any other program fails and says why.
func TestExecProbeRunsTheTagsBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	script := dir + "/fake-caa"
	// Exits 0 only when run in the pod's directory with the probe's
	// arguments and the container's variable.
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\n[ \"$1 $2\" = \"probe /readyz\" ] && [ \"$PROBE_OK\" = yes ] && [ \"$(pwd)\" = \""+dir+"\" ]\n"), 0o755))
	l := launch{binary: script, dir: dir, env: []string{"PROBE_OK=yes", "PATH=/usr/bin:/bin"}}
	p := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/usr/local/bin/caa", "probe", "/readyz"}}},
		TimeoutSeconds: 5, PeriodSeconds: 1}
	pr := newProber("readiness", p, &corev1.Container{}, l, time.Now())
	changed, _ := pr.run(t.Context(), nil, time.Now())
	assert.True(t, changed && pr.result, "exit 0 passes: %s", pr.lastFail)

	l.env = []string{"PROBE_OK=no"}
	pr = newProber("readiness", p, &corev1.Container{}, l, time.Now())
	pr.run(t.Context(), nil, time.Now())
	assert.False(t, pr.result)
	assert.Contains(t, pr.lastFail, "exit status 1")

	other := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/true"}}}}
	pr = newProber("liveness", other, &corev1.Container{}, l, time.Now())
	pr.run(t.Context(), nil, time.Now())
	assert.False(t, pr.result)
	assert.Contains(t, pr.lastFail, "runs only the caa binary")
}
