package ledger

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// commits is the id of the last committed write transaction: it grows by
// one with every commit.
func commits(t testing.TB, l *Ledger) int {
	t.Helper()
	var id int
	require.NoError(t, l.view(func(btx *bolt.Tx) error { id = btx.ID(); return nil }))
	return id
}

// lifecycle creates a pod, moves it to Running on a VM and deletes it.
func lifecycle(t testing.TB, l *Ledger, uid string) {
	t.Helper()
	r := mustPut(t, l, podRecord(uid))
	r = withVM(r, "i-"+uid)
	r.Phase = PhaseRunning
	r = mustPut(t, l, r)
	require.NoError(t, l.Delete(uid, r.Revision))
}

func TestPruneDeleted(t *testing.T) {
	l, clock := newTestLedger(t)
	ctx := context.Background()
	live := mustPut(t, l, podRecord("uid-live"))
	lifecycle(t, l, "uid-old")
	clock.Advance(time.Hour)
	cutoff := clock.Advance(time.Minute)
	clock.Advance(time.Minute)
	lifecycle(t, l, "uid-new")
	// The live pod's history is as old as the pruned one's, but it still
	// has a record.
	require.Equal(t, testEpoch, live.UpdatedAt)

	got, err := l.PruneDeleted(ctx, cutoff, 0)
	require.NoError(t, err)
	assert.Equal(t, Pruned{Pods: 1, Entries: 3}, got)
	pods, err := historyPods(l)
	require.NoError(t, err)
	assert.Equal(t, []string{"uid-live", "uid-new"}, pods)
	_, err = l.History("uid-old")
	assert.ErrorIs(t, err, ErrNotFound)

	got, err = l.PruneDeleted(ctx, cutoff, 0)
	require.NoError(t, err)
	assert.Zero(t, got, "pruning again finds nothing")

	// An entry exactly at the cutoff is not older than it.
	got, err = l.PruneDeleted(ctx, clock.Now(), 0)
	require.NoError(t, err)
	assert.Zero(t, got)
	got, err = l.PruneDeleted(ctx, clock.Now().Add(time.Nanosecond), 0)
	require.NoError(t, err)
	assert.Equal(t, Pruned{Pods: 1, Entries: 3}, got)
	pods, err = historyPods(l)
	require.NoError(t, err)
	assert.Equal(t, []string{"uid-live"}, pods)
	assertVerifies(t, l)
}

func TestPruneDeletedWorksInBatches(t *testing.T) {
	l, clock := newTestLedger(t)
	// 30 pods in UID order: every third keeps its record, the other 20 are
	// deleted and old enough to go.
	for i := range 30 {
		uid := fmt.Sprintf("uid-%02d", i)
		if i%3 == 0 {
			mustPut(t, l, podRecord(uid))
		} else {
			lifecycle(t, l, uid)
		}
	}
	cutoff := clock.Advance(time.Hour)

	writesBefore := commits(t, l)
	readsBefore := l.db.Stats().TxN
	got, err := l.PruneDeleted(context.Background(), cutoff, 3)
	require.NoError(t, err)
	assert.Equal(t, Pruned{Pods: 20, Entries: 60}, got)

	// 20 pods, at most 3 per write transaction.
	assert.Equal(t, 7, commits(t, l)-writesBefore, "write transactions")
	// Each read looks at 30 buckets at most and stops at 3 candidates, so
	// the scan took several short reads, not one long one.
	assert.GreaterOrEqual(t, l.db.Stats().TxN-readsBefore, 7, "read transactions")

	pods, err := historyPods(l)
	require.NoError(t, err)
	assert.Len(t, pods, 10)
	for _, uid := range pods {
		_, err := l.Get(uid)
		assert.NoError(t, err, "only pods with a record keep their history")
	}
	assertVerifies(t, l)
}

func TestPruneDeletedStopsWhenCancelled(t *testing.T) {
	l, clock := newTestLedger(t)
	for i := range 5 {
		lifecycle(t, l, fmt.Sprintf("uid-%d", i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	got, err := l.PruneDeleted(ctx, clock.Advance(time.Hour), 2)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), l.Path())
	assert.Zero(t, got)
	pods, err := historyPods(l)
	require.NoError(t, err)
	assert.Len(t, pods, 5, "nothing removed")
}

func TestHistoryPage(t *testing.T) {
	l, clock := newTestLedger(t)
	for i := range 7 {
		uid := fmt.Sprintf("uid-%d", i)
		clock.Advance(time.Second)
		if i%2 == 0 {
			lifecycle(t, l, uid) // deleted pods are part of the history too
		} else {
			mustPut(t, l, podRecord(uid))
		}
	}

	var pages []HistoryPage
	after := ""
	for {
		p, err := l.HistoryPage(after, 3)
		require.NoError(t, err)
		pages = append(pages, p)
		if p.Next == "" {
			break
		}
		after = p.Next
		require.Less(t, len(pages), 10, "the cursor must move on")
	}
	require.Len(t, pages, 3, "7 pods, 3 per page")
	assert.Equal(t, "uid-2", pages[0].Next)
	assert.Equal(t, "uid-5", pages[1].Next)
	assert.Empty(t, pages[2].Next)

	var uids []string
	events := 0
	for _, p := range pages {
		for _, e := range p.Events {
			if len(uids) == 0 || uids[len(uids)-1] != e.Record.PodUID {
				uids = append(uids, e.Record.PodUID)
			}
		}
		events += len(p.Events)
	}
	assert.Equal(t, []string{"uid-0", "uid-1", "uid-2", "uid-3", "uid-4", "uid-5", "uid-6"}, uids)
	assert.Equal(t, 4*3+3*1, events)

	t.Run("a cursor that names no pod resumes after it", func(t *testing.T) {
		p, err := l.HistoryPage("uid-4a", 0)
		require.NoError(t, err)
		require.NotEmpty(t, p.Events)
		assert.Equal(t, "uid-5", p.Events[0].Record.PodUID)
		assert.Empty(t, p.Next)
	})
	t.Run("past the end", func(t *testing.T) {
		p, err := l.HistoryPage("uid-9", 3)
		require.NoError(t, err)
		assert.Empty(t, p.Events)
		assert.Empty(t, p.Next)
	})
	t.Run("an exact fit ends without a cursor", func(t *testing.T) {
		p, err := l.HistoryPage("", 7)
		require.NoError(t, err)
		assert.Len(t, p.Events, 15)
		assert.Empty(t, p.Next)
	})
}

// TestPruneBoundsTheFile runs 10,000 pod lifecycles (create, two updates,
// delete; 2,000 with -short) the way a churning node would, pruning deleted
// pods' history with a short retention, and checks that the file stops
// growing and the number of pods with a history stays bounded. Without the
// pruning the file doubles between the half and the end.
func TestPruneBoundsTheFile(t *testing.T) {
	lifecycles := 10_000
	if testing.Short() {
		lifecycles = 2_000
	}
	const (
		perRound   = 40          // pods created (and deleted) per round
		step       = time.Minute // clock per round
		retention  = 10 * step
		pruneEvery = 5 // rounds
		batch      = 64
	)
	rounds := lifecycles / perRound
	l, clock := newTestLedger(t)
	ctx := context.Background()
	uid := func(round, i int) string { return fmt.Sprintf("pod-%05d-%02d", round, i) }

	var sizeAtHalf, maxPods int
	var pruned Pruned
	for round := 0; round < rounds+3; round++ {
		err := l.Update(func(tx *Tx) error {
			// A pod lives four rounds: created, running on a VM, seen in
			// the cloud again, deleted.
			for i := range perRound {
				if round >= 3 && round-3 < rounds {
					r, err := tx.Get(uid(round-3, i))
					if err != nil {
						return err
					}
					if err := tx.Delete(r.PodUID, r.Revision); err != nil {
						return err
					}
				}
				if round >= 2 && round-2 < rounds {
					r, err := tx.Get(uid(round-2, i))
					if err != nil {
						return err
					}
					r.LastSeenAt = tx.now
					if _, err := tx.Put(r); err != nil {
						return err
					}
				}
				if round >= 1 && round-1 < rounds {
					r, err := tx.Get(uid(round-1, i))
					if err != nil {
						return err
					}
					r = withVM(r, "i-"+r.PodUID)
					r.Phase = PhaseRunning
					if _, err := tx.Put(r); err != nil {
						return err
					}
				}
				if round < rounds {
					if _, err := tx.Put(podRecord(uid(round, i))); err != nil {
						return err
					}
				}
			}
			return nil
		})
		require.NoError(t, err, "round %d", round)
		now := clock.Advance(step)

		if round%pruneEvery == 0 {
			p, err := l.PruneDeleted(ctx, now.Add(-retention), batch)
			require.NoError(t, err)
			pruned.Pods += p.Pods
			pruned.Entries += p.Entries
			s, err := l.Stats()
			require.NoError(t, err)
			maxPods = max(maxPods, s.HistoryPods)
		}
		if round == rounds/2+3 { // half the lifecycles done
			sizeAtHalf = fileSize(t, l.Path())
		}
	}
	sizeAtEnd := fileSize(t, l.Path())
	t.Logf("file %d bytes after %d lifecycles, %d after %d; at most %d pods with a history; pruned %d pods, %d entries",
		sizeAtHalf, lifecycles/2, sizeAtEnd, lifecycles, maxPods, pruned.Pods, pruned.Entries)

	// Live pods (3 rounds), deleted pods inside the retention, and those
	// deleted since the last prune.
	bound := perRound * (3 + int(retention/step) + pruneEvery + 1)
	assert.LessOrEqual(t, maxPods, bound, "pods with a history")
	assert.Greater(t, pruned.Pods, lifecycles-bound)
	assert.Equal(t, 4*pruned.Pods, pruned.Entries, "four entries per lifecycle")
	// bbolt reuses the pages pruning frees: the second half of the run must
	// not grow the file by more than a small margin.
	assert.LessOrEqual(t, sizeAtEnd, sizeAtHalf+sizeAtHalf/10, "file size")
	assertVerifies(t, l)
}

func fileSize(t testing.TB, path string) int {
	t.Helper()
	info, err := os.Stat(path)
	require.NoError(t, err)
	return int(info.Size())
}

func TestStatsCountsTheHistoryPageByPage(t *testing.T) {
	l, _ := newTestLedger(t)
	const pods = 2*MaxHistoryPagePods + 10
	require.NoError(t, l.Update(func(tx *Tx) error {
		for i := range pods {
			r, err := tx.Put(podRecord(fmt.Sprintf("uid-%05d", i)))
			if err != nil {
				return err
			}
			if i%2 == 0 {
				if err := tx.Delete(r.PodUID, r.Revision); err != nil {
					return err
				}
			}
		}
		return nil
	}))
	reads := l.db.Stats().TxN
	s, err := l.Stats()
	require.NoError(t, err)
	assert.Equal(t, pods/2, s.Records)
	assert.Equal(t, pods, s.HistoryPods)
	assert.Equal(t, pods+pods/2, s.HistoryEntries)
	assert.Equal(t, 1+3, l.db.Stats().TxN-reads, "the records in one read, the history in three pages")
}
