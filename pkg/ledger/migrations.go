package ledger

import (
	"encoding/binary"
	"fmt"
	"log/slog"

	bolt "go.etcd.io/bbolt"
)

// migration moves the layout from version To-1 to To. Each runs inside the
// open's read-write transaction together with its version bump, so a crash
// or error leaves the file at the previous version, untouched.
type migration struct {
	To   int
	Name string
	Run  func(tx *bolt.Tx) error
	// Breaking marks a layout that a caa of an older schema cannot read or
	// write safely: it raises the file's compat to To, and older builds
	// refuse the file from then on (no rollback past it). Leave it false
	// for additive changes (a new bucket, a new key an older caa ignores).
	Breaking bool
}

// migrations is ordered by To, starting at 1 with no gaps. Append only; a
// test fails when an entry has no test of its own (migrations_test.go).
var migrations = append([]migration{
	{To: 1, Name: "initial-layout", Run: migrateInitialLayout, Breaking: true},
	{To: 2, Name: "sandboxes", Run: migrateSandboxes}, // sandbox.go
}, buildMigrations()...)

// currentSchema is the layout this build reads and writes.
var currentSchema = migrations[len(migrations)-1].To

// migrateInitialLayout creates the buckets of schema 1 in an empty file.
func migrateInitialLayout(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketMeta, bucketRecords, bucketVMs, bucketHistory} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// migrate runs, in order, every migration above version from, and bumps the
// stored version (and, for a breaking one, the compat) after each. A file
// of a newer schema is left as it is when its compat says this list can
// still use it (a rollback), and refused otherwise.
func migrate(tx *bolt.Tx, from int, list []migration, log *slog.Logger) error {
	latest := 0
	if len(list) > 0 {
		latest = list[len(list)-1].To
	}
	if from > latest {
		compat := compatOf(tx, from)
		if compat > latest {
			return fmt.Errorf("%w: schema %d is newer than this caa supports (%d), and caa versions before schema %d "+
				"cannot use it; run the caa version that wrote it, or a newer one", ErrSchema, from, latest, compat)
		}
		log.Info("ledger written by a newer caa; using it as it is (rollback-compatible)", "schema", from, "thisCaa", latest, "compat", compat)
		return nil
	}
	for i, m := range list {
		if m.To != i+1 {
			return fmt.Errorf("migration list out of order: entry %d (%s) goes to %d", i, m.Name, m.To)
		}
		if m.To <= from {
			continue
		}
		if err := m.Run(tx); err != nil {
			return fmt.Errorf("migrate ledger schema %d -> %d (%s): %w", m.To-1, m.To, m.Name, err)
		}
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return fmt.Errorf("migrate to %d: %w", m.To, err)
		}
		if err := meta.Put(keySchema, binary.BigEndian.AppendUint32(nil, uint32(m.To))); err != nil {
			return fmt.Errorf("migrate to %d: record version: %w", m.To, err)
		}
		if m.Breaking {
			if err := meta.Put(keyCompat, binary.BigEndian.AppendUint32(nil, uint32(m.To))); err != nil {
				return fmt.Errorf("migrate to %d: record compat: %w", m.To, err)
			}
		}
		log.Info("ledger schema migrated", "from", m.To-1, "to", m.To, "migration", m.Name)
	}
	return nil
}

// compatOf is the oldest schema that may use the file: meta/compat, or the
// file's schema when the key is absent (a file from before compat existed,
// which promised nothing to older builds).
func compatOf(tx *bolt.Tx, schema int) int {
	if b := tx.Bucket(bucketMeta); b != nil {
		if v := b.Get(keyCompat); len(v) == 4 {
			return int(binary.BigEndian.Uint32(v))
		}
	}
	return schema
}
