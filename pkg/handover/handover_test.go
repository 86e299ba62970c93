package handover

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	oldCaa = Peer{Pod: "caa-old", Version: "v1", PID: 10}
	newCaa = Peer{Pod: "caa-new", Version: "v2", PID: 20}
)

// holder serves path and passes each request to the returned channel.
func holder(t *testing.T, path string) (*Listener, <-chan *Request) {
	t.Helper()
	ln, err := Listen(path)
	require.NoError(t, err)
	reqs := make(chan *Request, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = ln.Serve(ctx, func(r *Request) { reqs <- r }) }()
	t.Cleanup(func() { cancel(); <-done; _ = ln.Close() })
	return ln, reqs
}

func sock(t *testing.T) string { return filepath.Join(t.TempDir(), "ledger.db.handover.sock") }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestAskWithoutAHolder(t *testing.T) {
	path := sock(t)
	_, err := Ask(ctxT(t), path, newCaa)
	require.ErrorIs(t, err, ErrNoHolder, "no socket file")

	require.NoError(t, os.WriteFile(path, nil, 0o600))
	_, err = Ask(ctxT(t), path, newCaa)
	require.ErrorIs(t, err, ErrNoHolder, "a file nobody listens on")
}

func TestListenReplacesAStaleSocketButNotALiveOne(t *testing.T) {
	path := sock(t)
	stale, err := Listen(path)
	require.NoError(t, err)
	stale.ln.UnixListener.Close() // the process died: the file stays, nobody answers
	_, err = os.Stat(path)
	require.NoError(t, err)

	ln, reqs := holder(t, path)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "owner-only")

	_, err = Listen(path)
	require.ErrorContains(t, err, "answered by another process")
	_ = ln
	_ = reqs
}

func TestAFullHandOver(t *testing.T) {
	path := sock(t)
	_, reqs := holder(t, path)
	stopped := time.Now().Add(-time.Second).Round(0)

	type asked struct {
		h   *Handover
		err error
	}
	got := make(chan asked, 1)
	go func() { h, err := Ask(ctxT(t), path, newCaa); got <- asked{h, err} }()
	req := <-reqs
	assert.Equal(t, newCaa, req.From)
	require.NoError(t, req.Release(oldCaa, 7, stopped))
	a := <-got
	require.NoError(t, a.err)
	assert.Equal(t, oldCaa, a.h.From)
	assert.EqualValues(t, 7, a.h.Epoch)
	assert.True(t, a.h.Stopped.Equal(stopped), "the gap starts when the old caa stopped work")

	readyErr := make(chan error, 1)
	acting := stopped.Add(20 * time.Millisecond)
	go func() { readyErr <- a.h.Ready(ctxT(t), acting) }()
	actingSeen, err := req.WaitReady(ctxT(t))
	require.NoError(t, err)
	assert.True(t, actingSeen.Equal(acting), "the old caa learns when the new one started acting")
	select {
	case err := <-readyErr:
		t.Fatalf("Ready returned (%v) before the old caa retired", err)
	default:
	}
	req.Retire()
	require.NoError(t, <-readyErr)
}

func TestRefusalCarriesTheReason(t *testing.T) {
	path := sock(t)
	_, reqs := holder(t, path)
	go func() { (<-reqs).Refuse("this caa is handing the ledger over to caa-x") }()
	_, err := Ask(ctxT(t), path, newCaa)
	require.ErrorIs(t, err, ErrRefused)
	assert.ErrorContains(t, err, "caa-x")
}

func TestHolderGoingAwayBeforeItReleases(t *testing.T) {
	path := sock(t)
	_, reqs := holder(t, path)
	go func() { r := <-reqs; _ = r.c.c.Close() }()
	_, err := Ask(ctxT(t), path, newCaa)
	require.ErrorIs(t, err, ErrHolderGone)
}

// released runs a hand-over up to the release and returns both ends.
func released(t *testing.T) (*Request, *Handover) {
	t.Helper()
	path := sock(t)
	_, reqs := holder(t, path)
	hc := make(chan *Handover, 1)
	go func() {
		h, err := Ask(ctxT(t), path, newCaa)
		assert.NoError(t, err)
		hc <- h
	}()
	req := <-reqs
	require.NoError(t, req.Release(oldCaa, 1, time.Now()))
	h := <-hc
	require.NotNil(t, h)
	return req, h
}

func TestSuccessorGoingAwayBeforeReadyIsAHandback(t *testing.T) {
	req, h := released(t)
	h.Close() // the new caa crashed
	_, err := req.WaitReady(ctxT(t))
	require.ErrorIs(t, err, ErrSuccessorGone)
}

func TestASlowSuccessorIsAbortedAndGivesTheLedgerBack(t *testing.T) {
	req, h := released(t)
	wctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := req.WaitReady(wctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	abortDone := make(chan error, 1)
	go func() { abortDone <- req.Abort(ctxT(t), "not ready within 3m") }()
	select {
	case reason := <-h.Aborted():
		assert.Equal(t, "not ready within 3m", reason)
	case <-ctxT(t).Done():
		t.Fatal("the successor never heard the abort")
	}
	select {
	case err := <-abortDone:
		t.Fatalf("Abort returned (%v) before the successor gave the ledger back", err)
	default:
	}
	h.Returned()
	require.NoError(t, <-abortDone)
}

func TestAReadyThatCrossesTheAbortLoses(t *testing.T) {
	req, h := released(t)
	abortDone := make(chan error, 1)
	go func() { abortDone <- req.Abort(ctxT(t), "too slow") }()
	// The successor turns ready just as the abort goes out: the abort wins.
	err := h.Ready(ctxT(t), time.Now())
	require.ErrorIs(t, err, ErrAborted)
	assert.ErrorContains(t, err, "too slow")
	h.Returned()
	require.NoError(t, <-abortDone)
}

func TestAbortOfAHungSuccessorIsBounded(t *testing.T) {
	req, h := released(t)
	defer h.Close()
	actx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	// The successor never answers the abort.
	err := req.Abort(actx, "too slow")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestReadyAfterTheHolderDiedKeepsTheLedger(t *testing.T) {
	req, h := released(t)
	_ = req.c.c.Close() // the old caa was killed after it released
	require.NoError(t, h.Ready(ctxT(t), time.Now()), "nobody can take the ledger back")
}

func TestCloseLeavesAReplacedSocketAlone(t *testing.T) {
	path := sock(t)
	old, err := Listen(path)
	require.NoError(t, err)
	// The new caa binds the path after the old one stopped answering.
	require.NoError(t, os.Remove(path))
	ln, err := Listen(path)
	require.NoError(t, err)
	require.NoError(t, old.Close())
	_, err = os.Stat(path)
	require.NoError(t, err, "the old listener's Close must not remove the new socket")
	require.NoError(t, ln.Close())
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "a listener removes its own socket")
}

func TestPeerCredentialsNameTheAskingProcess(t *testing.T) {
	path := sock(t)
	_, reqs := holder(t, path)
	go func() { _, _ = Ask(ctxT(t), path, newCaa) }()
	req := <-reqs
	defer req.Refuse("test")
	assert.Equal(t, os.Getpid(), req.Cred.PID, "the kernel's pid, not the one the asker wrote (%d)", newCaa.PID)
	assert.Equal(t, os.Getuid(), req.Cred.UID)
}

// A frozen holder thaws with requests queued whose askers gave up while it
// was stopped: it must see they are gone before it stops work for them.
func TestARequestWhoseAskerGaveUpIsNotAlive(t *testing.T) {
	path := sock(t)
	_, reqs := holder(t, path)
	actx, cancel := context.WithCancel(context.Background())
	asked := make(chan error, 1)
	go func() { _, err := Ask(actx, path, newCaa); asked <- err }()
	req := <-reqs
	assert.True(t, req.Alive(), "the asker is waiting for its answer")
	cancel()
	require.ErrorIs(t, <-asked, context.Canceled)
	assert.False(t, req.Alive(), "the asker hung up")
	assert.Error(t, req.Release(oldCaa, 1, time.Now()), "a release to a gone asker fails")
}

// A holder frozen (SIGSTOP) past its ready timeout wakes up to a timer that
// already fired; the successor's ready waiting in the socket still counts.
func TestAReadyThatArrivedWhileTheHolderWasFrozenCounts(t *testing.T) {
	req, h := released(t)
	acting := time.Now().Round(0)
	require.NoError(t, h.SayReady(acting))
	// On the thaw the expired timer is handled before the waiting read.
	frozen := &deadlineFirst{Conn: req.c.c}
	req.c.c, req.c.r = frozen, bufio.NewReader(frozen)
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	got, err := req.WaitReady(expired)
	require.NoError(t, err)
	assert.True(t, got.Equal(acting))
}

func TestAnAbortAfterTheSuccessorTurnedReadyIsAnsweredKept(t *testing.T) {
	req, h := released(t)
	require.NoError(t, h.SayReady(time.Now()))
	abortDone := make(chan error, 1)
	go func() { abortDone <- req.Abort(ctxT(t), "too slow") }()
	select {
	case <-h.Aborted():
	case <-ctxT(t).Done():
		t.Fatal("no abort")
	}
	h.Keep()
	require.ErrorIs(t, <-abortDone, ErrKept)
}

// deadlineFirst fails its first read as an expired read deadline does.
type deadlineFirst struct {
	net.Conn
	failed bool
}

func (c *deadlineFirst) Read(b []byte) (int, error) {
	if !c.failed {
		c.failed = true
		return 0, os.ErrDeadlineExceeded
	}
	return c.Conn.Read(b)
}

// The release carries the holder's listening sockets: the successor gets
// the same socket (a connection made before the release is accepted on
// it), the conversation goes on after it, and a refusal carries none.
func TestReleasePassesListeningSockets(t *testing.T) {
	path := sock(t)
	_, reqs := holder(t, path)
	kata := filepath.Join(filepath.Dir(path), "hv.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: kata, Net: "unix"})
	require.NoError(t, err)
	defer ln.Close()
	waiting, err := net.Dial("unix", kata) // queued in the backlog
	require.NoError(t, err)
	defer waiting.Close()

	got := make(chan *Handover, 1)
	go func() {
		h, err := Ask(ctxT(t), path, newCaa)
		assert.NoError(t, err)
		got <- h
	}()
	req := <-reqs
	f, err := ln.File()
	require.NoError(t, err)
	require.NoError(t, req.Release(oldCaa, 7, time.Now(), Socket{Name: "hypervisor", File: f}))
	h := <-got
	require.NotNil(t, h)
	require.Len(t, h.Sockets, 1)
	assert.Equal(t, "hypervisor", h.Sockets[0].Name)
	passed, err := net.FileListener(h.Sockets[0].File)
	require.NoError(t, err)
	_ = h.Sockets[0].File.Close()
	defer passed.Close()
	assert.Equal(t, kata, passed.Addr().String())
	c, err := passed.Accept()
	require.NoError(t, err, "the connection queued before the release is accepted by the successor")
	_ = c.Close()

	// The conversation goes on as before.
	require.NoError(t, h.SayReady(time.Now()))
	_, err = req.WaitReady(ctxT(t))
	require.NoError(t, err)
	req.Retire()
	<-h.Retired()
}
