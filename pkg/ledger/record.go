package ledger

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Phase is where a record stands in the life of its VM.
type Phase string

// The phases a record moves through. Creating is written before the cloud
// create call (the durable intent); Deleting before the cloud delete call.
const (
	PhaseCreating Phase = "Creating"
	PhaseRunning  Phase = "Running"
	PhaseDeleting Phase = "Deleting"
	PhaseFailed   Phase = "Failed"
)

// Phases lists every valid phase in display order.
var Phases = []Phase{PhaseCreating, PhaseRunning, PhaseDeleting, PhaseFailed}

// ParsePhase accepts a phase name in any letter case.
func ParsePhase(s string) (Phase, error) {
	for _, p := range Phases {
		if strings.EqualFold(string(p), s) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: unknown phase %q (want one of Creating, Running, Deleting, Failed)", ErrInvalid, s)
}

func (p Phase) valid() bool { return slices.Contains(Phases, p) }

// Record is the ledger's memory of one peer pod and its VM. It never holds a
// credential or user data (invariant I7): only identities, placement and state.
type Record struct {
	PodUID       string `json:"podUID"`
	Namespace    string `json:"namespace"`
	Name         string `json:"name"`
	RuntimeClass string `json:"runtimeClass,omitempty"`
	Node         string `json:"node"`

	Provider     string   `json:"provider,omitempty"`
	VMID         string   `json:"vmID,omitempty"`
	VMName       string   `json:"vmName,omitempty"`
	Key          string   `json:"idempotencyKey,omitempty"`
	InstanceType string   `json:"instanceType,omitempty"`
	Image        string   `json:"image,omitempty"`
	Zone         string   `json:"zone,omitempty"`
	IPs          []string `json:"ips,omitempty"`
	// Confidential is the TEE the VM was asked to be ("sev-snp", "tdx",
	// ...; see provider.TEE), written with the intent before the create.
	// Empty: an ordinary VM was asked for (--confidential=false), and a
	// record written before caa knew the field decodes so too: never as
	// confidential, so nothing older is served as a TEE it may not be.
	Confidential string `json:"confidential,omitempty"`

	Phase   Phase  `json:"phase"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	Attempt int    `json:"attempt"`

	// ReplacesVMID is a dead VM (stopped or failed) that this record's
	// current attempt replaces. It stays here until the cloud has deleted
	// it, so a replacement whose create keeps failing never strands it.
	ReplacesVMID string `json:"replacesVMID,omitempty"`
	// FailedSpec fingerprints the pod's VM annotations when the record went
	// Failed; the failure stands until the annotations change.
	FailedSpec string `json:"failedSpec,omitempty"`
	// OpenKeys are the idempotency keys of the pod's other attempts whose
	// VM may exist (a create was sent with them and no VM of theirs has
	// been adopted or deleted since), Key excepted. A VM that carries one
	// of them, beside the record's live VM, is the pod's own duplicate.
	OpenKeys []string `json:"openKeys,omitempty"`

	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	LastSeenAt time.Time `json:"lastSeenInCloudAt,omitzero"`

	// Revision is set by the ledger: 1 on create, +1 on every update. A write
	// must carry the revision it read (compare-and-set).
	Revision uint64 `json:"revision"`

	// unknown holds, encoded, the fields a newer caa wrote that this one
	// does not know; they are written back with the record.
	unknown []byte
}

// PodRef is the namespace/name form used in logs and the CLI.
func (r Record) PodRef() string { return r.Namespace + "/" + r.Name }

// validate checks what the ledger itself relies on; the reconciler owns the
// meaning of the rest.
func (r Record) validate() error {
	switch {
	case r.PodUID == "":
		return fmt.Errorf("%w: record has no podUID", ErrInvalid)
	case len(r.PodUID) > maxKeyLen:
		return fmt.Errorf("%w: podUID is %d bytes, the limit is %d", ErrInvalid, len(r.PodUID), maxKeyLen)
	case r.Namespace == "" || r.Name == "":
		return fmt.Errorf("%w: record %s needs both namespace and name (got %q/%q)", ErrInvalid, r.PodUID, r.Namespace, r.Name)
	case !r.Phase.valid():
		return fmt.Errorf("%w: record %s has phase %q (want one of Creating, Running, Deleting, Failed)", ErrInvalid, r.PodUID, r.Phase)
	case r.Attempt < 0:
		return fmt.Errorf("%w: record %s has negative attempt %d", ErrInvalid, r.PodUID, r.Attempt)
	case r.VMID != "" && r.Provider == "":
		return fmt.Errorf("%w: record %s names VM %q but no provider", ErrInvalid, r.PodUID, r.VMID)
	case len(r.Provider)+len(r.VMID)+1 > maxKeyLen:
		return fmt.Errorf("%w: record %s: provider and VM id are too long to index", ErrInvalid, r.PodUID)
	}
	return nil
}

// Event is one entry of a pod's history: a snapshot of the record after a
// change, and what the change was.
type Event struct {
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
	Action Action    `json:"action"`
	Record Record    `json:"record"`
}

// Action names the kind of change an Event records.
type Action string

// The actions history records.
const (
	ActionCreated Action = "created"
	ActionUpdated Action = "updated"
	ActionDeleted Action = "deleted"
)

// Filter selects records in List. The zero Filter selects all.
type Filter struct {
	Phases []Phase
}

func (f Filter) match(r Record) bool {
	return len(f.Phases) == 0 || slices.Contains(f.Phases, r.Phase)
}
