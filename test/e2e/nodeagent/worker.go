package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	"github.com/caa-project/caa/test/e2e/cluster"
)

const (
	// retryStart is how soon a container that could not start (unknown
	// tag, missing configuration) is tried again, besides on any change
	// of the pod.
	retryStart = 2 * time.Second
	maxBackoff = 30 * time.Second
	// idleWake bounds a worker's sleep when nothing is scheduled.
	idleWake = time.Minute
	// defaultGrace is the API's default terminationGracePeriodSeconds.
	defaultGrace = 30 * time.Second
)

// worker owns one pod's container from its binding to its deletion. All
// its fields but notify belong to run's goroutine.
type worker struct {
	agent  *Agent
	store  cache.Store
	key    string
	uid    types.UID
	name   types.NamespacedName
	node   string
	notify chan struct{}

	c         container
	proc      *process
	launch    launch
	tag       string
	startup   *prober
	readiness *prober
	liveness  *prober
	backoff   time.Duration
	restartAt time.Time
	lastErr   string
	written   string // fingerprint of the last status written
	grace     time.Duration
}

// current returns the pod from the informer's cache, or nil once it is
// gone (or replaced by another pod of the same name).
func (w *worker) current() *corev1.Pod {
	obj, ok, err := w.store.GetByKey(w.key)
	if err != nil || !ok {
		return nil
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.UID != w.uid {
		return nil
	}
	return pod
}

func (w *worker) run(ctx context.Context) {
	w.c.firstHandled = time.Now()
	w.grace = defaultGrace
	for {
		pod := w.current()
		if pod == nil {
			// Deleted without us (a forced delete): the kubelet kills
			// what is left.
			w.stopProcess(nil)
			return
		}
		w.grace = podGrace(pod)
		if pod.DeletionTimestamp != nil {
			w.terminate(ctx, pod)
			return
		}
		now := time.Now()
		if w.proc == nil && !now.Before(w.restartAt) {
			w.start(ctx, pod)
		}
		if w.proc != nil {
			w.probe(ctx)
		}
		w.writeStatus(ctx)

		var exited chan struct{}
		if w.proc != nil {
			exited = w.proc.done
		}
		timer := time.NewTimer(time.Until(w.nextWake()))
		select {
		case <-ctx.Done():
			timer.Stop()
			w.stopProcess(nil)
			return
		case <-w.notify:
		case <-exited:
			w.exited()
		case <-timer.C:
		}
		timer.Stop()
	}
}

// podGrace is how long a stopping container gets: the deletion's grace
// when one is set, else the pod's.
func podGrace(pod *corev1.Pod) time.Duration {
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return defaultGrace
}

// nextWake is the earliest scheduled probe or restart.
func (w *worker) nextWake() time.Time {
	next := time.Now().Add(idleWake)
	if w.proc == nil {
		if !w.restartAt.IsZero() && w.restartAt.Before(next) {
			next = w.restartAt
		}
		return next
	}
	for _, p := range w.activeProbers() {
		if p.next.Before(next) {
			next = p.next
		}
	}
	return next
}

// activeProbers are the probes that run now: the startup probe until it
// passes, then readiness and liveness.
func (w *worker) activeProbers() []*prober {
	var out []*prober
	if !w.c.started {
		if w.startup != nil {
			out = append(out, w.startup)
		}
		return out
	}
	for _, p := range []*prober{w.readiness, w.liveness} {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

func (w *worker) observe(kind ObservationKind, err error) {
	if w.agent.cfg.Observe == nil {
		return
	}
	o := Observation{At: time.Now(), Kind: kind, Pod: w.name, UID: w.uid, Node: w.node, Tag: w.tag,
		Restarts: w.c.restarts, Err: err}
	if w.proc != nil {
		o.PID = w.proc.pid()
		o.HealthURL = fmt.Sprintf("http://%s:%d", podIP, w.launch.localPort)
	}
	w.agent.cfg.Observe(o)
}

// start runs the pod's container, or records why it cannot.
func (w *worker) start(ctx context.Context, pod *corev1.Pod) {
	err := w.tryStart(ctx, pod)
	if err == nil {
		w.lastErr = ""
		w.observe(Started, nil)
		return
	}
	w.restartAt = time.Now().Add(retryStart)
	switch {
	case errors.Is(err, errImage):
		w.c.waitReason = "ErrImagePull"
	case errors.Is(err, errConfig):
		w.c.waitReason = "CreateContainerConfigError"
	default:
		w.c.waitReason = "RunContainerError"
	}
	w.c.waitMessage = err.Error()
	if err.Error() != w.lastErr { // once per distinct failure, not per retry
		w.lastErr = err.Error()
		w.agent.report(fmt.Errorf("pod %s on %s: %w", w.key, w.node, err))
		w.observe(Failed, err)
	}
}

func (w *worker) tryStart(ctx context.Context, pod *corev1.Pod) error {
	if len(pod.Spec.Containers) != 1 || len(pod.Spec.InitContainers) != 0 {
		return fmt.Errorf("%w: the agent runs pods of exactly one container and no init containers", errConfig)
	}
	spec := &pod.Spec.Containers[0]
	tag, err := imageTag(spec.Image)
	if err != nil {
		return err
	}
	w.tag = tag
	if _, ok := w.agent.cfg.Binaries[tag]; !ok {
		return fmt.Errorf("%w: no binary for image %s (tag %q)", errImage, spec.Image, tag)
	}
	dir := w.agent.PodDir(w.node, w.name, w.uid)
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return fmt.Errorf("pod directory: %w", err)
	}
	e, err := resolveEnv(ctx, w.agent.cfg.Client, pod, spec)
	if err != nil {
		return err
	}
	if hostIP := w.agent.cfg.HostIP; hostIP != nil {
		for _, v := range spec.Env {
			if v.ValueFrom != nil && v.ValueFrom.FieldRef != nil && v.ValueFrom.FieldRef.FieldPath == "status.hostIP" {
				e.set(v.Name, hostIP(w.node))
			}
		}
	}
	ms, err := mounts(pod, spec, w.agent.cfg.Dir, dir)
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := w.agent.writeKubeconfig(ctx, pod, kubeconfig); err != nil {
		return err
	}
	port, err := cluster.FreePort()
	if err != nil {
		return err
	}
	l, err := buildLaunch(spec, w.agent.cfg.Binaries, e, ms, port, kubeconfig, home)
	if err != nil {
		return err
	}
	l.dir = dir
	l.shortenHealthSocket()
	var start func(*exec.Cmd) error
	if st := w.agent.cfg.Start; st != nil {
		start = func(cmd *exec.Cmd) error { return st(w.node, cmd) }
	}
	proc, err := startProcess(l, dir, filepath.Join(dir, "caa.log"), start)
	if err != nil {
		return err
	}
	w.proc, w.launch = proc, l
	w.c.running, w.c.everStarted = true, true
	w.c.startedAt = proc.started
	w.c.waitReason, w.c.waitMessage = "", ""
	w.c.containerID = fmt.Sprintf("caa-agent://%s/%d", w.uid, w.c.restarts)
	w.c.imageBinary = "caa-agent://" + l.binary
	w.startup = newProber("startup", spec.StartupProbe, spec, l, proc.started)
	w.readiness = newProber("readiness", spec.ReadinessProbe, spec, l, proc.started)
	w.liveness = newProber("liveness", spec.LivenessProbe, spec, l, proc.started)
	w.c.started = w.startup == nil
	w.c.ready = false
	return nil
}

// probe runs the probes that are due and acts on their results.
func (w *worker) probe(ctx context.Context) {
	now := time.Now()
	if !w.c.started {
		if !w.startup.due(now) {
			return
		}
		_, exhausted := w.startup.run(ctx, w.agent.probes, now)
		switch {
		case w.startup.result:
			w.c.started = true
		case exhausted:
			w.restart("startup", w.startup.lastFail)
			return
		default:
			return
		}
	}
	if w.readiness == nil {
		if !w.c.ready {
			w.c.ready = true
			w.observe(Ready, nil)
		}
	} else if w.readiness.due(now) {
		if changed, _ := w.readiness.run(ctx, w.agent.probes, now); changed {
			w.c.ready = w.readiness.result
			if w.c.ready {
				w.observe(Ready, nil)
			} else {
				w.observe(NotReady, nil)
			}
		}
	}
	if w.liveness.due(now) {
		if _, exhausted := w.liveness.run(ctx, w.agent.probes, now); exhausted {
			w.restart("liveness", w.liveness.lastFail)
		}
	}
}

// restart kills the container after a failed startup or liveness probe;
// the next turn starts it again at once.
func (w *worker) restart(kind, why string) {
	w.agent.cfg.Logf("nodeagent: %s on %s: %s probe failed (%s); restarting", w.key, w.node, kind, why)
	w.proc.stop(w.grace)
	w.c.lastExit = w.proc.terminated(w.c.containerID)
	w.c.restarts++
	w.resetRun()
	w.observe(Restarted, fmt.Errorf("%s probe: %s", kind, why))
	w.restartAt = time.Now()
}

// exited handles a process that ended on its own: restarted after a
// backoff that doubles up to 30s, as the kubelet's CrashLoopBackOff.
func (w *worker) exited() {
	w.c.lastExit = w.proc.terminated(w.c.containerID)
	w.c.restarts++
	w.observe(Exited, fmt.Errorf("exit code %d", w.c.lastExit.ExitCode))
	w.resetRun()
	if w.backoff == 0 {
		w.backoff = w.agent.cfg.RestartBackoff
	} else {
		w.backoff = min(2*w.backoff, maxBackoff)
	}
	w.restartAt = time.Now().Add(w.backoff)
	w.c.waitReason, w.c.waitMessage = "CrashLoopBackOff", fmt.Sprintf("back-off %s restarting the container", w.backoff)
}

func (w *worker) resetRun() {
	w.proc = nil
	w.c.running, w.c.started, w.c.ready = false, false, false
	w.startup, w.readiness, w.liveness = nil, nil, nil
}

// stopProcess stops a running process within the pod's grace; term, if
// set, receives the container's final state.
func (w *worker) stopProcess(term **corev1.ContainerStateTerminated) {
	if w.proc == nil {
		return
	}
	if w.proc.stop(w.grace) {
		w.agent.cfg.Logf("nodeagent: %s on %s ignored SIGTERM for %s and was killed", w.key, w.node, w.grace)
	}
	t := w.proc.terminated(w.c.containerID)
	if term != nil {
		*term = t
	}
	w.observe(Terminated, nil)
	w.proc = nil
}

// terminate stops the container of a pod being deleted (SIGTERM, the
// grace period, SIGKILL), reports its final state and completes the
// deletion, as the kubelet does, with a UID precondition so that a new
// pod of the same name is never deleted by mistake.
func (w *worker) terminate(ctx context.Context, pod *corev1.Pod) {
	var term *corev1.ContainerStateTerminated
	w.stopProcess(&term)
	if term == nil && w.c.lastExit != nil {
		// Deleted in a back-off: the container is its last run, ended.
		term = w.c.lastExit
	}
	if term == nil {
		term = &corev1.ContainerStateTerminated{Reason: "ContainerStatusUnknown", ExitCode: 137,
			Message: "the container never ran", FinishedAt: metav1.Now()}
	}
	w.c.terminated = term
	w.c.running, w.c.ready, w.c.started = false, false, false
	if ctx.Err() != nil {
		return
	}
	w.writeStatus(ctx)
	zero := int64(0)
	err := w.agent.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &w.uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		w.agent.report(fmt.Errorf("complete the deletion of pod %s: %w", w.key, err))
		return
	}
	w.observe(Deleted, nil)
}

// writeStatus sends the pod's status when what the agent knows changed
// since the last write. It reads the pod from the API, not the cache, so
// it builds on the latest status and rarely conflicts.
func (w *worker) writeStatus(ctx context.Context) {
	fp := w.c.fingerprint()
	if fp == w.written {
		return
	}
	pods := w.agent.cfg.Client.CoreV1().Pods(w.name.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := pods.Get(ctx, w.name.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.UID != w.uid {
			return apierrors.NewNotFound(corev1.Resource("pods"), w.name.Name)
		}
		pod.Status = podStatus(pod, w.c, time.Now())
		_, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	switch {
	case err == nil:
		w.written = fp
	case apierrors.IsNotFound(err) || ctx.Err() != nil:
	default:
		w.agent.report(fmt.Errorf("status of pod %s: %w", w.key, err))
	}
}

// fingerprint sums up what the status is built from, so an unchanged
// container costs no API call.
func (c container) fingerprint() string {
	exit := ""
	if c.lastExit != nil {
		exit = fmt.Sprint(c.lastExit.ExitCode, c.lastExit.FinishedAt.UnixNano())
	}
	term := ""
	if c.terminated != nil {
		term = c.terminated.Reason
	}
	return fmt.Sprint(c.waitReason, "|", c.waitMessage, "|", c.running, c.started, c.ready, c.everStarted, "|",
		c.restarts, "|", c.containerID, "|", exit, "|", term)
}
