package health

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHandoverIsShownAndCounted(t *testing.T) {
	r := newRig(t, Config{})
	at := r.clock.Now()
	r.status.SetHandover(Handover{Role: RoleHandedOver, Peer: "caa-v2", Outcome: HandoverUnderway, StartedAt: at})
	snap := r.status.Snapshot()
	require.NotNil(t, snap.Handover)
	assert.Equal(t, HandoverUnderway, snap.Handover.Outcome)
	assert.Zero(t, testutil.ToFloat64(r.m.handovers.WithLabelValues(RoleHandedOver, HandoverUnderway)), "an unfinished hand-over is not counted")

	r.status.SetHandover(Handover{Role: RoleHandedOver, Peer: "caa-v2", Outcome: HandoverHandedBack, Reason: "gone",
		StartedAt: at, Took: Duration(3 * time.Second)})
	r.status.SetHandover(Handover{Role: RoleHandedOver, Peer: "caa-v2", Outcome: HandoverDone,
		StartedAt: at, Took: Duration(2 * time.Second), Gap: Duration(1500 * time.Millisecond)})
	assert.Equal(t, 1.0, testutil.ToFloat64(r.m.handovers.WithLabelValues(RoleHandedOver, HandoverHandedBack)))
	assert.Equal(t, 1.0, testutil.ToFloat64(r.m.handovers.WithLabelValues(RoleHandedOver, HandoverDone)))
	assert.Equal(t, 2.0, testutil.ToFloat64(r.m.handoverTook))
	assert.Equal(t, 1.5, testutil.ToFloat64(r.m.handoverGap))
	assert.Equal(t, HandoverDone, r.status.Snapshot().Handover.Outcome)
}

// TestPodDoneMovesOnePodBetweenTheLists: work on one pod between passes
// updates /status and the metrics, and never readiness.
func TestPodDoneMovesOnePodBetweenTheLists(t *testing.T) {
	r := newRig(t, Config{})
	r.status.PassDone(converged(r.clock.Now(), 3))
	web := PodNote{UID: "u1", Pod: "team/web", Reason: "NoRecord"}
	r.status.PodDone(web, true, false)
	snap := r.status.Snapshot()
	require.Len(t, snap.Pending, 1)
	assert.Equal(t, 1.0, testutil.ToFloat64(r.m.podsPending))
	assert.True(t, snap.Ready, "readiness is the passes' alone")

	web.Reason = "InvalidSpec"
	r.status.PodDone(web, false, true)
	snap = r.status.Snapshot()
	assert.Empty(t, snap.Pending)
	require.Len(t, snap.Failed, 1)
	assert.Equal(t, "InvalidSpec", snap.Failed[0].Reason)

	r.status.PodDone(web, false, false)
	snap = r.status.Snapshot()
	assert.Empty(t, snap.Pending)
	assert.Empty(t, snap.Failed)
	assert.Zero(t, testutil.ToFloat64(r.m.podsFailed))
}

func TestPreflightRunsAreCounted(t *testing.T) {
	r := newRig(t, Config{})
	assert.Zero(t, testutil.ToFloat64(r.m.preflights.WithLabelValues(PreflightPassed)), "the series exists at 0")
	r.status.CountPreflight(false)
	r.status.CountPreflight(false)
	r.status.CountPreflight(true)
	assert.Equal(t, 2.0, testutil.ToFloat64(r.m.preflights.WithLabelValues(PreflightFailed)))
	assert.Equal(t, 1.0, testutil.ToFloat64(r.m.preflights.WithLabelValues(PreflightPassed)))
	NewStatus(Config{}).CountPreflight(true) // no metrics: nothing to count, no panic
}
