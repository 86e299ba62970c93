package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Listen of the same path that comes while a Close has checked the file
// is its own but not yet unlinked it (a new caa or relay binding the agent
// socket as the old one closes) must not lose its socket to that unlink.
// The Close is held in that window by a hook while another Listen starts;
// that Listen waits for the directory's lock (signalled by its own hook,
// no sleep), and once the Close is done it binds a socket that stays.
func TestListenDuringACloseKeepsItsSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "us")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "agent.sock")
	old, err := Listen(path, Options{})
	require.NoError(t, err)

	var cur *Listener
	var curErr error
	bound := make(chan struct{})
	waiting := make(chan struct{})
	old.afterOwns = func() {
		go func() {
			defer close(bound)
			cur, curErr = Listen(path, Options{lockWait: func() { close(waiting) }})
		}()
		select { // the other Listen either waits for the lock or is done
		case <-waiting:
		case <-bound:
		}
	}
	require.NoError(t, old.Close())
	<-bound
	require.NoError(t, curErr)
	defer cur.Close()
	assert.True(t, cur.Owns(), "the new listener's file is at the path")
	c, err := net.Dial("unix", path)
	require.NoError(t, err, "the new listener's clients connect")
	c.Close()
}

// A socket a live process serves is never replaced: Listen connects to
// it, and an answer is ErrServed. The server's clients still connect.
func TestListenNeverReplacesAServedSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "us")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "agent.sock")
	live, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	defer live.Close()

	_, err = Listen(path, Options{})
	require.ErrorIs(t, err, ErrServed)
	c, err := net.Dial("unix", path)
	require.NoError(t, err, "the live socket is still there")
	c.Close()
	s, err := live.Accept()
	require.NoError(t, err)
	s.Close()
}
