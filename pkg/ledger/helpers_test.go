package ledger

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// Test identities: every test ledger belongs to testNode in testCluster.
const (
	testNode    = "node-a"
	testCluster = "cluster-1"
)

// testEpoch is where test clocks start; the nanoseconds check that times
// survive the codec at full precision.
var testEpoch = time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.UTC)

// fakeClock is a settable clock for Options.Now.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *fakeClock { return &fakeClock{now: testEpoch} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// testOptions returns writable options for a fresh file in t.TempDir(),
// with a short lock timeout and clock.
func testOptions(t testing.TB, clock *fakeClock) Options {
	t.Helper()
	return Options{
		Path:    filepath.Join(t.TempDir(), "caa", "ledger.db"),
		Node:    testNode,
		Cluster: testCluster,
		Timeout: 200 * time.Millisecond,
		Now:     clock.Now,
	}
}

// openLedger opens opts and closes the ledger when the test ends.
func openLedger(t testing.TB, opts Options) *Ledger {
	t.Helper()
	l, err := Open(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// newTestLedger opens a fresh writable ledger with its own clock.
func newTestLedger(t testing.TB) (*Ledger, *fakeClock) {
	t.Helper()
	clock := newClock()
	return openLedger(t, testOptions(t, clock)), clock
}

// podRecord is a valid record for a new pod, without a VM.
func podRecord(uid string) Record {
	return Record{
		PodUID:       uid,
		Namespace:    "default",
		Name:         "pod-" + uid,
		RuntimeClass: "kata-remote",
		Phase:        PhaseCreating,
		Attempt:      1,
	}
}

// withVM gives r a VM of provider "aws".
func withVM(r Record, vmID string) Record {
	r.Provider = "aws"
	r.VMID = vmID
	r.VMName = "podvm-" + r.Name
	return r
}

// mustPut stores r and returns the stored record.
func mustPut(t testing.TB, l *Ledger, r Record) Record {
	t.Helper()
	stored, err := l.Put(r)
	require.NoError(t, err)
	return stored
}

// rawUpdate runs fn against the file at path with bbolt directly, as a tool
// or another version of caa would.
func rawUpdate(t testing.TB, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	require.NoError(t, db.Update(fn))
}

// rawView reads the file at path with bbolt directly.
func rawView(t testing.TB, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	require.NoError(t, db.View(fn))
}

// fillLedger writes n records (pod-00000 ...) in transactions of batch
// records, every third with a VM, and returns their UIDs.
func fillLedger(t testing.TB, l *Ledger, n, batch int) []string {
	t.Helper()
	uids := make([]string, 0, n)
	for start := 0; start < n; start += batch {
		err := l.Update(func(tx *Tx) error {
			for i := start; i < min(start+batch, n); i++ {
				r := podRecord(fmt.Sprintf("pod-%05d", i))
				if i%3 == 0 {
					r = withVM(r, fmt.Sprintf("i-%05d", i))
				}
				if _, err := tx.Put(r); err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(t, err)
	}
	for i := range n {
		uids = append(uids, fmt.Sprintf("pod-%05d", i))
	}
	return uids
}

// childTest returns a command that runs one test of this test binary in a
// child process with env added; the child test does its work only when it
// finds its variable in the environment.
func childTest(ctx context.Context, test string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// indexedVM follows the VM index from a provider's VM to the record it
// names, or returns ErrNotFound; tests use it to check the index.
func indexedVM(t testing.TB, l *Ledger, provider, vmID string) (r Record, err error) {
	t.Helper()
	err = l.View(func(tx *Tx) error {
		uid := tx.tx.Bucket(bucketVMs).Get(vmKey(provider, vmID))
		if uid == nil {
			return fmt.Errorf("VM %s/%s: %w", provider, vmID, ErrNotFound)
		}
		r, err = tx.Get(string(uid))
		return err
	})
	return r, err
}
