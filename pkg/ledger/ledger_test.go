package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

func permOf(t *testing.T, path string) os.FileMode {
	t.Helper()
	info, err := os.Stat(path)
	require.NoError(t, err)
	return info.Mode().Perm()
}

func TestOpenCreatesPrivateDirAndFile(t *testing.T) {
	opts := testOptions(t, newClock())
	opts.Path = filepath.Join(t.TempDir(), "var", "lib", "caa", "ledger.db")

	l := openLedger(t, opts)

	assert.Equal(t, os.FileMode(0o700), permOf(t, filepath.Dir(opts.Path)))
	assert.Equal(t, os.FileMode(0o600), permOf(t, opts.Path))
	m := l.Meta()
	assert.Equal(t, currentSchema, m.SchemaVersion)
	assert.Equal(t, testNode, m.Node)
	assert.Equal(t, testCluster, m.Cluster)
	assert.Len(t, m.ID, 32)
	assert.Equal(t, uint64(1), m.OpenEpoch)
	assert.Equal(t, os.Getpid(), m.HolderPID)
	assert.Equal(t, testEpoch, m.CreatedAt)
	assert.Equal(t, testEpoch, m.OpenedAt)
	assert.False(t, l.ReadOnly())
	assert.Equal(t, opts.Path, l.Path())
}

func TestOpenTightensLooseModes(t *testing.T) {
	opts := testOptions(t, newClock())
	l, err := Open(opts)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	dir := filepath.Dir(opts.Path)
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.Chmod(opts.Path, 0o644))

	openLedger(t, opts)

	assert.Equal(t, os.FileMode(0o700), permOf(t, dir))
	assert.Equal(t, os.FileMode(0o600), permOf(t, opts.Path))
}

func TestOpenRefusesBadOptions(t *testing.T) {
	base := testOptions(t, newClock())
	for _, tc := range []struct {
		name   string
		modify func(*Options)
	}{
		{"no path", func(o *Options) { o.Path = "" }},
		{"no node", func(o *Options) { o.Node = "" }},
		{"no cluster", func(o *Options) { o.Cluster = "" }},
		{"neither node nor cluster", func(o *Options) { o.Node, o.Cluster = "", "" }},
		{"path is a directory", func(o *Options) { o.Path = t.TempDir() }},
		{"read-only path is a directory", func(o *Options) { o.Path, o.ReadOnly = t.TempDir(), true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := base
			tc.modify(&opts)
			l, err := Open(opts)
			require.ErrorIs(t, err, ErrInvalid)
			assert.Nil(t, l)
			assert.Contains(t, err.Error(), opts.Path)
		})
	}
	_, err := os.Stat(base.Path)
	assert.ErrorIs(t, err, os.ErrNotExist, "a refused open must not create the file")
}

func TestOpenReadOnlyMissingFile(t *testing.T) {
	opts := testOptions(t, newClock())
	opts.ReadOnly = true

	_, err := Open(opts)

	require.ErrorIs(t, err, ErrNotFound)
	assert.Contains(t, err.Error(), opts.Path)
	_, statErr := os.Stat(filepath.Dir(opts.Path))
	assert.ErrorIs(t, statErr, os.ErrNotExist, "a read-only open must not create the directory")
}

func TestReopenIncrementsEpoch(t *testing.T) {
	clock := newClock()
	opts := testOptions(t, clock)
	var id string
	for want := uint64(1); want <= 3; want++ {
		at := clock.Advance(time.Minute)
		l, err := Open(opts)
		require.NoError(t, err)
		m := l.Meta()
		assert.Equal(t, want, m.OpenEpoch)
		assert.Equal(t, at, m.OpenedAt)
		if id == "" {
			id = m.ID
		}
		assert.Equal(t, id, m.ID, "the ledger id is fixed at creation")
		require.NoError(t, l.Close())
	}

	ro := opts
	ro.ReadOnly = true
	l := openLedger(t, ro)
	assert.Equal(t, uint64(3), l.Meta().OpenEpoch, "a read-only open does not count")
	assert.True(t, l.ReadOnly())
}

func TestOpenWrongOwner(t *testing.T) {
	opts := testOptions(t, newClock())
	l, err := Open(opts)
	require.NoError(t, err)
	require.NoError(t, l.Close())

	// A node mismatch is a wrong file or node name; a cluster mismatch on
	// the right node is a cluster id that changed. Each gets its own advice.
	nodeAdvice := []string{"never moves between nodes", "hostPath", "NODE_NAME"}
	clusterAdvice := []string{"--cluster-id " + testCluster, "CAA_CLUSTER_ID", "kube-system namespace"}
	for _, tc := range []struct {
		name          string
		node, cluster string
		readOnly      bool
		want, notWant []string
	}{
		{"writable node mismatch", "node-b", testCluster, false,
			append([]string{`node "node-a", not node "node-b"`}, nodeAdvice...), clusterAdvice},
		{"writable cluster mismatch", testNode, "cluster-2", false,
			append([]string{`cluster id "cluster-1", and caa now runs with cluster id "cluster-2"`}, clusterAdvice...), nodeAdvice},
		{"read-only node mismatch", "node-b", "", true,
			append([]string{`node "node-a", not node "node-b"`}, nodeAdvice...), clusterAdvice},
		{"read-only cluster mismatch", "", "cluster-2", true,
			append([]string{`cluster id "cluster-1", and caa now runs with cluster id "cluster-2"`}, clusterAdvice...), nodeAdvice},
		{"read-only both mismatch", "node-b", "cluster-2", true,
			append([]string{`node "node-a", not node "node-b" (and for cluster id "cluster-1", not "cluster-2")`}, nodeAdvice...), clusterAdvice},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := opts
			o.Node, o.Cluster, o.ReadOnly = tc.node, tc.cluster, tc.readOnly
			l, err := Open(o)
			require.ErrorIs(t, err, ErrWrongLedger)
			assert.Nil(t, l)
			assert.Contains(t, err.Error(), opts.Path)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			for _, w := range tc.notWant {
				assert.NotContains(t, err.Error(), w)
			}
		})
	}

	// Refused opens changed nothing; an open with no identity reads the owner.
	o := opts
	o.Node, o.Cluster, o.ReadOnly = "", "", true
	l = openLedger(t, o)
	assert.Equal(t, testNode, l.Meta().Node)
	assert.Equal(t, testCluster, l.Meta().Cluster)
	assert.Equal(t, uint64(1), l.Meta().OpenEpoch, "a refused writable open must not bump the epoch")
}

func TestOpenLockedNamesHolder(t *testing.T) {
	opts := testOptions(t, newClock())
	l := openLedger(t, opts)

	h, err := ReadHolder(HolderPath(opts.Path))
	require.NoError(t, err)
	assert.Equal(t, os.Getpid(), h.PID)
	assert.Equal(t, l.Meta().OpenEpoch, h.Epoch)
	assert.Equal(t, os.FileMode(0o600), permOf(t, HolderPath(opts.Path)))

	for _, readOnly := range []bool{false, true} {
		t.Run("readOnly="+strconv.FormatBool(readOnly), func(t *testing.T) {
			o := opts
			o.ReadOnly = readOnly
			start := time.Now()
			second, err := Open(o)
			elapsed := time.Since(start)
			require.ErrorIs(t, err, ErrLocked)
			assert.Nil(t, second)
			// bbolt polls the lock every 50ms and gives up one poll early.
			assert.GreaterOrEqual(t, elapsed, opts.Timeout/2, "it must wait for the lock")
			assert.Less(t, elapsed, opts.Timeout+2*time.Second, "the open timeout must bound the wait")
			assert.Contains(t, err.Error(), opts.Path)
			assert.Contains(t, err.Error(), "process "+strconv.Itoa(os.Getpid()))
		})
	}

	// The holder is still in place: failed opens did not disturb it.
	_, err = ReadHolder(HolderPath(opts.Path))
	require.NoError(t, err)
	require.NoError(t, l.Close())
	_, err = os.Stat(HolderPath(opts.Path))
	assert.ErrorIs(t, err, os.ErrNotExist, "Close removes the holder file")

	// The lock is released: the file opens again at once.
	l2 := openLedger(t, opts)
	assert.Equal(t, uint64(2), l2.Meta().OpenEpoch)
}

func TestCloseIsIdempotent(t *testing.T) {
	l, _ := newTestLedger(t)
	require.NoError(t, l.Close())
	assert.NoError(t, l.Close())
	assert.NoError(t, l.Close())
}

func TestReadOnlyRefusesWrites(t *testing.T) {
	opts := testOptions(t, newClock())
	l, err := Open(opts)
	require.NoError(t, err)
	stored := mustPut(t, l, podRecord("uid-1"))
	require.NoError(t, l.Close())
	opts.ReadOnly = true
	ro := openLedger(t, opts)
	_, err = os.Stat(HolderPath(opts.Path))
	assert.ErrorIs(t, err, os.ErrNotExist, "a read-only open is not a holder")

	for _, tc := range []struct {
		name  string
		write func() error
	}{
		{"Update", func() error { return ro.Update(func(*Tx) error { return nil }) }},
		{"Put", func() error { _, err := ro.Put(stored); return err }},
		{"Delete", func() error { return ro.Delete("uid-1", stored.Revision) }},
		{"PruneDeleted", func() error { _, err := ro.PruneDeleted(context.Background(), time.Now(), 0); return err }},
		{"Tx.Put in View", func() error {
			return ro.View(func(tx *Tx) error { _, err := tx.Put(stored); return err })
		}},
		{"Tx.Delete in View", func() error {
			return ro.View(func(tx *Tx) error { return tx.Delete("uid-1", stored.Revision) })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.write()
			require.ErrorIs(t, err, ErrReadOnly)
			assert.Contains(t, err.Error(), opts.Path)
		})
	}
	got, err := ro.Get("uid-1")
	require.NoError(t, err)
	assert.Equal(t, stored, got)
}

func TestOpenForeignBboltFile(t *testing.T) {
	opts := testOptions(t, newClock())
	rawUpdate(t, opts.Path, func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("etcd"))
		if err != nil {
			return err
		}
		return b.Put([]byte("k"), []byte("v"))
	})

	for _, readOnly := range []bool{false, true} {
		t.Run("readOnly="+strconv.FormatBool(readOnly), func(t *testing.T) {
			o := opts
			o.ReadOnly = readOnly
			_, err := Open(o)
			require.ErrorIs(t, err, ErrNotLedger)
			assert.Contains(t, err.Error(), opts.Path)
		})
	}
	rawView(t, opts.Path, func(tx *bolt.Tx) error {
		assert.Nil(t, tx.Bucket(bucketMeta), "a refused open must not add caa's buckets")
		assert.NotNil(t, tx.Bucket([]byte("etcd")))
		return nil
	})
}

func TestOpenUnreadableMeta(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(meta *bolt.Bucket) error
	}{
		{"no schema", func(m *bolt.Bucket) error { return m.Delete(keySchema) }},
		{"short schema", func(m *bolt.Bucket) error { return m.Put(keySchema, []byte{1}) }},
		{"bad createdAt", func(m *bolt.Bucket) error { return m.Put(keyCreatedAt, []byte("yesterday")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions(t, newClock())
			l, err := Open(opts)
			require.NoError(t, err)
			require.NoError(t, l.Close())
			rawUpdate(t, opts.Path, func(tx *bolt.Tx) error { return tc.edit(tx.Bucket(bucketMeta)) })

			for _, readOnly := range []bool{false, true} {
				o := opts
				o.ReadOnly = readOnly
				_, err := Open(o)
				require.ErrorIs(t, err, ErrCorrupt, "readOnly=%v", readOnly)
				assert.Contains(t, err.Error(), opts.Path)
			}
		})
	}
}

func TestOpenNewerSchema(t *testing.T) {
	opts := testOptions(t, newClock())
	l, err := Open(opts)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	// A newer caa's breaking change: schema and compat both ahead of this
	// build (rollback_test.go covers the additive case, which opens).
	newer := currentSchema + 1
	rawUpdate(t, opts.Path, func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketMeta).Put(keyCompat, binary.BigEndian.AppendUint32(nil, uint32(newer))); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keySchema, binary.BigEndian.AppendUint32(nil, uint32(newer)))
	})

	for _, readOnly := range []bool{false, true} {
		t.Run("readOnly="+strconv.FormatBool(readOnly), func(t *testing.T) {
			o := opts
			o.ReadOnly = readOnly
			_, err := Open(o)
			require.ErrorIs(t, err, ErrSchema)
			assert.Contains(t, err.Error(), opts.Path)
			assert.Contains(t, err.Error(), strconv.Itoa(newer))
		})
	}
	rawView(t, opts.Path, func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketMeta).Get(keySchema)
		assert.Equal(t, uint32(newer), binary.BigEndian.Uint32(v), "a refused open must not rewrite the schema")
		assert.Equal(t, uint64(1), binary.BigEndian.Uint64(tx.Bucket(bucketMeta).Get(keyEpoch)))
		return nil
	})
}

func TestOpenOlderSchemaReadOnly(t *testing.T) {
	// Schema 0 means "no caa layout yet": a file whose meta says so but holds
	// buckets is not a ledger, and no open may migrate it into one.
	opts := testOptions(t, newClock())
	rawUpdate(t, opts.Path, func(tx *bolt.Tx) error {
		m, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		return m.Put(keySchema, binary.BigEndian.AppendUint32(nil, 0))
	})
	for _, readOnly := range []bool{false, true} {
		o := opts
		o.ReadOnly = readOnly
		_, err := Open(o)
		require.ErrorIs(t, err, ErrNotLedger, "readOnly=%v", readOnly)
		assert.Contains(t, err.Error(), opts.Path)
	}
}

func TestOpenTellsWhoHoldsTheLockWhileWaiting(t *testing.T) {
	opts := testOptions(t, newClock())
	holder := openLedger(t, opts)
	pid := strconv.Itoa(os.Getpid())

	waiting := func(log string) int { return strings.Count(log, "ledger is locked by another process") }
	second := func(timeout time.Duration) (*Ledger, string, error) {
		var buf bytes.Buffer
		o := opts
		o.Timeout = timeout
		o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		l, err := Open(o)
		if l != nil {
			t.Cleanup(func() { _ = l.Close() })
		}
		return l, buf.String(), err
	}

	t.Run("held for the whole timeout", func(t *testing.T) {
		start := time.Now()
		_, log, err := second(1500 * time.Millisecond)
		require.ErrorIs(t, err, ErrLocked)
		assert.GreaterOrEqual(t, time.Since(start), time.Second)
		assert.Equal(t, 1, waiting(log), "told once: %s", log)
		assert.Contains(t, log, "level=WARN")
		assert.Contains(t, log, "holderPID="+pid)
		assert.Contains(t, log, `holder="process `+pid)
		assert.Contains(t, log, "timeout=1.5s")
	})

	t.Run("a short wait is not worth a word", func(t *testing.T) {
		o := opts
		o.Path = filepath.Join(t.TempDir(), "ledger.db")
		first := openLedger(t, o)
		go func() { time.Sleep(200 * time.Millisecond); _ = first.Close() }()
		var buf bytes.Buffer
		o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		o.Timeout = 5 * time.Second
		l := openLedger(t, o)
		assert.NotNil(t, l)
		assert.Zero(t, waiting(buf.String()), buf.String())
	})

	t.Run("released after the notice", func(t *testing.T) {
		go func() { time.Sleep(lockNotice + 300*time.Millisecond); _ = holder.Close() }()
		l, log, err := second(5 * time.Second)
		require.NoError(t, err)
		assert.NotNil(t, l)
		assert.Equal(t, 1, waiting(log), log)
		assert.Contains(t, log, "ledger lock acquired")
	})
}
