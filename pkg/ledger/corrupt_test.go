package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
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

const pageSize = 4096 // bbolt's default on this platform; read from the file below

// damagedLedger writes n records to a fresh ledger, closes it and returns
// its options and UIDs.
func damagedLedger(t *testing.T, n int) (Options, []string) {
	t.Helper()
	opts := testOptions(t, newClock())
	l, err := Open(opts)
	require.NoError(t, err)
	uids := fillLedger(t, l, n, 10)
	require.NoError(t, l.Close())
	return opts, uids
}

// probeDamaged opens a damaged file writable and read-only. An open that
// fails must say why (one of the kinds in want) and name the file; an open
// that succeeds must report the damage through Verify, List or Get. Either
// way nothing may panic. It returns whether any open succeeded.
func probeDamaged(t *testing.T, opts Options, uids []string, want ...error) (opened bool) {
	t.Helper()
	for _, readOnly := range []bool{false, true} {
		t.Run("readOnly="+strconv.FormatBool(readOnly), func(t *testing.T) {
			o := opts
			o.ReadOnly = readOnly
			var l *Ledger
			var err error
			require.NotPanics(t, func() { l, err = Open(o) })
			if err != nil {
				t.Logf("open: %v", err)
				assert.True(t, isOneOf(err, want...), "open error %q is not one of %v", err, want)
				assert.NotErrorIs(t, err, ErrLocked, "a failed open must release the file")
				assert.Contains(t, err.Error(), opts.Path)
				return
			}
			opened = true
			defer func() { assert.NoError(t, l.Close()) }()
			reported := false
			require.NotPanics(t, func() {
				probs, err := l.Verify()
				require.NoError(t, err)
				for _, p := range probs {
					t.Logf("verify: %s", p)
				}
				reported = len(probs) > 0
				if _, err := l.List(Filter{}); err != nil {
					t.Logf("list: %v", err)
					assert.ErrorIs(t, err, ErrCorrupt)
					reported = true
				}
				for _, uid := range uids {
					if _, err := l.Get(uid); err != nil {
						reported = true
						assert.True(t, isOneOf(err, ErrCorrupt, ErrNotFound), "get %s: %v", uid, err)
					}
					_, _ = l.History(uid)
				}
				_, _ = l.Stats()
			})
			assert.True(t, reported, "the damage went unnoticed")
		})
	}
	return opened
}

func isOneOf(err error, kinds ...error) bool {
	for _, k := range kinds {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

func TestTruncatedFile(t *testing.T) {
	opts, uids := damagedLedger(t, 200)
	info, err := os.Stat(opts.Path)
	require.NoError(t, err)
	require.Greater(t, info.Size(), int64(8*pageSize), "the fixture must span many pages")
	require.NoError(t, os.Truncate(opts.Path, info.Size()/2))

	opened := probeDamaged(t, opts, uids, ErrCorrupt)
	assert.False(t, opened, "a file shorter than its pages must be refused at open")
}

// flipAround inverts the bytes of window [off+from, off+to) for every
// occurrence of needle past the two meta pages.
func flipAround(t *testing.T, path string, needle []byte, from, to int) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	flipped := 0
	for off := 0; ; {
		i := bytes.Index(data[off:], needle)
		if i < 0 {
			break
		}
		at := off + i
		off = at + len(needle)
		if at < 2*pageSize {
			continue
		}
		for j := max(at+from, 2*pageSize); j < min(at+to, len(data)); j++ {
			data[j] ^= 0xff
		}
		flipped++
	}
	require.Positive(t, flipped, "no %q in the file", needle)
	require.NoError(t, os.WriteFile(path, data, 0o600))
}

// smashPageHeaders overwrites the header (id, flags, count, overflow) of
// every page past the meta pages that holds needle.
func smashPageHeaders(t *testing.T, path string, needle []byte, header []byte) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	smashed := map[int]bool{}
	for off := 2 * pageSize; ; {
		i := bytes.Index(data[off:], needle)
		if i < 0 {
			break
		}
		page := (off + i) / pageSize
		off += i + len(needle)
		if !smashed[page] {
			copy(data[page*pageSize:], header)
			smashed[page] = true
		}
	}
	require.NotEmpty(t, smashed, "no %q in the file", needle)
	require.NoError(t, os.WriteFile(path, data, 0o600))
}

// branchPointsPastEnd points the first child of every branch page far past
// the end of the file, where reading it faults rather than panics.
func branchPointsPastEnd(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	n := 0
	for p := 2; (p+1)*pageSize <= len(data); p++ {
		h := data[p*pageSize:]
		// page header: id uint64, flags uint16 (0x01 branch), count, overflow;
		// then branch elements: pos uint32, ksize uint32, pgid uint64.
		if binary.LittleEndian.Uint64(h) == uint64(p) && binary.LittleEndian.Uint16(h[8:]) == 0x01 {
			binary.LittleEndian.PutUint64(h[16+8:], 1<<30)
			n++
		}
	}
	require.Positive(t, n, "no branch page in the file")
	require.NoError(t, os.WriteFile(path, data, 0o600))
}

const damagedChildEnv = "CAA_LEDGER_DAMAGED_CHILD"

// TestDamagedChild probes a damaged file in a child process (see
// probeInChild); without its variable it does nothing.
func TestDamagedChild(t *testing.T) {
	path, n, ok := strings.Cut(os.Getenv(damagedChildEnv), "|")
	if !ok {
		return
	}
	count, err := strconv.Atoi(n)
	require.NoError(t, err)
	var uids []string
	for i := range count {
		uids = append(uids, fmt.Sprintf("pod-%05d", i))
	}
	probeDamaged(t, Options{Path: path, Node: testNode, Cluster: testCluster, Timeout: 200 * time.Millisecond}, uids, ErrCorrupt)
}

// probeInChild runs probeDamaged in a child process, so that a damaged file
// that crashes the process (a fault outside the ledger's guard) fails this
// test instead of killing the whole test binary.
func probeInChild(t *testing.T, path string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := childTest(ctx, "TestDamagedChild", damagedChildEnv+"="+path+"|"+strconv.Itoa(n)).CombinedOutput()
	if err != nil {
		if len(out) > 4000 {
			out = out[:4000] // the top of a crash says what and where
		}
		t.Fatalf("probing the damaged file failed or crashed the process (%v):\n%s", err, out)
	}
	require.Contains(t, string(out), "--- PASS: TestDamagedChild")
	t.Logf("child:\n%s", out)
}

func TestFlippedBytesInDataPage(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	junk := make([]byte, 16)
	for i := range junk {
		junk[i] = byte(rng.Uint32())
	}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"value bytes", func(t *testing.T, path string) { flipAround(t, path, []byte("pod-00100"), 0, 24) }},
		{"key and value bytes", func(t *testing.T, path string) { flipAround(t, path, []byte("pod-00100"), -8, 40) }},
		{"element headers", func(t *testing.T, path string) { flipAround(t, path, []byte("pod-00150"), -64, 0) }},
		{"page header: huge count", func(t *testing.T, path string) {
			// id, flags = leaf, count = 0xffff, overflow = 0
			smashPageHeaders(t, path, []byte("pod-00120"), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0xff, 0xff, 0, 0, 0, 0})
		}},
		{"page header: branch flag on a leaf", func(t *testing.T, path string) {
			smashPageHeaders(t, path, []byte("pod-00060"), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 0x20, 0, 0, 0, 0, 0})
		}},
		{"page header: random", func(t *testing.T, path string) { smashPageHeaders(t, path, []byte("pod-00180"), junk) }},
		{"branch points past the end", branchPointsPastEnd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, _ := damagedLedger(t, 200)
			tc.damage(t, opts.Path)
			probeInChild(t, opts.Path, 200)
		})
	}
}

func TestNotABboltFile(t *testing.T) {
	random := make([]byte, 64<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	for _, tc := range []struct {
		name    string
		content []byte
	}{
		{"random bytes", random},
		{"text file", bytes.Repeat([]byte("node-a: this is not a ledger\n"), 300)},
		{"one short line", []byte("hello\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions(t, newClock())
			require.NoError(t, os.MkdirAll(filepath.Dir(opts.Path), 0o700))
			require.NoError(t, os.WriteFile(opts.Path, tc.content, 0o600))

			opened := probeDamaged(t, opts, nil, ErrCorrupt, ErrNotLedger)
			assert.False(t, opened)
			got, err := os.ReadFile(opts.Path)
			require.NoError(t, err)
			assert.Equal(t, tc.content, got, "a refused open must not write to someone else's file")
		})
	}
}

func TestZeroLengthFile(t *testing.T) {
	opts := testOptions(t, newClock())
	require.NoError(t, os.MkdirAll(filepath.Dir(opts.Path), 0o700))
	require.NoError(t, os.WriteFile(opts.Path, nil, 0o600))

	t.Run("read-only", func(t *testing.T) {
		ro := opts
		ro.ReadOnly = true
		_, err := Open(ro)
		require.Error(t, err, "an empty file is no ledger to read")
		assert.True(t, isOneOf(err, ErrNotLedger, ErrCorrupt, ErrNotFound), "error %q wraps no kind", err)
		assert.Contains(t, err.Error(), opts.Path)
	})
	t.Run("writable", func(t *testing.T) {
		l := openLedger(t, opts)
		assert.Equal(t, currentSchema, l.Meta().SchemaVersion)
		mustPut(t, l, podRecord("uid-1"))
		assertVerifies(t, l)
	})
}

func TestVerifyHealthy(t *testing.T) {
	l, _ := newTestLedger(t)
	fillLedger(t, l, 50, 7)
	r, err := l.Get("pod-00003")
	require.NoError(t, err)
	r.VMID = "i-moved"
	r = mustPut(t, l, r)
	require.NoError(t, l.Delete("pod-00006", 1))
	require.NoError(t, l.Delete(r.PodUID, r.Revision))
	assertVerifies(t, l)
}

func TestVerifyFindsInconsistencies(t *testing.T) {
	for _, tc := range []struct {
		name      string
		damage    func(t *testing.T, l *Ledger, tx *bolt.Tx) error
		wantWhere string
		wantWhat  string
	}{
		{"index entry for a missing record", func(_ *testing.T, _ *Ledger, tx *bolt.Tx) error {
			return tx.Bucket(bucketVMs).Put(vmKey("aws", "i-ghost"), []byte("uid-ghost"))
		}, "vms/aws/i-ghost", "uid-ghost"},
		{"record whose VM is not indexed", func(_ *testing.T, _ *Ledger, tx *bolt.Tx) error {
			return tx.Bucket(bucketVMs).Delete(vmKey("aws", "i-1"))
		}, "records/uid-vm", "not indexed"},
		{"index pointing at a pod with another VM", func(_ *testing.T, _ *Ledger, tx *bolt.Tx) error {
			return tx.Bucket(bucketVMs).Put(vmKey("aws", "i-stale"), []byte("uid-vm"))
		}, "vms/aws/i-stale", "i-1"},
		{"index key without separator", func(_ *testing.T, _ *Ledger, tx *bolt.Tx) error {
			return tx.Bucket(bucketVMs).Put([]byte("i-nosep"), []byte("uid-vm"))
		}, `vms/"i-nosep"`, "separator"},
		{"record under another key", func(t *testing.T, _ *Ledger, tx *bolt.Tx) error {
			return tx.Bucket(bucketRecords).Put([]byte("uid-other"), encodeRecord(podRecordOn("uid-plain", testNode)))
		}, "records/uid-other", "uid-plain"},
		{"record of another node", func(_ *testing.T, _ *Ledger, tx *bolt.Tx) error {
			return tx.Bucket(bucketRecords).Put([]byte("uid-x"), encodeRecord(podRecordOn("uid-x", "node-b")))
		}, "records/uid-x", "node-b"},
		{"invalid record", func(_ *testing.T, _ *Ledger, tx *bolt.Tx) error {
			r := podRecordOn("uid-x", testNode)
			r.Phase = "Pending"
			return tx.Bucket(bucketRecords).Put([]byte("uid-x"), encodeRecord(r))
		}, "records/uid-x", "Pending"},
		{"undecodable history entry", func(_ *testing.T, _ *Ledger, tx *bolt.Tx) error {
			return tx.Bucket(bucketHistory).Bucket([]byte("uid-plain")).Put(seqKey(9), []byte{0x07})
		}, "history/uid-plain/0000000000000009", "decode"},
		{"meta without node", func(_ *testing.T, _ *Ledger, tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Delete(keyNode)
		}, "meta", "node"},
		{"missing bucket", func(_ *testing.T, _ *Ledger, tx *bolt.Tx) error {
			return tx.DeleteBucket(bucketHistory)
		}, "buckets", "missing"},
		{"file readable by others", func(t *testing.T, l *Ledger, _ *bolt.Tx) error {
			return os.Chmod(l.Path(), 0o644)
		}, "file", "644"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := newTestLedger(t)
			mustPut(t, l, withVM(podRecord("uid-vm"), "i-1"))
			mustPut(t, l, podRecord("uid-plain"))
			assertVerifies(t, l)
			require.NoError(t, l.db.Update(func(tx *bolt.Tx) error { return tc.damage(t, l, tx) }))

			probs, err := l.Verify()
			require.NoError(t, err)
			require.NotEmpty(t, probs)
			found := false
			for _, p := range probs {
				t.Logf("%s", p)
				if p.Where == tc.wantWhere {
					found = true
					assert.Contains(t, p.What, tc.wantWhat)
				}
			}
			assert.True(t, found, "no problem at %s in %v", tc.wantWhere, probs)
		})
	}
}

func podRecordOn(uid, node string) Record {
	r := podRecord(uid)
	r.Node = node
	r.Revision = 1
	return r
}
