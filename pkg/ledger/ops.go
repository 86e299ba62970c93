package ledger

import (
	"bytes"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The methods below each run one transaction (Stats reads the history in
// several); use View or Update with the Tx methods of the same names to
// compose several.

// Get returns the record of a pod, or ErrNotFound.
func (l *Ledger) Get(podUID string) (r Record, err error) {
	err = l.View(func(tx *Tx) error { r, err = tx.Get(podUID); return err })
	return r, err
}

// List returns the records that match f; see Tx.List for partial results.
func (l *Ledger) List(f Filter) (rs []Record, err error) {
	err = l.View(func(tx *Tx) error { rs, err = tx.List(f); return err })
	return rs, err
}

// Put stores r durably with compare-and-set; see Tx.Put.
func (l *Ledger) Put(r Record) (stored Record, err error) {
	err = l.Update(func(tx *Tx) error { stored, err = tx.Put(r); return err })
	return stored, err
}

// Delete removes a pod's record durably if it is still at revision.
func (l *Ledger) Delete(podUID string, revision uint64) error {
	return l.Update(func(tx *Tx) error { return tx.Delete(podUID, revision) })
}

// History returns a pod's history, oldest first.
func (l *Ledger) History(podUID string) (es []Event, err error) {
	err = l.View(func(tx *Tx) error { es, err = tx.History(podUID); return err })
	return es, err
}

// Stats summarises a ledger for `caa ledger stats` and the daemon's metrics.
type Stats struct {
	Path           string         `json:"path"`
	Meta           Meta           `json:"meta"`
	FileBytes      int64          `json:"fileBytes"`
	Records        int            `json:"records"`
	ByPhase        map[Phase]int  `json:"byPhase"`
	Undecodable    int            `json:"undecodable"`
	IndexedVMs     int            `json:"indexedVMs"`
	HistoryPods    int            `json:"historyPods"`
	HistoryEntries int            `json:"historyEntries"`
	HistoryLimit   int            `json:"historyLimit"`
	Oldest         time.Time      `json:"oldestRecord,omitzero"`
	Newest         time.Time      `json:"newestRecord,omitzero"`
	Providers      map[string]int `json:"providers,omitempty"`
	// Sandboxes counts the kata sandboxes (remote hypervisor mode) by
	// phase; undecodable ones are in Undecodable.
	Sandboxes        int                  `json:"sandboxes"`
	SandboxesByPhase map[SandboxPhase]int `json:"sandboxesByPhase,omitempty"`
}

// Stats counts records by phase, the index and the history.
func (l *Ledger) Stats() (Stats, error) {
	s := Stats{Path: l.path, Meta: l.meta, ByPhase: map[Phase]int{}, HistoryLimit: l.historyLimit}
	for _, p := range Phases {
		s.ByPhase[p] = 0
	}
	if info, err := os.Stat(l.path); err == nil {
		s.FileBytes = info.Size()
	}
	err := l.View(func(tx *Tx) error {
		recs, err := tx.List(Filter{})
		if err != nil {
			s.Undecodable = countUndecodable(tx)
		}
		s.Records = len(recs)
		for _, r := range recs {
			s.ByPhase[r.Phase]++
			if r.Provider != "" {
				if s.Providers == nil {
					s.Providers = map[string]int{}
				}
				s.Providers[r.Provider]++
			}
			if s.Oldest.IsZero() || r.CreatedAt.Before(s.Oldest) {
				s.Oldest = r.CreatedAt
			}
			if r.CreatedAt.After(s.Newest) {
				s.Newest = r.CreatedAt
			}
		}
		s.IndexedVMs = tx.tx.Bucket(bucketVMs).Stats().KeyN
		var bad int
		s.Sandboxes, s.SandboxesByPhase, bad = tx.countSandboxes()
		s.Undecodable += bad
		return nil
	})
	if err != nil {
		return s, err
	}
	// The history, deleted pods included, can be much larger than the
	// records: count it a page of pods per read transaction.
	var after []byte
	for end := false; !end; {
		err := l.view(func(btx *bolt.Tx) error {
			hist := btx.Bucket(bucketHistory)
			c := hist.Cursor()
			n := 0
			for k, v := seekAfter(c, after); k != nil; k, v = c.Next() {
				if v != nil {
					continue
				}
				if n == MaxHistoryPagePods {
					return nil
				}
				s.HistoryPods++
				s.HistoryEntries += hist.Bucket(k).Stats().KeyN
				after = bytes.Clone(k)
				n++
			}
			end = true
			return nil
		})
		if err != nil {
			return s, err
		}
	}
	return s, nil
}

func countUndecodable(tx *Tx) int {
	n := 0
	_ = tx.tx.Bucket(bucketRecords).ForEach(func(_, v []byte) error {
		if _, err := decodeRecord(v); err != nil {
			n++
		}
		return nil
	})
	return n
}
