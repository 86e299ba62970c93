package adaptorvm

import (
	"fmt"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/provider"
)

// TieKind says what on this node ties an adaptor VM to a sandbox.
type TieKind string

// Ties.
const (
	// Untied: no sandbox the adaptor recorded on this node has the VM's
	// sandbox prefix. The VM may be another node's or another cluster's.
	Untied TieKind = "untied"
	// Tied: exactly one recorded sandbox gives the VM's exact name.
	Tied TieKind = "tied"
	// Mismatch: a recorded sandbox has the VM's sandbox prefix but gives
	// another name (another pod): a forged or colliding record.
	Mismatch TieKind = "mismatch"
	// Ambiguous: more than one recorded sandbox gives the VM's name.
	Ambiguous TieKind = "ambiguous"
)

// Tie is the result of TieOf.
type Tie struct {
	Kind TieKind
	// Sandbox is the recorded sandbox (Tied), or the first that matched
	// the prefix (Mismatch, Ambiguous).
	Sandbox Sandbox
}

// TieOf finds the sandbox on this node that the VM named name was made
// for: the one whose pod and id give exactly that name.
func TieOf(name string, sandboxes []Sandbox) Tie {
	_, prefix, ok := Parse(name)
	if !ok {
		return Tie{Kind: Untied}
	}
	var exact, near []Sandbox
	for _, sb := range sandboxes {
		if !strings.HasPrefix(clean(sb.ID), prefix) {
			continue
		}
		if Name(sb.Pod, sb.ID) == name {
			exact = append(exact, sb)
		} else {
			near = append(near, sb)
		}
	}
	switch {
	case len(exact) == 1:
		return Tie{Kind: Tied, Sandbox: exact[0]}
	case len(exact) > 1:
		return Tie{Kind: Ambiguous, Sandbox: exact[0]}
	case len(near) > 0:
		return Tie{Kind: Mismatch, Sandbox: near[0]}
	}
	return Tie{Kind: Untied}
}

// PodKind is what the apiserver answered for the tied sandbox's pod.
type PodKind string

// Pod answers.
const (
	PodUnread PodKind = ""         // not asked (the VM is not tied)
	PodError  PodKind = "error"    // the read failed: nothing is known
	PodGone   PodKind = "notFound" // the apiserver has no pod of that namespace and name
	PodExists PodKind = "exists"
)

// Pod is the apiserver's word on the tied sandbox's pod, read from the
// apiserver itself (not a cache) at the time of the decision.
type Pod struct {
	Kind    PodKind
	Err     string
	Created time.Time // the pod's creationTimestamp (PodExists)
	Phase   string    // the pod's phase (PodExists)
}

// Evidence is everything Decide looks at for one VM.
type Evidence struct {
	VM  provider.VM
	Tie Tie
	Pod Pod
	// KataHas: kata's runtime on this node has a sandbox of the tied id.
	KataHas bool
	Now     time.Time
	// Grace: how old the VM must be, by the cloud's clock, and how much
	// later than the VM a pod of the same name must have been created
	// to be another pod.
	Grace time.Duration
}

// Judgement is Decide's answer.
type Judgement string

// Judgements.
const (
	// Dead: no sandbox can use the VM any more, on the evidence given.
	// (Deleting still needs a second sighting a grace later, and the
	// opt-in: see Tracker.)
	Dead Judgement = "dead"
	// Keep: the VM may be in use, or the evidence is incomplete.
	Keep Judgement = "keep"
	// ReportOnly: nothing on this node ties the VM to a sandbox; it is
	// reported and never deleted by this node.
	ReportOnly Judgement = "report"
	// Gone: the cloud shows the VM terminated; nothing to do.
	Gone Judgement = "gone"
)

// Verdict is a judgement and why, in words for the operator.
type Verdict struct {
	Judgement Judgement
	Why       string
}

// Decide judges one adaptor VM. It is a pure function: every input is in
// e. A VM is Dead only when all of these hold:
//   - the cloud shows it alive or dead (not stopping, unknown or gone)
//     and carries none of caa's identity tags;
//   - exactly one sandbox the adaptor recorded on this node gives the
//     VM's exact name (the tie);
//   - kata's runtime on this node has no sandbox of that id;
//   - the apiserver says the sandbox's pod is gone: no pod of that
//     namespace and name, or one that is terminal, or one created more
//     than the grace after the VM (a later pod of the same name: a pod's
//     VM is always made after the pod);
//   - the cloud made the VM at least the grace ago.
func Decide(e Evidence) Verdict {
	vm := e.VM
	if vm.Owner().Managed || vm.Tags[provider.TagPodUID] != "" {
		return Verdict{Keep, "carries caa's identity tags: caa's own VM, judged by caa's reconcile rules"}
	}
	if _, _, ok := Parse(vm.Name); !ok {
		return Verdict{ReportOnly, fmt.Sprintf("the name %q is not one the adaptor makes (podvm-<pod>-<8 of the sandbox id>)", vm.Name)}
	}
	switch {
	case vm.State.Gone():
		return Verdict{Gone, "the cloud shows it terminated"}
	case !vm.State.Alive() && !vm.State.Dead():
		return Verdict{Keep, fmt.Sprintf("its state is %s: in flight or unreadable; looked at again later", vm.State)}
	}
	sb := e.Tie.Sandbox
	switch e.Tie.Kind {
	case Untied:
		return Verdict{ReportOnly, "nothing on this node ties it to a sandbox (no adaptor record of its sandbox in the pods directory): " +
			"it may be another node's or another cluster's; reported, never deleted"}
	case Mismatch:
		return Verdict{Keep, fmt.Sprintf("the adaptor's record of sandbox %s on this node is for pod %s/%s, whose VM would be named %s: "+
			"a forged or colliding record ties nothing", sb.ID, sb.Namespace, sb.Pod, Name(sb.Pod, sb.ID))}
	case Ambiguous:
		return Verdict{Keep, fmt.Sprintf("more than one adaptor record on this node gives this name (sandbox %s among them): ambiguous", sb.ID)}
	}
	pod := sb.Namespace + "/" + sb.Pod
	if e.KataHas {
		return Verdict{Keep, fmt.Sprintf("kata still has sandbox %s on this node (pod %s)", sb.ID, pod)}
	}
	var why string
	switch e.Pod.Kind {
	case PodGone:
		why = fmt.Sprintf("pod %s (sandbox %s) is gone from the apiserver", pod, sb.ID)
	case PodExists:
		switch {
		case e.Pod.Phase == "Succeeded" || e.Pod.Phase == "Failed":
			why = fmt.Sprintf("pod %s (sandbox %s) is terminal (%s)", pod, sb.ID, e.Pod.Phase)
		case !vm.CreatedAt.IsZero() && e.Pod.Created.After(vm.CreatedAt.Add(e.Grace)):
			why = fmt.Sprintf("pod %s was created at %s, after this VM was made (%s): a later pod of the same name; sandbox %s's pod is gone",
				pod, e.Pod.Created.UTC().Format(time.RFC3339), vm.CreatedAt.UTC().Format(time.RFC3339), sb.ID)
		default:
			return Verdict{Keep, fmt.Sprintf("pod %s exists and may still use it", pod)}
		}
	case PodError:
		return Verdict{Keep, fmt.Sprintf("pod %s could not be read from the apiserver: %s", pod, e.Pod.Err)}
	default:
		return Verdict{Keep, fmt.Sprintf("pod %s was not read", pod)}
	}
	switch {
	case vm.CreatedAt.IsZero():
		return Verdict{Keep, why + "; but the cloud gives no creation time, so its age is unknown"}
	case e.Now.Sub(vm.CreatedAt) < e.Grace:
		return Verdict{Keep, fmt.Sprintf("%s; but the VM was made less than %s ago", why, e.Grace)}
	}
	return Verdict{Dead, why}
}
