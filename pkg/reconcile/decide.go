// Package reconcile decides, for each peer pod, what caa must do about its
// VM, and applies those decisions. The decision is a pure function of what
// is known (the pod, its ledger record, its VM, the clock and the
// configuration), so every rule of docs/design.md's loop is a table test.
package reconcile

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
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
	// NotPeer: the pod's runtime class is outside the configured set. caa
	// makes no VM for it, and never deletes one because of that: the set
	// selects which pods get VMs, not which VMs are deleted (invariant I3).
	NotPeer bool
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
	// Retries counts the failed cloud calls in a row for this pod before
	// this decision (0 on the first try): a retry is not a restart.
	Retries int
	// HighestAttempt is the highest attempt that any VM of this pod in the
	// cloud's listing carries in its key tag, terminated ones included (0:
	// none seen). A new attempt never goes below it: a key whose VM
	// existed may be spent (invariant I6 rebuilds from these tags).
	HighestAttempt int
	// Siblings are the pod's other VMs in the listing (not VM, not gone):
	// those that carry one of the record's open keys are its duplicates.
	Siblings []*provider.VM
	Now      time.Time
}

// Config is the policy the decision applies.
type Config struct {
	// Spec picks instance type and image from pod annotations.
	Spec provider.SpecConfig
	// ConfirmMissing is how long a VM must stay NotFound before it counts
	// as gone: clouds are eventually consistent, and one NotFound proves
	// nothing (invariant I3).
	ConfirmMissing time.Duration
	// Provider is the name of the cloud this caa runs against. A record
	// made on another cloud (caa restarted with another --provider) is
	// never replaced nor deleted from here: this cloud cannot see its VM,
	// so a NotFound here proves nothing. Empty: not checked.
	Provider string
	// NodeConfig is the provider's node-level settings (its NodeConfig:
	// subnet, security groups, zone, tags). A spec the cloud refused is
	// remembered with it, so a change of the node's configuration retries
	// what was refused. The Reconciler fills it in from its provider.
	NodeConfig string
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
	// DefaultType and DefaultImage: the selection's type (image) is the
	// node's default rather than the pod's own choice, so a cloud refusing
	// it is the node's configuration at fault, not the pod's.
	DefaultType, DefaultImage bool
	// Fingerprint names the selection and the node's configuration, kept
	// with a refusal of the pod's spec (Record.FailedSpec).
	Fingerprint string
	// Duplicates, for KindAdopt: other VMs of the pod, made by attempts the
	// record names as open, to delete now that one VM is kept.
	Duplicates []string
	// Recreate: this create replaces a VM that is gone or dead; OldVMID,
	// when set, is a dead VM (stopped or failed) to delete once the new
	// intent is durable, so it is never leaked.
	Recreate bool
	OldVMID  string
	// TEE, for KindCreate: the confidential VM to ask for (none when
	// --confidential=false), recorded with the intent.
	TEE provider.TEE
	// For KindWait: when to look again.
	RequeueAfter time.Duration
}

// Key derives the idempotency key of a pod's VM for one attempt: stable
// across processes, so a create resumed after a crash reuses it.
func Key(podUID string, attempt int) string { return fmt.Sprintf("%s-a%d", podUID, attempt) }

// Reasons used in actions.
const (
	ReasonNewPod       = "NewPod"
	ReasonResumeCreate = "ResumeCreate"
	ReasonVMGone       = "VMGone"
	ReasonVMDead       = "VMDead"
	// ReasonNotConfidential: the cloud reports the pod's VM as not the
	// confidential VM it was asked to be; it never serves the pod, and is
	// replaced and deleted as a dead one is.
	ReasonNotConfidential = "VMNotConfidential"
	ReasonVMMissing       = "VMMissing"
	ReasonVMBooting       = "VMBooting"
	ReasonVMTransitional  = "VMTransitional"
	ReasonAdopted         = "Adopted"
	ReasonRebuilt         = "RebuiltFromCloud"
	ReasonInvalidSpec     = "InvalidSpec"
	ReasonSpecFixed       = "SpecFixed"
	ReasonPodGone         = "PodGone"
	ReasonPodTerminal     = "PodTerminal"
	ReasonCacheNotSynced  = "CacheNotSynced"
	ReasonInSync          = "InSync"
	ReasonRetryCreate     = "RetryCreate"
	ReasonCloudRefused    = "CloudRefusedSpec"
	ReasonNotPeer         = "RuntimeClassNotWatched"
	ReasonVMDegraded      = "VMDegraded"
	ReasonVMUnknown       = "VMUnknown"
	ReasonBackoff         = "BackingOff"
	ReasonOtherProvider   = "RecordedOnAnotherProvider"
	ReasonNodeRefused     = "NodeConfigRefused"
	ReasonDuplicates      = "DuplicateVMs"
)

// Decide returns what to do for one pod UID. It never returns a delete on
// an unsynced cache or for a pod that still exists and is not terminal,
// never a recreate on a single NotFound, and never a create while a VM of
// the pod may still be alive.
func Decide(in Input, cfg Config) Action {
	if foreign(in.Record, cfg) {
		return Action{Kind: KindNone, Reason: ReasonOtherProvider,
			Message: fmt.Sprintf("the record's VM %s is on provider %s, but this caa runs %s: nothing is created, replaced or deleted for it; "+
				"run caa with --provider %s", in.Record.VMID, in.Record.Provider, cfg.Provider, in.Record.Provider)}
	}
	if in.Pod == nil || in.Pod.Terminal {
		return decideUnwanted(in)
	}
	rec, vm := in.Record, in.VM
	if in.Pod.NotPeer {
		return decideNotPeer(in)
	}

	// No record: a first create, or a VM that the ledger lost (I6).
	if rec == nil {
		switch {
		case vm != nil && vm.State.Alive() && cfg.Spec.Confidential && !vm.TEE.Confidential():
			// Nothing says what it was asked to be, and caa asks every VM
			// to be confidential: an ordinary VM is never adopted.
			return notConfidential(in, cfg, vm, max(AttemptOf(vm.Owner().Key), in.HighestAttempt)+1,
				fmt.Sprintf("VM %s carries this pod's tags, the ledger had no record, and the cloud reports it as not confidential (--confidential is on)", vm.ID))
		case vm != nil && vm.State.Alive():
			return Action{Kind: KindAdopt, Reason: ReasonRebuilt,
				Message: fmt.Sprintf("VM %s carries this pod's tags but the ledger had no record", vm.ID)}
		case vm != nil && isDead(vm.State):
			// The next attempt's key: the dead VM's own key would find it again.
			a := decideCreate(in, cfg, max(AttemptOf(vm.Owner().Key), in.HighestAttempt)+1, ReasonVMDead,
				fmt.Sprintf("VM %s of this pod is %s and the ledger had no record", vm.ID, vm.State))
			if a.Kind == KindCreate {
				a.Recreate, a.OldVMID = true, vm.ID
			}
			return a
		case vm != nil && !isGone(vm.State):
			return Action{Kind: KindWait, Reason: ReasonVMTransitional, RequeueAfter: transitionalWait(cfg),
				Message: fmt.Sprintf("VM %s of this pod is %s and the ledger had no record", vm.ID, vm.State)}
		}
		if in.HighestAttempt > 0 {
			// Only terminated VMs of the pod show: their keys may be spent.
			return decideCreate(in, cfg, in.HighestAttempt+1, ReasonVMGone,
				fmt.Sprintf("the ledger had no record and the pod's VMs up to attempt %d are gone", in.HighestAttempt))
		}
		return decideCreate(in, cfg, 1, ReasonNewPod, "first VM for this pod")
	}

	switch rec.Phase {
	case ledger.PhaseFailed:
		return decideFailed(in, cfg)
	case ledger.PhaseDeleting:
		// The pod is desired again only if it came back under the same UID,
		// which Kubernetes never does; finish what was started.
		return decideUnwanted(in)
	}

	// Creating or Running.
	if vm == nil {
		if rec.Phase == ledger.PhaseCreating && rec.VMID == "" {
			// Crashed (or failed) between the durable intent and the create's
			// answer: the same key finds the VM if the cloud made it.
			reason, msg := ReasonResumeCreate, "resume the create recorded before a restart"
			if in.Retries > 0 {
				reason, msg = ReasonRetryCreate, fmt.Sprintf("retry the create (%d failed so far)", in.Retries)
			}
			a := decideCreate(in, cfg, max(rec.Attempt, 1), reason, msg)
			if a.Kind == KindCreate && rec.ReplacesVMID != "" {
				a.Recreate, a.OldVMID = true, rec.ReplacesVMID
			}
			return a
		}
		if in.MissingSince.IsZero() || in.Now.Sub(in.MissingSince) < cfg.ConfirmMissing {
			wait := cfg.ConfirmMissing
			if !in.MissingSince.IsZero() {
				wait -= in.Now.Sub(in.MissingSince)
			}
			return Action{Kind: KindWait, Reason: ReasonVMMissing, RequeueAfter: wait,
				Message: fmt.Sprintf("VM %s not found; confirming before recreating", rec.VMID)}
		}
		a := decideCreate(in, cfg, nextAttempt(in), ReasonVMGone,
			fmt.Sprintf("VM %s not found for %s", rec.VMID, in.Now.Sub(in.MissingSince).Round(time.Second)))
		a.Recreate = a.Kind == KindCreate
		return a
	}
	if why := vm.Downgraded(provider.TEE(rec.Confidential)); why != "" && vm.State.Alive() {
		return notConfidential(in, cfg, vm, nextAttempt(in), why)
	}
	switch {
	case vm.State.Alive():
		dups := duplicates(in, vm)
		if rec.Phase == ledger.PhaseRunning && provider.SameVM(rec.VMID, vm.ID) && rec.ReplacesVMID == "" && len(dups) == 0 {
			return Action{Kind: KindNone, Reason: ReasonInSync}
		}
		a := Action{Kind: KindAdopt, Reason: ReasonAdopted, Message: fmt.Sprintf("VM %s is %s", vm.ID, vm.State), Duplicates: dups}
		if rec.Phase == ledger.PhaseRunning && provider.SameVM(rec.VMID, vm.ID) && rec.ReplacesVMID == "" {
			a.Reason, a.Message = ReasonDuplicates, fmt.Sprintf("VM %s is kept; other attempts made %s", vm.ID, strings.Join(dups, ", "))
		}
		if rec.ReplacesVMID != "" && !provider.SameVM(rec.ReplacesVMID, vm.ID) {
			// The replacement exists; the dead VM it replaces still has to go.
			a.OldVMID = rec.ReplacesVMID
		}
		return a
	case isGone(vm.State):
		a := decideCreate(in, cfg, nextAttempt(in), ReasonVMGone, fmt.Sprintf("VM %s is %s", vm.ID, vm.State))
		a.Recreate = a.Kind == KindCreate
		return a
	case isDead(vm.State):
		// Stopped or failed, but still there: replace it, and delete it once
		// the replacement's intent is durable, so it never leaks.
		a := decideCreate(in, cfg, nextAttempt(in), ReasonVMDead, fmt.Sprintf("VM %s is %s", vm.ID, vm.State))
		if a.Kind == KindCreate {
			a.Recreate, a.OldVMID = true, vm.ID
		}
		return a
	}
	// Stopping, Unknown: in flight or unreadable; never act on it yet.
	reason := ReasonVMTransitional
	if vm.State == provider.StateUnknown {
		reason = ReasonVMUnknown
	}
	return Action{Kind: KindWait, Reason: reason, RequeueAfter: transitionalWait(cfg),
		Message: fmt.Sprintf("VM %s is %s", vm.ID, vm.State)}
}

// notConfidential refuses a VM that is not the confidential VM asked for:
// it is replaced by a new one of the next attempt, and deleted once that
// intent is durable (OldVMID), as a dead VM is; never adopted or served.
func notConfidential(in Input, cfg Config, vm *provider.VM, attempt int, why string) Action {
	a := decideCreate(in, cfg, attempt, ReasonNotConfidential, why)
	if a.Kind == KindCreate {
		a.Recreate, a.OldVMID = true, vm.ID
	}
	return a
}

// nextAttempt is the attempt after every one the record or the cloud shows.
func nextAttempt(in Input) int { return max(in.Record.Attempt, in.HighestAttempt) + 1 }

// duplicates returns the ids of the pod's other VMs that one of the
// record's attempts made, other than keep: the record's open keys and its
// own key, unless keep carries it. They are the pod's own, so no orphan
// grace applies; a VM whose key the record does not name is left to the
// orphan rules.
func duplicates(in Input, keep *provider.VM) []string {
	rec := in.Record
	if rec == nil || len(in.Siblings) == 0 {
		return nil
	}
	open := map[string]bool{}
	for _, k := range rec.OpenKeys {
		open[k] = true
	}
	if rec.Key != "" {
		open[rec.Key] = true
	}
	delete(open, keep.Owner().Key)
	var out []string
	for _, s := range in.Siblings {
		k := s.Owner().Key
		if provider.SameVM(s.ID, keep.ID) || provider.SameVM(s.ID, rec.ReplacesVMID) || isGone(s.State) || k == "" || !open[k] {
			continue
		}
		out = append(out, s.ID)
	}
	slices.Sort(out)
	return out
}

// foreign: the record was made on another cloud than this caa's.
func foreign(rec *ledger.Record, cfg Config) bool {
	return rec != nil && cfg.Provider != "" && rec.Provider != "" && rec.Provider != cfg.Provider
}

func transitionalWait(cfg Config) time.Duration { return max(cfg.ConfirmMissing/4, time.Second) }

// isGone: positive evidence that the VM no longer exists.
func isGone(s provider.State) bool { return s.Gone() }

// isDead: the VM still exists but can never serve its pod again.
func isDead(s provider.State) bool { return s.Dead() }

// decideFailed handles a record whose pod's spec failed: it stands while the
// pod asks for what failed, and gets a new attempt once it asks otherwise.
func decideFailed(in Input, cfg Config) Action {
	rec, vm := in.Record, in.VM
	sel, err := cfg.Spec.Select(in.Pod.Annotations)
	if err != nil {
		return Action{Kind: KindNone, Reason: rec.Reason, Message: rec.Message}
	}
	if vm != nil && vm.State.Alive() {
		return Action{Kind: KindAdopt, Reason: ReasonAdopted, Message: "a live VM of this pod exists"}
	}
	if rec.FailedSpec != "" && rec.FailedSpec == Fingerprint(sel, cfg) {
		// The cloud refused exactly this; asking again changes nothing.
		return Action{Kind: KindNone, Reason: rec.Reason, Message: rec.Message}
	}
	what := "the pod's spec is valid now"
	if rec.FailedSpec != "" {
		what = fmt.Sprintf("the pod now asks for %s with image %s, or the node's configuration changed", sel.InstanceType, sel.Image)
	}
	a := decideCreate(in, cfg, nextAttempt(in), ReasonSpecFixed, what)
	if a.Kind == KindCreate && vm != nil && isDead(vm.State) {
		a.Recreate, a.OldVMID = true, vm.ID
	}
	return a
}

// decideNotPeer handles a record whose pod still exists but no longer has a
// watched runtime class (the class or the flag changed): the VM is kept and
// reported. Only positive evidence deletes it: the pod gone or terminal.
func decideNotPeer(in Input) Action {
	rec := in.Record
	if rec == nil {
		return Action{Kind: KindNone}
	}
	if rec.Phase == ledger.PhaseDeleting {
		return decideUnwanted(in)
	}
	msg := fmt.Sprintf("runtime class %q is not one caa watches; the VM is kept until the pod is gone or terminal", in.Pod.RuntimeClass)
	if rec.VMID != "" {
		msg = fmt.Sprintf("runtime class %q is not one caa watches; VM %s is kept until the pod is gone or terminal", in.Pod.RuntimeClass, rec.VMID)
	}
	return Action{Kind: KindNone, Reason: ReasonNotPeer, Message: msg}
}

// Fingerprint names, in the ledger (FailedSpec), a selection the cloud
// refused together with the node's configuration it was refused under
// (the default type and image, the provider's node settings): a change of
// either retries it. Short and free of anything secret (a hash).
func Fingerprint(sel provider.Selection, cfg Config) string {
	sum := sha256.Sum256([]byte(strings.Join([]string{sel.InstanceType, sel.Image,
		cfg.Spec.DefaultType, cfg.Spec.DefaultImage, cfg.NodeConfig}, "\x00")))
	return hex.EncodeToString(sum[:8])
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
	if rec.VMID == "" && rec.ReplacesVMID == "" && (in.VM == nil || isGone(in.VM.State)) {
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
	tee, err := cfg.Spec.SelectTEE(in.Pod.Annotations, sel.InstanceType)
	if err != nil {
		return Action{Kind: KindFail, Reason: ReasonInvalidSpec, Message: err.Error()}
	}
	return Action{Kind: KindCreate, Reason: reason, Message: msg, Attempt: attempt, Key: Key(in.Pod.UID, attempt), Selection: sel, TEE: tee,
		DefaultType: sel.InstanceType == cfg.Spec.DefaultType, DefaultImage: sel.Image == cfg.Spec.DefaultImage,
		Fingerprint: Fingerprint(sel, cfg)}
}
