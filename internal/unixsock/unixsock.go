// Package unixsock opens and serves the unix sockets caa and its relay
// daemon listen on (kata's hypervisor socket, the agent sockets, the relay
// daemon's control socket): the socket's directory made if missing, a stale
// socket file from a killed process replaced, the mode set, and an accept
// loop that survives transient errors and ends with its context.
package unixsock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// ErrNotSocket: the path holds a file that is not a socket (never removed).
var ErrNotSocket = errors.New("exists and is not a socket")

// ErrServed: another process still accepts connections on the socket.
var ErrServed = errors.New("another process serves it")

// Options say how Listen treats the path.
type Options struct {
	// DirMode is the mode of the socket's directory when Listen makes it
	// (default 0700); an existing directory is left as it is.
	DirMode fs.FileMode
	// Mode, when not 0, is set on the socket file once it listens.
	Mode fs.FileMode

	// lockWait, when set (tests), is called when the directory's lock is
	// held by another and Listen is about to wait for it.
	lockWait func()
}

// FileID names a file independently of its path: a socket file bound at
// the same path again is another FileID.
type FileID struct{ Dev, Ino uint64 }

// Listener is a unix socket listener whose Close removes the socket file
// only while the path still names the file it bound. Without that check,
// closing a listener whose path another process has since taken (it
// replaced the file: a relay mode switch, a new caa) would delete that
// process's live socket, and its new clients would get ENOENT.
type Listener struct {
	*net.UnixListener
	path string
	id   FileID
	ok   bool // id is known; unknown never removes

	// Only the first Close may remove the file. A later one (a context's
	// AfterFunc closing the listener again, after its owner's Close) could
	// run once another listener has bound the path, and a file system that
	// reuses the freed inode number would make that file look like ours.
	closeOnce sync.Once
	closeErr  error

	// afterOwns, when set (tests), is called in Close between the check
	// that the path is still this listener's and the unlink.
	afterOwns func()
}

// Close removes the socket file if it is still this listener's, then
// stops listening. The check and the unlink are done under the lock of the
// socket's directory that Listen takes too, so no socket bound at the path
// by another Listen (in this process or another) can come between them and
// be unlinked in this one's place.
func (l *Listener) Close() error {
	closed := false
	l.closeOnce.Do(func() {
		closed = true
		l.closeErr = l.removeIfMine()
		if err := l.UnixListener.Close(); err != nil {
			l.closeErr = err
		}
	})
	if !closed {
		return fmt.Errorf("close %s: %w", l.path, net.ErrClosed)
	}
	return l.closeErr
}

func (l *Listener) removeIfMine() error {
	unlock, err := lockDir(filepath.Dir(l.path), nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the directory, and so the file, is gone
	}
	if err != nil {
		return fmt.Errorf("close %s: %w", l.path, err)
	}
	defer unlock()
	mine := l.Owns()
	if l.afterOwns != nil {
		l.afterOwns()
	}
	if !mine {
		return nil
	}
	if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Owns reports whether the socket file at the listener's path is still
// the one it bound. Only meaningful while the listener is open: once its
// file is unlinked, the inode number may be given to another file.
func (l *Listener) Owns() bool {
	return l.ok && Owns(l.path, l.id)
}

// Owns reports whether path names the file id.
func Owns(path string, id FileID) bool {
	fi, err := os.Lstat(path)
	if err != nil {
		return false
	}
	cur, ok := Inode(fi)
	return ok && cur == id
}

// Path is the socket file's path.
func (l *Listener) Path() string { return l.path }

// Listen listens on a unix socket at path. A socket file left by a process
// that is gone (SIGKILL leaves it: connecting is refused) is replaced; one
// that a live process still accepts on is never taken over (ErrServed),
// nor is any other kind of file (ErrNotSocket), so a wrong path never
// deletes data or cuts off another server's clients. The check, the
// removal of a stale file and the bind are done under an exclusive flock
// of the socket's directory, which Listener.Close takes too. Closing the
// listener removes the file while it is still the one this listener bound.
func Listen(path string, o Options) (*Listener, error) {
	if o.DirMode == 0 {
		o.DirMode = 0o700
	}
	if err := os.MkdirAll(filepath.Dir(path), o.DirMode); err != nil {
		return nil, err
	}
	unlock, err := lockDir(filepath.Dir(path), o.lockWait)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	defer unlock()
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	case fi.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("%s %w (%s)", path, ErrNotSocket, fi.Mode().Type())
	default:
		if err := stale(path); err != nil {
			return nil, err
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("remove the stale socket file: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false) // by path, whoever's file it is by then; see Listener.Close
	l := &Listener{UnixListener: ln, path: path}
	if fi, err := os.Lstat(path); err == nil {
		l.id, l.ok = Inode(fi)
	}
	if o.Mode != 0 {
		if err := os.Chmod(path, o.Mode); err != nil {
			// Still under the lock: the file is this listener's.
			_ = os.Remove(path)
			_ = ln.Close()
			return nil, err
		}
	}
	return l, nil
}

// stale returns nil when the socket at path has no listener: connecting
// is refused (or the file is gone). A connection accepted, or any other
// answer (a full backlog, a timeout), means a live process may serve it:
// an error wrapping ErrServed.
func stale(path string) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	switch {
	case err == nil:
		_ = c.Close()
		return fmt.Errorf("%s: %w", path, ErrServed)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, fs.ErrNotExist):
		return nil
	}
	return fmt.Errorf("%s: %w (connecting: %w)", path, ErrServed, err)
}

// Accept hands each connection accepted on ln to handle (in the calling
// goroutine: handle starts its own if it blocks) until ln is closed; ctx's
// end closes ln. An accept error other than the listener's closing (out of
// file descriptors, say) is logged and retried after a back-off growing
// from 5 ms to 1 s: closing the socket would fail every client for good.
// It returns ctx's error if ctx ended, else the error of the closed ln
// (wrapping net.ErrClosed).
func Accept(ctx context.Context, ln net.Listener, log *slog.Logger, handle func(net.Conn)) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Returning must mean the socket is closed: an Accept that starts after
	// the close has begun fails at once, before the descriptor is gone, so
	// wait for the close itself.
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { defer close(closed); _ = ln.Close() })
	defer func() {
		if !stop() {
			<-closed
		}
	}()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err == nil {
			delay = 0
			handle(c)
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, net.ErrClosed) {
			return err
		}
		delay = min(max(2*delay, 5*time.Millisecond), time.Second)
		log.Warn("accept failed; retrying", "socket", ln.Addr().String(), "err", err, "in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Cred is the process at the other end of a unix socket connection, as the
// kernel saw it connect.
type Cred struct {
	PID      int32
	UID, GID uint32
}
