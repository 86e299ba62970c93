package nodeagent

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// container is what the agent knows of a pod's one container, the input
// of podStatus.
type container struct {
	// waiting is set while no process runs: a reason such as ErrImagePull,
	// CreateContainerConfigError or CrashLoopBackOff, and why.
	waitReason, waitMessage string
	// running: a process runs since startedAt.
	running   bool
	startedAt time.Time
	// started: the startup probe passed (or there is none).
	started bool
	// ready: the readiness probe passes (or there is none).
	ready        bool
	restarts     int32
	lastExit     *corev1.ContainerStateTerminated
	containerID  string
	everStarted  bool
	terminated   *corev1.ContainerStateTerminated // set once stopped for the pod's deletion
	imageBinary  string
	firstHandled time.Time
}

// podStatus is the status the agent reports for pod given its container's
// state at now. It starts from the pod's current status, so fields the
// agent does not own (QoS class, the scheduler's PodScheduled) are kept,
// and a condition keeps its transition time while its status holds.
func podStatus(pod *corev1.Pod, c container, now time.Time) corev1.PodStatus {
	s := *pod.Status.DeepCopy()
	switch {
	case c.terminated != nil:
		// DaemonSet pods restart always: a stopped one is Running until
		// the object goes, as the kubelet leaves it.
		if c.everStarted {
			s.Phase = corev1.PodRunning
		} else {
			s.Phase = corev1.PodPending
		}
	case c.everStarted:
		s.Phase = corev1.PodRunning
	default:
		s.Phase = corev1.PodPending
	}
	s.HostIP, s.PodIP = podIP, podIP
	s.HostIPs = []corev1.HostIP{{IP: podIP}}
	s.PodIPs = []corev1.PodIP{{IP: podIP}}
	if s.StartTime == nil && !c.firstHandled.IsZero() {
		t := metav1.NewTime(c.firstHandled)
		s.StartTime = &t
	}
	ready := c.ready && c.running && c.terminated == nil
	cond := func(typ corev1.PodConditionType, ok bool, reason string) {
		setCondition(&s, typ, ok, reason, now)
	}
	if findCondition(s.Conditions, corev1.PodScheduled) == nil {
		cond(corev1.PodScheduled, true, "")
	}
	cond(corev1.PodInitialized, true, "")
	notReady := ""
	if !ready {
		notReady = "ContainersNotReady"
	}
	cond(corev1.ContainersReady, ready, notReady)
	cond(corev1.PodReady, ready, notReady)

	spec := pod.Spec.Containers[0]
	cs := corev1.ContainerStatus{
		Name:                 spec.Name,
		Image:                spec.Image,
		ImageID:              c.imageBinary,
		ContainerID:          c.containerID,
		Ready:                ready,
		RestartCount:         c.restarts,
		Started:              new(c.started && c.running && c.terminated == nil),
		LastTerminationState: corev1.ContainerState{Terminated: c.lastExit},
	}
	switch {
	case c.terminated != nil:
		cs.State.Terminated = c.terminated
	case c.running:
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.startedAt)}
	default:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: c.waitReason, Message: c.waitMessage}
	}
	s.ContainerStatuses = []corev1.ContainerStatus{cs}
	return s
}

// setCondition sets a condition's status, moving its transition time only
// when the status changes.
func setCondition(s *corev1.PodStatus, typ corev1.PodConditionType, ok bool, reason string, now time.Time) {
	status := corev1.ConditionFalse
	if ok {
		status = corev1.ConditionTrue
	}
	if c := findCondition(s.Conditions, typ); c != nil {
		if c.Status != status {
			c.Status = status
			c.LastTransitionTime = metav1.NewTime(now)
		}
		c.Reason = reason
		return
	}
	s.Conditions = append(s.Conditions, corev1.PodCondition{
		Type: typ, Status: status, Reason: reason, LastTransitionTime: metav1.NewTime(now),
	})
}

func findCondition(conds []corev1.PodCondition, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

// PodReady reports whether pod's Ready condition is True.
func PodReady(pod *corev1.Pod) bool {
	c := findCondition(pod.Status.Conditions, corev1.PodReady)
	return c != nil && c.Status == corev1.ConditionTrue
}
