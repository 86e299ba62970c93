// Package reconcile decides, for each peer pod, what caa must do about its
// VM, and (in later work) applies those decisions. The decision is a pure
// function of what is known (the pod, its ledger record, its VM, the clock
// and the configuration), so every row of DESIGN.md's loop is a table test.
package reconcile

import (
	"fmt"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

// Pod is what the decision needs of a peer pod, as the informer saw it.
type Pod struct {
	UID          string
	Namespace    string
	Name         string
	RuntimeClass string
	Annotations  map[string]string
	// Terminal: phase Succeeded or Failed; the pod needs no VM any more.
	Terminal bool
}

// Input is everything known about one pod UID at one moment.
type Input struct {
	// Pod is nil when the synced cache holds no desired pod of this UID.
	Pod *Pod
	// Record is nil when the ledger has none.
	Record *ledger.Record
	// VM is the cloud's view of the pod's VM (found by the record's VM id,
	// or by the pod UID tag), nil when the cloud shows none.
	VM *provider.VM
	// MissingSince is when the cloud first showed no VM for a record that
	// names one; zero while it has not (or it was just seen missing now).
	MissingSince time.Time
	// CacheSynced: the pod cache has synced since the last (re)connect.
	// Nothing is deleted on an unsynced cache (invariant I3).
	CacheSynced bool
	Now         time.Time
}

// Config is the policy the decision applies.
type Config struct {
	// Spec picks instance type and image from pod annotations.
	Spec provider.SpecConfig
	// ConfirmMissing is how long a VM must stay NotFound before it counts
	// as gone: clouds are eventually consistent, and one NotFound proves
	// nothing (invariant I3).
	ConfirmMissing time.Duration
}

// Kind names what to do.
type Kind string

// The kinds of action. Each names its cloud effect, if any.
const (
	// KindNone: nothing to do (the VM is live and recorded as Running).
	KindNone Kind = "None"
	// KindAdopt: the VM is live; record it as Running. No cloud write.
	KindAdopt Kind = "Adopt"
	// KindCreate: write the intent (Creating, attempt, key) durably, then
	// create the VM with that key. Covers a first create, a create resumed
	// after a crash (same attempt and key) and a recreate (next attempt).
	KindCreate Kind = "Create"
	// KindWait: something is in flight or unproven (a VM booting or
	// stopping, a NotFound not yet confirmed); look again after RequeueAfter.
	KindWait Kind = "Wait"
	// KindFail: the pod's spec is invalid; record Failed with the reason
	// and raise an event. The node's readiness does not wait for it.
	KindFail Kind = "Fail"
	// KindDelete: the pod is gone or terminal; record Deleting durably,
	// delete the VM, then remove the record.
	KindDelete Kind = "Delete"
	// KindForget: remove a record that has no VM to delete.
	KindForget Kind = "Forget"
)

// Action is the decision for one pod.
type Action struct {
	Kind Kind
	// Reason is a CamelCase word for events and metrics; Message says why
	// in words.
	Reason  string
	Message string
	// For KindCreate: the attempt and its idempotency key, and the shape.
	Attempt   int
	Key       string
	Selection provider.Selection
	// Recreate: this create replaces a VM that is gone or dead; OldVMID,
	// when set, is a dead VM (stopped or failed) to delete once the new
	// intent is durable, so it is never leaked.
	Recreate bool
	OldVMID  string
	// For KindWait: when to look again.
	RequeueAfter time.Duration
}

// Key derives the idempotency key of a pod's VM for one attempt: stable
// across processes, so a create resumed after a crash reuses it.
func Key(podUID string, attempt int) string { return fmt.Sprintf("%s-a%d", podUID, attempt) }

// Reasons used in actions.
const (
	ReasonNewPod         = "NewPod"
	ReasonResumeCreate   = "ResumeCreate"
	ReasonVMGone         = "VMGone"
	ReasonVMDead         = "VMDead"
	ReasonVMMissing      = "VMMissing"
	ReasonVMBooting      = "VMBooting"
	ReasonVMTransitional = "VMTransitional"
	ReasonAdopted        = "Adopted"
	ReasonRebuilt        = "RebuiltFromCloud"
	ReasonInvalidSpec    = "InvalidSpec"
	ReasonSpecFixed      = "SpecFixed"
	ReasonPodGone        = "PodGone"
	ReasonPodTerminal    = "PodTerminal"
	ReasonCacheNotSynced = "CacheNotSynced"
	ReasonInSync         = "InSync"
)

// Decide returns what to do for one pod UID. It never returns a delete on
// an unsynced cache, never a recreate on a single NotFound, and never a
// create while a VM of the pod may still be alive.
func Decide(in Input, cfg Config) Action {
	if in.Pod == nil || in.Pod.Terminal {
		return decideUnwanted(in)
	}
	rec, vm := in.Record, in.VM

	// No record: a first create, or a VM that the ledger lost (I6).
	if rec == nil {
		if vm != nil && !vm.State.Gone() {
			return Action{Kind: KindAdopt, Reason: ReasonRebuilt,
				Message: fmt.Sprintf("VM %s carries this pod's tags but the ledger had no record", vm.ID)}
		}
		return decideCreate(in, cfg, 1, ReasonNewPod, "first VM for this pod")
	}

	switch rec.Phase {
	case ledger.PhaseFailed:
		// Annotations can change; a spec that selects now gets a new attempt.
		if _, err := cfg.Spec.Select(in.Pod.Annotations); err != nil {
			return Action{Kind: KindNone, Reason: rec.Reason, Message: rec.Message}
		}
		if vm != nil && !vm.State.Gone() {
			return Action{Kind: KindAdopt, Reason: ReasonAdopted, Message: "a live VM of this pod exists"}
		}
		return decideCreate(in, cfg, rec.Attempt+1, ReasonSpecFixed, "the pod's spec is valid now")
	case ledger.PhaseDeleting:
		// The pod is desired again only if it came back under the same UID,
		// which Kubernetes never does; finish what was started.
		return decideUnwanted(in)
	}

	// Creating or Running.
	if vm == nil {
		if rec.Phase == ledger.PhaseCreating && rec.VMID == "" {
			// Crashed between the durable intent and the create's answer:
			// the same key finds the VM if the cloud made it.
			return decideCreate(in, cfg, max(rec.Attempt, 1), ReasonResumeCreate, "resume the create recorded before a restart")
		}
		if in.MissingSince.IsZero() || in.Now.Sub(in.MissingSince) < cfg.ConfirmMissing {
			wait := cfg.ConfirmMissing
			if !in.MissingSince.IsZero() {
				wait -= in.Now.Sub(in.MissingSince)
			}
			return Action{Kind: KindWait, Reason: ReasonVMMissing, RequeueAfter: wait,
				Message: fmt.Sprintf("VM %s not found; confirming before recreating", rec.VMID)}
		}
		a := decideCreate(in, cfg, rec.Attempt+1, ReasonVMGone,
			fmt.Sprintf("VM %s not found for %s", rec.VMID, in.Now.Sub(in.MissingSince).Round(time.Second)))
		a.Recreate = a.Kind == KindCreate
		return a
	}
	switch {
	case vm.State.Alive():
		if rec.Phase == ledger.PhaseRunning && rec.VMID == vm.ID {
			return Action{Kind: KindNone, Reason: ReasonInSync}
		}
		return Action{Kind: KindAdopt, Reason: ReasonAdopted, Message: fmt.Sprintf("VM %s is %s", vm.ID, vm.State)}
	case vm.State.Gone():
		a := decideCreate(in, cfg, rec.Attempt+1, ReasonVMGone, fmt.Sprintf("VM %s is %s", vm.ID, vm.State))
		a.Recreate = a.Kind == KindCreate
		return a
	case vm.State == provider.StateStopped:
		a := decideCreate(in, cfg, rec.Attempt+1, ReasonVMDead, fmt.Sprintf("VM %s was stopped behind caa's back", vm.ID))
		if a.Kind == KindCreate {
			a.Recreate, a.OldVMID = true, vm.ID
		}
		return a
	}
	// Stopping, Unknown: in flight or unreadable; never act on it yet.
	return Action{Kind: KindWait, Reason: ReasonVMTransitional, RequeueAfter: max(cfg.ConfirmMissing/4, time.Second),
		Message: fmt.Sprintf("VM %s is %s", vm.ID, vm.State)}
}

// decideUnwanted handles a record whose pod is gone or terminal.
func decideUnwanted(in Input) Action {
	rec := in.Record
	if rec == nil {
		return Action{Kind: KindNone}
	}
	reason := ReasonPodGone
	if in.Pod != nil && in.Pod.Terminal {
		reason = ReasonPodTerminal
	}
	if !in.CacheSynced && rec.Phase != ledger.PhaseDeleting {
		return Action{Kind: KindWait, Reason: ReasonCacheNotSynced, RequeueAfter: time.Second,
			Message: "the pod cache has not synced: no delete on partial knowledge"}
	}
	if rec.VMID == "" && (in.VM == nil || in.VM.State.Gone()) {
		return Action{Kind: KindForget, Reason: reason, Message: "no VM was recorded or found"}
	}
	return Action{Kind: KindDelete, Reason: reason, Message: "the pod no longer needs its VM"}
}

// decideCreate selects the spec and returns the create, or a failure when
// the pod's annotations cannot be served.
func decideCreate(in Input, cfg Config, attempt int, reason, msg string) Action {
	sel, err := cfg.Spec.Select(in.Pod.Annotations)
	if err != nil { // always ErrInvalidSpec: the pod's to fix
		return Action{Kind: KindFail, Reason: ReasonInvalidSpec, Message: err.Error()}
	}
	return Action{Kind: KindCreate, Reason: reason, Message: msg, Attempt: attempt, Key: Key(in.Pod.UID, attempt), Selection: sel}
}
