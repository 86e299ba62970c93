package reconcile

import (
	"maps"
	"slices"
	"strings"
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
func Orphans(vms []provider.VM, records []ledger.Record, alive map[string]bool) []provider.VM {
	recorded := make(map[string]bool, len(records))
	byPod := make(map[string]ledger.Record, len(records))
	for _, r := range records {
		byPod[r.PodUID] = r
		if r.VMID != "" {
			recorded[provider.VMKey(r.VMID)] = true
		}
		if r.ReplacesVMID != "" {
			recorded[provider.VMKey(r.ReplacesVMID)] = true // its record deletes it
		}
	}
	var out []provider.VM
	for _, vm := range vms {
		owner := vm.Owner()
		// A dead VM (stopped, failed) is still there and still costs: only
		// a terminated one is left to the cloud to forget.
		if !owner.Managed || owner.PodUID == "" || recorded[provider.VMKey(vm.ID)] || isGone(vm.State) {
			continue
		}
		r, hasRecord := byPod[owner.PodUID]
		switch {
		case !hasRecord && !alive[owner.PodUID]:
			out = append(out, vm)
		case hasRecord && r.VMID != "" && r.Key != "" && owner.Key != "" && owner.Key != r.Key:
			out = append(out, vm)
		}
	}
	return out
}

// OrphanTracker remembers when caa itself first saw each orphan, so that
// one is deleted only on positive evidence (invariant I3): seen as an
// orphan in listings at least Grace apart. The cloud's creation time plays
// no part: a clock that is wrong, or a VM dated in the future, must neither
// shorten nor stretch the grace. A VM that drops out of the orphan set
// (adopted, or gone) is forgotten, so its clock starts again if it returns.
type OrphanTracker struct {
	grace     time.Duration
	firstSeen map[string]PendingOrphan
}

// PendingOrphan is an orphan waiting out its grace period.
type PendingOrphan struct {
	ID        string    `json:"id"`
	Pod       string    `json:"pod,omitempty"`
	PodUID    string    `json:"podUID,omitempty"`
	FirstSeen time.Time `json:"firstSeen"`
}

// NewOrphanTracker returns a tracker with the given grace period.
func NewOrphanTracker(grace time.Duration) *OrphanTracker {
	return &OrphanTracker{grace: grace, firstSeen: map[string]PendingOrphan{}}
}

// Observe records the orphans of one listing taken at now and returns those
// that may be deleted now.
func (t *OrphanTracker) Observe(orphans []provider.VM, now time.Time) []provider.VM {
	seen := make(map[string]bool, len(orphans))
	var ready []provider.VM
	for _, vm := range orphans {
		seen[vm.ID] = true
		p, ok := t.firstSeen[vm.ID]
		if !ok {
			o := vm.Owner()
			t.firstSeen[vm.ID] = PendingOrphan{ID: vm.ID, Pod: o.Pod, PodUID: o.PodUID, FirstSeen: now}
			continue
		}
		if now.Sub(p.FirstSeen) >= t.grace {
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

// Pending lists the orphans waiting out their grace, oldest first.
func (t *OrphanTracker) Pending() []PendingOrphan {
	out := slices.Collect(maps.Values(t.firstSeen))
	slices.SortFunc(out, func(a, b PendingOrphan) int {
		if c := a.FirstSeen.Compare(b.FirstSeen); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}
