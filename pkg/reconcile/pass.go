package reconcile

import (
	"context"
	"errors"
	"fmt"
	"maps"
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

	// BootCheck is how long after a create between full passes the VM is
	// read once to see it run (default 30s).
	BootCheck time.Duration

	// work orders full passes against per-pod work: a pass holds it
	// exclusively, ReconcilePod shared, so both never act on one pod.
	work    sync.RWMutex
	mu      sync.Mutex
	missing map[string]missingVM // by pod UID
	orphans *OrphanTracker
	booting map[string]bootWatch  // by VM id: the VMs seen booting in the last pass
	retries map[string]retryState // by pod UID: cloud failures in a row
	noticed map[string]bool       // by pod UID: records of unwatched pods already reported
	// degraded are the degraded VMs already reported, by pod UID.
	degraded map[string]string
	// bootChecks are the pods whose next look is the one read after a create.
	bootChecks map[string]bool
	// audits is the optional cluster view for audits (auditsource.go).
	audits auditHook
	// prefetch is a listing taken before the ledger was opened, for the
	// next pass (prefetch.go).
	prefetch *Prefetch
}

// retryState is a pod's streak of failed cloud calls: how many, for which
// kind of action, and not before when to try that action again.
type retryState struct {
	n     int
	kind  Kind
	until time.Time
	err   string
	node  bool // the cloud refused the node's configuration
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
	// VMs are the records with a VM after the pass, each with the TEE it
	// was asked to be (or, adopted, was reported to be).
	VMs []RecordedVM
	// RequeueAfter is the soonest another pass is wanted (0: at the resync).
	RequeueAfter time.Duration
	// Booting counts the pods held Pending only by a VM still booting.
	Booting        int
	OrphansDeleted int
	// NotWatched are records whose pod exists with a runtime class caa no
	// longer watches: kept, never deleted for that, and reported.
	NotWatched []PodStatus
	// Orphans are the orphan VMs waiting out their grace period.
	Orphans []PendingOrphan
	// Degraded are desired pods whose VM runs while the cloud reports it
	// degraded (provider.VM.Degraded): kept, never replaced, reported.
	Degraded []PodStatus
	// Requeue asks for another look at these pods (by UID) after the given
	// time: a VM missing but not yet confirmed, a backoff, a VM in flight.
	Requeue map[string]time.Duration
	// Err is set when the pass could not run or a failure blocks the
	// daemon (errors.Is(Err, ErrDaemon)); pods not reached are Pending.
	Err error
}

// Converged reports whether every desired pod has its VM or a terminal
// failure, and nothing blocks the daemon.
func (p PassResult) Converged() bool { return p.Err == nil && len(p.Pending) == 0 }

// Pass reconciles every pod once. pods is the cache's view of ALL this
// node's pods (terminal ones, and those of other runtime classes, marked
// NotPeer); synced says whether that view is complete. Nothing is deleted
// from an unsynced view, and nothing for a pod that still exists and is
// not terminal. Once Exec.Stop is done, no new cloud or ledger work starts.
func (r *Reconciler) Pass(ctx context.Context, pods []*Pod, synced bool) (out PassResult) {
	now := r.now()
	res := PassResult{At: now, Actions: map[Kind]int{}}
	defer func() { out.Duration = r.now().Sub(now) }()
	r.work.Lock()
	defer r.work.Unlock()
	if r.Exec.stopping() {
		res.Err = ErrStopping
		return r.report(res, pods, nil, nil, nil)
	}

	records, err := r.Exec.Ledger.List(ledger.Filter{})
	if err != nil && !errors.Is(err, ledger.ErrCorrupt) {
		res.Err = fmt.Errorf("%w: read the ledger: %w", ErrDaemon, err)
		return r.report(res, pods, nil, nil, nil)
	}
	// Undecodable records are left out; their pods' VMs are still found by
	// tag and adopted, never duplicated.
	sel := provider.Selector{Cluster: r.Exec.Cluster, Node: r.Exec.Node}
	vms, vouched, have := r.viewVMs(ctx, sel, records)
	err = nil // a corrupt record was tolerated above
	// A listing handed over from before the ledger opened serves once
	// (prefetch.go); a cluster view that served instead drops it.
	if pf := r.takePrefetch(); !have && pf != nil {
		vms, have = pf.Wait(ctx, sel)
		r.Exec.log().Debug("the listing taken before the ledger opened", "used", have, "age", time.Since(pf.Started()))
	}
	if !have {
		if err := r.Exec.read(ctx); err != nil {
			res.Err = err
			return r.report(res, pods, records, nil, nil)
		}
		lctx, cancel := r.Exec.call(ctx)
		vms, err = r.Exec.Provider.List(lctx, sel)
		cancel()
	}
	if err != nil {
		res.Err = fmt.Errorf("list VMs: %w", err)
		if errors.Is(err, provider.ErrAuth) {
			res.Err = fmt.Errorf("%w: %w", ErrDaemon, res.Err)
		}
		res.RequeueAfter = r.Exec.retryBase()
		return r.report(res, pods, records, nil, nil)
	}

	inputs := r.inputs(ctx, pods, records, vms, synced, now)
	final, booting, waiting := r.apply(ctx, inputs, vouched, &res)

	if synced && res.Err == nil && !r.Exec.stopping() {
		r.collectOrphans(ctx, vms, records, pods, now, &res)
	}
	return r.report(res, pods, final, r.stillBooting(booting, now), waiting)
}

// inputs assembles one Input per pod UID that is a watched pod or has a
// record, confirming with a direct Get any recorded VM the listing did not
// show (listings lag too).
func (r *Reconciler) inputs(ctx context.Context, pods []*Pod, records []ledger.Record, vms []provider.VM, synced bool, now time.Time) []Input {
	byID := make(map[string]*provider.VM, len(vms))
	byPod := map[string][]*provider.VM{}
	for i := range vms {
		vm := &vms[i]
		byID[provider.VMKey(vm.ID)] = vm
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
		if !p.NotPeer || recs[p.UID] != nil {
			uids = append(uids, p.UID)
		}
	}
	for uid := range recs {
		if podByUID[uid] == nil {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)

	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Input, 0, len(uids))
	for _, uid := range uids {
		in := Input{Pod: podByUID[uid], Record: recs[uid], CacheSynced: synced, Now: now, Retries: r.retries[uid].n}
		if in.Record != nil && in.Record.VMID != "" && !foreign(in.Record, r.Config) {
			in.VM = byID[provider.VMKey(in.Record.VMID)]
			if in.VM == nil && r.Exec.read(ctx) == nil {
				in.VM = r.confirm(ctx, in.Record.VMID)
			}
		}
		if in.VM == nil {
			in.VM = pickByTag(byPod[uid], in.Record)
		}
		for _, vm := range byPod[uid] {
			in.HighestAttempt = max(in.HighestAttempt, AttemptOf(vm.Owner().Key))
			if (in.VM == nil || vm.ID != in.VM.ID) && !isGone(vm.State) {
				in.Siblings = append(in.Siblings, vm)
			}
		}
		if in.Record != nil && in.Record.VMID != "" {
			in.MissingSince = r.seenMissing(uid, in.Record.VMID, in.VM == nil, now)
		} else {
			delete(r.missing, uid)
		}
		out = append(out, in)
	}
	// Forget what belongs to pods and records no longer known, so a
	// churning node's memory stays bounded.
	known := make(map[string]bool, len(uids))
	for _, uid := range uids {
		known[uid] = true
	}
	maps.DeleteFunc(r.missing, func(uid string, _ missingVM) bool { return !known[uid] })
	maps.DeleteFunc(r.retries, func(uid string, _ retryState) bool { return !known[uid] })
	maps.DeleteFunc(r.noticed, func(uid string, _ bool) bool { return !known[uid] })
	maps.DeleteFunc(r.degraded, func(uid string, _ string) bool { return !known[uid] })
	maps.DeleteFunc(r.bootChecks, func(uid string, _ bool) bool { return !known[uid] })
	return out
}

// seenMissing records whether a pod's recorded VM was missing from the
// cloud at now and returns since when it has been (zero when it was found),
// so a recreate waits for a NotFound that lasted ConfirmMissing. The caller
// holds mu.
func (r *Reconciler) seenMissing(uid, vmID string, missing bool, now time.Time) time.Time {
	if !missing {
		delete(r.missing, uid)
		return time.Time{}
	}
	if r.missing == nil {
		r.missing = map[string]missingVM{}
	}
	if m, ok := r.missing[uid]; !ok || !provider.SameVM(m.vmID, vmID) {
		r.missing[uid] = missingVM{vmID: vmID, since: now}
	}
	return r.missing[uid].since
}

// confirm looks a recorded VM up directly; nil only on a NotFound. Any
// other failure is reported as an Unknown VM, which Decide waits on.
func (r *Reconciler) confirm(ctx context.Context, id string) *provider.VM {
	gctx, cancel := r.Exec.call(ctx)
	defer cancel()
	vm, err := r.Exec.Provider.Get(gctx, id)
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
// returns the records as they stand afterwards, the recorded VMs that were
// still booting, and the pods left waiting (with why), by pod UID. A pod
// whose last cloud call failed waits out its backoff before the same kind
// of action is tried again; once stop is done, nothing more starts.
func (r *Reconciler) apply(ctx context.Context, inputs []Input, vouched map[string]bool, res *PassResult) ([]ledger.Record, map[string]provider.VM, map[string]PodStatus) {
	limit := r.Concurrency
	if limit <= 0 {
		limit = 8
	}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		final   []ledger.Record
		booting = map[string]provider.VM{}
		waiting = map[string]PodStatus{}
	)
	note := func(in Input, a Action) {
		if in.Pod == nil || in.Pod.Terminal {
			return
		}
		st := PodStatus{UID: in.Pod.UID, Pod: podRef(in.Pod), Reason: a.Reason, Message: a.Message}
		if vm := in.VM; vm != nil && vm.Degraded != "" && vm.State.Alive() {
			r.noteDegraded(in, res)
		}
		switch {
		case a.Reason == ReasonNotPeer:
			res.NotWatched = append(res.NotWatched, st)
			r.mu.Lock()
			if r.noticed == nil {
				r.noticed = map[string]bool{}
			}
			first := !r.noticed[in.Pod.UID]
			r.noticed[in.Pod.UID] = true
			r.mu.Unlock()
			if first {
				r.Exec.log().Warn("a recorded pod's runtime class is not watched; its VM is kept", "pod", st.Pod, "uid", st.UID,
					"runtimeClass", in.Pod.RuntimeClass)
				r.Exec.event(in.Pod, true, EventNotWatched, a.Message)
			}
		case a.Kind == KindWait && a.Reason != ReasonVMMissing:
			waiting[in.Pod.UID] = st
		case a.Reason == ReasonOtherProvider:
			// A wrong --provider: the node is not whole, and readiness says so.
			waiting[in.Pod.UID] = st
		}
	}
	sem := make(chan struct{}, limit)
	cfg := r.config()
	for _, in := range inputs {
		a := Decide(in, cfg)
		// A VM only the cluster view vouched for is read before anything
		// is done about it (auditsource.go).
		in, a = r.verified(ctx, in, a, vouched, cfg)
		// res is shared with the workers started below: every write to
		// it, here too, holds mu.
		if held, wait := r.heldBack(in, a); held != nil {
			mu.Lock()
			res.Actions[KindWait]++
			if res.RequeueAfter == 0 || wait < res.RequeueAfter {
				res.RequeueAfter = wait
			}
			if res.Requeue == nil {
				res.Requeue = map[string]time.Duration{}
			}
			res.Requeue[podUID(in)] = wait
			note(in, *held)
			mu.Unlock()
			continue
		}
		mu.Lock()
		note(in, a)
		mu.Unlock()
		if a.Kind != KindNone && r.Exec.stopping() {
			break // no new work after stop (invariant I4)
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out, err := r.Exec.Apply(ctx, in, a)
			r.track(in, a, out)
			mu.Lock()
			defer mu.Unlock()
			res.Actions[a.Kind]++
			res.CloudWrites += out.CloudWrites
			if out.RequeueAfter > 0 && (res.RequeueAfter == 0 || out.RequeueAfter < res.RequeueAfter) {
				res.RequeueAfter = out.RequeueAfter
			}
			if wait := max(out.RequeueAfter, a.RequeueAfter); wait > 0 {
				if res.Requeue == nil {
					res.Requeue = map[string]time.Duration{}
				}
				res.Requeue[podUID(in)] = wait
			}
			if err != nil && !errors.Is(err, ErrStopping) {
				if errors.Is(err, ErrDaemon) && res.Err == nil {
					res.Err = err
				}
				r.Exec.log().Warn("apply failed", "pod", podRef(in.Pod), "action", a.Kind, "err", err)
			}
			if out.Record != nil {
				final = append(final, *out.Record)
				if rec := out.Record; rec.Phase == ledger.PhaseRunning && out.VM != nil &&
					provider.SameVM(out.VM.ID, rec.VMID) && out.VM.State == provider.StatePending {
					booting[rec.PodUID] = *out.VM
				}
			}
			if r.Progress != nil {
				r.Progress()
			}
		}()
	}
	wg.Wait()
	return final, booting, waiting
}

// noteDegraded reports a pod whose VM runs degraded: in the pass's result
// every time, and with a warning event and a log line once per VM.
func (r *Reconciler) noteDegraded(in Input, res *PassResult) {
	vm := in.VM
	res.Degraded = append(res.Degraded, PodStatus{UID: in.Pod.UID, Pod: podRef(in.Pod), Reason: ReasonVMDegraded,
		Message: fmt.Sprintf("VM %s: %s", vm.ID, vm.Degraded)})
	r.mu.Lock()
	if r.degraded == nil {
		r.degraded = map[string]string{}
	}
	first := !provider.SameVM(r.degraded[in.Pod.UID], vm.ID)
	r.degraded[in.Pod.UID] = vm.ID
	r.mu.Unlock()
	if first {
		r.Exec.log().Warn("a pod's VM runs degraded; it is kept", "pod", podRef(in.Pod), "vm", vm.ID, "why", vm.Degraded)
		r.Exec.event(in.Pod, true, EventVMDegraded, fmt.Sprintf("VM %s: %s", vm.ID, vm.Degraded))
	}
}

// heldBack returns a wait in place of a when the pod's last try of the same
// kind of action failed and its backoff has not run out.
func (r *Reconciler) heldBack(in Input, a Action) (*Action, time.Duration) {
	uid := podUID(in)
	r.mu.Lock()
	st, ok := r.retries[uid]
	r.mu.Unlock()
	if !ok || st.kind != a.Kind || !in.Now.Before(st.until) {
		return nil, 0
	}
	wait := st.until.Sub(in.Now)
	if st.node {
		return &Action{Kind: KindWait, Reason: ReasonNodeRefused, RequeueAfter: wait,
			Message: fmt.Sprintf("the cloud refused the node's configuration %d times in a row, next try in %s: %s",
				st.n, wait.Round(time.Second), st.err)}, wait
	}
	return &Action{Kind: KindWait, Reason: ReasonBackoff, RequeueAfter: wait,
		Message: fmt.Sprintf("%d failed cloud calls in a row, next try in %s: %s", st.n, wait.Round(time.Second), st.err)}, wait
}

// track counts a pod's cloud failures in a row, and clears the count once
// an action gets through.
func (r *Reconciler) track(in Input, a Action, out Result) {
	uid := podUID(in)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case out.CloudErr != nil:
		if r.retries == nil {
			r.retries = map[string]retryState{}
		}
		st := r.retries[uid]
		st.n++
		st.kind, st.err, st.node = a.Kind, out.CloudErr.Error(), out.NodeRefused
		st.until = in.Now.Add(out.RequeueAfter)
		r.retries[uid] = st
	case a.Kind != KindWait && a.Kind != KindNone:
		delete(r.retries, uid)
	}
}

func podUID(in Input) string {
	if in.Pod != nil {
		return in.Pod.UID
	}
	if in.Record != nil {
		return in.Record.PodUID
	}
	return ""
}

// collectOrphans deletes the VMs nothing owns once they have been orphans
// for the grace period (seen in two listings that far apart).
func (r *Reconciler) collectOrphans(ctx context.Context, vms []provider.VM, records []ledger.Record, pods []*Pod, now time.Time, res *PassResult) {
	// Every pod that exists and is not terminal keeps its VM, whatever its
	// runtime class: configuration never makes an orphan (invariant I3).
	alive := map[string]bool{}
	for _, p := range pods {
		if !p.Terminal {
			alive[p.UID] = true
		}
	}
	// A record of another cloud says nothing about this cloud's VMs: its
	// pod counts as alive, so no VM of it here is taken for superseded.
	own := records[:0:0]
	for _, rec := range records {
		if foreign(&rec, r.Config) {
			alive[rec.PodUID] = true
			continue
		}
		own = append(own, rec)
	}
	orphans := Orphans(vms, own, alive)
	if lf, ok := r.Exec.Provider.(provider.LeftoverFinder); ok {
		// What a create made apart from its VM and outlived it: collected
		// by the same rule.
		orphans = append(orphans, lf.Leftovers(provider.Selector{Cluster: r.Exec.Cluster, Node: r.Exec.Node})...)
	}
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
		if r.Exec.stopping() {
			break
		}
		if err := r.Exec.cloudDelete(ctx, vm.ID); err != nil {
			if errors.Is(err, ErrStopping) {
				break
			}
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
	r.mu.Lock()
	res.Orphans = r.orphans.Pending()
	r.mu.Unlock()
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

// RecordedVM is a VM the ledger records, with its TEE, for /status.
type RecordedVM struct {
	Pod, ID string
	TEE     provider.TEE
}

// report fills Pending and Failed from the records after the pass; a pod
// whose recorded VM is in booting is Pending until the VM runs.
func (r *Reconciler) report(res PassResult, pods []*Pod, records []ledger.Record, booting map[string]provider.VM, waiting map[string]PodStatus) PassResult {
	recs := make(map[string]ledger.Record, len(records))
	res.Records = map[ledger.Phase]int{}
	res.VMs = []RecordedVM{}
	for _, rec := range records {
		recs[rec.PodUID] = rec
		res.Records[rec.Phase]++
		if rec.VMID != "" {
			res.VMs = append(res.VMs, RecordedVM{Pod: rec.PodRef(), ID: rec.VMID, TEE: provider.TEE(rec.Confidential)})
		}
	}
	for _, p := range pods {
		if p.Terminal || p.NotPeer {
			continue
		}
		st := PodStatus{UID: p.UID, Pod: p.Namespace + "/" + p.Name}
		rec, ok := recs[p.UID]
		if w, held := waiting[p.UID]; held && (!ok || rec.Phase != ledger.PhaseFailed) {
			res.Pending = append(res.Pending, w)
			continue
		}
		switch {
		case ok && rec.Phase == ledger.PhaseRunning && rec.VMID != "":
			r.mu.Lock()
			m, missing := r.missing[p.UID]
			r.mu.Unlock()
			if missing && provider.SameVM(m.vmID, rec.VMID) {
				st.Reason, st.Message = ReasonVMMissing, "VM "+rec.VMID+" not found; confirming"
				break
			}
			if vm, ok := booting[p.UID]; ok && provider.SameVM(vm.ID, rec.VMID) {
				st.Reason, st.Message = ReasonVMBooting, "VM "+rec.VMID+" is booting"
				res.Booting++
				break
			}
			continue
		case ok && rec.Phase == ledger.PhaseFailed:
			st.Reason, st.Message = rec.Reason, rec.Message
			res.Failed = append(res.Failed, st)
			continue
		case ok && rec.Reason == ReasonNodeRefused:
			st.Reason, st.Message = rec.Reason, rec.Message
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
	slices.SortFunc(res.NotWatched, byPod)
	return res
}

// config is Config with the provider's node configuration filled in.
func (r *Reconciler) config() Config {
	cfg := r.Config
	if cfg.NodeConfig == "" {
		cfg.NodeConfig = provider.NodeConfigOf(r.Exec.Provider)
	}
	return cfg
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now().UTC()
	}
	return time.Now().UTC()
}
