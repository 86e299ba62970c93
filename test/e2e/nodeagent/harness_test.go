package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

const (
	// pollEvery and patience bound every wait for a condition: generous,
	// because the machine is shared and the tests run under -race.
	pollEvery = 20 * time.Millisecond
	patience  = 30 * time.Second
	// fakeTag is the image tag the agent maps onto the fake caa.
	fakeTag = "v1"
)

// harness runs a real Agent against the fake clientset, with this test
// binary standing in for caa (see fakecaa_test.go).
type harness struct {
	t      *testing.T
	client *fake.Clientset
	agent  *Agent
	ctrl   string // the fake caa's control directory
	pod    *corev1.Pod

	mu  sync.Mutex
	obs []Observation
}

// startAgent runs an agent for pod, which must come from fakePod, until
// the test ends; the agent's processes are stopped before the test's
// directories go. The agent also runs others, more pods (from fakePod)
// the harness's helpers do not look at.
func startAgent(t *testing.T, pod *corev1.Pod, backoff time.Duration, others ...*corev1.Pod) *harness {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	objs := []runtime.Object{pod}
	for _, o := range others {
		objs = append(objs, o)
	}
	h := &harness{t: t, client: fake.NewClientset(objs...), ctrl: controlDir(pod), pod: pod}
	// The fake tracker cannot create a TokenRequest; the apiserver answers
	// one with a token, and so does this reactor.
	h.client.PrependReactor("create", "serviceaccounts", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "token" {
			return false, nil, nil
		}
		tr := action.(k8stesting.CreateAction).GetObject().(*authv1.TokenRequest).DeepCopy()
		tr.Status.Token = "token-for-" + tr.Spec.BoundObjectRef.Name
		return true, tr, nil
	})
	h.agent, err = New(Config{
		Client:         h.client,
		REST:           &rest.Config{Host: "https://127.0.0.1:1"},
		Dir:            t.TempDir(),
		Binaries:       map[string]string{fakeTag: self},
		Observe:        h.observe,
		Logf:           t.Logf,
		RestartBackoff: backoff,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.agent.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return h
}

// fakePod is a caa pod running the fake caa with its control directory
// (made here), health served on container port 8000 named "health", and a
// grace period of one second; edit adjusts its container.
func fakePod(t *testing.T, name string, edit func(*corev1.Container)) *corev1.Pod {
	grace := int64(1)
	c := corev1.Container{
		Name:  "caa",
		Image: "registry.example.com/caa:" + fakeTag,
		Ports: []corev1.ContainerPort{{Name: "health", ContainerPort: 8000}},
		Env: []corev1.EnvVar{
			{Name: fakeCAAEnv, Value: "1"},
			{Name: fakeDirEnv, Value: t.TempDir()},
			{Name: healthEnv, Value: ":8000"},
			// Under -race a process lingers a second after it chose to
			// exit, as long as the pods' grace: an exit on SIGTERM would
			// look like a kill.
			{Name: "GORACE", Value: "atexit_sleep_ms=0"},
		},
	}
	if edit != nil {
		edit(&c)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "caa-system", Name: name, UID: types.UID("uid-" + name),
			Labels: map[string]string{"app.kubernetes.io/name": "caa"}},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "caa",
			TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{c}},
	}
}

func controlDir(pod *corev1.Pod) string {
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == fakeDirEnv {
			return e.Value
		}
	}
	return ""
}

// probeOn probes path on the health port every second. The timeout is
// long so a loaded machine (these tests run in parallel, under -race)
// does not fail a healthy process's probe.
func probeOn(path string, failureThreshold int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: path, Port: intstr.FromString("health")}},
		PeriodSeconds: 1, TimeoutSeconds: 5, FailureThreshold: failureThreshold,
	}
}

// control sets a control file of the fake caa (see fakecaa_test.go); an
// empty content removes it.
func (h *harness) control(name, content string) {
	h.t.Helper()
	require.NoError(h.t, writeFile(h.ctrl, name, content))
}

// writeFile writes a control file in dir; an empty content removes it.
func writeFile(dir, name, content string) error {
	path := filepath.Join(dir, name)
	if content == "" {
		return os.Remove(path)
	}
	return os.WriteFile(path, []byte(content), 0o644)
}

func (h *harness) observe(o Observation) {
	h.mu.Lock()
	h.obs = append(h.obs, o)
	h.mu.Unlock()
}

// observed returns the observations of the given kinds (all when none
// is given), in order.
func (h *harness) observed(kinds ...ObservationKind) []Observation {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Observation
	for _, o := range h.obs {
		if len(kinds) == 0 || containsKind(kinds, o.Kind) {
			out = append(out, o)
		}
	}
	return out
}

func containsKind(kinds []ObservationKind, k ObservationKind) bool {
	for _, want := range kinds {
		if want == k {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds, failing the test with what and the
// story so far when it does not within patience.
func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, pollEvery, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		h.t.Fatalf("waiting for %s: %v\n%s", what, err, h.story())
	}
}

// waitForPod polls the pod in the API until cond holds for it.
func (h *harness) waitForPod(what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	h.t.Helper()
	var last *corev1.Pod
	h.waitFor(what, func() bool {
		pod, err := h.client.CoreV1().Pods(h.pod.Namespace).Get(context.Background(), h.pod.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = pod
		return cond(pod)
	})
	return last
}

// waitForKind waits until there are at least n observations of kind and
// returns them.
func (h *harness) waitForKind(kind ObservationKind, n int) []Observation {
	h.t.Helper()
	h.waitFor(fmt.Sprintf("%d %s observation(s)", n, kind), func() bool { return len(h.observed(kind)) >= n })
	return h.observed(kind)
}

// log is the pod's container log so far (every process of it).
func (h *harness) log() string {
	b, err := os.ReadFile(h.agent.LogPath(h.pod.Spec.NodeName, types.NamespacedName{Namespace: h.pod.Namespace, Name: h.pod.Name}, h.pod.UID))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		h.t.Fatalf("read the container log: %v", err)
	}
	return string(b)
}

// requests counts the fake caa's logged answers to GET path with status.
func (h *harness) requests(path string, status int) int {
	return strings.Count(h.log(), fmt.Sprintf("fake-caa: GET %s -> %d\n", path, status))
}

// story is what a failing wait prints: the observations, the agent's
// errors and the container log.
func (h *harness) story() string {
	var b strings.Builder
	for _, o := range h.observed() {
		fmt.Fprintf(&b, "observed %s %s pid=%d restarts=%d err=%v\n", o.At.Format("15:04:05.000"), o.Kind, o.PID, o.Restarts, o.Err)
	}
	for _, err := range h.agent.Errors() {
		fmt.Fprintf(&b, "agent error: %v\n", err)
	}
	fmt.Fprintf(&b, "container log:\n%s", h.log())
	return b.String()
}

// containerStatus is the pod's one container status, or a zero one.
func containerStatus(pod *corev1.Pod) corev1.ContainerStatus {
	if len(pod.Status.ContainerStatuses) != 1 {
		return corev1.ContainerStatus{}
	}
	return pod.Status.ContainerStatuses[0]
}

// statusWrites are the pod statuses the agent wrote, oldest first, with
// the index of each in the clientset's actions.
func (h *harness) statusWrites() (pods []*corev1.Pod, at []int) {
	for i, a := range h.client.Actions() {
		u, ok := a.(k8stesting.UpdateAction)
		if !ok || a.GetVerb() != "update" || a.GetSubresource() != "status" {
			continue
		}
		if pod, ok := u.GetObject().(*corev1.Pod); ok {
			pods, at = append(pods, pod), append(at, i)
		}
	}
	return pods, at
}

// deletes are the pod deletions sent, with the index of each in the
// clientset's actions.
func (h *harness) deletes() (opts []metav1.DeleteOptions, at []int) {
	for i, a := range h.client.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok && a.GetResource().Resource == "pods" {
			opts, at = append(opts, d.GetDeleteOptions()), append(at, i)
		}
	}
	return opts, at
}

// markDeleted does what the apiserver does on a graceful delete of the
// pod: it sets the deletion timestamp and grace and leaves the object for
// the kubelet to finish (the fake clientset's Delete removes it at once).
func (h *harness) markDeleted(grace int64) time.Time {
	h.t.Helper()
	ctx := context.Background()
	pods := h.client.CoreV1().Pods(h.pod.Namespace)
	pod, err := pods.Get(ctx, h.pod.Name, metav1.GetOptions{})
	require.NoError(h.t, err)
	now := metav1.Now()
	pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = &now, &grace
	_, err = pods.Update(ctx, pod, metav1.UpdateOptions{})
	require.NoError(h.t, err)
	return now.Time
}
