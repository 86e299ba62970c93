package ledger

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// newerBuild is what a next caa version would carry: this build's
// migrations and one more at the next schema.
func newerBuild(breaking bool) []migration {
	next := migration{To: currentSchema + 1, Name: "next", Breaking: breaking, Run: func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists([]byte("next"))
		return err
	}}
	return append(append([]migration{}, migrations...), next)
}

func metaUint32(t *testing.T, path string, key []byte) int {
	t.Helper()
	var v int
	rawView(t, path, func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketMeta).Get(key); len(b) == 4 {
			v = int(binary.BigEndian.Uint32(b))
		}
		return nil
	})
	return v
}

// TestRollbackOpensALedgerOfANewerAdditiveSchema: a ledger a newer caa
// migrated with an additive change is opened by this caa as it is, for
// writing and for reading, and keeps the newer schema.
func TestRollbackOpensALedgerOfANewerAdditiveSchema(t *testing.T) {
	clock := newClock()
	opts := testOptions(t, clock)
	l := openLedger(t, opts)
	mustPut(t, l, podRecord("pod-a"))
	require.NoError(t, l.Close())
	rawUpdate(t, opts.Path, func(tx *bolt.Tx) error { return migrate(tx, currentSchema, newerBuild(false), discard) })
	require.Equal(t, currentSchema+1, metaUint32(t, opts.Path, keySchema))

	l = openLedger(t, opts)
	assert.Equal(t, currentSchema+1, l.Meta().SchemaVersion, "no migration down")
	r, err := l.Get("pod-a")
	require.NoError(t, err)
	clock.Advance(1)
	r.Phase = PhaseRunning
	_, err = l.Put(r)
	require.NoError(t, err, "this caa writes to it")
	require.NoError(t, l.Close())

	ro := opts
	ro.ReadOnly = true
	l = openLedger(t, ro)
	require.NoError(t, l.Close())
	assert.Equal(t, currentSchema+1, metaUint32(t, opts.Path, keySchema))
}

// TestRollbackPastABreakingSchemaIsRefused: once a newer caa made a
// breaking change, this caa refuses the file and says which to run.
func TestRollbackPastABreakingSchemaIsRefused(t *testing.T) {
	opts := testOptions(t, newClock())
	require.NoError(t, openLedger(t, opts).Close())
	rawUpdate(t, opts.Path, func(tx *bolt.Tx) error { return migrate(tx, currentSchema, newerBuild(true), discard) })
	require.Equal(t, currentSchema+1, metaUint32(t, opts.Path, keyCompat))

	_, err := Open(opts)
	require.ErrorIs(t, err, ErrSchema)
	assert.ErrorContains(t, err, "cannot use it")
	ro := opts
	ro.ReadOnly = true
	_, err = Open(ro)
	require.ErrorIs(t, err, ErrSchema)
}

// TestFieldsOfANewerCaaSurviveAnUpdate: a record a newer caa wrote with a
// field this caa does not know keeps that field through this caa's
// updates and in its history, so a roll forward again finds it.
func TestFieldsOfANewerCaaSurviveAnUpdate(t *testing.T) {
	l, clock := newTestLedger(t)
	stored := mustPut(t, l, podRecord("pod-a"))
	const tagOfTheFuture = 999
	newer := stored
	newer.unknown = appendString(nil, tagOfTheFuture, "a newer caa's field")
	raw := encodeRecord(newer)
	require.NoError(t, l.Update(func(tx *Tx) error { return tx.tx.Bucket(bucketRecords).Put([]byte("pod-a"), raw) }))

	r, err := l.Get("pod-a")
	require.NoError(t, err)
	clock.Advance(1)
	r.Phase = PhaseRunning
	r = withVM(r, "i-1")
	_, err = l.Put(r)
	require.NoError(t, err)

	var after []byte
	require.NoError(t, l.View(func(tx *Tx) error {
		after = append(after, tx.tx.Bucket(bucketRecords).Get([]byte("pod-a"))...)
		return nil
	}))
	got, err := decodeRecord(after)
	require.NoError(t, err)
	assert.Equal(t, PhaseRunning, got.Phase)
	assert.True(t, hasField(got.unknown, tagOfTheFuture), "the newer caa's field is written back")
	hist, err := l.History("pod-a")
	require.NoError(t, err)
	assert.True(t, hasField(hist[len(hist)-1].Record.unknown, tagOfTheFuture), "and kept in the history")
}
