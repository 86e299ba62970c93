package reconcile

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/cluster"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// TestAFreshForgedViewCannotHideADeadVMForEver (issue 42.5): a view kept
// fresh at every audit calls a pod's VM running after it stopped (the pod UID
// and key are on the VM's tags for anyone to copy). The node still lists
// the cloud on its own within cluster.DefaultListEvery, sees the VM dead and
// gives the pod a new one.
func TestAFreshForgedViewCannotHideADeadVMForEver(t *testing.T) {
	ctx := context.Background()
	pods := peerPods(1)
	f := newViewFixture(t, pods)
	rec := f.record(t, pods[0].UID)
	require.NoError(t, f.cloud.Stop(rec.VMID))
	f.cloud.ResetCounters()

	const interval = 10 * time.Minute // the default --audit-interval
	var recovered time.Duration
	for elapsed := interval; elapsed <= cluster.DefaultListEvery+2*interval; elapsed += interval {
		f.clock.Advance(interval)
		f.writeView(t, cluster.ViewVM{ID: rec.VMID, State: provider.StateRunning, PodUID: rec.PodUID, Key: rec.Key})
		require.NoError(t, f.rec.Pass(ctx, pods, true).Err)
		if now := f.record(t, pods[0].UID); now.VMID != rec.VMID && now.VMID != "" {
			vm, err := f.cloud.Get(now.VMID)
			require.NoError(t, err)
			if vm.State.Alive() {
				recovered = elapsed
				break
			}
		}
	}
	require.NotZero(t, recovered, "the pod never got a VM back while the view called its dead VM running")
	assert.LessOrEqual(t, recovered, cluster.DefaultListEvery+interval, "found within the bound and an audit")
	assert.Positive(t, f.cloud.Counters()[cloud.OpList], "the node listed on its own")
	assert.Len(t, f.cloud.Live(), 1)
}
