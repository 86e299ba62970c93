package reconcile

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// A listing taken before the ledger was read can miss VMs the previous
// holder created after it: the pass reads those by id and adopts them,
// with no create, no delete and no listing of its own.
func TestAStalePrefetchedListingNeverActsOnAbsence(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	pods := peerPods(10)
	sel := provider.Selector{Cluster: "c", Node: "n"}

	early := StartPrefetch(ctx, f.rec.Exec.Provider, sel, time.Minute)
	_, ok := early.Wait(ctx, sel) // taken while the cloud has no VM
	require.True(t, ok)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged(), "the previous holder creates every VM")

	f.cloud.ResetCounters()
	restarted := &Reconciler{Exec: f.rec.Exec, Config: cfg, OrphanGrace: 5 * time.Minute, Now: f.clock.Now}
	restarted.UsePrefetch(early)
	res := restarted.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	assert.True(t, res.Converged(), "pending: %v", res.Pending)
	assert.Equal(t, 10, res.Actions[KindNone])
	assert.Zero(t, res.CloudWrites)
	c := f.cloud.Counters()
	assert.Zero(t, c[cloud.OpList], "the prefetched listing served the pass")
	assert.Equal(t, int64(10), c[cloud.OpGet], "each VM the listing missed is read by id")
	assert.Len(t, f.cloud.Live(), 10)

	// Once: the next pass lists again.
	f.cloud.ResetCounters()
	require.True(t, restarted.Pass(ctx, pods, true).Converged())
	assert.Equal(t, int64(1), f.cloud.Counters()[cloud.OpList])
}

// An orphan in a prefetched listing is only its first sighting: it is
// deleted only when a later listing shows it again past the grace.
func TestAPrefetchedListingIsOneSightingOfAnOrphan(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	pods := peerPods(2)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())
	stray := provider.Spec{Key: "uid-stray-a1", Cluster: "c", Node: "n", PodUID: "uid-stray", PodNamespace: "ns", PodName: "stray"}
	_, err := f.cloud.Create(cloud.CreateRequest{Token: stray.Key, Tags: stray.Tags(), Image: "img", InstanceType: "small"})
	require.NoError(t, err)
	sel := provider.Selector{Cluster: "c", Node: "n"}

	early := StartPrefetch(ctx, f.rec.Exec.Provider, sel, time.Minute)
	_, ok := early.Wait(ctx, sel)
	require.True(t, ok)
	f.clock.Advance(10 * time.Minute) // however old the listing, one sighting is one
	f.cloud.ResetCounters()
	restarted := &Reconciler{Exec: f.rec.Exec, Config: cfg, OrphanGrace: 5 * time.Minute, Now: f.clock.Now}
	restarted.UsePrefetch(early)
	res := restarted.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	assert.Zero(t, f.cloud.Counters()[cloud.OpList])
	assert.Zero(t, res.OrphansDeleted, "first sighting")
	assert.Len(t, f.cloud.Live(), 3)

	f.clock.Advance(5 * time.Minute)
	res = restarted.Pass(ctx, pods, true)
	assert.Equal(t, 1, res.OrphansDeleted, "seen again past the grace by a listing of the pass's own")
	assert.Len(t, f.cloud.Live(), 2)
}

func TestPrefetchForAnotherSelectorIsNotUsed(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	early := StartPrefetch(ctx, f.rec.Exec.Provider, provider.Selector{Cluster: "c", Node: "other"}, time.Minute)
	_, ok := early.Wait(ctx, provider.Selector{Cluster: "c", Node: "other"})
	require.True(t, ok)
	f.cloud.ResetCounters()
	f.rec.UsePrefetch(early)
	require.NoError(t, f.rec.Pass(ctx, peerPods(2), true).Err)
	assert.Equal(t, int64(1), f.cloud.Counters()[cloud.OpList], "a listing of another node never stands in for this one's")
	var none *Prefetch
	_, ok = none.Wait(ctx, provider.Selector{})
	assert.False(t, ok)
}
