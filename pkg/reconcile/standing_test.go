package reconcile

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

// TestStandingAfterPerPodWork: between full passes, the worker's view of a
// pod (for /status) follows its record: pending before its VM, done once
// created, failed on a refused spec, and gone with its pod.
func TestStandingAfterPerPodWork(t *testing.T) {
	f := newPassFixture(t, 0)
	ctx := context.Background()
	pods := peerPods(2)

	st, s := f.rec.Standing(pods[0].UID, pods[0])
	assert.Equal(t, StandingPending, s)
	assert.Equal(t, "NoRecord", st.Reason)
	assert.Equal(t, "ns/pod-000", st.Pod)

	res := f.rec.ReconcilePod(ctx, pods[0].UID, pods[0], true)
	require.NoError(t, res.Err)
	require.Equal(t, 1, res.CloudWrites)
	_, s = f.rec.Standing(pods[0].UID, pods[0])
	assert.Equal(t, StandingDone, s)

	bad := pods[1]
	bad.Annotations = map[string]string{provider.AnnotationMachineType: "no-such-type"}
	f.rec.ReconcilePod(ctx, bad.UID, bad, true)
	st, s = f.rec.Standing(bad.UID, bad)
	if rec, err := f.ledger.Get(bad.UID); err == nil && rec.Phase == ledger.PhaseFailed {
		assert.Equal(t, StandingFailed, s)
		assert.Equal(t, rec.Reason, st.Reason)
	} else {
		t.Fatalf("the refused spec did not fail the pod: %+v %v", rec, err)
	}

	_, s = f.rec.Standing(pods[0].UID, nil)
	assert.Equal(t, StandingDone, s, "a gone pod leaves the lists")
}
