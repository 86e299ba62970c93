package ledger

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// TestPreflightFingerprintIsRecordedAtOpen: a writable open with a
// fingerprint records it; an open without one (the CLI's rebuild, an
// older caa) leaves it; a read-only reader sees it.
func TestPreflightFingerprintIsRecordedAtOpen(t *testing.T) {
	opts := testOptions(t, newClock())
	l, err := Open(opts)
	require.NoError(t, err)
	assert.Empty(t, l.Meta().Preflight, "a new ledger has no preflight recorded")
	require.NoError(t, l.Close())

	opts.Preflight = "sha256:aaaa"
	l, err = Open(opts)
	require.NoError(t, err)
	assert.Equal(t, "sha256:aaaa", l.Meta().Preflight)
	require.NoError(t, l.Close())

	opts.Preflight = ""
	l, err = Open(opts)
	require.NoError(t, err)
	assert.Equal(t, "sha256:aaaa", l.Meta().Preflight, "an open without a fingerprint keeps the recorded one")
	require.NoError(t, l.Close())

	ro := Options{Path: opts.Path, ReadOnly: true, Timeout: opts.Timeout}
	l, err = Open(ro)
	require.NoError(t, err)
	assert.Equal(t, "sha256:aaaa", l.Meta().Preflight)
	require.NoError(t, l.Close())

	opts.Preflight = "sha256:bbbb"
	l, err = Open(opts)
	require.NoError(t, err)
	assert.Equal(t, "sha256:bbbb", l.Meta().Preflight, "a new fingerprint replaces the old")
	require.NoError(t, l.Close())
}

// TestUnknownMetaKeysNeedNoMigration is the rule meta/preflight relies on
// for rollback: a meta key this build does not know (as meta/preflight is
// to a caa older than it) opens for writing and reading, verifies clean,
// and is still there after this build wrote the file.
func TestUnknownMetaKeysNeedNoMigration(t *testing.T) {
	opts := testOptions(t, newClock())
	l := openLedger(t, opts)
	mustPut(t, l, podRecord("pod-a"))
	require.NoError(t, l.Close())
	rawUpdate(t, opts.Path, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("fromANewerCaa"), []byte("sha256:cccc"))
	})

	l, err := Open(opts)
	require.NoError(t, err)
	assert.Equal(t, currentSchema, l.Meta().SchemaVersion, "no migration ran for the key")
	probs, err := l.Verify()
	require.NoError(t, err)
	assert.Empty(t, probs)
	_, err = l.Put(withVM(podRecord("pod-b"), "i-b"))
	require.NoError(t, err)
	require.NoError(t, l.Close())

	var kept []byte
	rawView(t, opts.Path, func(tx *bolt.Tx) error {
		kept = append(kept, tx.Bucket(bucketMeta).Get([]byte("fromANewerCaa"))...)
		return nil
	})
	assert.Equal(t, "sha256:cccc", string(kept), "a writable open keeps a key it does not know")
}
