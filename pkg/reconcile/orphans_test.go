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

func TestOrphanTrackerCountsTheGraceFromItsOwnFirstSighting(t *testing.T) {
	grace := 5 * time.Minute
	tr := NewOrphanTracker(grace)
	// The cloud's creation time plays no part: one VM dated a year ahead,
	// one an hour back, one with no date at all.
	future := tagged("i-future", "p", "k", provider.StateRunning, t0.AddDate(1, 0, 0))
	old := tagged("i-old", "q", "k", provider.StateRunning, t0.Add(-time.Hour))
	undated := tagged("i-undated", "r", "k", provider.StateRunning, time.Time{})
	all := []provider.VM{future, old, undated}

	assert.Empty(t, tr.Observe(all, t0), "first sighting never deletes, however old the cloud says it is")
	assert.Empty(t, tr.Observe(all, t0.Add(grace-time.Second)), "second sighting too soon")
	assert.Equal(t, []string{"i-future", "i-old", "i-undated"}, ids(tr.Observe(all, t0.Add(grace))),
		"a grace after caa first saw them, whatever their cloud dates")

	// A VM that leaves the orphan set starts over when it comes back.
	assert.Empty(t, tr.Observe(nil, t0.Add(10*time.Minute)))
	assert.Empty(t, tr.Pending())
	assert.Empty(t, tr.Observe([]provider.VM{old}, t0.Add(11*time.Minute)))
	pending := tr.Pending()
	if assert.Len(t, pending, 1) {
		assert.Equal(t, PendingOrphan{ID: "i-old", Pod: "ns/p", PodUID: "q", FirstSeen: t0.Add(11 * time.Minute)}, pending[0])
	}
	tr.Forget("i-old")
	assert.Empty(t, tr.Pending())
}

func TestOrphansIncludeDeadVMsButNotPodsOfOtherRuntimeClasses(t *testing.T) {
	old := t0.Add(-time.Hour)
	records := []ledger.Record{
		{PodUID: "p-rec", VMID: "i-new", Key: "p-rec-a2", ReplacesVMID: "i-replaced", Phase: ledger.PhaseRunning},
		{PodUID: "p-two", VMID: "i-two-new", Key: "p-two-a3", Phase: ledger.PhaseRunning},
	}
	// p-other exists with a runtime class caa does not watch: alive, so its
	// VM is never an orphan (a configuration change deletes nothing).
	alive := map[string]bool{"p-rec": true, "p-two": true, "p-other": true}
	vms := []provider.VM{
		tagged("i-new", "p-rec", "p-rec-a2", provider.StateRunning, old),
		tagged("i-replaced", "p-rec", "p-rec-a1", provider.StateStopped, old),          // its record deletes it
		tagged("i-two-failed", "p-two", "p-two-a2", provider.StateFailed, old),         // superseded and failed: collected
		tagged("i-two-stopped", "p-two", "p-two-a1", provider.StateStopped, old),       // superseded and stopped: collected
		tagged("i-two-terminated", "p-two", "p-two-a0", provider.StateTerminated, old), // the cloud forgets it
		tagged("i-other", "p-other", "p-other-a1", provider.StateRunning, old),
		tagged("i-gone-failed", "p-gone", "p-gone-a1", provider.StateFailed, old), // nobody wants it
	}
	assert.Equal(t, []string{"i-two-failed", "i-two-stopped", "i-gone-failed"}, ids(Orphans(vms, records, alive)))
}
