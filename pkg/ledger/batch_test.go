package ledger

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// txID is the id of the ledger's last committed write transaction.
func txID(t *testing.T, l *Ledger) int {
	t.Helper()
	var id int
	require.NoError(t, l.view(func(tx *bolt.Tx) error { id = tx.ID(); return nil }))
	return id
}

// kata stops a node's sandboxes at once (a Deployment scaled down: bench
// S10's 100 StopVM calls), and each StopVM answers once its record says
// Deleting, durably. Writes of sandboxes at the same moment share one
// commit (and its fsyncs) instead of queueing for one each: 100 StopVMs
// took 1.3-2.3 s to answer, over the second kata's runtime-rs gives one.
func TestConcurrentSandboxWritesShareCommits(t *testing.T) {
	l, _ := newTestLedger(t)
	const n = 100
	stored := make([]Sandbox, n)
	for i := range n {
		s, err := l.PutSandbox(sandboxRecord(fmt.Sprintf("sb%03d", i)))
		require.NoError(t, err)
		stored[i] = s
	}
	before := txID(t, l)
	var wg sync.WaitGroup
	errs := make([]error, n)
	gate := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-gate
			s := stored[i]
			s.Phase, s.Reason = SandboxDeleting, "StopVM"
			stored[i], errs[i] = l.PutSandbox(s)
		})
	}
	close(gate)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "sandbox %d", i)
		got, err := l.GetSandbox(stored[i].ID)
		require.NoError(t, err)
		assert.Equal(t, SandboxDeleting, got.Phase)
		assert.Equal(t, uint64(2), got.Revision)
		hist, err := l.SandboxHistory(stored[i].ID)
		require.NoError(t, err)
		assert.Len(t, hist, 2, "one history entry per write, none twice")
	}
	commits := txID(t, l) - before
	t.Logf("%d concurrent sandbox writes in %d commits", n, commits)
	assert.Less(t, commits, n/4, "writes at the same moment share commits")
}

// A write that loses its compare-and-set inside a shared commit fails
// alone: the others are stored, it gets ErrConflict and nothing of it is
// kept.
func TestSharedCommitKeepsCompareAndSet(t *testing.T) {
	l, _ := newTestLedger(t)
	base, err := l.PutSandbox(sandboxRecord("sb1"))
	require.NoError(t, err)
	other, err := l.PutSandbox(sandboxRecord("sb2"))
	require.NoError(t, err)
	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-gate
			s := base // every writer carries revision 1
			s.Message = fmt.Sprintf("writer %d", i)
			_, errs[i] = l.PutSandbox(s)
		})
	}
	wg.Go(func() {
		<-gate
		o := other
		o.Message = "other"
		_, err := l.PutSandbox(o)
		assert.NoError(t, err)
	})
	close(gate)
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else {
			assert.True(t, errors.Is(err, ErrConflict), "%v", err)
		}
	}
	assert.Equal(t, 1, won, "exactly one writer at revision 1 wins")
	got, err := l.GetSandbox("sb1")
	require.NoError(t, err)
	assert.Equal(t, uint64(2), got.Revision)
	hist, err := l.SandboxHistory("sb1")
	require.NoError(t, err)
	assert.Len(t, hist, 2)
	o, err := l.GetSandbox("sb2")
	require.NoError(t, err)
	assert.Equal(t, "other", o.Message)
}
