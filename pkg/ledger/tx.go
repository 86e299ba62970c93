package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Tx is one ledger transaction. Its methods never open transactions of
// their own, so several calls inside one Update commit together or not at all.
type Tx struct {
	tx  *bolt.Tx
	l   *Ledger
	now time.Time
}

// Get returns the record of a pod, or ErrNotFound.
func (tx *Tx) Get(podUID string) (Record, error) {
	v := tx.tx.Bucket(bucketRecords).Get([]byte(podUID))
	if v == nil {
		return Record{}, fmt.Errorf("record %s: %w", podUID, ErrNotFound)
	}
	r, err := decodeRecord(v)
	if err != nil {
		return Record{}, fmt.Errorf("record %s: %w: %v", podUID, ErrCorrupt, err)
	}
	return r, nil
}

// List returns the records that match f, ordered by pod UID. A record that
// does not decode is left out and named in the returned error (which wraps
// ErrCorrupt); the records returned alongside are still good to use.
func (tx *Tx) List(f Filter) ([]Record, error) {
	var out []Record
	var bad []error
	err := tx.tx.Bucket(bucketRecords).ForEach(func(k, v []byte) error {
		r, err := decodeRecord(v)
		if err != nil {
			bad = append(bad, fmt.Errorf("record %q: %v", k, err))
			return nil
		}
		if f.match(r) {
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list records: %w", err)
	}
	if len(bad) > 0 {
		return out, fmt.Errorf("list records: %w: %d undecodable: %w", ErrCorrupt, len(bad), errors.Join(bad...))
	}
	return out, nil
}

// Put stores r with compare-and-set on its revision: Revision 0 creates and
// fails with ErrAlreadyExists if the pod has a record; any other revision
// must equal the stored one or the write fails with ErrConflict. The ledger
// sets Node (when empty), Revision, CreatedAt and UpdatedAt, keeps the VM
// index in step, appends a history entry and returns the stored record.
// A VM already indexed to another pod is ErrConflict (one VM, one pod).
func (tx *Tx) Put(r Record) (Record, error) {
	if err := tx.writable(); err != nil {
		return Record{}, err
	}
	if r.Node == "" {
		r.Node = tx.l.meta.Node
	}
	if err := r.validate(); err != nil {
		return Record{}, fmt.Errorf("put record: %w", err)
	}
	if r.Node != tx.l.meta.Node {
		return Record{}, fmt.Errorf("put record %s: %w: it is for node %q but this ledger belongs to node %q",
			r.PodUID, ErrInvalid, r.Node, tx.l.meta.Node)
	}
	r.IPs = slices.Clone(r.IPs)
	key := []byte(r.PodUID)
	recs := tx.tx.Bucket(bucketRecords)
	vms := tx.tx.Bucket(bucketVMs)

	action := ActionCreated
	var old Record
	if v := recs.Get(key); v == nil {
		if r.Revision != 0 {
			return Record{}, fmt.Errorf("put record %s at revision %d: %w: the record is gone (deleted since it was read)",
				r.PodUID, r.Revision, ErrConflict)
		}
		r.Revision = 1
		r.CreatedAt = tx.now
	} else {
		var err error
		if old, err = decodeRecord(v); err != nil {
			return Record{}, fmt.Errorf("put record %s: stored value: %w: %v", r.PodUID, ErrCorrupt, err)
		}
		if r.Revision == 0 {
			return Record{}, fmt.Errorf("put record %s: %w (revision %d); update it with that revision", r.PodUID, ErrAlreadyExists, old.Revision)
		}
		if r.Revision != old.Revision {
			return Record{}, fmt.Errorf("put record %s: %w: stored revision is %d, the write carried %d; re-read and retry",
				r.PodUID, ErrConflict, old.Revision, r.Revision)
		}
		action = ActionUpdated
		r.Revision = old.Revision + 1
		r.CreatedAt = old.CreatedAt
	}
	r.UpdatedAt = tx.now

	// Every check comes before the first write, so a refused Put leaves the
	// transaction as it found it even when the caller goes on to commit.
	vk := vmKey(r.Provider, r.VMID)
	if r.VMID != "" {
		if owner := vms.Get(vk); owner != nil && !bytes.Equal(owner, key) {
			return Record{}, fmt.Errorf("put record %s: %w: VM %s/%s is already recorded for pod %s",
				r.PodUID, ErrConflict, r.Provider, r.VMID, owner)
		}
	}
	if old.VMID != "" && (old.Provider != r.Provider || old.VMID != r.VMID) {
		if err := vms.Delete(vmKey(old.Provider, old.VMID)); err != nil {
			return Record{}, fmt.Errorf("put record %s: unindex VM %s: %w", r.PodUID, old.VMID, err)
		}
	}
	if r.VMID != "" {
		if err := vms.Put(vk, key); err != nil {
			return Record{}, fmt.Errorf("put record %s: index VM: %w", r.PodUID, err)
		}
	}
	if err := recs.Put(key, encodeRecord(r)); err != nil {
		return Record{}, fmt.Errorf("put record %s: %w", r.PodUID, err)
	}
	if err := tx.appendHistory(action, r); err != nil {
		return Record{}, err
	}
	return r, nil
}

// Delete removes the record of a pod if it is still at revision; its VM
// leaves the index and its history keeps a final "deleted" entry.
func (tx *Tx) Delete(podUID string, revision uint64) error {
	if err := tx.writable(); err != nil {
		return err
	}
	r, err := tx.Get(podUID)
	if err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if r.Revision != revision {
		return fmt.Errorf("delete record %s: %w: stored revision is %d, the delete carried %d; re-read and retry",
			podUID, ErrConflict, r.Revision, revision)
	}
	if r.VMID != "" {
		if err := tx.tx.Bucket(bucketVMs).Delete(vmKey(r.Provider, r.VMID)); err != nil {
			return fmt.Errorf("delete record %s: unindex VM: %w", podUID, err)
		}
	}
	if err := tx.tx.Bucket(bucketRecords).Delete([]byte(podUID)); err != nil {
		return fmt.Errorf("delete record %s: %w", podUID, err)
	}
	r.UpdatedAt = tx.now
	return tx.appendHistory(ActionDeleted, r)
}

// History returns a pod's history, oldest first, or ErrNotFound when the
// ledger has never seen the pod.
func (tx *Tx) History(podUID string) ([]Event, error) {
	b := tx.tx.Bucket(bucketHistory).Bucket([]byte(podUID))
	if b == nil {
		return nil, fmt.Errorf("history of %s: %w", podUID, ErrNotFound)
	}
	var out []Event
	err := b.ForEach(func(k, v []byte) error {
		e, err := decodeEvent(v)
		if err != nil {
			return fmt.Errorf("history of %s, entry %x: %w: %v", podUID, k, ErrCorrupt, err)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

// HistoryPods lists the pod UIDs that have a history, record or not.
func (tx *Tx) HistoryPods() ([]string, error) {
	var out []string
	err := tx.tx.Bucket(bucketHistory).ForEachBucket(func(k []byte) error {
		out = append(out, string(k))
		return nil
	})
	return out, err
}

func (tx *Tx) appendHistory(action Action, r Record) error {
	b, err := tx.tx.Bucket(bucketHistory).CreateBucketIfNotExists([]byte(r.PodUID))
	if err != nil {
		return fmt.Errorf("history of %s: %w", r.PodUID, err)
	}
	seq, err := b.NextSequence()
	if err != nil {
		return fmt.Errorf("history of %s: %w", r.PodUID, err)
	}
	e := Event{Seq: seq, Time: tx.now, Action: action, Record: r}
	if err := b.Put(seqKey(seq), encodeEvent(e)); err != nil {
		return fmt.Errorf("history of %s: %w", r.PodUID, err)
	}
	// Sequences are contiguous per pod, so everything at or below seq-limit
	// is past the bound.
	limit := uint64(tx.l.historyLimit)
	if seq <= limit {
		return nil
	}
	cutoff := seqKey(seq - limit)
	var old [][]byte
	c := b.Cursor()
	for k, _ := c.First(); k != nil && bytes.Compare(k, cutoff) <= 0; k, _ = c.Next() {
		old = append(old, bytes.Clone(k))
	}
	for _, k := range old {
		if err := b.Delete(k); err != nil {
			return fmt.Errorf("trim history of %s: %w", r.PodUID, err)
		}
	}
	return nil
}

func (tx *Tx) writable() error {
	if !tx.tx.Writable() {
		return fmt.Errorf("ledger %s: %w", tx.l.path, ErrReadOnly)
	}
	return nil
}

func vmKey(provider, vmID string) []byte {
	k := make([]byte, 0, len(provider)+1+len(vmID))
	k = append(k, provider...)
	k = append(k, 0)
	return append(k, vmID...)
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }
