package nodeagent

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

func condition(s corev1.PodStatus, typ corev1.PodConditionType) corev1.PodCondition {
	c := findCondition(s.Conditions, typ)
	if c == nil {
		return corev1.PodCondition{}
	}
	return *c
}

func TestPodStatusThroughALife(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	pod := testPod(corev1.Container{Name: "caa", Image: "caa:v9"})
	pod.Status.QOSClass = corev1.PodQOSBurstable
	sched := metav1.NewTime(t0.Add(-time.Second))
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: sched}}

	// An unknown tag: Pending, the container waiting as on a failed pull.
	c := container{firstHandled: t0, waitReason: "ErrImagePull", waitMessage: "no binary for caa:v9"}
	s := podStatus(pod, c, t0)
	assert.Equal(t, corev1.PodPending, s.Phase)
	assert.Equal(t, corev1.PodQOSBurstable, s.QOSClass, "fields the agent does not own are kept")
	assert.Equal(t, sched, condition(s, corev1.PodScheduled).LastTransitionTime, "the scheduler's condition is kept")
	require.Len(t, s.ContainerStatuses, 1)
	require.NotNil(t, s.ContainerStatuses[0].State.Waiting)
	assert.Equal(t, "ErrImagePull", s.ContainerStatuses[0].State.Waiting.Reason)
	assert.Equal(t, corev1.ConditionFalse, condition(s, corev1.PodReady).Status)
	assert.Equal(t, metav1.NewTime(t0), *s.StartTime)

	// Running, not ready yet.
	pod.Status = s
	c = container{firstHandled: t0, running: true, everStarted: true, startedAt: t0.Add(time.Second), started: true, containerID: "caa-agent://x/0"}
	s = podStatus(pod, c, t0.Add(2*time.Second))
	assert.Equal(t, corev1.PodRunning, s.Phase)
	assert.Equal(t, "127.0.0.1", s.PodIP)
	cs := s.ContainerStatuses[0]
	require.NotNil(t, cs.State.Running)
	assert.Equal(t, metav1.NewTime(t0.Add(time.Second)), cs.State.Running.StartedAt)
	assert.False(t, cs.Ready)
	assert.True(t, *cs.Started)
	notReadySince := condition(s, corev1.PodReady).LastTransitionTime
	assert.Equal(t, metav1.NewTime(t0), notReadySince, "still not ready: the transition time holds")

	// Ready: both conditions flip at the same moment.
	pod.Status = s
	c.ready = true
	s = podStatus(pod, c, t0.Add(3*time.Second))
	for _, typ := range []corev1.PodConditionType{corev1.ContainersReady, corev1.PodReady} {
		assert.Equal(t, corev1.ConditionTrue, condition(s, typ).Status, typ)
		assert.Equal(t, metav1.NewTime(t0.Add(3*time.Second)), condition(s, typ).LastTransitionTime, typ)
	}
	assert.True(t, s.ContainerStatuses[0].Ready)
	for _, typ := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized} {
		assert.Equal(t, corev1.ConditionTrue, condition(s, typ).Status, typ)
	}

	// Crashed: not ready, one restart, the last state kept, waiting in back-off.
	pod.Status = s
	exit := &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}
	c = container{firstHandled: t0, everStarted: true, restarts: 1, lastExit: exit, waitReason: "CrashLoopBackOff"}
	s = podStatus(pod, c, t0.Add(4*time.Second))
	assert.Equal(t, corev1.PodRunning, s.Phase, "a restarting container keeps its pod Running")
	cs = s.ContainerStatuses[0]
	assert.Equal(t, int32(1), cs.RestartCount)
	assert.Equal(t, exit, cs.LastTerminationState.Terminated)
	assert.Equal(t, "CrashLoopBackOff", cs.State.Waiting.Reason)
	assert.Equal(t, corev1.ConditionFalse, condition(s, corev1.PodReady).Status)

	// Stopped for deletion.
	c = container{firstHandled: t0, everStarted: true, terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}
	s = podStatus(pod, c, t0.Add(5*time.Second))
	assert.Equal(t, "Completed", s.ContainerStatuses[0].State.Terminated.Reason)
	assert.False(t, *s.ContainerStatuses[0].Started)
	assert.False(t, PodReady(&corev1.Pod{Status: s}))
}

// TestWriteStatusAndCompleteDeletion drives a worker's status write and
// its deletion against the fake clientset.
func TestWriteStatusAndCompleteDeletion(t *testing.T) {
	ctx := context.Background()
	pod := testPod(corev1.Container{Name: "caa", Image: "caa:v1"})
	client := fake.NewClientset(pod)
	a, err := New(Config{Client: client, REST: &rest.Config{Host: "https://127.0.0.1:1"}, Dir: t.TempDir()})
	require.NoError(t, err)
	w := &worker{agent: a, key: "caa-system/caa-x7k2p", uid: pod.UID, node: "node-a",
		name: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}}
	w.c = container{firstHandled: time.Now(), running: true, everStarted: true, started: true, ready: true, startedAt: time.Now()}

	w.writeStatus(ctx)
	got, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, PodReady(got))
	assert.Equal(t, corev1.PodRunning, got.Status.Phase)
	writes := countActions(client, "update")
	w.writeStatus(ctx)
	assert.Equal(t, writes, countActions(client, "update"), "an unchanged container costs no write")

	w.terminate(ctx, got)
	_, err = client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	assert.True(t, err != nil, "the deletion was completed")
	var deletes []metav1.DeleteOptions
	for _, act := range client.Actions() {
		if del, ok := act.(k8stesting.DeleteAction); ok {
			deletes = append(deletes, del.GetDeleteOptions())
		}
	}
	require.Len(t, deletes, 1)
	assert.Equal(t, int64(0), *deletes[0].GracePeriodSeconds, "completed with grace 0")
	assert.Equal(t, pod.UID, *deletes[0].Preconditions.UID, "only this very pod")
	assert.Empty(t, a.Errors())
}

func countActions(c *fake.Clientset, verb string) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == verb {
			n++
		}
	}
	return n
}
