package ledger

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNoSpaceErrorSaysWhereAndWhatToDo(t *testing.T) {
	l, _ := newTestLedger(t)
	dir := filepath.Dir(l.Path())
	mnt := mountPoint(dir)
	require.NotEmpty(t, mnt)

	for _, tc := range []struct {
		name  string
		cause error
		want  []string
	}{
		{"ENOSPC on a page write", &os.PathError{Op: "write", Path: l.Path(), Err: syscall.ENOSPC},
			[]string{"is full (", " free of ", "write " + l.Path() + ": no space left on device"}},
		{"EDQUOT", &os.PathError{Op: "write", Path: l.Path(), Err: syscall.EDQUOT},
			[]string{fmt.Sprintf("the disk quota of user %d on", os.Geteuid()), "is used up"}},
		{"errno lost in bbolt's text", errors.New("file resize error: no space left on device"),
			[]string{"is full (", "file resize error"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := l.noSpace(fmt.Errorf("commit: %w", tc.cause))
			require.ErrorIs(t, err, ErrNoSpace)
			msg := err.Error()
			t.Log(msg)
			assert.True(t, strings.HasPrefix(msg, "ledger "+l.Path()+": no space left for the ledger: "), msg)
			assert.Contains(t, msg, "the file system mounted at "+mnt)
			assert.Contains(t, msg, "the write was not made and the ledger keeps its last good state")
			assert.Contains(t, msg, "free space on that file system")
			assert.Contains(t, msg, dir)
			for _, w := range tc.want {
				assert.Contains(t, msg, w)
			}
			assert.Equal(t, err, l.noSpace(err), "wrapping twice changes nothing")
		})
	}

	other := errors.New("input/output error")
	assert.Equal(t, other, l.noSpace(other))
	assert.NoError(t, l.noSpace(nil))
}

func TestMountPoint(t *testing.T) {
	assert.Equal(t, "/", mountPoint("/"))
	assert.Equal(t, "/proc", mountPoint("/proc/self/fd"))
	dir := t.TempDir()
	mnt := mountPoint(dir)
	assert.True(t, mnt == "/" || strings.HasPrefix(dir, mnt+"/"), "%s is not under %s", dir, mnt)
	assert.Empty(t, mountPoint(filepath.Join(dir, "missing")))
}

func TestSizeIEC(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 256 << 10: "256.0 KiB", 3 << 29: "1.5 GiB"} {
		assert.Equal(t, want, sizeIEC(n))
	}
}

// TestDiskFull fills a real file system: a 256 KiB tmpfs, mounted in a
// child process of its own user and mount namespaces, so the test needs
// no privilege and leaves nothing mounted. Where unshare is not allowed
// the test is skipped.
func TestDiskFull(t *testing.T) {
	if dir := os.Getenv("CAA_TEST_TMPFS"); dir != "" {
		diskFullChild(t, dir)
		return
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare here:", err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	script := `mount -t tmpfs -o size=256k caa-test "$1" || { echo "NO-TMPFS"; exit 0; }; ` +
		`exec "$2" -test.run='^TestDiskFull$' -test.count=1 -test.v`
	cmd := exec.CommandContext(ctx, "unshare", "-Urm", "sh", "-c", script, "sh", dir, os.Args[0])
	cmd.Env = append(os.Environ(), "CAA_TEST_TMPFS="+dir)
	out, err := cmd.CombinedOutput()
	if strings.Contains(string(out), "NO-TMPFS") || (err != nil && !strings.Contains(string(out), "=== RUN")) {
		t.Skipf("cannot mount a private tmpfs here: %v\n%s", err, out)
	}
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "--- PASS: TestDiskFull")
	t.Logf("child:\n%s", out)
}

func diskFullChild(t *testing.T, mnt string) {
	opts := testOptions(t, newClock())
	opts.Path = filepath.Join(mnt, "caa", "ledger.db")
	l := openLedger(t, opts)

	var stored []Record
	var err error
	for i := 0; i < 10_000; i++ {
		r := withVM(podRecord(fmt.Sprintf("pod-%05d", i)), fmt.Sprintf("i-%05d", i))
		r.Message = strings.Repeat("x", 2000)
		var s Record
		if s, err = l.Put(r); err != nil {
			break
		}
		stored = append(stored, s)
	}
	require.Error(t, err, "a 256 KiB file system never filled up")
	t.Logf("after %d records: %v", len(stored), err)
	require.ErrorIs(t, err, ErrNoSpace)
	msg := err.Error()
	assert.Contains(t, msg, "ledger "+opts.Path+": no space left for the ledger")
	assert.Contains(t, msg, "the file system mounted at "+mnt+" is full (")
	assert.Contains(t, msg, "free of 256.0 KiB")
	assert.Contains(t, msg, "free space on that file system")

	// The refused write left the ledger as it was.
	recs, err := l.List(Filter{})
	require.NoError(t, err)
	assert.Len(t, recs, len(stored))
	assertVerifies(t, l)
}
