package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Sandboxes are the records of the remote hypervisor mode (kata's shim
// drives caa): one per kata sandbox, keyed by the sandbox id the shim sends.
// A pod has one sandbox or more over its life, each with its own VM; a newer
// sandbox of a pod supersedes the older one's VM. They live in buckets of
// their own (schema 2, migration "sandboxes"), beside the pod records of the
// informer mode:
//
//	sandboxes
//	 └── <sandbox id>      sandbox value (tags below)
//	sandboxHistory
//	 └── <sandbox id>      bucket, one per sandbox
//	      └── <seq>        uint64 big-endian -> sandbox event value
//
// A sandbox record holds what serving its sandbox again after a restart
// needs without a cloud write: the VM and its IP, the tunnel's settings, the
// agent socket and the forwarder's address, and the serial numbers of the
// certificates issued for it. Never a private key, user data or initdata
// (invariant I7).

// MaxSandboxIDLen is the longest sandbox id caa accepts.
const MaxSandboxIDLen = 128

// ValidSandboxID reports whether id can name a sandbox: 1 to 128 ASCII
// letters, digits, '.', '_' or '-', starting with a letter or digit, so
// that it is usable as a directory name and a cloud tag value (kata sends
// 64 hex digits). Written out rather than as a regular expression: the
// compiled form of a bounded repetition of 127 costs about 100 KiB of heap
// in every process that holds it.
func ValidSandboxID(id string) bool {
	if id == "" || len(id) > MaxSandboxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// SandboxPhase is where a sandbox stands.
type SandboxPhase string

// The sandbox phases. Created is written by CreateVM (no cloud call);
// Creating before the cloud create (the durable intent, I2); Running once
// the VM runs and its agent answered; Lost when caa cannot serve it again:
// its VM was found gone under it (never recreated: the containers' state
// was in the VM), or `caa ledger rebuild` made the record from the VM's
// tags, which do not carry its tunnel or agent socket; Deleting
// before the cloud delete (StopVM, or positive evidence that the sandbox is
// over); Failed when StartVM could not give it a VM and no VM exists.
const (
	SandboxCreated  SandboxPhase = "Created"
	SandboxCreating SandboxPhase = "Creating"
	SandboxRunning  SandboxPhase = "Running"
	SandboxLost     SandboxPhase = "Lost"
	SandboxDeleting SandboxPhase = "Deleting"
	SandboxFailed   SandboxPhase = "Failed"
)

// SandboxPhases lists every valid sandbox phase.
var SandboxPhases = []SandboxPhase{SandboxCreated, SandboxCreating, SandboxRunning, SandboxLost, SandboxDeleting, SandboxFailed}

// Tunnel is the pod network's VXLAN between the pod's namespace on the node
// and the VM, as it was set up.
type Tunnel struct {
	VXLANID  int    `json:"vxlanID,omitempty"`
	Port     int    `json:"port,omitempty"`
	LocalIP  string `json:"localIP,omitempty"`  // the node's end
	RemoteIP string `json:"remoteIP,omitempty"` // the VM's end
}

// Sandbox is the ledger's memory of one kata sandbox and its VM.
type Sandbox struct {
	ID        string `json:"id"`
	PodUID    string `json:"podUID"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Node      string `json:"node"`
	NetNS     string `json:"netns,omitempty"`

	Provider     string   `json:"provider,omitempty"`
	VMID         string   `json:"vmID,omitempty"`
	VMName       string   `json:"vmName,omitempty"`
	Key          string   `json:"idempotencyKey,omitempty"`
	InstanceType string   `json:"instanceType,omitempty"`
	Image        string   `json:"image,omitempty"`
	IPs          []string `json:"ips,omitempty"`
	// Confidential is the TEE the sandbox's VM was asked to be (see
	// Record.Confidential): empty for an ordinary VM, and for a sandbox
	// written before caa knew the field.
	Confidential string `json:"confidential,omitempty"`

	AgentSocket string   `json:"agentSocket,omitempty"`
	RelayAddr   string   `json:"relayAddr,omitempty"` // the forwarder, VM_IP:port
	Tunnel      Tunnel   `json:"tunnel,omitzero"`
	CertSerials []string `json:"certSerials,omitempty"`

	Phase   SandboxPhase `json:"phase"`
	Reason  string       `json:"reason,omitempty"`
	Message string       `json:"message,omitempty"`
	Attempt int          `json:"attempt"`

	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	Revision  uint64    `json:"revision"`

	unknown []byte
}

// PodRef is namespace/name.
func (s Sandbox) PodRef() string { return s.Namespace + "/" + s.Name }

func (s Sandbox) validate() error {
	switch {
	case s.ID == "":
		return fmt.Errorf("%w: sandbox has no id", ErrInvalid)
	case len(s.ID) > maxKeyLen:
		return fmt.Errorf("%w: sandbox id is %d bytes, the limit is %d", ErrInvalid, len(s.ID), maxKeyLen)
	case s.Namespace == "" || s.Name == "":
		return fmt.Errorf("%w: sandbox %s needs both pod namespace and name (got %q/%q)", ErrInvalid, s.ID, s.Namespace, s.Name)
	case !slices.Contains(SandboxPhases, s.Phase):
		return fmt.Errorf("%w: sandbox %s has phase %q", ErrInvalid, s.ID, s.Phase)
	case s.VMID != "" && s.Provider == "":
		return fmt.Errorf("%w: sandbox %s names VM %q but no provider", ErrInvalid, s.ID, s.VMID)
	case s.Attempt < 0:
		return fmt.Errorf("%w: sandbox %s has negative attempt %d", ErrInvalid, s.ID, s.Attempt)
	}
	return nil
}

// SandboxEvent is one entry of a sandbox's history.
type SandboxEvent struct {
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Action  Action    `json:"action"`
	Sandbox Sandbox   `json:"sandbox"`
}

var (
	bucketSandboxes       = []byte("sandboxes")
	bucketSandboxHistory  = []byte("sandboxHistory")
	errNoSandboxesBuckets = fmt.Errorf("%w: the sandboxes buckets are missing (schema below 2)", ErrSchema)
)

// migrateSandboxes adds the sandbox buckets. Additive: an older caa opens
// the file and ignores them.
func migrateSandboxes(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketSandboxes, bucketSandboxHistory} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// GetSandbox returns a sandbox, or ErrNotFound.
func (tx *Tx) GetSandbox(id string) (Sandbox, error) {
	b := tx.tx.Bucket(bucketSandboxes)
	if b == nil {
		return Sandbox{}, errNoSandboxesBuckets
	}
	v := b.Get([]byte(id))
	if v == nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	s, err := decodeSandbox(v)
	if err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: %w: %v", id, ErrCorrupt, err)
	}
	return s, nil
}

// ListSandboxes returns every sandbox, ordered by id. Undecodable values
// are left out and named in an error wrapping ErrCorrupt, as in List.
func (tx *Tx) ListSandboxes() ([]Sandbox, error) {
	b := tx.tx.Bucket(bucketSandboxes)
	if b == nil {
		return nil, errNoSandboxesBuckets
	}
	var out []Sandbox
	var bad []error
	_ = b.ForEach(func(k, v []byte) error {
		s, err := decodeSandbox(v)
		if err != nil {
			bad = append(bad, fmt.Errorf("sandbox %q: %v", k, err))
			return nil
		}
		out = append(out, s)
		return nil
	})
	if len(bad) > 0 {
		return out, fmt.Errorf("list sandboxes: %w: %w", ErrCorrupt, errors.Join(bad...))
	}
	return out, nil
}

// PutSandbox stores s with compare-and-set on its revision (0 creates), as
// Put does for pod records, and appends to the sandbox's history. A VM
// already recorded for another sandbox is ErrConflict (one VM, one sandbox).
func (tx *Tx) PutSandbox(s Sandbox) (Sandbox, error) {
	if err := tx.writable(); err != nil {
		return Sandbox{}, err
	}
	b := tx.tx.Bucket(bucketSandboxes)
	if b == nil {
		return Sandbox{}, errNoSandboxesBuckets
	}
	if s.Node == "" {
		s.Node = tx.l.meta.Node
	}
	if err := s.validate(); err != nil {
		return Sandbox{}, fmt.Errorf("put sandbox: %w", err)
	}
	if s.Node != tx.l.meta.Node {
		return Sandbox{}, fmt.Errorf("put sandbox %s: %w: it is for node %q but this ledger belongs to node %q", s.ID, ErrInvalid, s.Node, tx.l.meta.Node)
	}
	s.IPs, s.CertSerials = slices.Clone(s.IPs), slices.Clone(s.CertSerials)
	action := ActionCreated
	if v := b.Get([]byte(s.ID)); v == nil {
		if s.Revision != 0 {
			return Sandbox{}, fmt.Errorf("put sandbox %s at revision %d: %w: the sandbox is gone", s.ID, s.Revision, ErrConflict)
		}
		s.Revision, s.CreatedAt = 1, tx.now
	} else {
		old, err := decodeSandbox(v)
		if err != nil {
			return Sandbox{}, fmt.Errorf("put sandbox %s: stored value: %w: %v", s.ID, ErrCorrupt, err)
		}
		if s.Revision == 0 {
			return Sandbox{}, fmt.Errorf("put sandbox %s: %w (revision %d)", s.ID, ErrAlreadyExists, old.Revision)
		}
		if s.Revision != old.Revision {
			return Sandbox{}, fmt.Errorf("put sandbox %s: %w: stored revision is %d, the write carried %d", s.ID, ErrConflict, old.Revision, s.Revision)
		}
		action, s.Revision, s.CreatedAt = ActionUpdated, old.Revision+1, old.CreatedAt
	}
	s.UpdatedAt = tx.now
	if s.VMID != "" {
		var owner string
		_ = b.ForEach(func(k, v []byte) error {
			if string(k) == s.ID {
				return nil
			}
			if o, err := decodeSandbox(v); err == nil && o.Provider == s.Provider && o.VMID == s.VMID {
				owner = o.ID
				return errStop
			}
			return nil
		})
		if owner != "" {
			return Sandbox{}, fmt.Errorf("put sandbox %s: %w: VM %s/%s is already recorded for sandbox %s", s.ID, ErrConflict, s.Provider, s.VMID, owner)
		}
	}
	if err := b.Put([]byte(s.ID), encodeSandbox(s)); err != nil {
		return Sandbox{}, fmt.Errorf("put sandbox %s: %w", s.ID, err)
	}
	return s, tx.appendSandboxHistory(action, s)
}

// DeleteSandbox removes a sandbox if it is still at revision; its history
// keeps a final "deleted" entry.
func (tx *Tx) DeleteSandbox(id string, revision uint64) error {
	if err := tx.writable(); err != nil {
		return err
	}
	s, err := tx.GetSandbox(id)
	if err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if s.Revision != revision {
		return fmt.Errorf("delete sandbox %s: %w: stored revision is %d, the delete carried %d", id, ErrConflict, s.Revision, revision)
	}
	if err := tx.tx.Bucket(bucketSandboxes).Delete([]byte(id)); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	s.UpdatedAt = tx.now
	return tx.appendSandboxHistory(ActionDeleted, s)
}

// SandboxHistory returns a sandbox's history, oldest first.
func (tx *Tx) SandboxHistory(id string) ([]SandboxEvent, error) {
	hist := tx.tx.Bucket(bucketSandboxHistory)
	if hist == nil {
		return nil, errNoSandboxesBuckets
	}
	b := hist.Bucket([]byte(id))
	if b == nil {
		return nil, fmt.Errorf("history of sandbox %s: %w", id, ErrNotFound)
	}
	var out []SandboxEvent
	err := b.ForEach(func(k, v []byte) error {
		e, err := decodeSandboxEvent(v)
		if err != nil {
			return fmt.Errorf("history of sandbox %s, entry %x: %w: %v", id, k, ErrCorrupt, err)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

func (tx *Tx) appendSandboxHistory(action Action, s Sandbox) error {
	b, err := tx.tx.Bucket(bucketSandboxHistory).CreateBucketIfNotExists([]byte(s.ID))
	if err != nil {
		return fmt.Errorf("history of sandbox %s: %w", s.ID, err)
	}
	seq, err := b.NextSequence()
	if err != nil {
		return fmt.Errorf("history of sandbox %s: %w", s.ID, err)
	}
	e := SandboxEvent{Seq: seq, Time: tx.now, Action: action, Sandbox: s}
	if err := b.Put(seqKey(seq), encodeSandboxEvent(e)); err != nil {
		return fmt.Errorf("history of sandbox %s: %w", s.ID, err)
	}
	if limit := uint64(tx.l.historyLimit); seq > limit {
		cutoff := seqKey(seq - limit)
		var old [][]byte
		c := b.Cursor()
		for k, _ := c.First(); k != nil && bytes.Compare(k, cutoff) <= 0; k, _ = c.Next() {
			old = append(old, bytes.Clone(k))
		}
		for _, k := range old {
			if err := b.Delete(k); err != nil {
				return fmt.Errorf("trim history of sandbox %s: %w", s.ID, err)
			}
		}
	}
	return nil
}

// PruneSandboxHistory drops, in one transaction, the history of sandboxes
// that have no record and whose last entry is older than before; it
// returns how many it dropped.
func (l *Ledger) PruneSandboxHistory(before time.Time) (int, error) {
	n := 0
	err := l.update(func(btx *bolt.Tx) error {
		n = 0
		hist, recs := btx.Bucket(bucketSandboxHistory), btx.Bucket(bucketSandboxes)
		if hist == nil || recs == nil {
			return nil
		}
		var drop [][]byte
		_ = hist.ForEachBucket(func(k []byte) error {
			if recs.Get(k) != nil {
				return nil
			}
			last, _ := hist.Bucket(k).Cursor().Last()
			if last == nil {
				drop = append(drop, bytes.Clone(k))
				return nil
			}
			if e, err := decodeSandboxEvent(hist.Bucket(k).Get(last)); err == nil && e.Time.Before(before) {
				drop = append(drop, bytes.Clone(k))
			}
			return nil
		})
		for _, k := range drop {
			if err := hist.DeleteBucket(k); err != nil {
				return fmt.Errorf("prune history of sandbox %s: %w", k, err)
			}
		}
		n = len(drop)
		return nil
	})
	return n, err
}

// The ledger methods below each run one transaction.

// GetSandbox returns a sandbox, or ErrNotFound.
func (l *Ledger) GetSandbox(id string) (s Sandbox, err error) {
	err = l.View(func(tx *Tx) error { s, err = tx.GetSandbox(id); return err })
	return s, err
}

// ListSandboxes returns every sandbox; see Tx.ListSandboxes.
func (l *Ledger) ListSandboxes() (ss []Sandbox, err error) {
	err = l.View(func(tx *Tx) error { ss, err = tx.ListSandboxes(); return err })
	return ss, err
}

// PutSandbox stores s durably with compare-and-set; see Tx.PutSandbox.
func (l *Ledger) PutSandbox(s Sandbox) (stored Sandbox, err error) {
	put := func(tx *Tx) error {
		var perr error
		stored, perr = tx.PutSandbox(s)
		return perr
	}
	// Alone, it commits at once; beside other sandboxes' writes of the
	// moment (a burst of StartVM or StopVM calls), it shares their commit.
	defer l.sandboxWrites.Add(-1)
	if l.sandboxWrites.Add(1) == 1 {
		err = l.Update(put)
	} else {
		err = l.batch(put)
	}
	return stored, err
}

// DeleteSandbox removes a sandbox durably if it is still at revision.
func (l *Ledger) DeleteSandbox(id string, revision uint64) error {
	return l.Update(func(tx *Tx) error { return tx.DeleteSandbox(id, revision) })
}

// SandboxHistory returns a sandbox's history, oldest first.
func (l *Ledger) SandboxHistory(id string) (es []SandboxEvent, err error) {
	err = l.View(func(tx *Tx) error { es, err = tx.SandboxHistory(id); return err })
	return es, err
}

// Sandbox value tags. Never reuse a retired number.
const (
	sbID           = 1
	sbPodUID       = 2
	sbNamespace    = 3
	sbName         = 4
	sbNode         = 5
	sbNetNS        = 6
	sbProvider     = 7
	sbVMID         = 8
	sbVMName       = 9
	sbKey          = 10
	sbInstanceType = 11
	sbImage        = 12
	sbIP           = 13 // repeated
	sbAgentSocket  = 14
	sbRelayAddr    = 15
	sbVXLANID      = 16
	sbVXLANPort    = 17
	sbLocalIP      = 18
	sbRemoteIP     = 19
	sbCertSerial   = 20 // repeated
	sbPhase        = 21
	sbReason       = 22
	sbMessage      = 23
	sbAttempt      = 24
	sbCreatedAt    = 25
	sbUpdatedAt    = 26
	sbRevision     = 27
	// 28..39 are left to fields other branches add; the TEE is 40.
	sbConfidential = 40
)

const sandboxEncodingV1 byte = 1

func encodeSandbox(s Sandbox) []byte {
	b := make([]byte, 0, 384)
	b = append(b, sandboxEncodingV1)
	for _, f := range []struct {
		tag uint64
		v   string
	}{
		{sbID, s.ID}, {sbPodUID, s.PodUID}, {sbNamespace, s.Namespace}, {sbName, s.Name}, {sbNode, s.Node},
		{sbNetNS, s.NetNS}, {sbProvider, s.Provider}, {sbVMID, s.VMID}, {sbVMName, s.VMName}, {sbKey, s.Key},
		{sbInstanceType, s.InstanceType}, {sbImage, s.Image}, {sbAgentSocket, s.AgentSocket},
		{sbRelayAddr, s.RelayAddr}, {sbLocalIP, s.Tunnel.LocalIP}, {sbRemoteIP, s.Tunnel.RemoteIP},
		{sbPhase, string(s.Phase)}, {sbReason, s.Reason}, {sbMessage, s.Message},
		{sbConfidential, s.Confidential},
	} {
		b = appendString(b, f.tag, f.v)
	}
	for _, ip := range s.IPs {
		b = appendField(b, sbIP, []byte(ip))
	}
	for _, c := range s.CertSerials {
		b = appendField(b, sbCertSerial, []byte(c))
	}
	b = appendUint(b, sbVXLANID, uint64(max(s.Tunnel.VXLANID, 0)))
	b = appendUint(b, sbVXLANPort, uint64(max(s.Tunnel.Port, 0)))
	b = appendUint(b, sbAttempt, uint64(max(s.Attempt, 0)))
	b = appendTime(b, sbCreatedAt, s.CreatedAt)
	b = appendTime(b, sbUpdatedAt, s.UpdatedAt)
	b = appendUint(b, sbRevision, s.Revision)
	return append(b, s.unknown...)
}

func decodeSandbox(data []byte) (Sandbox, error) {
	var s Sandbox
	if len(data) == 0 {
		return s, errors.New("empty value")
	}
	if data[0] != sandboxEncodingV1 {
		return s, fmt.Errorf("unknown sandbox encoding version %d (this caa reads %d)", data[0], sandboxEncodingV1)
	}
	strs := map[uint64]*string{
		sbID: &s.ID, sbPodUID: &s.PodUID, sbNamespace: &s.Namespace, sbName: &s.Name, sbNode: &s.Node,
		sbNetNS: &s.NetNS, sbProvider: &s.Provider, sbVMID: &s.VMID, sbVMName: &s.VMName, sbKey: &s.Key,
		sbInstanceType: &s.InstanceType, sbImage: &s.Image, sbAgentSocket: &s.AgentSocket,
		sbRelayAddr: &s.RelayAddr, sbLocalIP: &s.Tunnel.LocalIP, sbRemoteIP: &s.Tunnel.RemoteIP,
		sbReason: &s.Reason, sbMessage: &s.Message, sbConfidential: &s.Confidential,
	}
	err := eachField(data[1:], func(tag uint64, v []byte) error {
		if p, ok := strs[tag]; ok {
			*p = string(v)
			return nil
		}
		var err error
		var n uint64
		switch tag {
		case sbPhase:
			s.Phase = SandboxPhase(v)
		case sbIP:
			s.IPs = append(s.IPs, string(v))
		case sbCertSerial:
			s.CertSerials = append(s.CertSerials, string(v))
		case sbVXLANID, sbVXLANPort, sbAttempt:
			if n, err = fieldUint(v); err == nil && n > maxAttempt {
				err = fmt.Errorf("number %d out of range", n)
			}
			switch tag {
			case sbVXLANID:
				s.Tunnel.VXLANID = int(n)
			case sbVXLANPort:
				s.Tunnel.Port = int(n)
			default:
				s.Attempt = int(n)
			}
		case sbCreatedAt:
			s.CreatedAt, err = fieldTime(v)
		case sbUpdatedAt:
			s.UpdatedAt, err = fieldTime(v)
		case sbRevision:
			s.Revision, err = fieldUint(v)
		default:
			s.unknown = appendField(s.unknown, tag, v)
		}
		if err != nil {
			return fmt.Errorf("field %d: %w", tag, err)
		}
		return nil
	})
	if err != nil {
		return Sandbox{}, err
	}
	if s.ID == "" {
		return Sandbox{}, errors.New("sandbox has no id")
	}
	return s, nil
}

func encodeSandboxEvent(e SandboxEvent) []byte {
	sb := encodeSandbox(e.Sandbox)
	b := make([]byte, 0, len(sb)+32)
	b = append(b, eventEncodingV1)
	b = appendUint(b, tagEventSeq, e.Seq)
	b = appendTime(b, tagEventTime, e.Time)
	b = appendString(b, tagEventAction, string(e.Action))
	return appendField(b, tagEventRecord, sb)
}

func decodeSandboxEvent(data []byte) (SandboxEvent, error) {
	var e SandboxEvent
	if len(data) == 0 || data[0] != eventEncodingV1 {
		return e, errors.New("empty value or unknown event encoding")
	}
	err := eachField(data[1:], func(tag uint64, v []byte) error {
		var err error
		switch tag {
		case tagEventSeq:
			e.Seq, err = fieldUint(v)
		case tagEventTime:
			e.Time, err = fieldTime(v)
		case tagEventAction:
			e.Action = Action(v)
		case tagEventRecord:
			e.Sandbox, err = decodeSandbox(v)
		}
		return err
	})
	if err != nil {
		return SandboxEvent{}, err
	}
	return e, nil
}

// countSandboxes counts the sandboxes by phase, and those that do not
// decode; a ledger without the bucket (schema 1) has none.
func (tx *Tx) countSandboxes() (n int, byPhase map[SandboxPhase]int, undecodable int) {
	b := tx.tx.Bucket(bucketSandboxes)
	if b == nil {
		return 0, nil, 0
	}
	_ = b.ForEach(func(_, v []byte) error {
		s, err := decodeSandbox(v)
		if err != nil {
			undecodable++
			return nil
		}
		if byPhase == nil {
			byPhase = map[SandboxPhase]int{}
		}
		n++
		byPhase[s.Phase]++
		return nil
	})
	return n, byPhase, undecodable
}

// verifySandboxes checks the sandbox buckets for Verify: every record and
// history entry decodes, is stored under its own id and is valid for this
// node; a running sandbox names what serving it again needs; no VM belongs
// to two sandboxes, nor to a sandbox and a pod record; no two sandboxes
// share a VXLAN id.
func verifySandboxes(btx *bolt.Tx, m Meta, add func(where, format string, args ...any)) {
	sbs, hist := btx.Bucket(bucketSandboxes), btx.Bucket(bucketSandboxHistory)
	if sbs == nil || hist == nil {
		if m.SchemaVersion >= 2 {
			add("buckets", "sandboxes or sandboxHistory bucket missing in a schema %d ledger", m.SchemaVersion)
		}
		return
	}
	vmOwner := map[string]string{}
	vxlanOwner := map[int]string{}
	vms := btx.Bucket(bucketVMs)
	_ = sbs.ForEach(func(k, v []byte) error {
		where := "sandboxes/" + string(k)
		s, err := decodeSandbox(v)
		if err != nil {
			add(where, "does not decode: %v", err)
			return nil
		}
		if s.ID != string(k) {
			add(where, "holds sandbox id %q", s.ID)
		}
		if err := s.validate(); err != nil {
			add(where, "%v", err)
		}
		if m.Node != "" && s.Node != m.Node {
			add(where, "is for node %q, the ledger for %q", s.Node, m.Node)
		}
		if s.Phase == SandboxRunning && (s.VMID == "" || s.RelayAddr == "" || s.AgentSocket == "") {
			add(where, "is Running but does not name its VM (%q), its forwarder (%q) and its agent socket (%q): it cannot be served again",
				s.VMID, s.RelayAddr, s.AgentSocket)
		}
		if s.Phase == SandboxCreating && s.Key == "" {
			add(where, "is Creating without an idempotency key: a create resumed after a crash could make a second VM")
		}
		if s.VMID != "" {
			vk := string(vmKey(s.Provider, s.VMID))
			if o, ok := vmOwner[vk]; ok {
				add(where, "VM %s/%s is also recorded for sandbox %s", s.Provider, s.VMID, o)
			}
			vmOwner[vk] = s.ID
			if vms != nil {
				if pod := vms.Get([]byte(vk)); pod != nil {
					add(where, "VM %s/%s is also recorded for pod %s", s.Provider, s.VMID, pod)
				}
			}
		}
		if id := s.Tunnel.VXLANID; id != 0 {
			if o, ok := vxlanOwner[id]; ok {
				add(where, "VXLAN id %d is also sandbox %s's", id, o)
			}
			vxlanOwner[id] = s.ID
		}
		return nil
	})
	_ = hist.ForEachBucket(func(k []byte) error {
		_ = hist.Bucket(k).ForEach(func(sk, v []byte) error {
			where := fmt.Sprintf("sandboxHistory/%s/%x", k, sk)
			e, err := decodeSandboxEvent(v)
			if err != nil {
				add(where, "does not decode: %v", err)
			} else if e.Sandbox.ID != string(k) {
				add(where, "holds an entry of sandbox %q", e.Sandbox.ID)
			}
			return nil
		})
		return nil
	})
}

// ParseSandboxPhase accepts a phase name in any letter case.
func ParseSandboxPhase(s string) (SandboxPhase, error) {
	for _, p := range SandboxPhases {
		if strings.EqualFold(string(p), s) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: unknown sandbox phase %q", ErrInvalid, s)
}
