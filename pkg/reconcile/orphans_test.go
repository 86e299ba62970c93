package reconcile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

func tagged(id, podUID, key string, s provider.State, created time.Time) provider.VM {
	spec := provider.Spec{Key: key, Cluster: "c", Node: "n", PodUID: podUID, PodNamespace: "ns", PodName: "p"}
	return provider.VM{ID: id, State: s, Tags: spec.Tags(), CreatedAt: created}
}

func ids(vms []provider.VM) []string {
	out := []string{}
	for _, v := range vms {
		out = append(out, v.ID)
	}
	return out
}

func TestOrphans(t *testing.T) {
	old := t0.Add(-time.Hour)
	records := []ledger.Record{
		{PodUID: "p-rec", VMID: "i-rec", Key: "p-rec-a2", Phase: ledger.PhaseRunning},
		{PodUID: "p-creating", Key: "p-creating-a1", Phase: ledger.PhaseCreating},
	}
	desired := map[string]bool{"p-rec": true, "p-desired": true, "p-creating": true}
	vms := []provider.VM{
		tagged("i-rec", "p-rec", "p-rec-a2", provider.StateRunning, old),                // recorded
		tagged("i-superseded", "p-rec", "p-rec-a1", provider.StateRunning, old),         // an older attempt of a recorded pod
		tagged("i-desired", "p-desired", "p-desired-a1", provider.StateRunning, old),    // desired, record lost: adopt, not orphan
		tagged("i-creating", "p-creating", "p-creating-a1", provider.StatePending, old), // mid-create: the record has no VM id yet
		tagged("i-gone-pod", "p-gone", "p-gone-a1", provider.StateRunning, old),         // nobody wants it
		tagged("i-dead", "p-gone2", "p-gone2-a1", provider.StateTerminated, old),        // already gone
		{ID: "i-foreign", State: provider.StateRunning, CreatedAt: old},                 // not caa's
	}
	assert.Equal(t, []string{"i-superseded", "i-gone-pod"}, ids(Orphans(vms, records, desired)))
}

func TestOrphanTrackerNeedsTwoSightingsAGraceApartAndAge(t *testing.T) {
	grace := 5 * time.Minute
	tr := NewOrphanTracker(grace)
	young := tagged("i-young", "p", "k", provider.StateRunning, t0.Add(time.Minute))
	old := tagged("i-old", "q", "k", provider.StateRunning, t0.Add(-time.Hour))

	assert.Empty(t, tr.Observe([]provider.VM{young, old}, t0), "first sighting never deletes")
	assert.Empty(t, tr.Observe([]provider.VM{young, old}, t0.Add(grace-time.Second)), "second sighting too soon")
	assert.Equal(t, []string{"i-old"}, ids(tr.Observe([]provider.VM{young, old}, t0.Add(grace))))
	assert.Equal(t, []string{"i-young", "i-old"}, ids(tr.Observe([]provider.VM{young, old}, t0.Add(grace+time.Minute))),
		"the young one once it is older than the grace period too")

	// A VM that leaves the orphan set starts over when it comes back.
	assert.Empty(t, tr.Observe(nil, t0.Add(10*time.Minute)))
	assert.Equal(t, 0, tr.Pending())
	assert.Empty(t, tr.Observe([]provider.VM{old}, t0.Add(11*time.Minute)))
	assert.Equal(t, 1, tr.Pending())
	tr.Forget("i-old")
	assert.Equal(t, 0, tr.Pending())
}

func TestOrphanWithoutCreationTimeIsNeverOldEnough(t *testing.T) {
	tr := NewOrphanTracker(time.Minute)
	vm := tagged("i-x", "p", "k", provider.StateRunning, time.Time{})
	tr.Observe([]provider.VM{vm}, t0)
	assert.Empty(t, tr.Observe([]provider.VM{vm}, t0.Add(time.Hour)))
}
