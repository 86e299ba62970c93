package e2e

import (
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// schemaOf reads the ledger's layout version straight from the file, as
// neither caa build would report another's.
func schemaOf(t *testing.T, path string) int {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	require.NoError(t, err)
	defer db.Close()
	var v int
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte("meta")).Get([]byte("schema")); len(b) == 4 {
			v = int(b[0])<<24 | int(b[1])<<16 | int(b[2])<<8 | int(b[3])
		}
		return nil
	}))
	return v
}

// TestRollForwardAndBack runs two real builds in turn on one ledger: this
// caa (v1) and a test build (v2, -tags caa_ledger_v2test) that migrates the
// ledger one schema past the ordinary build (3) and writes a record field v1 does not know. v1 → v2 →
// v1 → v2, each taking over from the one before: nothing is recreated or
// deleted, new pods get their VMs, v1 uses the schema-2 file as it is, and
// `caa ledger verify` of both builds is clean.
func TestRollForwardAndBack(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 8*time.Minute)
	v2Bin := filepath.Join(t.TempDir(), "caa-v2")
	require.NoError(t, cluster.BuildCaa(ctx, v2Bin, "v2-test", "caa_ledger_v2test"))

	const node = "worker-1"
	c := startWithNode(ctx, t, node)
	aws, calls := newRecordedAWSCloud(t)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	pods := createPods(ctx, t, c, "team", "web", node, 6)

	start := func(bin, label string) *daemon {
		t.Helper()
		d := launchCaaBin(t, bin, c, node, ledgerPath, label, append(aws.awsArgs(), "--pod-name", label), awsEnv())
		d.waitReady(t, func() {})
		requireOneEach(t, aws.core, pods, time.Minute)
		return d
	}
	writes := func() int {
		n := calls.counts()
		return n["RunInstances"] + n["TerminateInstances"]
	}

	v1 := start(caaBin, "v1")
	before := liveVMs(aws.core)
	steps := []struct {
		bin, label string
		schema     int
	}{{v2Bin, "v2", 3}, {caaBin, "v1-again", 3}, {v2Bin, "v2-again", 3}}
	prev := v1
	for i, s := range steps {
		w := writes()
		d := start(s.bin, s.label)
		prev.stop(t)
		// The running build reports the schema over its socket.
		stats := runBin(t, s.bin, "ledger", "stats", "--ledger", ledgerPath, "-o", "json")
		assert.Contains(t, stats, fmt.Sprintf(`"schemaVersion": %d`, s.schema), "after %s: %s", s.label, stats)
		assert.Equal(t, w, writes(), "%s adopts every VM: no cloud write", s.label)
		for uid, id := range before {
			assert.Equal(t, id, liveVMs(aws.core)[uid], "%s replaced no VM", s.label)
		}
		// New work is done by each version.
		maps.Copy(pods, createPods(ctx, t, c, "team", "step"+string(rune('a'+i)), node, 2))
		requireOneEach(t, aws.core, pods, time.Minute)
		before = liveVMs(aws.core)
		prev = d
		if s.label == "v1-again" {
			assert.Contains(t, d.logs.String(), "ledger written by a newer caa", "v1 says it runs on a newer schema")
		}
	}
	prev.stop(t)
	assert.Equal(t, 3, schemaOf(t, ledgerPath), "no version migrated the file down")
	for _, bin := range []string{caaBin, v2Bin} {
		out := runBin(t, bin, "ledger", "verify", "--ledger", ledgerPath)
		assert.True(t, strings.Contains(out, "ok"), "%s ledger verify: %s", bin, out)
	}
}
