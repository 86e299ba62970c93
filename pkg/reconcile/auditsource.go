package reconcile

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

// AuditSource may stand in for an audit's cloud listing of the node's VMs:
// the cluster caa's published view (pkg/cluster). What it says is written
// by another process, so it may only narrow what the pass reads, never
// decide a cloud write (see docs/design.md, "A view narrows reads"):
//
//   - vouched are recorded VM ids the source shows alive, under the pod UID
//     and key their record names. The pass takes them as their record says
//     (identity, name, addresses from the ledger; the state the source
//     shows) and skips reading them. Before any action other than none or
//     wait is taken on one of them, the pass reads it from the cloud and
//     decides again on what the cloud said.
//   - unknown are VM ids no record names that the source shows for this
//     node. The pass reads each by id, through its read budget and at most
//     MaxViewReads of them per audit (more: it lists the cloud instead),
//     and keeps those the cloud itself tags for this node.
//
// A recorded VM in neither is read by id, as for a listing that lagged.
// ok false: no view to use; the pass lists the cloud itself. It is
// consulted only after the startup pass.
type AuditSource interface {
	AuditVMs(ctx context.Context, sel provider.Selector, records []ledger.Record) (vouched map[string]provider.State, unknown []string, ok bool)
}

// MaxViewReads bounds the reads by id of VMs that a view shows and the
// ledger does not know, per audit: past it, one listing costs less.
const MaxViewReads = 16

// auditHook holds the reconciler's optional AuditSource and whether the
// steady state (past startup) has begun.
type auditHook struct {
	source AuditSource
	steady atomic.Bool
}

// SetAuditSource makes later audits ask src first (nil: list the cloud).
func (r *Reconciler) SetAuditSource(src AuditSource) { r.audits.source = src }

// viewVMs is the pass's listing from the AuditSource, in the steady state
// when it has one to give, and the ids in it that no cloud read backs
// (vouched); false: the pass lists the cloud.
func (r *Reconciler) viewVMs(ctx context.Context, sel provider.Selector, records []ledger.Record) ([]provider.VM, map[string]bool, bool) {
	if r.audits.source == nil || !r.audits.steady.Load() {
		return nil, nil, false
	}
	states, unknown, ok := r.audits.source.AuditVMs(ctx, sel, records)
	if !ok {
		return nil, nil, false
	}
	if len(unknown) > MaxViewReads {
		r.Exec.log().Info("the cluster view shows more VMs unknown to the ledger than an audit reads by id: listing the cloud instead",
			"unknown", len(unknown), "maxReads", MaxViewReads)
		return nil, nil, false
	}
	shown := make(map[string]provider.State, len(states))
	for id, st := range states {
		shown[provider.VMKey(id)] = st
	}
	var vms []provider.VM
	vouched := map[string]bool{}
	for _, rec := range records {
		st, ok := shown[provider.VMKey(rec.VMID)]
		if rec.VMID == "" || !ok || !st.Alive() || vouched[provider.VMKey(rec.VMID)] {
			continue
		}
		vouched[provider.VMKey(rec.VMID)] = true
		vms = append(vms, provider.VM{
			ID: rec.VMID, Name: rec.VMName, IPs: rec.IPs, Zone: rec.Zone, State: st,
			InstanceType: rec.InstanceType, Image: rec.Image,
			// The view carries no TEE: the VM is taken as its record asked
			// for it (taken as none, every confidential VM would look
			// downgraded and be read by id at every audit).
			TEE: provider.TEE(rec.Confidential),
			Tags: provider.Spec{Key: rec.Key, Cluster: sel.Cluster, Node: sel.Node, PodUID: rec.PodUID,
				PodNamespace: rec.Namespace, PodName: rec.Name}.Tags(),
		})
	}
	for _, id := range unknown {
		if vouched[provider.VMKey(id)] {
			continue
		}
		if err := r.Exec.read(ctx); err != nil {
			return nil, nil, false
		}
		gctx, cancel := r.Exec.call(ctx)
		vm, err := r.Exec.Provider.Get(gctx, id)
		cancel()
		switch {
		case err == nil && sel.Matches(vm.Tags):
			vms = append(vms, vm)
		case err != nil && !errors.Is(err, provider.ErrNotFound):
			r.Exec.log().Debug("cannot read a VM the cluster view shows", "vm", id, "err", err)
		}
	}
	return vms, vouched, true
}

// verified returns in and a unchanged when a decides nothing (none, wait)
// or rests on no VM that only the view vouched for. Otherwise it reads
// those VMs from the cloud, through the read budget, and decides again on
// what the cloud said: nothing another process wrote decides a cloud write
// or an adoption.
func (r *Reconciler) verified(ctx context.Context, in Input, a Action, vouched map[string]bool, cfg Config) (Input, Action) {
	if len(vouched) == 0 || a.Kind == KindNone || a.Kind == KindWait {
		return in, a
	}
	fromView := func(vm *provider.VM) bool { return vm != nil && vouched[provider.VMKey(vm.ID)] }
	touched := fromView(in.VM)
	for _, s := range in.Siblings {
		touched = touched || fromView(s)
	}
	if !touched {
		return in, a
	}
	if err := r.Exec.read(ctx); err != nil {
		return in, Action{Kind: KindWait, Reason: ReasonVMUnknown, RequeueAfter: r.Exec.retryBase(),
			Message: "the VM must be read from the cloud before acting on it: " + err.Error()}
	}
	if fromView(in.VM) {
		in.VM = r.confirm(ctx, in.VM.ID)
		if in.VM == nil && in.Record != nil && in.Record.VMID != "" {
			// Not found now: the missing clock starts, as after a listing.
			r.mu.Lock()
			in.MissingSince = r.seenMissing(podUID(in), in.Record.VMID, true, in.Now)
			r.mu.Unlock()
		}
	}
	sibs := make([]*provider.VM, 0, len(in.Siblings))
	for _, s := range in.Siblings {
		if fromView(s) {
			if s = r.confirm(ctx, s.ID); s == nil || isGone(s.State) || s.Owner().PodUID != podUID(in) {
				continue
			}
		}
		sibs = append(sibs, s)
	}
	in.Siblings = sibs
	return in, Decide(in, cfg)
}
