package ledger

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// migrationTests holds one test per entry of migrations, by name. A new
// migration without an entry here fails TestEveryMigrationHasATest.
var migrationTests = map[string]func(t *testing.T){
	"initial-layout": testMigrationInitialLayout,
	"sandboxes":      testMigrationSandboxes,
}

func TestEveryMigrationHasATest(t *testing.T) {
	for _, m := range migrations {
		assert.Contains(t, migrationTests, m.Name, "migration %d (%s) has no test in migrationTests", m.To, m.Name)
	}
	names := map[string]bool{}
	for _, m := range migrations {
		assert.False(t, names[m.Name], "two migrations are named %s", m.Name)
		names[m.Name] = true
	}
	for name := range migrationTests {
		assert.True(t, names[name], "migrationTests has %s, which is not in migrations", name)
	}
}

func TestMigrations(t *testing.T) {
	for i, m := range migrations {
		require.Equal(t, i+1, m.To, "migrations must go 1, 2, 3, ... with no gap")
		if test, ok := migrationTests[m.Name]; ok {
			t.Run(m.Name, test)
		}
	}
	assert.Equal(t, migrations[len(migrations)-1].To, currentSchema)
}

// migrateTo runs the migrations up to and including version to on the file
// at path, starting from the version the file is at.
func migrateTo(t *testing.T, path string, to int) {
	t.Helper()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return migrate(tx, schemaOf(tx), migrations[:to], discard)
	})
}

var discard = slog.New(slog.DiscardHandler)

// schemaOf reads meta/schema as migrate's caller does: 0 without a meta bucket.
func schemaOf(tx *bolt.Tx) int {
	b := tx.Bucket(bucketMeta)
	if b == nil {
		return 0
	}
	v := b.Get(keySchema)
	if len(v) != 4 {
		return -1
	}
	return int(binary.BigEndian.Uint32(v))
}

func testMigrationInitialLayout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	migrateTo(t, path, 1)

	rawView(t, path, func(tx *bolt.Tx) error {
		assert.Equal(t, 1, schemaOf(tx))
		var names []string
		require.NoError(t, tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			names = append(names, string(name))
			return nil
		}))
		assert.ElementsMatch(t, []string{"meta", "records", "vms", "history"}, names)
		for _, b := range [][]byte{bucketRecords, bucketVMs, bucketHistory} {
			assert.Zero(t, tx.Bucket(b).Stats().KeyN, "%s starts empty", b)
		}
		return nil
	})

	// Running it again is a no-op: the file is at 1 already.
	migrateTo(t, path, 1)
	rawView(t, path, func(tx *bolt.Tx) error {
		assert.Equal(t, 1, schemaOf(tx))
		return nil
	})

}

// synthetic is a migration list for the mechanism tests; each step records
// that it ran (in a "steps" bucket, so a rolled-back step leaves no trace)
// and the schema it found, to show the bump after each step.
type synthetic struct {
	ran   []string
	saw   map[string]int
	fails string
}

var errStep = errors.New("step failed")

func (s *synthetic) list(n int) []migration {
	var list []migration
	for to := 1; to <= n; to++ {
		name := []string{"", "one", "two", "three", "four"}[to]
		list = append(list, migration{To: to, Name: name, Run: func(tx *bolt.Tx) error {
			s.ran = append(s.ran, name)
			s.saw[name] = schemaOf(tx)
			b, err := tx.CreateBucketIfNotExists([]byte("steps"))
			if err != nil {
				return err
			}
			if err := b.Put([]byte(name), []byte("done")); err != nil {
				return err
			}
			if name == s.fails {
				return errStep
			}
			return nil
		}})
	}
	return list
}

func newSynthetic() *synthetic { return &synthetic{saw: map[string]int{}} }

// fileAt writes a file at schema version v with the given steps done.
func fileAt(t *testing.T, v int, steps ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "old.db")
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		m, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		if err := m.Put(keySchema, binary.BigEndian.AppendUint32(nil, uint32(v))); err != nil {
			return err
		}
		b, err := tx.CreateBucket([]byte("steps"))
		if err != nil {
			return err
		}
		for _, s := range steps {
			if err := b.Put([]byte(s), []byte("done")); err != nil {
				return err
			}
		}
		return nil
	})
	return path
}

func stepsDone(t *testing.T, path string) (schema int, steps []string) {
	t.Helper()
	rawView(t, path, func(tx *bolt.Tx) error {
		schema = schemaOf(tx)
		if b := tx.Bucket([]byte("steps")); b != nil {
			return b.ForEach(func(k, _ []byte) error { steps = append(steps, string(k)); return nil })
		}
		return nil
	})
	return schema, steps
}

func TestMigrateRunsOnlyNewerStepsInOrder(t *testing.T) {
	path := fileAt(t, 1, "one")
	s := newSynthetic()
	rawUpdate(t, path, func(tx *bolt.Tx) error { return migrate(tx, 1, s.list(4), discard) })

	assert.Equal(t, []string{"two", "three", "four"}, s.ran)
	assert.Equal(t, map[string]int{"two": 1, "three": 2, "four": 3}, s.saw, "the schema is bumped after each step")
	schema, steps := stepsDone(t, path)
	assert.Equal(t, 4, schema)
	assert.ElementsMatch(t, []string{"one", "two", "three", "four"}, steps)

	t.Run("up to date", func(t *testing.T) {
		s := newSynthetic()
		rawUpdate(t, path, func(tx *bolt.Tx) error { return migrate(tx, 4, s.list(4), discard) })
		assert.Empty(t, s.ran)
	})
	t.Run("from an empty file", func(t *testing.T) {
		s := newSynthetic()
		empty := filepath.Join(t.TempDir(), "empty.db")
		rawUpdate(t, empty, func(tx *bolt.Tx) error { return migrate(tx, 0, s.list(2), discard) })
		assert.Equal(t, []string{"one", "two"}, s.ran)
		assert.Equal(t, 0, s.saw["one"])
		schema, _ := stepsDone(t, empty)
		assert.Equal(t, 2, schema)
	})
}

func TestMigrateFailureLeavesPreviousVersion(t *testing.T) {
	path := fileAt(t, 1, "one")
	s := newSynthetic()
	s.fails = "three"

	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	require.NoError(t, err)
	err = db.Update(func(tx *bolt.Tx) error { return migrate(tx, 1, s.list(4), discard) })
	require.NoError(t, db.Close())

	require.ErrorIs(t, err, errStep)
	assert.Contains(t, err.Error(), "three")
	assert.Contains(t, err.Error(), "2 -> 3")
	assert.Equal(t, []string{"two", "three"}, s.ran, "nothing runs after a failed step")
	schema, steps := stepsDone(t, path)
	assert.Equal(t, 1, schema, "the file stays at the version it had")
	assert.Equal(t, []string{"one"}, steps, "nothing of the failed transaction is written")
}

func TestMigrateRefusesBadLists(t *testing.T) {
	ok := func(*bolt.Tx) error { return nil }
	for _, tc := range []struct {
		name string
		list []migration
		from int
		want error
	}{
		{"gap", []migration{{1, "one", ok, false}, {3, "three", ok, false}}, 0, nil},
		{"swapped", []migration{{2, "two", ok, false}, {1, "one", ok, false}}, 0, nil},
		{"not from 1", []migration{{2, "two", ok, false}}, 0, nil},
		{"duplicate", []migration{{1, "one", ok, false}, {1, "one again", ok, false}}, 0, nil},
		{"file newer than the list", []migration{{1, "one", ok, false}, {2, "two", ok, false}}, 3, ErrSchema},
		{"file newer than an empty list", nil, 1, ErrSchema},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := fileAt(t, tc.from)
			db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
			require.NoError(t, err)
			err = db.Update(func(tx *bolt.Tx) error { return migrate(tx, tc.from, tc.list, discard) })
			require.NoError(t, db.Close())

			require.Error(t, err)
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
			} else {
				assert.Contains(t, err.Error(), "out of order")
			}
			schema, _ := stepsDone(t, path)
			assert.Equal(t, tc.from, schema, "a refused list changes nothing")
		})
	}
}
