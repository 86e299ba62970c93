package holder

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const childEnv = "HOLDER_TEST_LOCK_HOLDER"

// TestMain runs the lock-holding child when asked: it takes the file lock
// on the ledger path and renews the lease beside it, as a holding caa does.
func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		holdLock(path)
		return
	}
	os.Exit(m.Run())
}

// childTTL is long enough that a child starved of CPU on a loaded machine
// (CI runs every suite at once) still renews before its lease runs out.
const childTTL = time.Second

func holdLock(path string) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		os.Exit(2)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		os.Exit(3)
	}
	// Nothing below uses f: without this the collector may finalize it,
	// which closes the descriptor and so drops the lock while the child
	// still runs (seen under load: the waiter took the lock).
	defer runtime.KeepAlive(f)
	go Renew(context.Background(), LeasePath(path), "caa-new (pid "+fmt.Sprint(os.Getpid())+")", os.Getpid(), childTTL, func() bool { return true })
	fmt.Println("locked")
	select {}
}

var errLocked = errors.New("locked")

// tryLock is a non-blocking open of the lock, as ledger.Open is with its
// own timeout.
func tryLock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errLocked
		}
		return nil, err
	}
	return f, nil
}

// TestAStoppedHolderIsWaitedForLiveAndNeverBroken: a real process holds the
// lock and renews its lease; it is SIGSTOPped. The waiter keeps beating,
// says the lease expired and who holds the lock, never takes the lock while
// that process exists, and takes it as soon as the process is killed.
func TestAStoppedHolderIsWaitedForLiveAndNeverBroken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+path)
	var childErr bytes.Buffer
	child.Stderr = &childErr
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "locked\n", line)
	require.Eventually(t, func() bool { _, err := ReadLease(LeasePath(path)); return err == nil }, 5*time.Second, 10*time.Millisecond)

	var beats atomic.Int64
	var mu sync.Mutex
	var said []string
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		f, err := Wait(ctx, LockWait{
			LeasePath: LeasePath(path),
			Locked:    func(err error) bool { return errors.Is(err, errLocked) },
			Beat:      func(time.Time) { beats.Add(1) },
			Say:       func(r string) { mu.Lock(); said = append(said, r); mu.Unlock() },
			Prefix:    "taking the ledger back",
			Every:     20 * time.Millisecond,
		}, func(context.Context) (*os.File, error) { return tryLock(path) })
		if f != nil {
			_ = f.Close()
		}
		got <- err
	}()
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(said) == 0 {
			return ""
		}
		return said[len(said)-1]
	}
	sawRenewed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range said {
			if strings.Contains(r, "renewed") {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(20 * time.Second); !sawRenewed(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			select {
			case err := <-got:
				stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child.Process.Pid))
				require.Failf(t, "a live holder: its lease runs", "the waiter returned (%v) while the holder held the lock; holder stat %s stderr %s", err, stat, childErr.String())
			default:
			}
			stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child.Process.Pid))
			require.Failf(t, "a live holder: its lease runs", "never said renewed; last said %q; holder's stat: %s", last(), stat)
		}
	}

	require.NoError(t, child.Process.Signal(syscall.SIGSTOP))
	require.Eventually(t, func() bool { return strings.Contains(last(), "expired") }, 20*time.Second, 10*time.Millisecond,
		"a stopped holder stops renewing")
	assert.Contains(t, last(), fmt.Sprintf("pid %d", child.Process.Pid))
	assert.Contains(t, last(), "not broken on a timeout")
	// Many lease lifetimes later the lock is still the stopped process's,
	// and the waiter still beats.
	before := beats.Load()
	deadline := time.Now().Add(5 * childTTL)
	for time.Now().Before(deadline) {
		select {
		case err := <-got:
			t.Fatalf("the waiter returned (%v) while the stopped holder exists", err)
		case <-time.After(childTTL / 3):
		}
	}
	// A ticker drops the ticks a starved reader misses, so this asks for a
	// tenth of the 250 beats of an idle machine, not all of them.
	assert.Greater(t, beats.Load(), before+int64(5*childTTL/(20*time.Millisecond))/10, "the waiter's heartbeat goes on")

	require.NoError(t, child.Process.Kill()) // the kubelet's probe restarts the hung caa
	select {
	case err := <-got:
		require.NoError(t, err, "the lock frees with the process, and the waiter takes it")
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not take the freed lock")
	}
}

func TestRenewStopsWhenTheLoopStalls(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db.lease")
	var alive atomic.Bool
	alive.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Renew(ctx, path, "caa-a (pid 1)", 1, 90*time.Millisecond, alive.Load)
	require.Eventually(t, func() bool { _, err := ReadLease(path); return err == nil }, 5*time.Second, 5*time.Millisecond)
	alive.Store(false) // the reconcile loop stopped beating
	l, err := ReadLease(path)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return time.Now().After(l.Deadline.Add(100 * time.Millisecond)) }, 5*time.Second, 10*time.Millisecond)
	l2, err := ReadLease(path)
	require.NoError(t, err)
	assert.False(t, l2.Deadline.After(l.Deadline.Add(90*time.Millisecond)), "no renewal while the loop is stalled")
	assert.Contains(t, DescribeLockHolder(path, time.Now()), "expired")
}

func TestDescribeWithoutALease(t *testing.T) {
	assert.Contains(t, DescribeLockHolder(filepath.Join(t.TempDir(), "none"), time.Now()), "left no lease")
}
