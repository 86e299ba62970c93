package reconcile

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// TestNoDeleteForAVMTheCloudShowsGone (issue 30.12): the cluster caa
// deleted a departed node's VMs; a caa that takes that node's ledger over
// finds the pods gone and their VMs terminated. It removes the records and
// sends no terminate: a delete decided from a record is not sent for a VM
// the cloud already shows gone.
func TestNoDeleteForAVMTheCloudShowsGone(t *testing.T) {
	ctx := context.Background()
	f := newPassFixture(t, time.Hour) // terminated VMs stay visible, as on EC2
	pods := peerPods(3)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())
	for _, in := range f.cloud.Live() {
		require.NoError(t, f.cloud.Delete(in.ID), "the cluster caa's delete")
	}
	f.clock.Advance(time.Minute)
	f.cloud.ResetCounters()

	// The taking-over caa: no memory, the same ledger, and no pod left.
	takeover := &Reconciler{Exec: f.rec.Exec, Config: cfg, Now: f.clock.Now}
	res := takeover.Pass(ctx, nil, true)
	require.NoError(t, res.Err)
	assert.Zero(t, f.cloud.Counters()[cloud.OpDelete], "no terminate sent")
	assert.Zero(t, res.CloudWrites)
	recs, err := f.ledger.List(ledger.Filter{})
	require.NoError(t, err)
	assert.Empty(t, recs, "the records of the gone pods are removed")
}
