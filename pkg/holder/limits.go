package holder

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Defaults of the hand-over's own settings.
const (
	// DefaultReadyTimeout bounds how long a new caa may take, once it has
	// the ledger, to turn ready. It must exceed the boot timeout: the new
	// caa's startup pass waits for booting VMs that long.
	DefaultReadyTimeout = 12 * time.Minute
	// DefaultFailedCooldown is how long a pod whose hand-over failed is
	// refused. It must outlast the new pod's startup probe plus the
	// kubelet's longest crash back-off, so a container the kubelet
	// restarts does not cost the node a second gap.
	DefaultFailedCooldown = time.Hour
	// LeaseTTL is how long a lease stays valid after its last renewal;
	// the holder renews it every LeaseTTL/3.
	LeaseTTL = 30 * time.Second
	// KubeletMaxBackoff is the kubelet's cap on a crash-looping
	// container's restart delay (not configurable per pod).
	KubeletMaxBackoff = 5 * time.Minute
	// AbortWait is what the holder adds to the shutdown grace while it
	// waits for an aborted successor to answer "returned".
	AbortWait = 10 * time.Second
	// HeartbeatEvery is the period of the heartbeat every wait outside the
	// reconcile loop beats (asking, waiting for the lock, inert).
	HeartbeatEvery = time.Second
)

// Limits are the time limits that play in a rollout: the daemon's flags
// and, when known, the DaemonSet's probes and grace period (zero when
// unknown, as in `caa run` outside a cluster).
type Limits struct {
	Handover       bool
	Surge          bool // the update strategy runs two caa pods on a node
	ShutdownGrace  time.Duration
	BootTimeout    time.Duration
	ReadyTimeout   time.Duration
	FailedCooldown time.Duration
	// SandboxReady is the hypervisor mode's --sandbox-ready-timeout (zero
	// in the informer mode).
	SandboxReady time.Duration
	Stale        time.Duration // /healthz fails after this long without a heartbeat

	TerminationGrace time.Duration // terminationGracePeriodSeconds
	StartupWindow    time.Duration // startupProbe period x failureThreshold
	LivenessWindow   time.Duration // livenessProbe period x failureThreshold
}

// Check reports every pair of settings that cannot work together, each
// with its fix, as one error; nil when they all hold. The same relations
// are the table in docs/design.md (Rolling updates).
func (l Limits) Check() error {
	var errs []string
	add := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if l.Handover && l.ReadyTimeout <= l.BootTimeout {
		add("--handover-ready-timeout (%s) must exceed --boot-timeout (%s): a new caa waits for booting VMs before it turns ready, "+
			"so it would be aborted on a node with a slow VM; raise CAA_HANDOVER_READY_TIMEOUT or lower CAA_BOOT_TIMEOUT", l.ReadyTimeout, l.BootTimeout)
	}
	if l.Handover && l.SandboxReady > 0 && l.SandboxReady >= l.ReadyTimeout {
		add("--sandbox-ready-timeout (%s) must be below --handover-ready-timeout (%s): one silent sandbox agent would get every new caa "+
			"aborted; lower CAA_SANDBOX_READY_TIMEOUT", l.SandboxReady, l.ReadyTimeout)
	}
	if l.Handover && l.FailedCooldown <= l.ReadyTimeout {
		add("--handover-failed-cooldown (%s) must exceed --handover-ready-timeout (%s); raise CAA_HANDOVER_FAILED_COOLDOWN", l.FailedCooldown, l.ReadyTimeout)
	}
	if l.Stale > 0 && l.Stale <= 2*HeartbeatEvery {
		add("the liveness bound (%s, three --resync periods) must exceed twice the heartbeat of the waits (%s); raise CAA_RESYNC", l.Stale, HeartbeatEvery)
	}
	if l.Surge && !l.Handover {
		add("CAA_HANDOVER=false with a surge update strategy (maxSurge > 0): the new pod would wait for the ledger lock " +
			"while the old pod is never deleted; set CAA_HANDOVER=true, or use deploy/components/no-surge")
	}
	if l.TerminationGrace > 0 && l.ShutdownGrace >= l.TerminationGrace {
		add("--shutdown-grace (%s) must be below the pod's terminationGracePeriodSeconds (%s); lower CAA_SHUTDOWN_GRACE", l.ShutdownGrace, l.TerminationGrace)
	}
	if l.StartupWindow > 0 {
		if l.BootTimeout >= l.StartupWindow {
			add("--boot-timeout (%s) must be below the startup probe's window (%s)", l.BootTimeout, l.StartupWindow)
		}
		if l.Handover && l.ReadyTimeout+l.ShutdownGrace+AbortWait >= l.StartupWindow {
			add("--handover-ready-timeout plus the abort (%s) must end before the startup probe's window (%s): "+
				"the old caa, not the kubelet, must end a failed hand-over", l.ReadyTimeout+l.ShutdownGrace+AbortWait, l.StartupWindow)
		}
		if l.Handover && l.FailedCooldown <= l.StartupWindow+KubeletMaxBackoff {
			add("--handover-failed-cooldown (%s) must exceed the startup probe's window plus the kubelet's back-off (%s): "+
				"a restarted container of a failed pod would cost the node another gap", l.FailedCooldown, l.StartupWindow+KubeletMaxBackoff)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}
