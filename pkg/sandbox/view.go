package sandbox

import (
	"context"
	"errors"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

// viewVMs is the sync's listing from the cluster caa's view (Config.Audit)
// when it may stand in for one: past the startup sync, with a fresh view
// that names at most reconcile.MaxViewReads VMs the ledger does not know.
// reads counts the reads by id it made; ok false: the sync lists the cloud.
//
// The view is written by another process, so it only narrows reads (as in
// the informer mode, docs/design.md "A view narrows reads"):
//
//   - a sandbox's VM the view shows alive under the sandbox's pod UID and
//     key is taken as the ledger records it (name, addresses, the TEE it
//     was asked to be) and not read; nothing is done to it but serving it;
//   - a sandbox's VM the view shows otherwise (dead, gone, absent, another
//     pod or key) is left out, so the sync reads it by id and decides on
//     what the cloud says (confirmGone), as for a listing that missed it;
//   - a VM the ledger does not know is read by id and kept only if the
//     cloud itself tags it for this node: the orphan collection then works
//     on the cloud's word. A VM the view omits is not observed this sync,
//     which can only delay its collection;
//   - while an informer-mode pod record may need a delete (its pod gone or
//     terminal, or the record Deleting), the sync lists the cloud: no view
//     takes part in a decision to write.
func (m *Manager) viewVMs(ctx context.Context) (vms []provider.VM, reads int, ok bool) {
	if m.cfg.Audit == nil || !m.steady.Load() {
		return nil, 0, false
	}
	sandboxes, err := m.cfg.Ledger.ListSandboxes()
	if err != nil {
		return nil, 0, false
	}
	records, err := m.cfg.Ledger.List(ledger.Filter{})
	if err != nil {
		return nil, 0, false
	}
	sel := m.selector()
	var recs []ledger.Record
	vmOf := map[string]provider.VM{} // VM key -> the VM as the ledger records it
	for _, r := range records {
		if pod := m.cfg.Pods.Pod(r.PodUID); pod == nil || pod.Terminal || r.Phase == ledger.PhaseDeleting {
			return nil, 0, false
		}
		if r.VMID == "" {
			continue
		}
		recs = append(recs, r)
		vmOf[provider.VMKey(r.VMID)] = provider.VM{ID: r.VMID, Name: r.VMName, IPs: r.IPs, Zone: r.Zone,
			InstanceType: r.InstanceType, Image: r.Image, TEE: provider.TEE(r.Confidential),
			Tags: provider.Spec{Key: r.Key, Cluster: sel.Cluster, Node: sel.Node, PodUID: r.PodUID, PodNamespace: r.Namespace, PodName: r.Name}.Tags()}
	}
	for _, s := range sandboxes {
		if s.VMID == "" {
			continue
		}
		recs = append(recs, ledger.Record{PodUID: s.PodUID, Namespace: s.Namespace, Name: s.Name, Key: s.Key, VMID: s.VMID})
		vmOf[provider.VMKey(s.VMID)] = provider.VM{ID: s.VMID, Name: s.VMName, IPs: s.IPs,
			InstanceType: s.InstanceType, Image: s.Image, TEE: provider.TEE(s.Confidential),
			Tags: provider.Spec{Key: s.Key, Cluster: sel.Cluster, Node: sel.Node, PodUID: s.PodUID, PodNamespace: s.Namespace, PodName: s.Name,
				ExtraTags: map[string]string{TagSandbox: s.ID}}.Tags()}
	}
	states, unknown, ok := m.cfg.Audit.AuditVMs(ctx, sel, recs)
	if !ok {
		return nil, 0, false
	}
	if len(unknown) > reconcile.MaxViewReads {
		m.cfg.Log.Info("the cluster view shows more VMs unknown to the ledger than a sync reads by id: listing the cloud instead",
			"unknown", len(unknown), "maxReads", reconcile.MaxViewReads)
		return nil, 0, false
	}
	vouched := map[string]bool{}
	for id, st := range states {
		vm, known := vmOf[provider.VMKey(id)]
		if !known || !st.Alive() || vouched[provider.VMKey(id)] {
			continue
		}
		vouched[provider.VMKey(id)] = true
		vm.State = st
		vms = append(vms, vm)
	}
	for _, id := range unknown {
		if vouched[provider.VMKey(id)] {
			continue
		}
		if err := m.take(ctx, m.cfg.Reads); err != nil {
			return nil, reads, false
		}
		callCtx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
		vm, err := m.cfg.Provider.Get(callCtx, id)
		cancel()
		reads++
		switch {
		case err == nil && sel.Matches(vm.Tags):
			vms = append(vms, vm)
		case err != nil && !errors.Is(err, provider.ErrNotFound):
			m.cfg.Log.Debug("cannot read a VM the cluster view shows", "vm", id, "err", err)
		}
	}
	return vms, reads, true
}
