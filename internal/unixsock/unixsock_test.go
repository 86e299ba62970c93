package unixsock_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/unixsock"
)

func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "us") // socket paths are capped at 108 bytes
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// staleSocket leaves a socket file no process serves, as a SIGKILL does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
}

func TestListenReplacesAStaleSocketOnly(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "sub", "x.sock")
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	staleSocket(t, path)
	ln, err := unixsock.Listen(path, unixsock.Options{Mode: 0o600})
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	_, err = unixsock.Listen(path, unixsock.Options{})
	require.ErrorIs(t, err, unixsock.ErrServed, "a live socket is not taken over")
	require.NoError(t, ln.Close())
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "Close removes the file")

	file := filepath.Join(dir, "data")
	require.NoError(t, os.WriteFile(file, []byte("keep"), 0o600))
	_, err = unixsock.Listen(file, unixsock.Options{})
	require.ErrorIs(t, err, unixsock.ErrNotSocket)
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.Equal(t, "keep", string(data), "a file that is not a socket is never removed")

	fresh := filepath.Join(dir, "new", "y.sock")
	ln, err = unixsock.Listen(fresh, unixsock.Options{DirMode: 0o750})
	require.NoError(t, err)
	defer ln.Close()
	fi, err = os.Stat(filepath.Dir(fresh))
	require.NoError(t, err)
	assert.Zero(t, fi.Mode().Perm()&0o007, "the directory is made with DirMode: others have no access")
}

func TestAcceptServesUntilTheContextEnds(t *testing.T) {
	path := filepath.Join(shortDir(t), "a.sock")
	ln, err := unixsock.Listen(path, unixsock.Options{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan net.Conn, 1)
	done := make(chan error, 1)
	go func() { done <- unixsock.Accept(ctx, ln, nil, func(c net.Conn) { got <- c }) }()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer c.Close()
	select {
	case s := <-got:
		s.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("no connection handed over")
	}
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("Accept outlived its context")
	}
	_, err = net.Dial("unix", path)
	require.Error(t, err, "the context's end closed the listener")

	ln, err = unixsock.Listen(path, unixsock.Options{})
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	require.ErrorIs(t, unixsock.Accept(context.Background(), ln, nil, func(net.Conn) {}), net.ErrClosed)
}

func TestPeerIsTheConnectingProcess(t *testing.T) {
	path := filepath.Join(shortDir(t), "p.sock")
	ln, err := unixsock.Listen(path, unixsock.Options{})
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer c.Close()
	s, err := ln.Accept()
	require.NoError(t, err)
	defer s.Close()
	cred, err := unixsock.Peer(s)
	require.NoError(t, err)
	assert.Equal(t, unixsock.Cred{PID: int32(os.Getpid()), UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}, cred)
	_, err = unixsock.Peer(&net.TCPConn{})
	require.Error(t, err, "only a unix socket has a peer's credentials")
}

// A listener whose path another listener has since taken (the file was
// unlinked behind it, by a process not using this package or by hand, and
// bound again) leaves the new file on Close: its clients still connect.
func TestCloseRemovesOnlyItsOwnSocketFile(t *testing.T) {
	path := filepath.Join(shortDir(t), "agent.sock")
	old, err := unixsock.Listen(path, unixsock.Options{})
	require.NoError(t, err)
	require.NoError(t, os.Remove(path))
	cur, err := unixsock.Listen(path, unixsock.Options{})
	require.NoError(t, err)
	defer cur.Close()
	assert.False(t, old.Owns())
	assert.True(t, cur.Owns())
	require.NoError(t, old.Close())
	c, err := net.Dial("unix", path)
	require.NoError(t, err, "the new listener's socket file is still there")
	c.Close()
	require.NoError(t, cur.Close())
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "its owner's Close removes it")
}

// A listener closed twice (its owner's Close, then a context's AfterFunc)
// must not remove, on the second call, a file another listener bound at the
// path in between: the file system may give that file the freed inode
// number (CI saw relayd's replaced agent socket vanish this way). Repeated
// so that a reused inode number turns up on file systems that reuse them.
func TestASecondCloseRemovesNothing(t *testing.T) {
	path := filepath.Join(shortDir(t), "agent.sock")
	for i := range 50 {
		old, err := unixsock.Listen(path, unixsock.Options{})
		require.NoError(t, err)
		require.NoError(t, old.Close())
		cur, err := unixsock.Listen(path, unixsock.Options{})
		require.NoError(t, err)
		require.ErrorIs(t, old.Close(), net.ErrClosed, "round %d", i)
		_, err = os.Stat(path)
		require.NoError(t, err, "round %d: the second Close removed the new listener's file", i)
		require.NoError(t, cur.Close())
	}
}

// TestAcceptReturnsOnlyOnceTheSocketIsClosed: a context that ends while
// Accept is between two connections makes the next accept fail at once,
// before the close has released the socket; Accept must not return until
// it has, or a caller that stops and then checks (or rebinds) the path
// finds the old socket still answering. Failed 1 run in ~30 before.
func TestAcceptReturnsOnlyOnceTheSocketIsClosed(t *testing.T) {
	for i := range 200 {
		path := filepath.Join(shortDir(t), "a.sock")
		ln, err := unixsock.Listen(path, unixsock.Options{})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- unixsock.Accept(ctx, ln, nil, func(c net.Conn) { _ = c.Close() }) }()
		c, err := net.Dial("unix", path)
		require.NoError(t, err)
		_ = c.Close()
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		if c, err := net.Dial("unix", path); err == nil {
			_ = c.Close()
			t.Fatalf("run %d: the socket still answers after Accept returned", i)
		}
	}
}
