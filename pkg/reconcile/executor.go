package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

// EventSink receives the events caa raises on pods (Kubernetes Events in
// the daemon). Messages never hold user data or credentials (I7).
type EventSink interface {
	Event(pod *Pod, warning bool, reason, message string)
}

// Event reasons raised on pods.
const (
	EventVMCreated    = "VMCreated"
	EventVMRecreated  = "VMRecreated"
	EventVMAdopted    = "VMAdopted"
	EventVMDeleted    = "VMDeleted"
	EventCreateFailed = "VMCreateFailed"
	EventDeleteFailed = "VMDeleteFailed"
	EventNotWatched   = "RuntimeClassNotWatched"
	EventVMDegraded   = "VMDegraded"
	// EventSmallerThanAsked: the pod asked for more vCPUs or memory than
	// the type it got offers (no --instance-types list to fit it to).
	EventSmallerThanAsked = "VMSmallerThanRequested"
)

// Executor applies actions: the ledger's intent first (durable when Put
// returns), then the cloud call, then the outcome in the ledger.
type Executor struct {
	Ledger   *ledger.Ledger
	Provider provider.Provider
	Events   EventSink
	// Writes meters cloud creates and deletes, Reads listings and Gets
	// (nil: unmetered). A call waits for its token; it does not fail.
	Writes *rate.Limiter
	Reads  *rate.Limiter
	// Cluster and Node go into every VM's tags.
	Cluster, Node string
	// UserData returns the opaque user data for a pod's VM (nil: none).
	UserData func(*Pod) ([]byte, error)
	// RetryBase is the first backoff after a failed cloud call (default
	// 5s); it doubles per failure in a row up to RetryMax (default 5 min),
	// with jitter. Quota and capacity start higher; throttling waits at
	// least the cloud's Retry-After.
	RetryBase time.Duration
	RetryMax  time.Duration
	// CallTimeout bounds every cloud call (default 5 min: an Azure create
	// waits for its whole long-running operation), so no call can hang a
	// pass, the liveness heartbeat or a shutdown.
	CallTimeout time.Duration
	// Stop, when done, means no new work: no ledger intent and no cloud call
	// starts after it (invariant I4). Calls already in flight run on their
	// own context. Nil: never stops.
	Stop context.Context
	Log  *slog.Logger
	Now  func() time.Time

	nodeMu          sync.Mutex
	lastNodeRefusal string // the last node refusal raised on the Node
}

// ErrStopping: the daemon is shutting down (or handing over); the work was
// not started and will be picked up by the next process.
var ErrStopping = errors.New("caa is stopping: no new cloud or ledger work starts")

// stopping reports whether new work is forbidden.
func (e *Executor) stopping() bool { return e.Stop != nil && e.Stop.Err() != nil }

// call bounds one cloud call by CallTimeout.
func (e *Executor) call(ctx context.Context) (context.Context, context.CancelFunc) {
	d := e.CallTimeout
	if d <= 0 {
		d = 5 * time.Minute
	}
	return context.WithTimeout(ctx, d)
}

// ErrDaemon marks failures that no pod can get past (bad credentials,
// a broken ledger): the daemon reports itself unready with the reason.
var ErrDaemon = errors.New("daemon cannot proceed")

// Result is what Apply did.
type Result struct {
	// Record is the pod's record afterwards; nil when it was removed.
	Record *ledger.Record
	// VM is the record's VM as last seen (from the listing, or as the
	// create returned it); nil when unknown.
	VM *provider.VM
	// CloudWrites counts creates and deletes sent to the cloud.
	CloudWrites int
	// RequeueAfter, when positive, asks for another look then.
	RequeueAfter time.Duration
	// CloudErr is the cloud failure this apply ended on, if any: the caller
	// counts failures in a row per pod for its backoff.
	CloudErr error
	// NodeRefused: CloudErr is a refusal of the node's configuration.
	NodeRefused bool
}

// Apply carries out a for the pod described by in.
func (e *Executor) Apply(ctx context.Context, in Input, a Action) (Result, error) {
	res := Result{Record: in.Record, VM: in.VM}
	switch a.Kind {
	case KindNone:
		return res, nil
	}
	if e.stopping() {
		return res, ErrStopping
	}
	switch a.Kind {
	case KindWait:
		res.RequeueAfter = a.RequeueAfter
		return res, nil
	case KindAdopt:
		return e.adopt(ctx, in, a)
	case KindFail:
		return e.fail(in, a.Reason, a.Message)
	case KindCreate:
		return e.create(ctx, in, a)
	case KindDelete:
		return e.delete(ctx, in, a)
	case KindForget:
		if err := e.Ledger.Delete(in.Record.PodUID, in.Record.Revision); err != nil {
			return res, e.ledgerErr("forget the record", in, err)
		}
		return Result{}, nil
	}
	return res, fmt.Errorf("unknown action %q", a.Kind)
}

func (e *Executor) create(ctx context.Context, in Input, a Action) (Result, error) {
	pod := in.Pod
	// The key may have reached the cloud before only if the ledger held
	// it before this call (a Creating record cut short, a key left open).
	maybeSent := in.Record != nil && (in.Record.Key == a.Key || slices.Contains(in.Record.OpenKeys, a.Key))
	r := e.base(in)
	if r.Key != a.Key {
		if r.Key != "" && r.Phase != ledger.PhaseFailed {
			// The earlier attempt's VM may exist yet (a NotFound that
			// lied, a reply lost): the record keeps naming its key until
			// that VM is adopted or deleted.
			r.OpenKeys = openKey(r.OpenKeys, r.Key)
		}
		r.VMID, r.VMName, r.IPs, r.Zone, r.LastSeenAt = "", "", nil, "", time.Time{}
	}
	if a.OldVMID != "" {
		// Kept in the record until the cloud has deleted it, so a
		// replacement whose create keeps failing never strands it.
		r.ReplacesVMID = a.OldVMID
	}
	r.Phase, r.Attempt, r.Key = ledger.PhaseCreating, a.Attempt, a.Key
	r.OpenKeys = slices.DeleteFunc(r.OpenKeys, func(k string) bool { return k == a.Key })
	r.InstanceType, r.Image = a.Selection.InstanceType, a.Selection.Image
	r.Confidential = string(a.TEE)
	r.FailedSpec = ""
	res := Result{Record: in.Record}
	intent, err := e.putIntent(in, r, a.Reason, a.Message)
	if err != nil {
		return res, err
	}
	res.Record = &intent
	if a.Reason == ReasonNotConfidential {
		e.event(pod, true, ReasonNotConfidential, a.Message+"; it never serves the pod: it is deleted and a confidential VM replaces it")
	}

	if a.OldVMID != "" {
		if err := e.cloudDelete(ctx, a.OldVMID); err != nil {
			return e.cloudFailure(res, in, EventDeleteFailed, "delete the dead VM "+a.OldVMID, err)
		}
		res.CloudWrites++
	}
	spec := provider.Spec{
		Key: a.Key, Cluster: e.Cluster, Node: e.Node, PodUID: pod.UID, PodNamespace: pod.Namespace, PodName: pod.Name,
		InstanceType: a.Selection.InstanceType, Image: a.Selection.Image, TEE: a.TEE, MaybeSent: maybeSent,
	}
	if e.UserData != nil {
		var err error
		if spec.UserData, err = e.UserData(pod); err != nil {
			return res, fmt.Errorf("user data for pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	var vm provider.VM
	for skipped := 0; ; skipped++ {
		if err := e.wait(ctx); err != nil {
			return res, err
		}
		cctx, cancel := e.call(ctx)
		vm, err = e.Provider.Create(cctx, spec)
		cancel()
		res.CloudWrites++
		if !errors.Is(err, provider.ErrKeySpent) || skipped == maxKeySkips {
			break
		}
		// The key made a VM that is terminated now (a rebuilt ledger, or
		// a record older than the cloud's memory of its tokens): it can
		// never make another. Take the next attempt's, durably first.
		next := intent
		next.Attempt++
		next.Key = Key(pod.UID, next.Attempt)
		e.log().Info("idempotency key already spent; taking the next attempt's", "pod", podRef(pod), "uid", pod.UID,
			"spent", spec.Key, "next", next.Key)
		if intent, err = e.putIntent(Input{Pod: pod, Record: &intent}, next, ReasonKeySpent,
			fmt.Sprintf("key %s belongs to a terminated VM", spec.Key)); err != nil {
			return res, err
		}
		res.Record = &intent
		spec.Key, a.Attempt, spec.MaybeSent = next.Key, next.Attempt, false
	}
	if err != nil {
		in.Record = &intent
		if nodeCaused(err, a) {
			return e.nodeRefused(res, in, err)
		}
		if errors.Is(err, provider.ErrInvalidSpec) {
			failed, ferr := e.failRecord(in, ReasonCloudRefused, err.Error(), a.Fingerprint)
			failed.CloudWrites = res.CloudWrites
			return failed, ferr
		}
		return e.cloudFailure(res, in, EventCreateFailed, "create", err)
	}
	running := e.record(intent, vm, ledger.PhaseRunning)
	running.Reason, running.Message, running.ReplacesVMID = a.Reason, "", ""
	stored, err := e.Ledger.Put(running)
	if err != nil {
		return res, e.ledgerErr("record the created VM "+vm.ID, in, err)
	}
	res.Record, res.VM = &stored, &vm
	reason := EventVMCreated
	msg := fmt.Sprintf("VM %s (%s, %s, confidential=%s), attempt %d: %s", vm.ID, vm.InstanceType, vm.Zone, confidentialOf(a.TEE), a.Attempt, a.Message)
	if a.Recreate {
		reason = EventVMRecreated
		if a.OldVMID != "" {
			msg += "; replaces VM " + a.OldVMID
		}
	}
	e.event(pod, false, reason, msg)
	if a.Selection.Notice != "" {
		e.event(pod, true, EventSmallerThanAsked, fmt.Sprintf("VM %s: %s", vm.ID, a.Selection.Notice))
	}
	e.log().Info("VM created", "pod", podRef(pod), "uid", pod.UID, "vm", vm.ID, "type", vm.InstanceType,
		"confidential", confidentialOf(a.TEE), "attempt", a.Attempt)
	return res, nil
}

// confidentialOf names a TEE for events and logs, and an ordinary VM as
// the opt-out that asked for it.
func confidentialOf(t provider.TEE) string {
	if !t.Confidential() {
		return "off (--confidential=false)"
	}
	return string(t)
}

// maxKeySkips bounds the spent keys one create skips in a row; more is
// left to the next try, after a backoff.
const maxKeySkips = 8

// ReasonKeySpent: the record moved to the next attempt because the cloud
// called its key spent.
const ReasonKeySpent = "KeySpent"

// maxOpenKeys bounds Record.OpenKeys. A key dropped from it loses only the
// prompt collection of its VM: the orphan rules still collect it.
const maxOpenKeys = 8

// openKey adds key to keys, once, dropping the oldest past maxOpenKeys.
func openKey(keys []string, key string) []string {
	if key == "" || slices.Contains(keys, key) {
		return keys
	}
	keys = append(slices.Clone(keys), key)
	if len(keys) > maxOpenKeys {
		keys = keys[len(keys)-maxOpenKeys:]
	}
	return keys
}

// putIntent writes the create intent r, durably, unless in's record holds
// it already (a retry: rewriting it would only churn the history).
func (e *Executor) putIntent(in Input, r ledger.Record, reason, message string) (ledger.Record, error) {
	if in.Record != nil && sameIntent(*in.Record, r) {
		return *in.Record, nil
	}
	r.Reason, r.Message = reason, message
	// The intent is durable before the cloud hears of the VM (I2).
	stored, err := e.Ledger.Put(r)
	if err != nil {
		return ledger.Record{}, e.ledgerErr("record the create intent", in, err)
	}
	return stored, nil
}

// nodeCaused: the cloud refused the create for the node's configuration,
// not for what the pod chose. A refusal of the type or the image is the
// node's when that is the node's default; one that names neither is the
// pod's only if the pod chose something of its own.
func nodeCaused(err error, a Action) bool {
	switch {
	case errors.Is(err, provider.ErrNodeConfig):
		return true
	case !errors.Is(err, provider.ErrInvalidSpec):
		return false
	}
	switch provider.RefusedPart(err) {
	case provider.RefusedInstanceType:
		return a.DefaultType
	case provider.RefusedImage:
		return a.DefaultImage
	}
	return a.DefaultType && a.DefaultImage
}

// EventNodeRefused is the Node event of a create the cloud refused for the
// node's configuration.
const EventNodeRefused = "CaaNodeConfigRefused"

// NodeEventSink is an EventSink that can also raise events on the Node.
type NodeEventSink interface {
	NodeEvent(node string, warning bool, reason, message string)
}

// nodeRefused handles a create refused for the node's configuration: a
// node condition, never the pod's terminal failure. The intent stays
// (Creating), its reason says why, the pod backs off and is retried, and
// the Node gets an event once per distinct refusal.
func (e *Executor) nodeRefused(res Result, in Input, err error) (Result, error) {
	msg := fmt.Sprintf("the cloud refused the node's configuration (not the pod's spec); fix caa's settings and it is retried: %v", err)
	if rec := in.Record; rec.Reason != ReasonNodeRefused || rec.Message != msg {
		r := *rec
		r.Reason, r.Message = ReasonNodeRefused, msg
		stored, perr := e.Ledger.Put(r)
		if perr != nil {
			return res, e.ledgerErr("record the refusal", in, perr)
		}
		res.Record, in.Record = &stored, &stored
	}
	if ns, ok := e.Events.(NodeEventSink); ok && e.noteNodeRefusal(err) {
		ns.NodeEvent(e.Node, true, EventNodeRefused, msg)
	}
	res.NodeRefused = true
	return e.cloudFailure(res, in, EventCreateFailed, "create", err)
}

// noteNodeRefusal reports whether err is a refusal of the node not yet
// raised on the Node (the last one raised is remembered).
func (e *Executor) noteNodeRefusal(err error) bool {
	key := err.Error()
	var pe *provider.Error
	if errors.As(err, &pe) {
		key = pe.Code + " " + pe.Message
	}
	e.nodeMu.Lock()
	defer e.nodeMu.Unlock()
	if e.lastNodeRefusal == key {
		return false
	}
	e.lastNodeRefusal = key
	return true
}

// sameIntent: a record already holds this create's intent.
func sameIntent(old, next ledger.Record) bool {
	return old.Phase == ledger.PhaseCreating && old.Key == next.Key && old.Attempt == next.Attempt &&
		old.InstanceType == next.InstanceType && old.Image == next.Image && old.ReplacesVMID == next.ReplacesVMID &&
		old.VMID == next.VMID && old.FailedSpec == ""
}

func (e *Executor) adopt(ctx context.Context, in Input, a Action) (Result, error) {
	r := e.base(in)
	if owner := in.VM.Owner(); owner.Key != "" {
		// The record's key is the kept VM's: a VM that carries the key the
		// record had is then another attempt's, and goes (Duplicates), or
		// waits as an open key until it shows.
		if r.Key != owner.Key && r.Key != "" && in.Record != nil && in.Record.Phase != ledger.PhaseFailed {
			r.OpenKeys = openKey(r.OpenKeys, r.Key)
		}
		r.Key = owner.Key
		r.OpenKeys = slices.DeleteFunc(slices.Clone(r.OpenKeys), func(k string) bool { return k == owner.Key })
		r.Attempt = max(r.Attempt, AttemptOf(owner.Key), in.HighestAttempt)
	}
	res := Result{Record: in.Record, VM: in.VM}
	if a.OldVMID != "" {
		// The replacement is live; the dead VM it replaces goes now.
		if err := e.cloudDelete(ctx, a.OldVMID); err != nil {
			return e.cloudFailure(res, in, EventDeleteFailed, "delete the dead VM "+a.OldVMID, err)
		}
		res.CloudWrites++
	}
	r = e.record(r, *in.VM, ledger.PhaseRunning)
	if in.Record == nil {
		// A rebuilt record: the VM is what the cloud reports (Decide
		// adopts no ordinary VM while --confidential is on).
		r.Confidential = string(in.VM.TEE)
	}
	r.Reason, r.Message, r.ReplacesVMID, r.FailedSpec = a.Reason, "", "", ""
	if in.Record == nil || !sameAdoption(*in.Record, r) {
		stored, err := e.Ledger.Put(r)
		if err != nil {
			return res, e.ledgerErr("record the adopted VM "+in.VM.ID, in, err)
		}
		r = stored
		if in.Record == nil || in.Record.Phase != ledger.PhaseRunning {
			e.event(in.Pod, false, EventVMAdopted, fmt.Sprintf("VM %s is %s: %s", in.VM.ID, in.VM.State, a.Message))
		}
	}
	res.Record = &r
	return e.deleteDuplicates(ctx, in, a, res)
}

// sameAdoption: the record already says what adopting would write, so
// only duplicates are left to delete.
func sameAdoption(old, next ledger.Record) bool {
	return old.Phase == ledger.PhaseRunning && old.VMID == next.VMID && old.Key == next.Key &&
		old.Attempt == next.Attempt && slices.Equal(old.OpenKeys, next.OpenKeys) && old.ReplacesVMID == ""
}

// EventDuplicateDeleted is the event of a duplicate VM of the pod deleted.
const EventDuplicateDeleted = "VMDuplicateDeleted"

// deleteDuplicates deletes the VMs of the pod's other attempts beside the
// kept one (invariant I1): the pod's own, so no orphan grace, but each is
// logged and raised on the pod. The record then no longer names their keys.
func (e *Executor) deleteDuplicates(ctx context.Context, in Input, a Action, res Result) (Result, error) {
	if len(a.Duplicates) == 0 {
		return res, nil
	}
	keys := map[string]string{}
	for _, s := range in.Siblings {
		keys[s.ID] = s.Owner().Key
	}
	done := map[string]bool{}
	var failure error
	var failedID string
	for _, id := range a.Duplicates {
		if err := e.cloudDelete(ctx, id); err != nil {
			failure, failedID = err, id
			break
		}
		res.CloudWrites++
		done[keys[id]] = true
		msg := fmt.Sprintf("VM %s (key %s) was another attempt's VM of this pod beside VM %s: deleted", id, keys[id], in.VM.ID)
		e.log().Info("duplicate VM deleted", "pod", podRef(in.Pod), "uid", podUID(in), "vm", id, "key", keys[id], "kept", in.VM.ID)
		e.event(in.Pod, true, EventDuplicateDeleted, msg)
	}
	if len(done) > 0 {
		r := *res.Record
		r.OpenKeys = slices.DeleteFunc(slices.Clone(r.OpenKeys), func(k string) bool { return done[k] })
		if !slices.Equal(r.OpenKeys, res.Record.OpenKeys) {
			stored, err := e.Ledger.Put(r)
			if err != nil {
				return res, e.ledgerErr("record the duplicates deleted", in, err)
			}
			res.Record = &stored
		}
	}
	if failure != nil {
		in.Record = res.Record
		return e.cloudFailure(res, in, EventDeleteFailed, "delete the duplicate VM "+failedID, failure)
	}
	return res, nil
}

func (e *Executor) fail(in Input, reason, message string) (Result, error) {
	return e.failRecord(in, reason, message, "")
}

// failRecord records a terminal failure of the pod's spec; spec, when set,
// fingerprints the selection the cloud refused, so it is not asked again
// until the pod asks for something else.
func (e *Executor) failRecord(in Input, reason, message, spec string) (Result, error) {
	r := e.base(in)
	if r.Phase == ledger.PhaseFailed && r.Reason == reason && r.Message == message && r.FailedSpec == spec {
		return Result{Record: in.Record}, nil
	}
	r.Phase, r.Reason, r.Message, r.FailedSpec = ledger.PhaseFailed, reason, message, spec
	stored, err := e.Ledger.Put(r)
	if err != nil {
		return Result{Record: in.Record}, e.ledgerErr("record the failure", in, err)
	}
	e.event(in.Pod, true, EventCreateFailed, message)
	return Result{Record: &stored}, nil
}

func (e *Executor) delete(ctx context.Context, in Input, a Action) (Result, error) {
	r := *in.Record
	if r.Phase != ledger.PhaseDeleting {
		r.Phase, r.Reason, r.Message = ledger.PhaseDeleting, a.Reason, a.Message
		stored, err := e.Ledger.Put(r)
		if err != nil {
			return Result{Record: in.Record}, e.ledgerErr("record the delete intent", in, err)
		}
		r = stored
	}
	res := Result{Record: &r}
	vmID := r.VMID
	if vmID == "" && in.VM != nil && !isGone(in.VM.State) {
		vmID = in.VM.ID
	}
	for _, id := range []string{r.ReplacesVMID, vmID} {
		if id == "" {
			continue
		}
		if vm := in.VM; vm != nil && provider.SameVM(vm.ID, id) && isGone(vm.State) {
			// The cloud already shows it gone (deleted by the cluster caa,
			// or before a restart): nothing to send (issue 30.12).
			e.log().Info("VM already gone: no delete sent", "pod", r.PodRef(), "uid", r.PodUID, "vm", id, "state", vm.State)
			continue
		}
		if err := e.cloudDelete(ctx, id); err != nil {
			return e.cloudFailure(res, in, EventDeleteFailed, "delete VM "+id, err)
		}
		res.CloudWrites++
	}
	if err := e.Ledger.Delete(r.PodUID, r.Revision); err != nil {
		return res, e.ledgerErr("remove the record", in, err)
	}
	if in.Pod != nil {
		e.event(in.Pod, false, EventVMDeleted, fmt.Sprintf("VM %s deleted: %s", vmID, a.Message))
	}
	e.log().Info("VM deleted", "pod", r.PodRef(), "uid", r.PodUID, "vm", vmID, "reason", a.Reason)
	return Result{CloudWrites: res.CloudWrites}, nil
}

func (e *Executor) cloudDelete(ctx context.Context, id string) error {
	if err := e.wait(ctx); err != nil {
		return err
	}
	cctx, cancel := e.call(ctx)
	defer cancel()
	return e.Provider.Delete(cctx, id)
}

// cloudFailure turns a failed cloud call into a requeue, or into a daemon
// error for bad credentials. The backoff grows per failure in a row
// (in.Retries) and by kind: quota and capacity are not fixed by retrying
// soon. Only the first failure of a streak raises an event on the pod;
// throttling raises none: it is caa's to absorb, not the pod's to see.
func (e *Executor) cloudFailure(res Result, in Input, reason, what string, err error) (Result, error) {
	pod := in.Pod
	if errors.Is(err, ErrStopping) {
		return res, err
	}
	res.CloudErr = err
	res.RequeueAfter = jitter(e.Backoff(err, in.Retries))
	if errors.Is(err, provider.ErrAuth) {
		return res, fmt.Errorf("%w: %s: %w", ErrDaemon, what, err)
	}
	if errors.Is(err, provider.ErrThrottled) {
		e.log().Debug("cloud throttled", "what", what, "pod", podRef(pod), "retryAfter", res.RequeueAfter)
		return res, nil
	}
	e.log().Warn("cloud call failed", "what", what, "pod", podRef(pod), "err", err, "failuresInARow", in.Retries+1, "retryIn", res.RequeueAfter)
	if pod != nil && in.Retries == 0 {
		e.event(pod, true, reason, fmt.Sprintf("%s: %v (retrying with backoff)", what, err))
	}
	return res, nil
}

// Backoff is how long to wait after err, the (retries+1)-th failure in a
// row: exponential from a base that depends on the kind (1s for throttling,
// capped at 30s there), capped at RetryMax, and never less than the
// cloud's Retry-After.
func (e *Executor) Backoff(err error, retries int) time.Duration {
	base := e.retryBase()
	limit := e.RetryMax
	if limit <= 0 {
		limit = 5 * time.Minute
	}
	switch {
	case errors.Is(err, provider.ErrQuota):
		base = max(base, 60*time.Second)
	case errors.Is(err, provider.ErrCapacity), errors.Is(err, provider.ErrNodeConfig), errors.Is(err, provider.ErrInvalidSpec):
		// Nothing changes by itself soon: the operator fixes a node's
		// configuration in minutes, not seconds.
		base = max(base, 30*time.Second)
	case errors.Is(err, provider.ErrThrottled):
		// The cloud says when: follow its Retry-After closely, so its
		// allowance is not left unused; grow only while it keeps refusing.
		base, limit = time.Second, min(limit, 30*time.Second)
	}
	d := base
	for range min(retries, 20) {
		d *= 2
		if d >= limit {
			break
		}
	}
	d = min(d, limit)
	if ra, ok := provider.RetryAfter(err); ok && ra > d {
		d = ra
	}
	return d
}

// base is the record to write for in: the existing one, or a new one for
// the pod.
func (e *Executor) base(in Input) ledger.Record {
	if in.Record != nil {
		return *in.Record
	}
	return ledger.Record{
		PodUID: in.Pod.UID, Namespace: in.Pod.Namespace, Name: in.Pod.Name,
		RuntimeClass: in.Pod.RuntimeClass, Provider: e.Provider.Name(),
	}
}

// record copies what the cloud says of vm into r.
func (e *Executor) record(r ledger.Record, vm provider.VM, phase ledger.Phase) ledger.Record {
	r.Phase, r.Provider = phase, e.Provider.Name()
	r.VMID, r.VMName, r.IPs, r.Zone = vm.ID, vm.Name, vm.IPs, vm.Zone
	if vm.InstanceType != "" {
		r.InstanceType = vm.InstanceType
	}
	if vm.Image != "" {
		r.Image = vm.Image
	}
	r.LastSeenAt = e.now()
	return r
}

// wait takes a token of the write budget; it gives up at stop, and no
// write starts once stop is done.
func (e *Executor) wait(ctx context.Context) error { return e.take(ctx, e.Writes) }

// read takes a token of the read budget, as wait does for writes.
func (e *Executor) read(ctx context.Context) error { return e.take(ctx, e.Reads) }

func (e *Executor) take(ctx context.Context, budget *rate.Limiter) error {
	if e.stopping() {
		return ErrStopping
	}
	if budget != nil {
		wctx := ctx
		if e.Stop != nil {
			var cancel context.CancelFunc
			wctx, cancel = context.WithCancel(ctx)
			defer cancel()
			stop := context.AfterFunc(e.Stop, cancel)
			defer stop()
		}
		if err := budget.Wait(wctx); err != nil {
			if e.stopping() {
				return ErrStopping
			}
			return fmt.Errorf("wait for the cloud call budget: %w", err)
		}
	}
	if e.stopping() {
		return ErrStopping
	}
	return nil
}

// ledgerErr names the pod (namespace/name and UID) and the step. A
// conflict means another writer moved the record on: decide again from
// fresh state. Anything else blocks the daemon.
func (e *Executor) ledgerErr(what string, in Input, err error) error {
	ref := "pod"
	switch {
	case in.Pod != nil:
		ref = fmt.Sprintf("pod %s/%s (%s)", in.Pod.Namespace, in.Pod.Name, in.Pod.UID)
	case in.Record != nil:
		ref = fmt.Sprintf("pod %s (%s)", in.Record.PodRef(), in.Record.PodUID)
	}
	if errors.Is(err, ledger.ErrConflict) || errors.Is(err, ledger.ErrAlreadyExists) {
		return fmt.Errorf("%s for %s: %w", what, ref, err)
	}
	return fmt.Errorf("%w: %s for %s: %w", ErrDaemon, what, ref, err)
}

func (e *Executor) event(pod *Pod, warning bool, reason, msg string) {
	if e.Events != nil && pod != nil {
		e.Events.Event(pod, warning, reason, msg)
	}
}

func (e *Executor) retryBase() time.Duration {
	if e.RetryBase > 0 {
		return e.RetryBase
	}
	return 5 * time.Second
}

func (e *Executor) log() *slog.Logger {
	if e.Log != nil {
		return e.Log
	}
	return slog.New(slog.DiscardHandler)
}

func (e *Executor) now() time.Time {
	if e.Now != nil {
		return e.Now().UTC()
	}
	return time.Now().UTC()
}

// jitter spreads retries over [d, 1.25d) so throttled callers do not return
// in step.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration(rand.Int64N(int64(d)/4+1))
}

func podRef(p *Pod) string {
	if p == nil {
		return ""
	}
	return p.Namespace + "/" + p.Name
}

// AttemptOf reads the attempt back out of a key made by Key; 1 when the key
// has another shape.
func AttemptOf(key string) int {
	i := strings.LastIndex(key, "-a")
	if i < 0 {
		return 1
	}
	n, err := strconv.Atoi(key[i+2:])
	if err != nil || n < 1 {
		return 1
	}
	return n
}
