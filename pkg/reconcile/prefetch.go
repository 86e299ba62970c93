package reconcile

import (
	"context"
	"time"

	"github.com/caa-project/caa/pkg/provider"
)

// Prefetch is a listing of the node's VMs started before the ledger is
// open: a warm restart's one listing runs while the pod cache syncs and
// the ledger opens, instead of after both (on a restart the cloud's
// latency is most of the time to ready).
//
// A listing taken a few milliseconds before the ledger was read is safe
// for the startup pass, because nothing in a pass acts on the absence of
// a VM from one listing: a recorded VM the listing does not show is read
// by id before anything is decided (inputs), a missing VM must stay
// missing for ConfirmMissing, and an orphan must be seen again, past the
// grace, in a later listing. A VM the listing shows is positive evidence
// whenever it was taken. The caller still hands a Prefetch only to a pass
// on a ledger it opened from a free lock: after a hand-over the old caa
// may have written until the release, so the listing would be older than
// the last write it could miss (cmd/caa decides).
type Prefetch struct {
	sel     provider.Selector
	started time.Time
	done    chan struct{}
	vms     []provider.VM
	err     error
}

// StartPrefetch lists sel's VMs through p in the background; timeout
// bounds the call (the executor's cloud call timeout).
func StartPrefetch(ctx context.Context, p provider.Provider, sel provider.Selector, timeout time.Duration) *Prefetch {
	pf := &Prefetch{sel: sel, started: time.Now(), done: make(chan struct{})}
	go func() {
		defer close(pf.done)
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		pf.vms, pf.err = p.List(ctx, sel)
	}()
	return pf
}

// Started is when the listing was asked for.
func (pf *Prefetch) Started() time.Time { return pf.started }

// Wait waits for the listing (or ctx) and returns it; ok is false when it
// failed, ctx ended first, or it was for another selector: the pass then
// lists as usual.
func (pf *Prefetch) Wait(ctx context.Context, sel provider.Selector) (vms []provider.VM, ok bool) {
	if pf == nil || pf.sel != sel {
		return nil, false
	}
	select {
	case <-pf.done:
	case <-ctx.Done():
		return nil, false
	}
	if pf.err != nil {
		return nil, false
	}
	return pf.vms, true
}

// UsePrefetch hands the next pass a listing taken before the ledger was
// opened, once (see Prefetch for when that is safe). A listing the pass
// cannot use (failed, or a cluster view serves the pass) is dropped.
func (r *Reconciler) UsePrefetch(pf *Prefetch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.prefetch = pf
}

// takePrefetch returns the handed listing and forgets it.
func (r *Reconciler) takePrefetch() *Prefetch {
	r.mu.Lock()
	defer r.mu.Unlock()
	pf := r.prefetch
	r.prefetch = nil
	return pf
}
