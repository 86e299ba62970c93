package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

// Reconciler runs passes: for every pod UID known to the pod cache or the
// ledger it assembles an Input from the ledger, one cloud listing and the
// cache, decides, and applies with bounded concurrency. Between passes it
// remembers when each recorded VM was first missing and which orphans it
// has seen, the two facts that need more than one look (invariant I3).
type Reconciler struct {
	Exec   *Executor
	Config Config
	// Concurrency bounds applies in flight (default 8); cloud writes are
	// further metered by Exec.Writes.
	Concurrency int
	// OrphanGrace is how long an orphan must be known before it is deleted
	// (default 5 min).
	OrphanGrace time.Duration
	Now         func() time.Time
	// Progress, when set, is called after each pod is applied, so a long
	// pass still shows the loop alive (the liveness heartbeat).
	Progress func()
	// BootTimeout is how long a VM may stay booting (cloud state Pending)
	// and still hold a pod Pending in the report (default 10 min). Past it
	// the pod no longer blocks readiness: a VM stuck in boot is the cloud's
	// problem to report, and the node's other pods must not wait on it.
	BootTimeout time.Duration

	mu      sync.Mutex
	missing map[string]missingVM // by pod UID
	orphans *OrphanTracker
	booting map[string]bootWatch // by VM id: the VMs seen booting in the last pass
}

// bootWatch is a booting VM: since when, and whether its overrun was logged.
type bootWatch struct {
	since  time.Time
	warned bool
}

// missingVM is a recorded VM the cloud did not show, and since when.
type missingVM struct {
	vmID  string
	since time.Time
}

// PodStatus is one pod in a pass's report.
type PodStatus struct {
	UID     string `json:"uid"`
	Pod     string `json:"pod"`
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// PassResult reports one pass.
type PassResult struct {
	At          time.Time
	Duration    time.Duration
	Actions     map[Kind]int
	CloudWrites int
	// Pending are desired pods without a running VM recorded (booting
	// VMs count as pending, up to BootTimeout); Failed are pods with a
	// terminal failure (bad spec), which never block readiness (I5).
	Pending []PodStatus
	Failed  []PodStatus
	// Records counts the ledger's records by phase after the pass.
	Records map[ledger.Phase]int
	// RequeueAfter is the soonest another pass is wanted (0: at the resync).
	RequeueAfter time.Duration
	// Booting counts the pods held Pending only by a VM still booting.
	Booting        int
	OrphansDeleted int
	// Err is set when the pass could not run or a failure blocks the
	// daemon (errors.Is(Err, ErrDaemon)); pods not reached are Pending.
	Err error
}

// Converged reports whether every desired pod has its VM or a terminal
// failure, and nothing blocks the daemon.
func (p PassResult) Converged() bool { return p.Err == nil && len(p.Pending) == 0 }

// Pass reconciles every pod once. pods is the cache's view of this node's
// peer pods (terminal ones included); synced says whether that view is
// complete. Nothing is deleted from an unsynced view.
func (r *Reconciler) Pass(ctx context.Context, pods []*Pod, synced bool) (out PassResult) {
	now := r.now()
	res := PassResult{At: now, Actions: map[Kind]int{}}
	defer func() { out.Duration = r.now().Sub(now) }()

	records, err := r.Exec.Ledger.List(ledger.Filter{})
	if err != nil && !errors.Is(err, ledger.ErrCorrupt) {
		res.Err = fmt.Errorf("%w: read the ledger: %w", ErrDaemon, err)
		return r.report(res, pods, nil, nil)
	}
	// Undecodable records are left out; their pods' VMs are still found by
	// tag and adopted, never duplicated.
	sel := provider.Selector{Cluster: r.Exec.Cluster, Node: r.Exec.Node}
	vms, err := r.Exec.Provider.List(ctx, sel)
	if err != nil {
		res.Err = fmt.Errorf("list VMs: %w", err)
		if errors.Is(err, provider.ErrAuth) {
			res.Err = fmt.Errorf("%w: %w", ErrDaemon, res.Err)
		}
		res.RequeueAfter = r.Exec.retryBase()
		return r.report(res, pods, records, nil)
	}

	inputs := r.inputs(ctx, pods, records, vms, synced, now)
	final, booting := r.apply(ctx, inputs, &res)

	if synced && res.Err == nil {
		r.collectOrphans(ctx, vms, records, pods, now, &res)
	}
	return r.report(res, pods, final, r.stillBooting(booting, now))
}

// inputs assembles one Input per pod UID, confirming with a direct Get any
// recorded VM the listing did not show (listings lag too).
func (r *Reconciler) inputs(ctx context.Context, pods []*Pod, records []ledger.Record, vms []provider.VM, synced bool, now time.Time) []Input {
	byID := make(map[string]*provider.VM, len(vms))
	byPod := map[string][]*provider.VM{}
	for i := range vms {
		vm := &vms[i]
		byID[vm.ID] = vm
		if uid := vm.Owner().PodUID; uid != "" {
			byPod[uid] = append(byPod[uid], vm)
		}
	}
	recs := make(map[string]*ledger.Record, len(records))
	for i := range records {
		recs[records[i].PodUID] = &records[i]
	}
	podByUID := make(map[string]*Pod, len(pods))
	var uids []string
	for _, p := range pods {
		podByUID[p.UID] = p
		uids = append(uids, p.UID)
	}
	for uid := range recs {
		if podByUID[uid] == nil {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.missing == nil {
		r.missing = map[string]missingVM{}
	}
	out := make([]Input, 0, len(uids))
	for _, uid := range uids {
		in := Input{Pod: podByUID[uid], Record: recs[uid], CacheSynced: synced, Now: now}
		if in.Record != nil && in.Record.VMID != "" {
			in.VM = byID[in.Record.VMID]
			if in.VM == nil {
				in.VM = r.confirm(ctx, in.Record.VMID)
			}
		}
		if in.VM == nil {
			in.VM = pickByTag(byPod[uid], in.Record)
		}
		if in.Record != nil && in.Record.VMID != "" && in.VM == nil {
			if m, ok := r.missing[uid]; !ok || m.vmID != in.Record.VMID {
				r.missing[uid] = missingVM{vmID: in.Record.VMID, since: now}
			}
			in.MissingSince = r.missing[uid].since
		} else {
			delete(r.missing, uid)
		}
		out = append(out, in)
	}
	return out
}

// confirm looks a recorded VM up directly; nil only on a NotFound. Any
// other failure is reported as an Unknown VM, which Decide waits on.
func (r *Reconciler) confirm(ctx context.Context, id string) *provider.VM {
	vm, err := r.Exec.Provider.Get(ctx, id)
	switch {
	case err == nil:
		return &vm
	case errors.Is(err, provider.ErrNotFound):
		return nil
	}
	r.Exec.log().Warn("cannot read recorded VM", "vm", id, "err", err)
	return &provider.VM{ID: id, State: provider.StateUnknown}
}

// pickByTag chooses among the VMs that carry a pod's UID: the live one
// with the record's key, else any live one, else any with the record's key
// (any at all without a record). A dead VM of another attempt says nothing
// about this attempt's VM, which may just not be visible yet.
func pickByTag(vms []*provider.VM, rec *ledger.Record) *provider.VM {
	var alive, anyVM *provider.VM
	for _, vm := range vms {
		if rec != nil && vm.Owner().Key == rec.Key && vm.State.Alive() {
			return vm
		}
		if vm.State.Alive() && alive == nil {
			alive = vm
		}
		if anyVM == nil && (rec == nil || vm.Owner().Key == rec.Key) {
			anyVM = vm
		}
	}
	if alive != nil {
		return alive
	}
	return anyVM
}

// apply decides and applies every input, Concurrency at a time, and
// returns the records as they stand afterwards, and the recorded VMs that
// were still booting, by pod UID.
func (r *Reconciler) apply(ctx context.Context, inputs []Input, res *PassResult) ([]ledger.Record, map[string]provider.VM) {
	limit := r.Concurrency
	if limit <= 0 {
		limit = 8
	}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		final   []ledger.Record
		booting = map[string]provider.VM{}
	)
	sem := make(chan struct{}, limit)
	for _, in := range inputs {
		a := Decide(in, r.Config)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out, err := r.Exec.Apply(ctx, in, a)
			mu.Lock()
			defer mu.Unlock()
			res.Actions[a.Kind]++
			res.CloudWrites += out.CloudWrites
			if out.RequeueAfter > 0 && (res.RequeueAfter == 0 || out.RequeueAfter < res.RequeueAfter) {
				res.RequeueAfter = out.RequeueAfter
			}
			if err != nil {
				if errors.Is(err, ErrDaemon) && res.Err == nil {
					res.Err = err
				}
				r.Exec.log().Warn("apply failed", "pod", podRef(in.Pod), "action", a.Kind, "err", err)
			}
			if out.Record != nil {
				final = append(final, *out.Record)
				if rec := out.Record; rec.Phase == ledger.PhaseRunning && out.VM != nil &&
					out.VM.ID == rec.VMID && out.VM.State == provider.StatePending {
					booting[rec.PodUID] = *out.VM
				}
			}
			if r.Progress != nil {
				r.Progress()
			}
		}()
	}
	wg.Wait()
	return final, booting
}

// collectOrphans deletes the VMs nothing owns once they have been orphans
// for the grace period (seen in two listings that far apart).
func (r *Reconciler) collectOrphans(ctx context.Context, vms []provider.VM, records []ledger.Record, pods []*Pod, now time.Time, res *PassResult) {
	desired := map[string]bool{}
	for _, p := range pods {
		if !p.Terminal {
			desired[p.UID] = true
		}
	}
	orphans := Orphans(vms, records, desired)
	r.mu.Lock()
	if r.orphans == nil {
		grace := r.OrphanGrace
		if grace <= 0 {
			grace = 5 * time.Minute
		}
		r.orphans = NewOrphanTracker(grace)
	}
	ready := r.orphans.Observe(orphans, now)
	r.mu.Unlock()
	for _, vm := range ready {
		if err := r.Exec.cloudDelete(ctx, vm.ID); err != nil {
			r.Exec.log().Warn("orphan delete failed", "vm", vm.ID, "err", err)
			continue
		}
		r.mu.Lock()
		r.orphans.Forget(vm.ID)
		r.mu.Unlock()
		res.CloudWrites++
		res.OrphansDeleted++
		r.Exec.log().Info("orphan VM deleted", "vm", vm.ID, "pod", vm.Owner().Pod, "podUID", vm.Owner().PodUID)
	}
}

// stillBooting drops from booting the VMs that have booted for longer than
// BootTimeout (since their creation, or since first seen booting when the
// cloud gives no creation time), with one warning each.
func (r *Reconciler) stillBooting(booting map[string]provider.VM, now time.Time) map[string]provider.VM {
	limit := r.BootTimeout
	if limit <= 0 {
		limit = 10 * time.Minute
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := make(map[string]bootWatch, len(booting))
	for uid, vm := range booting {
		w, ok := r.booting[vm.ID]
		if !ok {
			w.since = vm.CreatedAt
			if w.since.IsZero() {
				w.since = now
			}
		}
		if now.Sub(w.since) > limit {
			if !w.warned {
				r.Exec.log().Warn("VM still booting past the boot timeout; it no longer holds back readiness",
					"vm", vm.ID, "podUID", uid, "since", w.since, "bootTimeout", limit)
				w.warned = true
			}
			delete(booting, uid)
		}
		seen[vm.ID] = w
	}
	r.booting = seen
	return booting
}

// report fills Pending and Failed from the records after the pass; a pod
// whose recorded VM is in booting is Pending until the VM runs.
func (r *Reconciler) report(res PassResult, pods []*Pod, records []ledger.Record, booting map[string]provider.VM) PassResult {
	recs := make(map[string]ledger.Record, len(records))
	res.Records = map[ledger.Phase]int{}
	for _, rec := range records {
		recs[rec.PodUID] = rec
		res.Records[rec.Phase]++
	}
	for _, p := range pods {
		if p.Terminal {
			continue
		}
		st := PodStatus{UID: p.UID, Pod: p.Namespace + "/" + p.Name}
		rec, ok := recs[p.UID]
		switch {
		case ok && rec.Phase == ledger.PhaseRunning && rec.VMID != "":
			r.mu.Lock()
			m, missing := r.missing[p.UID]
			r.mu.Unlock()
			if missing && m.vmID == rec.VMID {
				st.Reason, st.Message = ReasonVMMissing, "VM "+rec.VMID+" not found; confirming"
				break
			}
			if vm, ok := booting[p.UID]; ok && vm.ID == rec.VMID {
				st.Reason, st.Message = ReasonVMBooting, "VM "+rec.VMID+" is booting"
				res.Booting++
				break
			}
			continue
		case ok && rec.Phase == ledger.PhaseFailed:
			st.Reason, st.Message = rec.Reason, rec.Message
			res.Failed = append(res.Failed, st)
			continue
		case ok:
			st.Reason, st.Message = string(rec.Phase), rec.Message
		default:
			st.Reason = "NoRecord"
		}
		res.Pending = append(res.Pending, st)
	}
	byPod := func(a, b PodStatus) int { return strings.Compare(a.Pod, b.Pod) }
	slices.SortFunc(res.Pending, byPod)
	slices.SortFunc(res.Failed, byPod)
	return res
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now().UTC()
	}
	return time.Now().UTC()
}
