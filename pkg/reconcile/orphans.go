package reconcile

import (
	"time"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

// Orphans returns the VMs of a listing (already scoped to this cluster and
// node) that nothing owns: no record names them, and either their pod is
// neither desired nor recorded, or their pod's record has moved on to a
// later attempt whose VM is recorded (a superseded VM, which would break
// "one live VM per pod"). A VM that carries no pod UID is left alone: caa
// did not make it, or cannot tell whose it is.
func Orphans(vms []provider.VM, records []ledger.Record, desired map[string]bool) []provider.VM {
	recorded := make(map[string]bool, len(records))
	byPod := make(map[string]ledger.Record, len(records))
	for _, r := range records {
		byPod[r.PodUID] = r
		if r.VMID != "" {
			recorded[r.VMID] = true
		}
	}
	var out []provider.VM
	for _, vm := range vms {
		owner := vm.Owner()
		if !owner.Managed || owner.PodUID == "" || recorded[vm.ID] || vm.State.Gone() {
			continue
		}
		r, hasRecord := byPod[owner.PodUID]
		switch {
		case !hasRecord && !desired[owner.PodUID]:
			out = append(out, vm)
		case hasRecord && r.VMID != "" && r.Key != "" && owner.Key != "" && owner.Key != r.Key:
			out = append(out, vm)
		}
	}
	return out
}

// OrphanTracker remembers when each orphan was first seen, so that one is
// deleted only on positive evidence (invariant I3): seen as an orphan in
// listings at least Grace apart, and older than Grace itself. A VM that
// drops out of the orphan set (adopted, or gone) is forgotten, so its
// clock starts again if it comes back.
type OrphanTracker struct {
	grace     time.Duration
	firstSeen map[string]time.Time
}

// NewOrphanTracker returns a tracker with the given grace period.
func NewOrphanTracker(grace time.Duration) *OrphanTracker {
	return &OrphanTracker{grace: grace, firstSeen: map[string]time.Time{}}
}

// Observe records the orphans of one listing taken at now and returns those
// that may be deleted now.
func (t *OrphanTracker) Observe(orphans []provider.VM, now time.Time) []provider.VM {
	seen := make(map[string]bool, len(orphans))
	var ready []provider.VM
	for _, vm := range orphans {
		seen[vm.ID] = true
		first, ok := t.firstSeen[vm.ID]
		if !ok {
			t.firstSeen[vm.ID] = now
			continue
		}
		oldEnough := !vm.CreatedAt.IsZero() && now.Sub(vm.CreatedAt) >= t.grace
		if now.Sub(first) >= t.grace && oldEnough {
			ready = append(ready, vm)
		}
	}
	for id := range t.firstSeen {
		if !seen[id] {
			delete(t.firstSeen, id)
		}
	}
	return ready
}

// Forget drops a VM, e.g. once it is deleted.
func (t *OrphanTracker) Forget(id string) { delete(t.firstSeen, id) }

// Pending is how many orphans are waiting out their grace period.
func (t *OrphanTracker) Pending() int { return len(t.firstSeen) }
