package ledger

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

func TestPutCompareAndSet(t *testing.T) {
	l, clock := newTestLedger(t)
	created := testEpoch
	first := mustPut(t, l, podRecord("uid-1"))
	require.Equal(t, uint64(1), first.Revision)
	require.Equal(t, created, first.CreatedAt)
	require.Equal(t, created, first.UpdatedAt)
	require.Equal(t, testNode, first.Node, "an empty Node gets the ledger's node")

	running := first
	running.Phase = PhaseRunning
	updatedAt := clock.Advance(time.Minute)
	second := mustPut(t, l, running)
	require.Equal(t, uint64(2), second.Revision)
	require.Equal(t, created, second.CreatedAt, "an update keeps CreatedAt")
	require.Equal(t, updatedAt, second.UpdatedAt)

	gone := mustPut(t, l, podRecord("uid-gone"))
	require.NoError(t, l.Delete("uid-gone", gone.Revision))

	for _, tc := range []struct {
		name string
		put  Record
		want error
	}{
		{"create over an existing record", podRecord("uid-1"), ErrAlreadyExists},
		{"stale revision", first, ErrConflict},
		{"revision from the future", func() Record { r := second; r.Revision = 9; return r }(), ErrConflict},
		{"update of a deleted record", gone, ErrConflict},
		{"update of a never-created record", func() Record { r := podRecord("uid-new"); r.Revision = 1; return r }(), ErrConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock.Advance(time.Second)
			_, err := l.Put(tc.put)
			require.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.put.PodUID)
		})
	}

	got, err := l.Get("uid-1")
	require.NoError(t, err)
	assert.Equal(t, second, got, "refused writes leave the record as it was")
	_, err = l.Get("uid-gone")
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = l.Get("uid-new")
	assert.ErrorIs(t, err, ErrNotFound)
}

func TestPutRoundTripsEveryField(t *testing.T) {
	l, _ := newTestLedger(t)
	r := withVM(podRecord("uid-1"), "i-0abc")
	r.Node = testNode
	r.Key = "uid-1/1"
	r.InstanceType = "m6i.large"
	r.Image = "ami-123"
	r.Zone = "eu-west-1a"
	r.IPs = []string{"10.0.0.7", "fd00::7"}
	r.Phase = PhaseRunning
	r.Reason = "Adopted"
	r.Message = "found by tag"
	r.Attempt = 3
	r.LastSeenAt = testEpoch.Add(-time.Hour)

	stored := mustPut(t, l, r)
	got, err := l.Get("uid-1")
	require.NoError(t, err)
	assert.Equal(t, stored, got)
	r.Revision, r.CreatedAt, r.UpdatedAt = 1, testEpoch, testEpoch
	assert.Equal(t, r, got)
}

func TestPutRefusesInvalidRecords(t *testing.T) {
	l, _ := newTestLedger(t)
	long := strings.Repeat("x", maxKeyLen+1)
	for _, tc := range []struct {
		name   string
		modify func(*Record)
	}{
		{"no uid", func(r *Record) { r.PodUID = "" }},
		{"uid too long", func(r *Record) { r.PodUID = long }},
		{"no namespace", func(r *Record) { r.Namespace = "" }},
		{"no name", func(r *Record) { r.Name = "" }},
		{"no phase", func(r *Record) { r.Phase = "" }},
		{"bad phase", func(r *Record) { r.Phase = "Pending" }},
		{"negative attempt", func(r *Record) { r.Attempt = -1 }},
		{"VM without provider", func(r *Record) { r.VMID = "i-1" }},
		{"VM key too long", func(r *Record) { r.Provider, r.VMID = "aws", long }},
		{"another node", func(r *Record) { r.Node = "node-b" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := podRecord("uid-1")
			tc.modify(&r)
			_, err := l.Put(r)
			require.ErrorIs(t, err, ErrInvalid)
		})
	}
	recs, err := l.List(Filter{})
	require.NoError(t, err)
	assert.Empty(t, recs)
	pods, err := historyPods(l)
	require.NoError(t, err)
	assert.Empty(t, pods, "a refused put leaves no history")
}

func historyPods(l *Ledger) (pods []string, err error) {
	err = l.View(func(tx *Tx) error { pods, err = tx.HistoryPods(); return err })
	return pods, err
}

func TestVMIndex(t *testing.T) {
	l, _ := newTestLedger(t)
	a := mustPut(t, l, withVM(podRecord("uid-a"), "i-1"))
	b := mustPut(t, l, withVM(podRecord("uid-b"), "i-2"))

	got, err := indexedVM(t, l, "aws", "i-1")
	require.NoError(t, err)
	assert.Equal(t, a, got)
	_, err = indexedVM(t, l, "azure", "i-1")
	assert.ErrorIs(t, err, ErrNotFound, "the index is per provider")

	t.Run("moving to a new VM unindexes the old", func(t *testing.T) {
		moved := a
		moved.VMID = "i-3"
		a = mustPut(t, l, moved)
		_, err := indexedVM(t, l, "aws", "i-1")
		assert.ErrorIs(t, err, ErrNotFound)
		got, err := indexedVM(t, l, "aws", "i-3")
		require.NoError(t, err)
		assert.Equal(t, "uid-a", got.PodUID)
	})

	t.Run("a VM owned by another pod is a conflict", func(t *testing.T) {
		steal := a
		steal.VMID = "i-2"
		_, err := l.Put(steal)
		require.ErrorIs(t, err, ErrConflict)
		assert.Contains(t, err.Error(), "uid-b")

		got, err := l.Get("uid-a")
		require.NoError(t, err)
		assert.Equal(t, a, got, "the record is unchanged")
		owner, err := indexedVM(t, l, "aws", "i-3")
		require.NoError(t, err)
		assert.Equal(t, "uid-a", owner.PodUID, "the old VM is still indexed")
		owner, err = indexedVM(t, l, "aws", "i-2")
		require.NoError(t, err)
		assert.Equal(t, b, owner)
		_, err = l.Put(withVM(podRecord("uid-c"), "i-2"))
		require.ErrorIs(t, err, ErrConflict, "a create may not take an indexed VM either")
		_, err = l.Get("uid-c")
		assert.ErrorIs(t, err, ErrNotFound)
		assertVerifies(t, l)
	})

	t.Run("dropping the VM unindexes it", func(t *testing.T) {
		noVM := a
		noVM.Provider, noVM.VMID = "", ""
		a = mustPut(t, l, noVM)
		_, err := indexedVM(t, l, "aws", "i-3")
		assert.ErrorIs(t, err, ErrNotFound)
		assertVerifies(t, l)
	})
}

// A Tx method that fails must leave nothing behind, even when the caller
// goes on and commits the transaction: that is what makes composing them
// inside one Update safe.
func TestFailedPutInsideUpdateLeavesIndexIntact(t *testing.T) {
	l, _ := newTestLedger(t)
	a := mustPut(t, l, withVM(podRecord("uid-a"), "i-1"))
	mustPut(t, l, withVM(podRecord("uid-b"), "i-2"))

	err := l.Update(func(tx *Tx) error {
		steal := a
		steal.VMID = "i-2"
		_, err := tx.Put(steal)
		require.ErrorIs(t, err, ErrConflict)
		return nil // the caller decides to carry on with the rest of its changes
	})
	require.NoError(t, err)

	owner, err := indexedVM(t, l, "aws", "i-1")
	require.NoError(t, err, "uid-a's VM must still be indexed after a refused Put")
	assert.Equal(t, "uid-a", owner.PodUID)
	assertVerifies(t, l)
}

func assertVerifies(t *testing.T, l *Ledger) {
	t.Helper()
	probs, err := l.Verify()
	require.NoError(t, err)
	assert.Empty(t, probs)
}

func TestDelete(t *testing.T) {
	l, clock := newTestLedger(t)
	r := mustPut(t, l, withVM(podRecord("uid-1"), "i-1"))

	err := l.Delete("uid-1", r.Revision+1)
	require.ErrorIs(t, err, ErrConflict)
	_, err = l.Get("uid-1")
	require.NoError(t, err, "a refused delete keeps the record")

	deletedAt := clock.Advance(time.Minute)
	require.NoError(t, l.Delete("uid-1", r.Revision))
	_, err = l.Get("uid-1")
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = indexedVM(t, l, "aws", "i-1")
	assert.ErrorIs(t, err, ErrNotFound)

	hist, err := l.History("uid-1")
	require.NoError(t, err)
	require.Len(t, hist, 2)
	assert.Equal(t, ActionCreated, hist[0].Action)
	last := hist[1]
	assert.Equal(t, ActionDeleted, last.Action)
	assert.Equal(t, uint64(2), last.Seq)
	assert.Equal(t, deletedAt, last.Time)
	assert.Equal(t, "i-1", last.Record.VMID, "the final entry keeps what the pod had")

	err = l.Delete("uid-1", r.Revision)
	require.ErrorIs(t, err, ErrNotFound)
	assert.Contains(t, err.Error(), "uid-1")

	// The pod can come back as a new record; its history goes on.
	again := mustPut(t, l, withVM(podRecord("uid-1"), "i-1"))
	assert.Equal(t, uint64(1), again.Revision)
	hist, err = l.History("uid-1")
	require.NoError(t, err)
	require.Len(t, hist, 3)
	assert.Equal(t, ActionCreated, hist[2].Action)
	assertVerifies(t, l)
}

func TestListFilter(t *testing.T) {
	l, _ := newTestLedger(t)
	phases := map[string]Phase{
		"uid-c": PhaseCreating, "uid-a": PhaseRunning, "uid-b": PhaseRunning,
		"uid-d": PhaseDeleting, "uid-f": PhaseFailed,
	}
	for uid, p := range phases {
		r := podRecord(uid)
		r.Phase = p
		mustPut(t, l, r)
	}
	for _, tc := range []struct {
		name   string
		filter Filter
		want   []string
	}{
		{"all", Filter{}, []string{"uid-a", "uid-b", "uid-c", "uid-d", "uid-f"}},
		{"running", Filter{Phases: []Phase{PhaseRunning}}, []string{"uid-a", "uid-b"}},
		{"deleting or failed", Filter{Phases: []Phase{PhaseFailed, PhaseDeleting}}, []string{"uid-d", "uid-f"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := l.List(tc.filter)
			require.NoError(t, err)
			var uids []string
			for _, r := range recs {
				uids = append(uids, r.PodUID)
				assert.Equal(t, phases[r.PodUID], r.Phase)
			}
			assert.Equal(t, tc.want, uids, "ordered by pod UID")
		})
	}
}

func TestListReportsUndecodableRecords(t *testing.T) {
	l, _ := newTestLedger(t)
	good := []Record{mustPut(t, l, podRecord("uid-a")), mustPut(t, l, podRecord("uid-c"))}
	require.NoError(t, l.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecords).Put([]byte("uid-b"), []byte{recordEncodingV1, 0xff})
	}))

	recs, err := l.List(Filter{})
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), `"uid-b"`)
	assert.Equal(t, good, recs, "the good records come back with the error")

	_, err = l.Get("uid-b")
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), "uid-b")

	s, err := l.Stats()
	require.NoError(t, err)
	assert.Equal(t, 2, s.Records)
	assert.Equal(t, 1, s.Undecodable)

	probs, err := l.Verify()
	require.NoError(t, err)
	require.Len(t, probs, 1)
	assert.Equal(t, "records/uid-b", probs[0].Where)
}

func TestHistoryIsBounded(t *testing.T) {
	clock := newClock()
	opts := testOptions(t, clock)
	opts.HistoryLimit = 5
	l := openLedger(t, opts)

	r := mustPut(t, l, podRecord("uid-1"))
	for range 11 {
		clock.Advance(time.Second)
		r.Attempt++
		r = mustPut(t, l, r)
	}
	require.Equal(t, uint64(12), r.Revision)

	hist, err := l.History("uid-1")
	require.NoError(t, err)
	require.Len(t, hist, 5)
	for i, e := range hist {
		seq := uint64(8 + i)
		assert.Equal(t, seq, e.Seq)
		assert.Equal(t, ActionUpdated, e.Action)
		assert.Equal(t, seq, e.Record.Revision, "each entry snapshots the record after its change")
		assert.Equal(t, testEpoch.Add(time.Duration(seq-1)*time.Second), e.Time)
	}

	_, err = l.History("uid-unknown")
	assert.ErrorIs(t, err, ErrNotFound)
}

func TestUpdateIsAtomic(t *testing.T) {
	l, _ := newTestLedger(t)
	errBoom := errors.New("boom")
	err := l.Update(func(tx *Tx) error {
		if _, err := tx.Put(withVM(podRecord("uid-1"), "i-1")); err != nil {
			return err
		}
		if _, err := tx.Put(podRecord("uid-2")); err != nil {
			return err
		}
		got, err := tx.Get("uid-1")
		require.NoError(t, err, "a write is visible inside its transaction")
		require.Equal(t, uint64(1), got.Revision)
		return errBoom
	})
	require.ErrorIs(t, err, errBoom)

	recs, err := l.List(Filter{})
	require.NoError(t, err)
	assert.Empty(t, recs)
	_, err = indexedVM(t, l, "aws", "i-1")
	assert.ErrorIs(t, err, ErrNotFound)
	pods, err := historyPods(l)
	require.NoError(t, err)
	assert.Empty(t, pods)
}

func TestStats(t *testing.T) {
	l, clock := newTestLedger(t)
	for i, p := range []Phase{PhaseRunning, PhaseRunning, PhaseCreating, PhaseFailed} {
		r := podRecord(fmt.Sprintf("uid-%d", i))
		r.Phase = p
		if p == PhaseRunning {
			r = withVM(r, fmt.Sprintf("i-%d", i))
		}
		clock.Advance(time.Minute)
		r = mustPut(t, l, r)
		if i == 0 {
			r.Reason = "updated"
			mustPut(t, l, r) // a second history entry
		}
	}
	gone := mustPut(t, l, withVM(podRecord("uid-gone"), "i-gone"))
	require.NoError(t, l.Delete("uid-gone", gone.Revision))

	s, err := l.Stats()
	require.NoError(t, err)
	assert.Equal(t, l.Path(), s.Path)
	assert.Equal(t, l.Meta(), s.Meta)
	assert.Positive(t, s.FileBytes)
	assert.Equal(t, 4, s.Records)
	assert.Equal(t, map[Phase]int{PhaseCreating: 1, PhaseRunning: 2, PhaseDeleting: 0, PhaseFailed: 1}, s.ByPhase)
	assert.Zero(t, s.Undecodable)
	assert.Equal(t, 2, s.IndexedVMs)
	assert.Equal(t, 5, s.HistoryPods)
	assert.Equal(t, 2+1+1+1+2, s.HistoryEntries)
	assert.Equal(t, DefaultHistoryLimit, s.HistoryLimit)
	assert.Equal(t, testEpoch.Add(time.Minute), s.Oldest)
	assert.Equal(t, testEpoch.Add(4*time.Minute), s.Newest)
	assert.Equal(t, map[string]int{"aws": 2}, s.Providers)
}

func TestParsePhase(t *testing.T) {
	for _, p := range Phases {
		got, err := ParsePhase(strings.ToLower(string(p)))
		require.NoError(t, err)
		assert.Equal(t, p, got)
	}
	_, err := ParsePhase("Pending")
	assert.ErrorIs(t, err, ErrInvalid)
}
