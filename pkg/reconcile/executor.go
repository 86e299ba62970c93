package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
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
)

// Executor applies actions: the ledger's intent first (durable when Put
// returns), then the cloud call, then the outcome in the ledger.
type Executor struct {
	Ledger   *ledger.Ledger
	Provider provider.Provider
	Events   EventSink
	// Writes meters cloud creates and deletes (nil: unmetered).
	Writes *rate.Limiter
	// Cluster and Node go into every VM's tags.
	Cluster, Node string
	// UserData returns the opaque user data for a pod's VM (nil: none).
	UserData func(*Pod) ([]byte, error)
	// RetryBase is the backoff after a failed cloud call (default 5s),
	// with jitter; throttling waits the cloud's Retry-After instead.
	RetryBase time.Duration
	Log       *slog.Logger
	Now       func() time.Time
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
}

// Apply carries out a for the pod described by in.
func (e *Executor) Apply(ctx context.Context, in Input, a Action) (Result, error) {
	res := Result{Record: in.Record, VM: in.VM}
	switch a.Kind {
	case KindNone:
		return res, nil
	case KindWait:
		res.RequeueAfter = a.RequeueAfter
		return res, nil
	case KindAdopt:
		return e.adopt(in, a)
	case KindFail:
		return e.fail(in, a.Reason, a.Message)
	case KindCreate:
		return e.create(ctx, in, a)
	case KindDelete:
		return e.delete(ctx, in, a)
	case KindForget:
		if err := e.Ledger.Delete(in.Record.PodUID, in.Record.Revision); err != nil {
			return res, e.ledgerErr("forget", in.Record.PodUID, err)
		}
		return Result{}, nil
	}
	return res, fmt.Errorf("unknown action %q", a.Kind)
}

func (e *Executor) create(ctx context.Context, in Input, a Action) (Result, error) {
	pod := in.Pod
	r := e.base(in)
	if r.Key != a.Key {
		r.VMID, r.VMName, r.IPs, r.Zone, r.LastSeenAt = "", "", nil, "", time.Time{}
	}
	r.Phase, r.Attempt, r.Key = ledger.PhaseCreating, a.Attempt, a.Key
	r.InstanceType, r.Image = a.Selection.InstanceType, a.Selection.Image
	r.Reason, r.Message = a.Reason, a.Message
	// The intent is durable before the cloud hears of the VM (I2).
	intent, err := e.Ledger.Put(r)
	if err != nil {
		return Result{Record: in.Record}, e.ledgerErr("record create intent", pod.UID, err)
	}
	res := Result{Record: &intent}

	if a.OldVMID != "" {
		if err := e.cloudDelete(ctx, a.OldVMID); err != nil {
			return e.cloudFailure(res, pod, EventDeleteFailed, "delete the dead VM "+a.OldVMID, err)
		}
		res.CloudWrites++
	}
	spec := provider.Spec{
		Key: a.Key, Cluster: e.Cluster, Node: e.Node, PodUID: pod.UID, PodNamespace: pod.Namespace, PodName: pod.Name,
		InstanceType: a.Selection.InstanceType, Image: a.Selection.Image,
	}
	if e.UserData != nil {
		if spec.UserData, err = e.UserData(pod); err != nil {
			return res, fmt.Errorf("user data for pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	if err := e.wait(ctx); err != nil {
		return res, err
	}
	vm, err := e.Provider.Create(ctx, spec)
	res.CloudWrites++
	if err != nil {
		if errors.Is(err, provider.ErrInvalidSpec) {
			in.Record = &intent
			failed, ferr := e.fail(in, ReasonInvalidSpec, err.Error())
			failed.CloudWrites = res.CloudWrites
			return failed, ferr
		}
		return e.cloudFailure(res, pod, EventCreateFailed, "create", err)
	}
	running := e.record(intent, vm, ledger.PhaseRunning)
	running.Reason, running.Message = a.Reason, ""
	stored, err := e.Ledger.Put(running)
	if err != nil {
		return res, e.ledgerErr("record created VM "+vm.ID, pod.UID, err)
	}
	res.Record, res.VM = &stored, &vm
	reason := EventVMCreated
	if a.Recreate {
		reason = EventVMRecreated
	}
	e.event(pod, false, reason, fmt.Sprintf("VM %s (%s, %s), attempt %d: %s", vm.ID, vm.InstanceType, vm.Zone, a.Attempt, a.Message))
	return res, nil
}

func (e *Executor) adopt(in Input, a Action) (Result, error) {
	r := e.base(in)
	if in.Record == nil {
		owner := in.VM.Owner()
		r.Key, r.Attempt = owner.Key, AttemptOf(owner.Key)
	}
	r = e.record(r, *in.VM, ledger.PhaseRunning)
	r.Reason, r.Message = a.Reason, ""
	stored, err := e.Ledger.Put(r)
	if err != nil {
		return Result{Record: in.Record}, e.ledgerErr("record adopted VM "+in.VM.ID, r.PodUID, err)
	}
	if in.Record == nil || in.Record.Phase != ledger.PhaseRunning {
		e.event(in.Pod, false, EventVMAdopted, fmt.Sprintf("VM %s is %s: %s", in.VM.ID, in.VM.State, a.Message))
	}
	return Result{Record: &stored, VM: in.VM}, nil
}

func (e *Executor) fail(in Input, reason, message string) (Result, error) {
	r := e.base(in)
	if r.Phase == ledger.PhaseFailed && r.Reason == reason && r.Message == message {
		return Result{Record: in.Record}, nil
	}
	r.Phase, r.Reason, r.Message = ledger.PhaseFailed, reason, message
	stored, err := e.Ledger.Put(r)
	if err != nil {
		return Result{Record: in.Record}, e.ledgerErr("record failure", r.PodUID, err)
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
			return Result{Record: in.Record}, e.ledgerErr("record delete intent", r.PodUID, err)
		}
		r = stored
	}
	res := Result{Record: &r}
	vmID := r.VMID
	if vmID == "" && in.VM != nil {
		vmID = in.VM.ID
	}
	if vmID != "" {
		if err := e.cloudDelete(ctx, vmID); err != nil {
			return e.cloudFailure(res, in.Pod, EventDeleteFailed, "delete VM "+vmID, err)
		}
		res.CloudWrites++
	}
	if err := e.Ledger.Delete(r.PodUID, r.Revision); err != nil {
		return res, e.ledgerErr("remove record", r.PodUID, err)
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
	return e.Provider.Delete(ctx, id)
}

// cloudFailure turns a failed cloud call into a requeue, or into a daemon
// error for bad credentials. Throttling waits what the cloud asked and is
// not an event: it is caa's to absorb, not the pod's to see.
func (e *Executor) cloudFailure(res Result, pod *Pod, reason, what string, err error) (Result, error) {
	if errors.Is(err, provider.ErrAuth) {
		return res, fmt.Errorf("%w: %s: %w", ErrDaemon, what, err)
	}
	if d, ok := provider.RetryAfter(err); ok {
		res.RequeueAfter = jitter(d)
	} else {
		res.RequeueAfter = jitter(e.retryBase())
	}
	if errors.Is(err, provider.ErrThrottled) {
		e.log().Debug("cloud throttled", "what", what, "pod", podRef(pod), "retryAfter", res.RequeueAfter)
		return res, nil
	}
	e.log().Warn("cloud call failed", "what", what, "pod", podRef(pod), "err", err, "retryIn", res.RequeueAfter)
	if pod != nil {
		e.event(pod, true, reason, fmt.Sprintf("%s: %v (retrying)", what, err))
	}
	return res, nil
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

func (e *Executor) wait(ctx context.Context) error {
	if e.Writes == nil {
		return nil
	}
	if err := e.Writes.Wait(ctx); err != nil {
		return fmt.Errorf("wait for the cloud write budget: %w", err)
	}
	return nil
}

func (e *Executor) ledgerErr(what, uid string, err error) error {
	if errors.Is(err, ledger.ErrConflict) || errors.Is(err, ledger.ErrAlreadyExists) {
		// Another writer moved the record on: decide again from fresh state.
		return fmt.Errorf("%s for pod %s: %w", what, uid, err)
	}
	return fmt.Errorf("%w: %s for pod %s: %w", ErrDaemon, what, uid, err)
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
