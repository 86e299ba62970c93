package katafake

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

var magic = []byte("STREAM!!")

// echo serves a unix socket that checks the magic and echoes what follows
// through mangle (nil: as it is).
func echo(t *testing.T, mangle func(off int64, b []byte) []byte) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kf")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		head := make([]byte, len(magic))
		if _, err := io.ReadFull(c, head); err != nil || !bytes.Equal(head, magic) {
			return
		}
		buf := make([]byte, 1000)
		var off int64
		for {
			n, err := c.Read(buf)
			out := buf[:n]
			if mangle != nil {
				out = mangle(off, out)
			}
			off += int64(n)
			if _, werr := c.Write(out); werr != nil || err != nil {
				return
			}
		}
	}()
	return sock
}

func runStream(t *testing.T, sock string) (written, lost int64, err error) {
	t.Helper()
	s, err := StartStream(context.Background(), sock, magic, 512, time.Millisecond)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return s.Written() > 20000 }, 10*time.Second, time.Millisecond)
	return s.Finish(2 * time.Second)
}

func TestStreamSeesEveryByteComeBack(t *testing.T) {
	written, lost, err := runStream(t, echo(t, nil))
	require.NoError(t, err)
	assert.Zero(t, lost)
	assert.Greater(t, written, int64(20000))
}

func TestStreamReportsADroppedOrChangedByte(t *testing.T) {
	t.Run("dropped", func(t *testing.T) {
		_, lost, err := runStream(t, echo(t, func(off int64, b []byte) []byte {
			if off <= 5000 && 5000 < off+int64(len(b)) {
				i := 5000 - off
				return append(append([]byte(nil), b[:i]...), b[i+1:]...)
			}
			return b
		}))
		require.Error(t, err)
		assert.Positive(t, lost)
	})
	t.Run("changed", func(t *testing.T) {
		_, lost, err := runStream(t, echo(t, func(off int64, b []byte) []byte {
			if off <= 7000 && 7000 < off+int64(len(b)) {
				b[7000-off]++
			}
			return b
		}))
		require.ErrorContains(t, err, "stream byte 7000")
		assert.Positive(t, lost)
	})
}

func TestHealthCheckCountsMissesAndTheLongestAnswer(t *testing.T) {
	ag, err := podvmfake.StartAgent()
	require.NoError(t, err)
	defer ag.Close()
	a, err := DialAgent(context.Background(), ag.Socket())
	require.NoError(t, err)
	defer a.Close()
	s := &Shims{Agents: []*Agent{a}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.Check(ctx, time.Millisecond, time.Second)
	require.Eventually(t, func() bool { return a.Checks() >= 5 }, 10*time.Second, time.Millisecond)
	checks, misses := s.Counts()
	assert.GreaterOrEqual(t, checks, 5)
	assert.Zero(t, misses, "a serving agent")
	assert.Positive(t, s.Longest())

	ag.SetServing(false) // NOT_SERVING is a miss, as for kata
	require.Eventually(t, func() bool { return len(a.Misses()) > 0 }, 10*time.Second, time.Millisecond)
	ag.SetServing(true)
	n := len(a.Misses())
	require.NoError(t, ag.Close()) // the agent goes: every check after is a miss
	require.Eventually(t, func() bool { return len(a.Misses()) > n+2 }, 10*time.Second, time.Millisecond)
	cancel()
	s.Wait()
}
