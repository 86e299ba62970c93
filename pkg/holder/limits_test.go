package holder

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shipped are the daemon's defaults and the base DaemonSet's numbers;
// deploy/timeouts_test.go checks the same relations on the rendered
// manifests and the binary's --help.
var shipped = Limits{
	Handover: true, Surge: true, ShutdownGrace: 20 * time.Second, BootTimeout: 10 * time.Minute,
	ReadyTimeout: DefaultReadyTimeout, FailedCooldown: DefaultFailedCooldown, Stale: 3 * time.Minute, SandboxReady: 4 * time.Minute,
	TerminationGrace: 45 * time.Second, StartupWindow: 20 * time.Minute, LivenessWindow: time.Minute,
}

func TestShippedLimitsHold(t *testing.T) { require.NoError(t, shipped.Check()) }

func TestLimitsThatCannotWorkTogetherAreRefusedWithTheFix(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Limits)
		want   []string
	}{
		{"ready timeout below the boot timeout", func(l *Limits) { l.ReadyTimeout = 3 * time.Minute },
			[]string{"--handover-ready-timeout (3m0s) must exceed --boot-timeout (10m0s)", "CAA_HANDOVER_READY_TIMEOUT"}},
		{"a sandbox readiness bound past the hand-over's", func(l *Limits) { l.SandboxReady = DefaultReadyTimeout },
			[]string{"--sandbox-ready-timeout (12m0s) must be below --handover-ready-timeout (12m0s)", "CAA_SANDBOX_READY_TIMEOUT"}},
		{"no hand-over with a surge", func(l *Limits) { l.Handover = false },
			[]string{"CAA_HANDOVER=false with a surge", "no-surge"}},
		{"the old 15 min cooldown against a 20 min startup probe", func(l *Limits) {
			l.ReadyTimeout, l.BootTimeout, l.FailedCooldown = 3*time.Minute, 2*time.Minute, 15*time.Minute
		},
			[]string{"--handover-failed-cooldown (15m0s) must exceed the startup probe's window plus the kubelet's back-off (25m0s)"}},
		{"ready timeout past the startup probe", func(l *Limits) { l.ReadyTimeout = 19*time.Minute + 45*time.Second },
			[]string{"must end before the startup probe's window"}},
		{"shutdown grace past the termination grace", func(l *Limits) { l.ShutdownGrace = time.Minute },
			[]string{"CAA_SHUTDOWN_GRACE"}},
		{"boot timeout past the startup probe", func(l *Limits) { l.BootTimeout = 25 * time.Minute; l.ReadyTimeout = 26 * time.Minute },
			[]string{"--boot-timeout (25m0s) must be below the startup probe's window"}},
		{"a liveness bound the waits' heartbeat cannot meet", func(l *Limits) { l.Stale = time.Second },
			[]string{"CAA_RESYNC"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := shipped
			tc.change(&l)
			err := l.Check()
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	// Without hand-over and surge, the hand-over's own limits do not apply.
	l := shipped
	l.Handover, l.Surge, l.ReadyTimeout = false, false, time.Minute
	assert.NoError(t, l.Check())
}
