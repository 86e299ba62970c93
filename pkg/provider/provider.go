// Package provider is caa's boundary with a cloud: one small interface that
// creates, finds and deletes the VM of a peer pod, the VM and spec types,
// typed errors that carry the caller's decision, and spec selection from
// pod annotations. Implementations live in the subpackages, one per cloud.
package provider

import (
	"context"
	"fmt"
	"time"
)

// Provider is one cloud's VM API, narrowed to what caa needs. Every method
// is safe for concurrent use and honours ctx. Errors wrap the kinds in
// errors.go; anything unwrapped is transient.
type Provider interface {
	// Name is the provider's short name as recorded in the ledger: "aws",
	// "azure", "ibmcloud", "memory".
	Name() string

	// Create makes the VM for spec, tagged with spec.Tags(), and returns it
	// (usually Pending). It is idempotent by spec.Key: a second call with the
	// same key, even from another process after a crash, returns the VM the
	// first made and never makes a second one. A Create that returns an error
	// may still have made the VM; the caller finds it by key or tags later.
	// Invalid instance type or image: ErrInvalidSpec (Error.Refused says
	// which, when the cloud named it); a refusal of the node's settings
	// (subnet, security group, ...): ErrNodeConfig; a key whose VM the
	// cloud already terminated: ErrKeySpent.
	Create(ctx context.Context, spec Spec) (VM, error)

	// Get returns the VM with this id, or ErrNotFound once it is gone. A VM
	// that was just created may be NotFound for a while (clouds are
	// eventually consistent); Get reports that as it is and does not retry.
	Get(ctx context.Context, id string) (VM, error)

	// List returns every VM tagged for sel's cluster and node, in every
	// state the cloud still shows, following pagination to the end. It needs
	// no ledger (invariant I6).
	List(ctx context.Context, sel Selector) ([]VM, error)

	// Delete removes the VM and what Create made for it (disks, NICs). It is
	// idempotent: nil when the VM is already gone. It returns once the cloud
	// accepted the deletion; the VM may show as Stopping or Terminated a while.
	Delete(ctx context.Context, id string) error
}

// Preflighter is implemented by a provider that can check, at startup and
// without side effects, that its credentials work and the resources it was
// configured with exist and are usable: EC2's DryRun, reading the Azure
// resource group and the caller's permissions on it, reading the IBM Cloud
// subnet, VPC and image. Preflight returns nil when every check passed; on
// a failure it returns an error wrapping a kind from errors.go (ErrAuth for
// a missing permission, ErrInvalidSpec or ErrNodeConfig for a wrong
// resource id or a default the cloud does not offer) whose text
// names what failed and what to change (the permission or action, the
// setting). The daemon runs it before it touches any pod and keeps its
// readiness at 503 with that text until a retry passes.
type Preflighter interface {
	Preflight(ctx context.Context) error
}

// State is a VM's lifecycle state, mapped from each cloud's own.
//
// Every state falls in at most one of three classes, and each class asks
// the caller for one thing:
//
//   - Alive (Pending, Running): the VM is booting or serving; keep it.
//   - Dead (Stopped, Failed): the cloud still holds the VM, but it cannot
//     serve the pod. The pod needs a replacement, and the old VM must be
//     deleted, or it leaks: a failed Azure or IBM Cloud VM stays listed
//     (and billed for its disk) until someone deletes it, and so does a
//     stopped or deallocated one.
//   - Gone (Terminated): the cloud no longer holds the VM, or shows it
//     only as terminated; there is nothing left to delete.
//
// Stopping and Unknown are in no class: the VM is in flight or its state
// cannot be read, and the caller waits for a state it can act on.
type State string

// VM states.
const (
	StatePending    State = "Pending"
	StateRunning    State = "Running"
	StateStopping   State = "Stopping"
	StateStopped    State = "Stopped"
	StateTerminated State = "Terminated"
	StateFailed     State = "Failed"
	StateUnknown    State = "Unknown"
)

// Alive reports whether the VM is booting or running: one a pod can keep.
func (s State) Alive() bool { return s == StatePending || s == StateRunning }

// Dead reports whether the VM is present but unusable (stopped, failed):
// the pod needs a new VM, and this one must be deleted.
func (s State) Dead() bool { return s == StateStopped || s == StateFailed }

// Gone reports whether the VM is terminated, i.e. no longer present:
// positive evidence that the pod needs a new one, with nothing to delete.
// A failed VM is not gone (see Dead).
func (s State) Gone() bool { return s == StateTerminated }

// VM is what a provider knows of one instance.
type VM struct {
	ID           string            `json:"id"`
	Name         string            `json:"name"`
	State        State             `json:"state"`
	IPs          []string          `json:"ips,omitempty"`
	Tags         map[string]string `json:"tags,omitempty"`
	CreatedAt    time.Time         `json:"createdAt"`
	InstanceType string            `json:"instanceType,omitempty"`
	Image        string            `json:"image,omitempty"`
	Zone         string            `json:"zone,omitempty"`
	// Degraded, when set, says why the cloud reports an alive VM unhealthy
	// while it runs (Azure: the last control-plane operation failed, e.g.
	// an extension pushed by a policy). A degraded VM is kept and reported,
	// never replaced: a replacement would meet the same cause.
	Degraded string `json:"degraded,omitempty"`
	// TEE is what the cloud reports the VM to be (EC2 CpuOptions.AmdSevSnp,
	// Azure securityProfile.securityType, IBM confidential_compute_mode):
	// empty for an ordinary VM or one whose read does not say.
	TEE TEE `json:"tee,omitempty"`
}

// Owner reads the identity tags of a VM.
func (v VM) Owner() Owner {
	return Owner{
		Cluster: v.Tags[TagCluster], Node: v.Tags[TagNode],
		PodUID: v.Tags[TagPodUID], Pod: v.Tags[TagPod], Key: v.Tags[TagKey],
		Managed: v.Tags[TagManagedBy] == ManagedByValue,
	}
}

// Owner is the identity a VM carries in its tags.
type Owner struct {
	Cluster, Node, PodUID, Pod, Key string
	Managed                         bool
}

// Selector scopes List to one cluster and node.
type Selector struct {
	Cluster string
	Node    string
}

// Spec is everything a provider needs to create one VM.
type Spec struct {
	// Key is the idempotency key, derived from (pod UID, attempt).
	Key string
	// Identity, written to the VM's tags.
	Cluster      string
	Node         string
	PodUID       string
	PodNamespace string
	PodName      string
	// Placement, from SelectSpec and the provider's configuration.
	InstanceType string
	Image        string
	// TEE is the confidential VM to ask the cloud for (ChooseTEE); empty
	// for an ordinary VM (--confidential=false).
	TEE TEE
	// UserData is opaque bytes handed to the VM; it may hold secrets and is
	// never logged, stored in the ledger or put in an error (invariant I7).
	UserData []byte
	// ExtraTags are added to the identity tags (which win on a clash).
	ExtraTags map[string]string
	// MaybeSent says an earlier Create with this Key may have reached the
	// cloud: the ledger held the key before this call (a crash or an error
	// between the intent and the answer). A provider then looks for that
	// VM with a read before it writes. False when the caller wrote the
	// key's intent for this very call: nothing can have been sent with it,
	// and the cloud's own idempotency (EC2's client token, VPC's unique
	// names) still answers a replay with the VM already made, so the read
	// would only cost every create one more call.
	MaybeSent bool
}

// Validate checks the fields every provider relies on.
func (s Spec) Validate() error {
	missing := ""
	switch {
	case s.Key == "":
		missing = "Key"
	case s.Cluster == "":
		missing = "Cluster"
	case s.Node == "":
		missing = "Node"
	case s.PodUID == "":
		missing = "PodUID"
	case s.PodNamespace == "" || s.PodName == "":
		missing = "PodNamespace/PodName"
	case s.InstanceType == "":
		missing = "InstanceType"
	case s.Image == "":
		missing = "Image"
	}
	if missing != "" {
		return fmt.Errorf("%w: spec for pod %s/%s has no %s", ErrInvalidSpec, s.PodNamespace, s.PodName, missing)
	}
	// These go to tags whole: matching needs them exact, so they cannot be
	// shortened the way the pod's name is.
	for _, f := range []struct{ name, value string }{
		{"Key", s.Key}, {"Cluster", s.Cluster}, {"Node", s.Node}, {"PodUID", s.PodUID},
	} {
		if len(f.value) > MaxTagValue {
			return fmt.Errorf("%w: spec for pod %s: %s is %d bytes, more than a tag value takes (%d)",
				ErrInvalidSpec, PodTag(s.PodNamespace, s.PodName), f.name, len(f.value), MaxTagValue)
		}
	}
	return nil
}

// String leaves out the user data, so a spec is safe to log.
func (s Spec) String() string {
	return fmt.Sprintf("{key %s pod %s/%s (%s) node %s type %s image %s tee %s userData %d bytes}",
		s.Key, s.PodNamespace, s.PodName, s.PodUID, s.Node, s.InstanceType, s.Image, s.TEE, len(s.UserData))
}

// GoString keeps %#v from printing the user data too.
func (s Spec) GoString() string { return "provider.Spec" + s.String() }

// Tag keys on every VM caa creates. They avoid '/' and ':' so that every
// cloud accepts them as they are (Azure forbids '/' in tag names).
const (
	TagCluster     = "caa-cluster"
	TagNode        = "caa-node"
	TagPodUID      = "caa-pod-uid"
	TagPod         = "caa-pod" // namespace/name, for people (see PodTag)
	TagKey         = "caa-key"
	TagManagedBy   = "caa-managed-by"
	ManagedByValue = "caa"
)

// Tags returns the tags for the VM of spec: extra tags first, identity tags
// over them. Every identity tag value fits every cloud (see names.go): the
// pod's namespace/name, which can be longer, is shortened by PodTag; the
// others are bounded by Validate.
func (s Spec) Tags() map[string]string {
	t := make(map[string]string, len(s.ExtraTags)+6)
	for k, v := range s.ExtraTags {
		t[k] = v
	}
	t[TagCluster] = s.Cluster
	t[TagNode] = s.Node
	t[TagPodUID] = s.PodUID
	t[TagPod] = PodTag(s.PodNamespace, s.PodName)
	t[TagKey] = s.Key
	t[TagManagedBy] = ManagedByValue
	return t
}

// Matches reports whether a VM's tags put it in sel's cluster and node.
func (sel Selector) Matches(tags map[string]string) bool {
	return tags[TagManagedBy] == ManagedByValue && tags[TagCluster] == sel.Cluster && tags[TagNode] == sel.Node
}
