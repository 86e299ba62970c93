package nodeagent

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A process that keeps crashing at start is restarted after a back-off
// that doubles each time, reported as CrashLoopBackOff with the exit in
// the last termination state; once it stops crashing it becomes Ready.
func TestCrashLoopBacksOffThenRecovers(t *testing.T) {
	t.Parallel()
	const backoff = 200 * time.Millisecond
	pod := fakePod(t, "caa-crash", func(c *corev1.Container) { c.ReadinessProbe = probeOn("/readyz", 1) })
	require.NoError(t, writeFile(controlDir(pod), "exit-code", "3"))
	h := startAgent(t, pod, backoff)
	h.waitForKind(Exited, 3)
	h.control("exit-code", "")
	ready := h.waitForKind(Ready, 1)[0]

	starts, exits := h.observed(Started), h.observed(Exited)
	require.Len(t, starts, len(exits)+1, "a start after each exit, and the one that stayed up")
	for i, e := range exits {
		assert.Equal(t, int32(i+1), e.Restarts, "exit %d", i)
		assert.EqualError(t, e.Err, "exit code 3", "exit %d", i)
		wait := min(backoff<<i, maxBackoff)
		assert.GreaterOrEqual(t, starts[i+1].At.Sub(e.At), wait, "restart %d came before its back-off", i+1)
	}
	assert.Equal(t, int32(len(exits)), ready.Restarts)

	// Between the crashes the API saw the back-off, as kubectl shows it.
	sawBackoff := false
	writes, _ := h.statusWrites()
	for _, p := range writes {
		cs := containerStatus(p)
		if cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff" {
			sawBackoff = true
			require.NotNil(t, cs.LastTerminationState.Terminated)
			assert.Equal(t, int32(3), cs.LastTerminationState.Terminated.ExitCode)
			assert.Equal(t, "Error", cs.LastTerminationState.Terminated.Reason)
			assert.GreaterOrEqual(t, cs.RestartCount, int32(1))
			assert.False(t, PodReady(p))
			assert.Equal(t, corev1.PodRunning, p.Status.Phase, "a container that ran keeps its pod Running")
		}
	}
	assert.True(t, sawBackoff, "no status said CrashLoopBackOff")
	h.waitForPod("Ready with every crash counted", func(p *corev1.Pod) bool {
		return PodReady(p) && containerStatus(p).RestartCount == int32(len(exits))
	})
	assert.Empty(t, h.agent.Errors())
}

// A ready process that exits on its own makes the pod not ready, is
// counted and restarted after the back-off, and becomes Ready again.
func TestExitOfARunningContainer(t *testing.T) {
	t.Parallel()
	pod := fakePod(t, "caa-exit", func(c *corev1.Container) { c.ReadinessProbe = probeOn("/readyz", 1) })
	h := startAgent(t, pod, 100*time.Millisecond)
	first := h.waitForKind(Ready, 1)[0]
	resp, err := http.Get(first.HealthURL + "/exit?code=7")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	exited := h.waitForKind(Exited, 1)[0]
	assert.EqualError(t, exited.Err, "exit code 7")
	assert.Equal(t, int32(1), exited.Restarts)
	second := h.waitForKind(Ready, 2)[1]
	assert.NotEqual(t, first.PID, second.PID)
	assert.GreaterOrEqual(t, h.observed(Started)[1].At.Sub(exited.At), 100*time.Millisecond)

	notReady := false
	writes, _ := h.statusWrites()
	for _, p := range writes {
		cs := containerStatus(p)
		if cs.LastTerminationState.Terminated != nil && cs.LastTerminationState.Terminated.ExitCode == 7 && !PodReady(p) {
			notReady = true
		}
	}
	assert.True(t, notReady, "the API never saw the pod not ready after the exit")
	p := h.waitForPod("Ready with one restart", func(p *corev1.Pod) bool {
		return PodReady(p) && containerStatus(p).RestartCount == 1
	})
	require.NotNil(t, containerStatus(p).LastTerminationState.Terminated)
	assert.Equal(t, int32(7), containerStatus(p).LastTerminationState.Terminated.ExitCode)
}

// An image tag the agent has no binary for is the kubelet's ErrImagePull:
// the pod stays Pending with that waiting reason and Errors() says why.
// The agent keeps trying, so a corrected image runs.
func TestUnknownImageTagIsErrImagePull(t *testing.T) {
	t.Parallel()
	pod := fakePod(t, "caa-v9", func(c *corev1.Container) {
		c.Image = "registry.example.com/caa:v9"
		c.ReadinessProbe = probeOn("/readyz", 1)
	})
	h := startAgent(t, pod, 0)
	failed := h.waitForKind(Failed, 1)[0]
	assert.ErrorIs(t, failed.Err, errImage)
	h.waitFor("the agent's error", func() bool { return len(h.agent.Errors()) > 0 })
	errs := h.agent.Errors()
	require.Len(t, errs, 1)
	assert.ErrorIs(t, errs[0], errImage)
	assert.Contains(t, errs[0].Error(), "caa-system/caa-v9")
	assert.Contains(t, errs[0].Error(), `tag "v9"`)

	p := h.waitForPod("ErrImagePull in the status", func(p *corev1.Pod) bool {
		w := containerStatus(p).State.Waiting
		return w != nil && w.Reason == "ErrImagePull"
	})
	assert.Equal(t, corev1.PodPending, p.Status.Phase)
	assert.Contains(t, containerStatus(p).State.Waiting.Message, `tag "v9"`)
	assert.False(t, PodReady(p))
	assert.Empty(t, h.observed(Started))

	// Fix the image (a pod's image may be updated in place).
	ctx := context.Background()
	p.Spec.Containers[0].Image = "registry.example.com/caa:" + fakeTag
	_, err := h.client.CoreV1().Pods(p.Namespace).Update(ctx, p, metav1.UpdateOptions{})
	require.NoError(t, err)
	h.waitForKind(Ready, 1)
	p = h.waitForPod("the pod Ready", PodReady)
	assert.Equal(t, corev1.PodRunning, p.Status.Phase)
	assert.Nil(t, containerStatus(p).State.Waiting)
	assert.Len(t, h.agent.Errors(), 1, "no other failure")
}

// A ConfigMap the container needs but that is missing is the kubelet's
// CreateContainerConfigError: the agent tries again every few seconds
// (each try reads the ConfigMap), reports the failure once, and starts the
// container once the ConfigMap exists.
func TestMissingConfigMapIsRetriedAndReportedOnce(t *testing.T) {
	t.Parallel()
	pod := fakePod(t, "caa-config", func(c *corev1.Container) {
		c.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "caa-config"}}}}
		c.ReadinessProbe = probeOn("/readyz", 1)
	})
	h := startAgent(t, pod, 0)
	gets := func() int {
		n := 0
		for _, a := range h.client.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "configmaps" {
				n++
			}
		}
		return n
	}
	h.waitFor("a second try", func() bool { return gets() >= 2 })
	errs := h.agent.Errors()
	require.Len(t, errs, 1, "reported once, not per try")
	assert.ErrorIs(t, errs[0], errConfig)
	assert.Contains(t, errs[0].Error(), "caa-config")
	assert.Len(t, h.observed(Failed), 1)
	p := h.waitForPod("CreateContainerConfigError in the status", func(p *corev1.Pod) bool {
		w := containerStatus(p).State.Waiting
		return w != nil && w.Reason == "CreateContainerConfigError"
	})
	assert.Equal(t, corev1.PodPending, p.Status.Phase)

	_, err := h.client.CoreV1().ConfigMaps(pod.Namespace).Create(context.Background(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "caa-config"},
		Data:       map[string]string{"CAA_PROVIDER": "aws"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	h.waitForKind(Ready, 1)
	h.waitForPod("the pod Ready", PodReady)
	assert.Len(t, h.agent.Errors(), 1)
}

// On a graceful delete a process that ignores SIGTERM is killed after the
// deletion's grace (not the spec's), its end is written to the status,
// and then the deletion is completed with grace 0 for this very pod.
func TestDeletionKillsAProcessIgnoringSIGTERM(t *testing.T) {
	t.Parallel()
	const grace = 2 // the pod spec says 1: the deletion's grace wins
	pod := fakePod(t, "caa-stubborn", func(c *corev1.Container) { c.ReadinessProbe = probeOn("/readyz", 1) })
	require.NoError(t, writeFile(controlDir(pod), "ignore-sigterm", "yes"))
	h := startAgent(t, pod, 0)
	ready := h.waitForKind(Ready, 1)[0]
	h.waitForPod("the pod Ready", PodReady)

	deleting := h.markDeleted(grace)
	h.waitForKind(Deleted, 1)
	terms := h.observed(Terminated)
	require.Len(t, terms, 1)
	assert.Equal(t, ready.PID, terms[0].PID)
	assert.GreaterOrEqual(t, terms[0].At.Sub(deleting), grace*time.Second, "killed before the grace ran out")
	assert.Contains(t, h.log(), "fake-caa: ignoring SIGTERM", "SIGTERM came first")
	assert.Empty(t, h.observed(Exited, Restarted), "a stop for deletion is no crash")

	writes, writeAt := h.statusWrites()
	require.NotEmpty(t, writes)
	last := containerStatus(writes[len(writes)-1])
	require.NotNil(t, last.State.Terminated, "the final status says the container ended")
	assert.Equal(t, int32(137), last.State.Terminated.ExitCode)
	assert.Equal(t, int32(9), last.State.Terminated.Signal)
	assert.False(t, last.Ready)
	assertDeletionCompleted(t, h, writeAt[len(writeAt)-1])
}

// A process that honours SIGTERM is not waited out: it ends on its own
// well inside a long grace, and the deletion completes.
func TestDeletionOfAProcessHonouringSIGTERM(t *testing.T) {
	t.Parallel()
	pod := fakePod(t, "caa-polite", func(c *corev1.Container) { c.ReadinessProbe = probeOn("/readyz", 1) })
	h := startAgent(t, pod, 0)
	h.waitForKind(Ready, 1)
	h.markDeleted(3600) // were it waited out, the test would time out
	h.waitForKind(Deleted, 1)
	assert.Contains(t, h.log(), "fake-caa: SIGTERM, exiting")
	writes, writeAt := h.statusWrites()
	last := containerStatus(writes[len(writes)-1])
	require.NotNil(t, last.State.Terminated)
	assert.Equal(t, int32(0), last.State.Terminated.ExitCode)
	assert.Equal(t, "Completed", last.State.Terminated.Reason)
	assertDeletionCompleted(t, h, writeAt[len(writeAt)-1])
}

// assertDeletionCompleted checks the agent's one delete: after its last
// status write, with grace 0 and a precondition on the pod's UID, so a
// new pod of the same name would be left alone.
func assertDeletionCompleted(t *testing.T, h *harness, lastWrite int) {
	t.Helper()
	opts, at := h.deletes()
	require.Len(t, opts, 1)
	assert.Greater(t, at[0], lastWrite, "the status was written before the object went")
	require.NotNil(t, opts[0].GracePeriodSeconds)
	assert.Equal(t, int64(0), *opts[0].GracePeriodSeconds)
	require.NotNil(t, opts[0].Preconditions)
	require.NotNil(t, opts[0].Preconditions.UID)
	assert.Equal(t, h.pod.UID, *opts[0].Preconditions.UID)
	_, err := h.client.CoreV1().Pods(h.pod.Namespace).Get(context.Background(), h.pod.Name, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the pod is gone: %v", err)
	assert.Empty(t, h.agent.Errors())
}

// A pod deleted while its container waits out a crash back-off has the
// last run's end as its final state, as the kubelet reports an exited
// container (not a container that never ran), and the deletion completes.
func TestDeletionDuringBackOff(t *testing.T) {
	t.Parallel()
	pod := fakePod(t, "caa-backoff", nil)
	require.NoError(t, writeFile(controlDir(pod), "exit-code", "3"))
	h := startAgent(t, pod, time.Hour) // the restart never comes in time
	h.waitForKind(Exited, 1)
	h.waitForPod("CrashLoopBackOff in the status", func(p *corev1.Pod) bool {
		w := containerStatus(p).State.Waiting
		return w != nil && w.Reason == "CrashLoopBackOff"
	})
	h.markDeleted(3600)
	h.waitForKind(Deleted, 1)
	writes, writeAt := h.statusWrites()
	last := containerStatus(writes[len(writes)-1])
	require.NotNil(t, last.State.Terminated)
	assert.Equal(t, int32(3), last.State.Terminated.ExitCode, "the last run's exit: %+v", last.State.Terminated)
	assert.Equal(t, "Error", last.State.Terminated.Reason)
	assertDeletionCompleted(t, h, writeAt[len(writeAt)-1])
}
