package ledger

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Benchmark fixtures are built once per size and shared by the benchmarks
// that only read them; TestMain removes them.
var (
	fixtureMu   sync.Mutex
	fixtureDir  string
	fixtureOnce = map[int]*fixture{}
)

type fixture struct {
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	fixtureMu.Lock()
	if fixtureDir != "" {
		_ = os.RemoveAll(fixtureDir)
	}
	fixtureMu.Unlock()
	os.Exit(code)
}

// fixturePath returns a closed ledger file holding n records (every third
// with a VM), written in batches of 1000.
func fixturePath(b *testing.B, n int) string {
	b.Helper()
	fixtureMu.Lock()
	if fixtureDir == "" {
		dir, err := os.MkdirTemp("", "caa-ledger-bench-")
		require.NoError(b, err)
		fixtureDir = dir
	}
	f := fixtureOnce[n]
	if f == nil {
		f = &fixture{path: filepath.Join(fixtureDir, fmt.Sprintf("ledger-%d.db", n))}
		fixtureOnce[n] = f
	}
	fixtureMu.Unlock()

	f.once.Do(func() {
		start := time.Now()
		l, err := Open(Options{Path: f.path, Node: testNode, Cluster: testCluster, Timeout: time.Second})
		if err != nil {
			f.err = err
			return
		}
		fillLedger(b, l, n, 1000)
		f.err = l.Close()
		b.Logf("built the %d-record fixture in %s", n, time.Since(start).Round(time.Millisecond))
	})
	require.NoError(b, f.err)
	return f.path
}

func openFixture(b *testing.B, n int) *Ledger {
	b.Helper()
	l, err := Open(Options{Path: fixturePath(b, n), ReadOnly: true, Timeout: time.Second})
	require.NoError(b, err)
	b.Cleanup(func() { _ = l.Close() })
	return l
}

func BenchmarkPutDurable(b *testing.B) {
	l, _ := newTestLedger(b)
	i := 0
	for b.Loop() {
		mustPut(b, l, withVM(podRecord(fmt.Sprintf("pod-%08d", i)), fmt.Sprintf("i-%08d", i)))
		i++
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "records/s")
}

func BenchmarkPutBatched(b *testing.B) {
	const perUpdate = 100
	l, _ := newTestLedger(b)
	n := 0
	for b.Loop() {
		err := l.Update(func(tx *Tx) error {
			for j := range perUpdate {
				id := n + j
				if _, err := tx.Put(withVM(podRecord(fmt.Sprintf("pod-%08d", id)), fmt.Sprintf("i-%08d", id))); err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(b, err)
		n += perUpdate
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
}

func BenchmarkGet(b *testing.B) {
	const n = 10_000
	l := openFixture(b, n)
	i := 0
	for b.Loop() {
		r, err := l.Get(fmt.Sprintf("pod-%05d", (i*7919)%n))
		if err != nil || r.Revision != 1 {
			b.Fatalf("get: %v %+v", err, r)
		}
		i++
	}
}

func BenchmarkList(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			l := openFixture(b, n)
			iters := 0
			for b.Loop() {
				recs, err := l.List(Filter{})
				if err != nil || len(recs) != n {
					b.Fatalf("list: %d records, %v", len(recs), err)
				}
				iters++
			}
			b.ReportMetric(float64(n*iters)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// BenchmarkOpenScan100k is what `caa ledger list` costs on a big node: open
// read-only, read every record, close.
func BenchmarkOpenScan100k(b *testing.B) {
	const n = 100_000
	path := fixturePath(b, n)
	iters := 0
	for b.Loop() {
		iters++
		l, err := Open(Options{Path: path, ReadOnly: true, Timeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		recs, err := l.List(Filter{})
		if err != nil || len(recs) != n {
			b.Fatalf("list: %d records, %v", len(recs), err)
		}
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()*1000/float64(iters), "ms/op")
}

// BenchmarkFsyncFloor is the lower bound of one durable write on this disk:
// bbolt commits by writing its data pages, fdatasync, then its meta page,
// fdatasync. Two page writes each made durable cannot be beaten by any
// store that keeps fsync on; PutDurable is reported as a ratio to this.
func BenchmarkFsyncFloor(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "floor"))
	require.NoError(b, err)
	b.Cleanup(func() { _ = f.Close() })
	page := make([]byte, os.Getpagesize())
	for b.Loop() {
		for _, off := range []int64{int64(len(page)), 0} {
			if _, err := f.WriteAt(page, off); err != nil {
				b.Fatal(err)
			}
			if err := syscall.Fdatasync(int(f.Fd())); err != nil {
				b.Fatal(err)
			}
		}
	}
}
