package reconcile

import (
	"context"
	"sync/atomic"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

// AuditSource may stand in for an audit's cloud listing of the node's VMs:
// the cluster caa's published view (pkg/cluster). It returns the listing,
// in which a recorded VM it cannot vouch for is left out (so the pass reads
// it by id, as for a listing that lagged), or ok false to have the pass
// list the cloud itself. It is consulted only after the startup pass.
type AuditSource interface {
	AuditVMs(ctx context.Context, sel provider.Selector, records []ledger.Record) (vms []provider.VM, ok bool)
}

// auditHook holds the reconciler's optional AuditSource and whether the
// steady state (past startup) has begun.
type auditHook struct {
	source AuditSource
	steady atomic.Bool
}

// SetAuditSource makes later audits ask src first (nil: list the cloud).
func (r *Reconciler) SetAuditSource(src AuditSource) { r.audits.source = src }

// viewVMs is the pass's listing from the AuditSource, in the steady state
// when it has one to give; false: the pass lists the cloud.
func (r *Reconciler) viewVMs(ctx context.Context, sel provider.Selector, records []ledger.Record) ([]provider.VM, bool) {
	if r.audits.source == nil || !r.audits.steady.Load() {
		return nil, false
	}
	return r.audits.source.AuditVMs(ctx, sel, records)
}
