package ledger

import (
	"bytes"
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"
)

// Problem is one inconsistency Verify found.
type Problem struct {
	// Where names the bucket and key, e.g. "records/<uid>".
	Where string `json:"where"`
	What  string `json:"what"`
}

func (p Problem) String() string { return p.Where + ": " + p.What }

// Verify checks the file (bbolt's page consistency), the meta bucket, that
// every record and history entry decodes and is valid for this node, and
// that the VM index and the records agree both ways. It returns every
// problem found; the error is only for a failure to run the check at all.
func (l *Ledger) Verify() ([]Problem, error) {
	var probs []Problem
	add := func(where, format string, args ...any) {
		probs = append(probs, Problem{Where: where, What: fmt.Sprintf(format, args...)})
	}
	if info, err := os.Stat(l.path); err != nil {
		return nil, fmt.Errorf("verify ledger %s: %w", l.path, err)
	} else if info.Mode().Perm()&^fileMode != 0 {
		add("file", "mode is %o, want %o (it may be read by other users)", info.Mode().Perm(), fileMode)
	}
	// bbolt's Check runs in a goroutine of its own, outside guard, where a
	// page that points past the file is a fatal fault: walk every bucket
	// under guard first, and run Check only on a tree that walked cleanly.
	if err := l.view(walkAll); err != nil {
		return append(probs, Problem{Where: "file", What: err.Error()}), nil
	}
	err := l.view(func(btx *bolt.Tx) error {
		for err := range btx.Check() {
			add("bbolt", "%v", err)
		}
		m, err := readMeta(btx)
		if err != nil {
			add("meta", "%v", err)
		}
		switch {
		case m.SchemaVersion > currentSchema && compatOf(btx, m.SchemaVersion) <= currentSchema:
			// Written by a newer caa, rollback-compatible: fine.
		case m.SchemaVersion != currentSchema:
			add("meta/schema", "version %d, this caa expects %d", m.SchemaVersion, currentSchema)
		case m.ID == "" || m.Node == "" || m.Cluster == "":
			add("meta", "id, node or cluster missing (id %q, node %q, cluster %q)", m.ID, m.Node, m.Cluster)
		}
		recs, vms, hist := btx.Bucket(bucketRecords), btx.Bucket(bucketVMs), btx.Bucket(bucketHistory)
		if recs == nil || vms == nil || hist == nil {
			add("buckets", "records, vms or history bucket missing")
			return nil
		}
		_ = recs.ForEach(func(k, v []byte) error {
			where := "records/" + string(k)
			r, err := decodeRecord(v)
			if err != nil {
				add(where, "does not decode: %v", err)
				return nil
			}
			if r.PodUID != string(k) {
				add(where, "holds pod UID %q", r.PodUID)
			}
			if err := r.validate(); err != nil {
				add(where, "%v", err)
			}
			if m.Node != "" && r.Node != m.Node {
				add(where, "is for node %q, the ledger for %q", r.Node, m.Node)
			}
			if r.VMID != "" {
				if owner := vms.Get(vmKey(r.Provider, r.VMID)); !bytes.Equal(owner, k) {
					add(where, "VM %s/%s is not indexed to this pod (index says %q)", r.Provider, r.VMID, owner)
				}
			}
			return nil
		})
		_ = vms.ForEach(func(k, v []byte) error {
			provider, vmID, ok := bytes.Cut(k, []byte{0})
			if !ok {
				add(fmt.Sprintf("vms/%q", k), "index key has no provider separator")
				return nil
			}
			where := fmt.Sprintf("vms/%s/%s", provider, vmID)
			rv := recs.Get(v)
			if rv == nil {
				add(where, "points at pod %s, which has no record", v)
				return nil
			}
			if r, err := decodeRecord(rv); err == nil && (r.Provider != string(provider) || r.VMID != string(vmID)) {
				add(where, "points at pod %s, whose record names VM %s/%s", v, r.Provider, r.VMID)
			}
			return nil
		})
		_ = hist.ForEachBucket(func(k []byte) error {
			_ = hist.Bucket(k).ForEach(func(sk, v []byte) error {
				if _, err := decodeEvent(v); err != nil {
					add(fmt.Sprintf("history/%s/%x", k, sk), "does not decode: %v", err)
				}
				return nil
			})
			return nil
		})
		verifySandboxes(btx, m, add)
		return nil
	})
	if err != nil {
		probs = append(probs, Problem{Where: "file", What: err.Error()})
	}
	return probs, nil
}

// walkAll reads every key of every bucket, nested ones included.
func walkAll(btx *bolt.Tx) error {
	var visit func(b *bolt.Bucket) error
	visit = func(b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				if child := b.Bucket(k); child != nil {
					return visit(child)
				}
			}
			return nil
		})
	}
	return btx.ForEach(func(_ []byte, b *bolt.Bucket) error { return visit(b) })
}
