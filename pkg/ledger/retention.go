package ledger

import (
	"bytes"
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Defaults for PruneDeleted and HistoryPage.
const (
	// DefaultPruneBatch is how many pods' histories one write transaction
	// of PruneDeleted removes at most.
	DefaultPruneBatch = 100
	// DefaultHistoryPagePods is how many pods' histories one HistoryPage
	// reads at most.
	DefaultHistoryPagePods = 100
	// MaxHistoryPagePods caps the pods per HistoryPage, whatever is asked.
	MaxHistoryPagePods = 1000

	// pruneScanFactor bounds the history buckets one read transaction of
	// PruneDeleted looks at: this many times the batch.
	pruneScanFactor = 10
)

// Pruned counts what PruneDeleted removed.
type Pruned struct {
	// Pods is the number of deleted pods whose whole history was removed.
	Pods int `json:"pods"`
	// Entries is the number of history entries those pods had.
	Entries int `json:"entries"`
}

// PruneDeleted removes the history of every deleted pod (a pod with a
// history but no record) whose newest history entry is older than before.
// Pods that still have a record keep their history whatever its age; it is
// bounded per pod by Options.HistoryLimit.
//
// The work is split so that neither readers nor the daemon's own writes
// wait long: the history buckets are scanned in read transactions of at
// most 10×batch pods each, and the candidates found are removed in write
// transactions of at most batch pods each (batch <= 0 means
// DefaultPruneBatch). A candidate is checked again inside the write
// transaction, so a pod that came back meanwhile keeps its history. Each
// write transaction is durable when it commits: when ctx is done or a
// write fails, PruneDeleted stops and returns what it removed so far along
// with the error.
//
// A daemon calls it periodically with before = now - retention; without
// it, a node that churns pods grows its ledger without bound.
func (l *Ledger) PruneDeleted(ctx context.Context, before time.Time, batch int) (Pruned, error) {
	var done Pruned
	if l.readOnly {
		return done, fmt.Errorf("prune history of %s: %w", l.path, ErrReadOnly)
	}
	if batch <= 0 {
		batch = DefaultPruneBatch
	}
	var after []byte // the last history bucket looked at; nil before the first
	for {
		if err := ctx.Err(); err != nil {
			return done, fmt.Errorf("prune history of %s: %w", l.path, err)
		}
		var cands [][]byte
		var end bool
		err := l.view(func(btx *bolt.Tx) error {
			cands, after, end = scanPrunable(btx, after, before, batch, batch*pruneScanFactor)
			return nil
		})
		if err != nil {
			return done, fmt.Errorf("prune history of %s: %w", l.path, err)
		}
		if len(cands) > 0 {
			var got Pruned
			err := l.update(func(btx *bolt.Tx) error {
				got = Pruned{}
				hist := btx.Bucket(bucketHistory)
				recs := btx.Bucket(bucketRecords)
				for _, k := range cands {
					if !prunable(hist, recs, k, before) {
						continue
					}
					got.Entries += hist.Bucket(k).Stats().KeyN
					if err := hist.DeleteBucket(k); err != nil {
						return fmt.Errorf("remove history of %s: %w", k, err)
					}
					got.Pods++
				}
				return nil
			})
			if err != nil {
				return done, fmt.Errorf("prune history of %s: %w", l.path, err)
			}
			done.Pods += got.Pods
			done.Entries += got.Entries
		}
		if end {
			return done, nil
		}
	}
}

// scanPrunable looks at up to scan history buckets whose key follows after
// (from the first when after is nil) and returns those that prunable
// accepts, at most limit, the last key it looked at, and whether it
// reached the end of the history.
func scanPrunable(btx *bolt.Tx, after []byte, before time.Time, limit, scan int) (cands [][]byte, last []byte, end bool) {
	hist := btx.Bucket(bucketHistory)
	recs := btx.Bucket(bucketRecords)
	c := hist.Cursor()
	k, v := seekAfter(c, after)
	last = after
	for seen := 0; k != nil; k, v = c.Next() {
		if v != nil {
			continue // not a bucket: no pod's history
		}
		if seen == scan || len(cands) == limit {
			return cands, last, false
		}
		seen++
		last = bytes.Clone(k)
		if prunable(hist, recs, k, before) {
			cands = append(cands, last)
		}
	}
	return cands, last, true
}

// seekAfter positions c on the first key after after, or on the first key
// when after is nil.
func seekAfter(c *bolt.Cursor, after []byte) (k, v []byte) {
	if after == nil {
		return c.First()
	}
	k, v = c.Seek(after)
	if k != nil && bytes.Equal(k, after) {
		k, v = c.Next()
	}
	return k, v
}

// prunable says whether the history of pod uid may go: the pod has no
// record, and its newest entry is older than before (or is missing or
// unreadable, which no reader could use anyway).
func prunable(hist, recs *bolt.Bucket, uid []byte, before time.Time) bool {
	if recs.Get(uid) != nil {
		return false
	}
	b := hist.Bucket(uid)
	if b == nil {
		return false
	}
	_, v := b.Cursor().Last()
	if v == nil {
		return true
	}
	e, err := decodeEvent(v)
	return err != nil || e.Time.Before(before)
}

// HistoryPage is a slice of every pod's history, pods in UID order.
type HistoryPage struct {
	// Events holds the whole history of each pod in the page, one pod after
	// the other, each pod's oldest entry first.
	Events []Event `json:"events"`
	// Next is the cursor of the following page: pass it as after. It is
	// empty on the last page.
	Next string `json:"next,omitempty"`
}

// HistoryPage reads the histories of at most pods pods (deleted pods
// included) whose UIDs follow after in byte order; after "" starts at the
// first. pods <= 0 means DefaultHistoryPagePods and more than
// MaxHistoryPagePods means that many. Each page is one short read
// transaction, so a reader walking every page never holds the file for
// long (a long read transaction keeps bbolt from remapping a growing file
// and from reusing freed pages). The pages together are not one snapshot:
// a pod written between two pages shows as it was when its page was read.
func (l *Ledger) HistoryPage(after string, pods int) (HistoryPage, error) {
	if pods <= 0 {
		pods = DefaultHistoryPagePods
	}
	pods = min(pods, MaxHistoryPagePods)
	var page HistoryPage
	err := l.View(func(tx *Tx) error {
		page = HistoryPage{}
		hist := tx.tx.Bucket(bucketHistory)
		c := hist.Cursor()
		var start []byte
		if after != "" {
			start = []byte(after)
		}
		n := 0
		for k, v := seekAfter(c, start); k != nil; k, v = c.Next() {
			if v != nil {
				continue
			}
			if n == pods {
				return nil
			}
			es, err := tx.History(string(k))
			if err != nil {
				return err
			}
			page.Events = append(page.Events, es...)
			page.Next = string(k)
			n++
		}
		page.Next = ""
		return nil
	})
	return page, err
}
