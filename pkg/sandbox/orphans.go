package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

// In the remote hypervisor mode a VM of this node belongs to a sandbox
// record or, on a node switched over from the informer mode, to a pod
// record made there. Everything else caa tagged for this node is an orphan,
// collected by the informer mode's rule (invariant I3): seen as an orphan in
// two listings at least the grace apart, by caa's own clock.

// Orphans returns the VMs of a listing (already scoped to this cluster and
// node) that no record owns in the remote hypervisor mode:
//
//   - a VM a sandbox record names (its VM id, or its idempotency key while
//     the create's answer is not recorded) or a pod record names (its VM,
//     or the dead VM its attempt replaces) is owned;
//   - a VM tagged with a sandbox id no record holds is an orphan, whether
//     its pod lives or not: only StartVM makes such VMs, always after its
//     record, and nothing serves a sandbox without one;
//   - any other VM follows the informer mode's rule (reconcile.Orphans):
//     an orphan only when its pod is neither alive nor recorded, or when
//     its pod's record moved on to a later attempt. So a VM of a live pod
//     is never taken for an orphan just because the mode changed.
//
// A gone (terminated) VM, and one that carries no pod UID or no managed-by
// marker, is never an orphan: caa did not make it or cannot tell whose it is.
func Orphans(vms []provider.VM, sandboxes []ledger.Sandbox, records []ledger.Record, alive map[string]bool) []provider.VM {
	named := map[string]bool{}
	keys := map[string]bool{}
	ids := map[string]bool{}
	for _, s := range sandboxes {
		ids[s.ID] = true
		if s.VMID != "" {
			named[provider.VMKey(s.VMID)] = true
		}
		if s.Key != "" {
			keys[s.Key] = true
		}
	}
	for _, r := range records {
		for _, id := range []string{r.VMID, r.ReplacesVMID} {
			if id != "" {
				named[provider.VMKey(id)] = true
			}
		}
	}
	var out, plain []provider.VM
	for _, vm := range vms {
		o := vm.Owner()
		if !o.Managed || o.PodUID == "" || vm.State.Gone() || named[provider.VMKey(vm.ID)] || (o.Key != "" && keys[o.Key]) {
			continue
		}
		if sb := vm.Tags[TagSandbox]; sb != "" {
			if !ids[sb] {
				out = append(out, vm)
			}
			continue
		}
		plain = append(plain, vm)
	}
	return append(out, reconcile.Orphans(plain, records, alive)...)
}

// collectOrphans observes the orphans of a listing and deletes those seen
// as orphans for the grace. The records are read after the listing, so a
// VM created meanwhile is named by its record (intent first, I2).
func (m *Manager) collectOrphans(ctx context.Context, vms []provider.VM, rep *Report) error {
	sandboxes, err := m.cfg.Ledger.ListSandboxes()
	if err != nil {
		if errors.Is(err, ledger.ErrCorrupt) {
			// A record that does not decode may own a VM: collect nothing,
			// and let the sandboxes that do decode be served.
			m.cfg.Log.Warn("orphan collection skipped: a sandbox record does not decode", "err", err)
			return nil
		}
		return fmt.Errorf("read sandboxes for the orphan collection: %w", err)
	}
	records, err := m.cfg.Ledger.List(ledger.Filter{})
	if err != nil {
		if errors.Is(err, ledger.ErrCorrupt) {
			m.cfg.Log.Warn("orphan collection skipped: a pod record does not decode", "err", err)
			return nil
		}
		return fmt.Errorf("read pod records for the orphan collection: %w", err)
	}
	alive := map[string]bool{}
	for _, p := range m.cfg.Pods.Pods() {
		if !p.Terminal {
			alive[p.UID] = true
		}
	}
	orphans := Orphans(vms, sandboxes, records, alive)
	m.mu.Lock()
	ready := m.orphans.Observe(orphans, m.cfg.Now())
	m.mu.Unlock()
	for _, vm := range ready {
		if err := m.take(ctx, m.cfg.Writes); err != nil {
			return err
		}
		callCtx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
		err := m.cfg.Provider.Delete(callCtx, vm.ID)
		cancel()
		rep.CloudWrites++
		if err != nil {
			m.cfg.Log.Warn("orphan delete failed", "vm", vm.ID, "err", err)
			continue
		}
		m.mu.Lock()
		m.orphans.Forget(vm.ID)
		m.mu.Unlock()
		rep.OrphansDeleted++
		o := vm.Owner()
		m.cfg.Log.Info("orphan VM deleted", "vm", vm.ID, "pod", o.Pod, "podUID", o.PodUID, "sandbox", vm.Tags[TagSandbox])
	}
	m.mu.Lock()
	rep.Orphans = m.orphans.Pending()
	m.mu.Unlock()
	return nil
}

// syncRecords keeps the pod records of the informer mode on a node switched
// to the remote hypervisor mode: their VMs are adopted as they are (no
// cloud write, never recreated: only StartVM makes VMs here) while their
// pods live, and deleted by the informer mode's own rule once the synced
// pod cache shows a pod gone or terminal (a Deleting record is finished).
func (m *Manager) syncRecords(ctx context.Context, vms []provider.VM, synced bool, rep *Report) error {
	records, err := m.cfg.Ledger.List(ledger.Filter{})
	if err != nil && !errors.Is(err, ledger.ErrCorrupt) {
		return fmt.Errorf("read pod records: %w", err)
	}
	if len(records) == 0 {
		return nil
	}
	byID := map[string]*provider.VM{}
	byKey := map[string]*provider.VM{}
	for i := range vms {
		byID[provider.VMKey(vms[i].ID)] = &vms[i]
		if k := vms[i].Owner().Key; k != "" && !vms[i].State.Gone() {
			byKey[k] = &vms[i]
		}
	}
	now := m.cfg.Now()
	for i := range records {
		r := &records[i]
		pod := m.cfg.Pods.Pod(r.PodUID)
		if pod != nil && !pod.Terminal && r.Phase != ledger.PhaseDeleting {
			rep.Records++
			continue // adopted as it is, while its pod lives
		}
		in := reconcile.Input{Pod: pod, Record: r, CacheSynced: synced, Now: now}
		if r.VMID != "" {
			in.VM = byID[provider.VMKey(r.VMID)]
		} else if r.Key != "" {
			in.VM = byKey[r.Key]
		}
		a := reconcile.Decide(in, reconcile.Config{Provider: m.cfg.Provider.Name(), ConfirmMissing: m.cfg.ConfirmMissing})
		if a.Kind != reconcile.KindDelete && a.Kind != reconcile.KindForget {
			rep.Records++
			continue // an unsynced cache, a record of another cloud: kept
		}
		res, err := m.exec.Apply(ctx, in, a)
		rep.CloudWrites += res.CloudWrites
		if err != nil {
			if errors.Is(err, reconcile.ErrStopping) {
				return ErrStopping
			}
			m.cfg.Log.Warn("deleting the VM of an informer-mode record failed; trying again at the next sync", "pod", r.PodRef(), "podUID", r.PodUID, "vm", r.VMID, "err", err)
			rep.Records++
			continue
		}
		rep.RecordsRetired++
	}
	return nil
}

// orphanGrace is the default grace of an orphan (the informer mode's).
const orphanGrace = 5 * time.Minute

// ReasonRebuilt is the reason of a sandbox record rebuilt from its VM's tags.
const ReasonRebuilt = "RebuiltFromCloud"

// Rebuilt is the record `caa ledger rebuild` writes for a VM tagged with a
// sandbox id whose pod lives: phase Lost, since the tags name the sandbox,
// its pod, VM and key but not its network namespace, tunnel or agent
// socket, so caa cannot serve it again. The record keeps the VM from being
// taken for an orphan until its pod goes or a newer sandbox of the pod
// runs, which retire it. ok is false for a tag that is no sandbox id.
func Rebuilt(vm provider.VM, pod *reconcile.Pod, providerName string) (s ledger.Sandbox, ok bool) {
	id := vm.Tags[TagSandbox]
	if checkID(id) != nil {
		return s, false
	}
	key := vm.Owner().Key
	attempt := 0
	if rest, found := strings.CutPrefix(key, "sb-"+id+"-a"); found {
		attempt, _ = strconv.Atoi(rest)
	}
	return ledger.Sandbox{
		ID: id, PodUID: pod.UID, Namespace: pod.Namespace, Name: pod.Name,
		Provider: providerName, VMID: vm.ID, VMName: vm.Name, Key: key, InstanceType: vm.InstanceType, Image: vm.Image,
		IPs: slices.Clone(vm.IPs), Phase: ledger.SandboxLost, Reason: ReasonRebuilt, Attempt: attempt,
		Message: "rebuilt from the VM's tags: its network namespace, tunnel and agent socket are unknown, so it cannot be served again; " +
			"the VM is kept until the pod goes or a newer sandbox of the pod runs",
	}, true
}
