package reconcile

import (
	"context"
	"errors"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

// PodResult is what reconciling one pod did.
type PodResult struct {
	Action Action
	// CloudWrites and CloudReads count the calls made for this pod.
	CloudWrites int
	CloudReads  int
	// RequeueAfter, when positive, asks for another look at this pod then.
	RequeueAfter time.Duration
	Err          error
}

// ReconcilePod reconciles one pod between full passes: its ledger record,
// its own VM only (a Get by the recorded id, never a listing), Decide, and
// the executor. A pod change therefore costs only its own VM's calls: a new
// pod its create (and one read, BootCheck later, to see it run); a gone pod
// its delete. What needs a listing (a record whose create may have made a
// VM that no record names yet, an orphan) is left to the next full pass.
// pod is nil when the cache holds no pod of this UID.
func (r *Reconciler) ReconcilePod(ctx context.Context, uid string, pod *Pod, synced bool) (out PodResult) {
	if r.Exec.stopping() {
		return PodResult{Err: ErrStopping}
	}
	r.work.RLock()
	defer r.work.RUnlock()
	now := r.now()
	var rec *ledger.Record
	switch got, err := r.Exec.Ledger.Get(uid); {
	case err == nil:
		rec = &got
	case errors.Is(err, ledger.ErrNotFound):
	default:
		r.Exec.log().Warn("cannot read the pod's record; leaving it to the next full pass", "uid", uid, "err", err)
		return PodResult{Err: err, RequeueAfter: r.Exec.retryBase()}
	}
	if rec == nil && (pod == nil || pod.NotPeer || pod.Terminal) {
		return PodResult{} // nothing of caa's
	}
	if foreign(rec, r.Config) {
		return PodResult{Action: Decide(Input{Pod: pod, Record: rec}, r.Config)}
	}
	wanted := pod != nil && !pod.Terminal && !pod.NotPeer
	if !wanted && rec != nil && rec.Phase == ledger.PhaseCreating && rec.VMID == "" && rec.ReplacesVMID == "" {
		// The create may have made a VM that only its tags name: only a
		// listing can tell, so the full pass decides (never a blind forget).
		return PodResult{}
	}

	r.mu.Lock()
	in := Input{Pod: pod, Record: rec, CacheSynced: synced, Now: now, Retries: r.retries[uid].n}
	_, missing := r.missing[uid]
	bootCheck := r.bootChecks[uid]
	delete(r.bootChecks, uid)
	r.mu.Unlock()
	if wanted && rec != nil && rec.Phase == ledger.PhaseRunning && rec.VMID != "" && rec.ReplacesVMID == "" && !missing && !bootCheck {
		// A change of a pod whose VM is recorded Running (its phase moving
		// to Running, a label) changes nothing caa decides; whether the VM
		// still runs is the audit's question, not worth a read per event.
		return PodResult{Action: Action{Kind: KindNone, Reason: ReasonInSync}}
	}
	if wanted && rec != nil && rec.VMID != "" {
		if err := r.Exec.read(ctx); err != nil {
			return PodResult{Err: err}
		}
		in.VM = r.confirm(ctx, rec.VMID)
		out.CloudReads++
		r.mu.Lock()
		in.MissingSince = r.seenMissing(uid, rec.VMID, in.VM == nil, now)
		r.mu.Unlock()
	}

	a := Decide(in, r.config())
	if held, wait := r.heldBack(in, a); held != nil {
		return PodResult{Action: *held, RequeueAfter: wait, CloudReads: out.CloudReads}
	}
	out.Action = a
	if a.Kind == KindNone {
		r.forgetIfDone(uid, pod, rec)
		return out
	}
	res, err := r.Exec.Apply(ctx, in, a)
	r.track(in, a, res)
	out.CloudWrites, out.RequeueAfter, out.Err = res.CloudWrites, res.RequeueAfter, err
	if err != nil && !errors.Is(err, ErrStopping) {
		r.Exec.log().Warn("apply failed", "pod", podRef(pod), "uid", uid, "action", a.Kind, "err", err)
		if out.RequeueAfter == 0 {
			out.RequeueAfter = jitter(r.Exec.retryBase())
		}
	}
	if a.Kind == KindCreate && err == nil && res.VM != nil && res.VM.State == provider.StatePending && out.RequeueAfter == 0 {
		// One look once it should have booted: a VM that failed in boot is
		// replaced now rather than at the next audit.
		out.RequeueAfter = r.bootCheck()
		r.mu.Lock()
		if r.bootChecks == nil {
			r.bootChecks = map[string]bool{}
		}
		r.bootChecks[uid] = true
		r.mu.Unlock()
	}
	if res.Record == nil {
		r.forgetIfDone(uid, pod, nil)
	}
	return out
}

// PodStanding is where one pod stands for the node's readiness lists.
type PodStanding int

// Standings.
const (
	StandingDone    PodStanding = iota // its VM is recorded running, or it needs none
	StandingPending                    // desired, without a running VM yet
	StandingFailed                     // a terminal per-pod failure
)

// Standing reads, from the ledger and caa's memory alone (no cloud call),
// where a pod stands, as a full pass's report would put it.
func (r *Reconciler) Standing(uid string, pod *Pod) (PodStatus, PodStanding) {
	st := PodStatus{UID: uid}
	if pod == nil || pod.Terminal || pod.NotPeer {
		return st, StandingDone
	}
	st.Pod = pod.Namespace + "/" + pod.Name
	rec, err := r.Exec.Ledger.Get(uid)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		st.Reason = "NoRecord"
		return st, StandingPending
	case err != nil:
		st.Reason, st.Message = "LedgerUnreadable", err.Error()
		return st, StandingPending
	case rec.Phase == ledger.PhaseFailed:
		st.Reason, st.Message = rec.Reason, rec.Message
		return st, StandingFailed
	case rec.Phase == ledger.PhaseRunning && rec.VMID != "":
		r.mu.Lock()
		m, missing := r.missing[uid]
		r.mu.Unlock()
		if missing && m.vmID == rec.VMID {
			st.Reason, st.Message = ReasonVMMissing, "VM "+rec.VMID+" not found; confirming"
			return st, StandingPending
		}
		return st, StandingDone
	}
	st.Reason, st.Message = string(rec.Phase), rec.Message
	if rec.Reason == ReasonNodeRefused {
		st.Reason = rec.Reason
	}
	return st, StandingPending
}

// forgetIfDone drops the per-pod memory of a pod that has neither a pod
// nor a record any more.
func (r *Reconciler) forgetIfDone(uid string, pod *Pod, rec *ledger.Record) {
	if pod != nil || rec != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.missing, uid)
	delete(r.retries, uid)
	delete(r.noticed, uid)
	delete(r.bootChecks, uid)
}

func (r *Reconciler) bootCheck() time.Duration {
	if r.BootCheck > 0 {
		return r.BootCheck
	}
	return 30 * time.Second
}

// Stale lists, from the pod cache and the ledger alone (no cloud call),
// the pods whose state asks for work: a watched pod without a record, a
// record still Creating or Deleting or still naming a VM it replaces, a
// record whose pod is gone or terminal. The periodic resync enqueues them,
// so an event lost to a crash or a full queue is caught up cheaply.
func (r *Reconciler) Stale(pods []*Pod) ([]string, error) {
	records, err := r.Exec.Ledger.List(ledger.Filter{})
	if err != nil && !errors.Is(err, ledger.ErrCorrupt) {
		return nil, err
	}
	byUID := make(map[string]*Pod, len(pods))
	for _, p := range pods {
		byUID[p.UID] = p
	}
	seen := map[string]bool{}
	var out []string
	add := func(uid string) {
		if !seen[uid] {
			seen[uid] = true
			out = append(out, uid)
		}
	}
	for _, rec := range records {
		p := byUID[rec.PodUID]
		switch {
		case p == nil || p.Terminal:
			add(rec.PodUID)
		case rec.Phase == ledger.PhaseCreating || rec.Phase == ledger.PhaseDeleting || rec.ReplacesVMID != "":
			add(rec.PodUID)
		}
		delete(byUID, rec.PodUID)
	}
	for uid, p := range byUID {
		if !p.NotPeer && !p.Terminal {
			add(uid)
		}
	}
	return out, nil
}
