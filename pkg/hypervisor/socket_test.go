package hypervisor

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/hypervisor/hypervisorpb"
)

// slowStart answers StartVM only once release is closed; started is told
// when a StartVM is running.
type slowStart struct {
	fakeLifecycle
	started chan string
	release chan struct{}
}

func (s *slowStart) StartVM(ctx context.Context, id string) error {
	s.started <- id
	select {
	case <-s.release:
		return s.fakeLifecycle.StartVM(ctx, id)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hv")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "hypervisor.sock")
}

// session serves sock until the returned stop is called; stop returns
// Serve's error once it has returned.
func session(sock *Socket, lc Lifecycle, drain time.Duration) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sock.Serve(ctx, &Service{Sandboxes: lc}, drain) }()
	return func() error { cancel(); return <-done }
}

// call runs one CreateVM on its own connection, as the Go shim does.
func call(ctx context.Context, path, id string) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return err
	}
	cl := ttrpc.NewClient(c)
	defer cl.Close()
	_, err = hypervisorpb.NewHypervisorClient(cl).CreateVM(ctx, &hypervisorpb.CreateVMRequest{Id: id})
	return err
}

// startVM runs one StartVM on its own connection.
func startVM(ctx context.Context, path, id string) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return err
	}
	cl := ttrpc.NewClient(c)
	defer cl.Close()
	_, err = hypervisorpb.NewHypervisorClient(cl).StartVM(ctx, &hypervisorpb.StartVMRequest{Id: id})
	return err
}

// A call made while no session serves the socket (between two sessions of
// one process, or two processes of a hand-over) waits and is answered by
// the next session: it is never refused.
func TestACallBetweenSessionsWaitsForTheNext(t *testing.T) {
	path := socketPath(t)
	sock, err := ListenSocket(path)
	require.NoError(t, err)
	defer sock.Close()
	lc := &fakeLifecycle{}
	require.NoError(t, session(sock, lc, time.Second)())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	answered := make(chan error, 1)
	go func() { answered <- call(ctx, path, "between") }()
	select {
	case err := <-answered:
		t.Fatalf("the call was answered while nobody served: %v", err)
	case <-time.After(200 * time.Millisecond): // it must still be waiting
	}
	stop := session(sock, lc, time.Second)
	require.NoError(t, <-answered, "answered by the next session")
	require.NoError(t, stop())
	assert.Equal(t, []string{"CreateVM between"}, lc.calls)
}

// Stopping a session lets a call in flight finish within the drain, and a
// call arriving meanwhile waits for the next session.
func TestStopDrainsCallsInFlight(t *testing.T) {
	path := socketPath(t)
	sock, err := ListenSocket(path)
	require.NoError(t, err)
	defer sock.Close()
	lc := &slowStart{started: make(chan string, 1), release: make(chan struct{})}
	stop := session(sock, lc, 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	startErr := make(chan error, 1)
	go func() { startErr <- startVM(ctx, path, "slow") }()
	require.Equal(t, "slow", <-lc.started)
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// The session no longer accepts: a new call waits.
	newCall := make(chan error, 1)
	go func() { newCall <- call(ctx, path, "later") }()
	select {
	case err := <-stopped:
		t.Fatalf("the session stopped with a call in flight: %v", err)
	case err := <-newCall:
		t.Fatalf("a call was answered by a stopping session: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(lc.release)
	require.NoError(t, <-startErr, "the call in flight is answered")
	require.NoError(t, <-stopped)

	next := session(sock, lc, time.Second)
	require.NoError(t, <-newCall, "the waiting call is served by the next session")
	require.NoError(t, next())
}

// A call still running when the drain runs out is cut (kata sees it fail),
// and the session ends.
func TestDrainIsBounded(t *testing.T) {
	path := socketPath(t)
	sock, err := ListenSocket(path)
	require.NoError(t, err)
	defer sock.Close()
	lc := &slowStart{started: make(chan string, 1), release: make(chan struct{})}
	stop := session(sock, lc, 200*time.Millisecond)
	startErr := make(chan error, 1)
	go func() { startErr <- startVM(context.Background(), path, "stuck") }()
	<-lc.started
	require.NoError(t, stop())
	require.Error(t, <-startErr)
}

// The socket passed to another holder (as a hand-over passes it to the new
// caa) serves the same path; calls queued during the switch are answered
// there; the old holder's close leaves the file; a socket bound to another
// path, or a descriptor that is not a listening socket, is refused.
func TestSocketPassesToTheNextHolder(t *testing.T) {
	path := socketPath(t)
	old, err := ListenSocket(path)
	require.NoError(t, err)
	lc := &fakeLifecycle{}
	require.NoError(t, session(old, lc, time.Second)())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := range 5 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- call(ctx, path, "queued-"+string(rune('a'+i))) }()
	}
	f, err := old.File()
	require.NoError(t, err)
	next, err := FromFile(f, path)
	require.NoError(t, err)
	require.NoError(t, old.Close())
	_, err = os.Lstat(path)
	require.NoError(t, err, "the old holder's close leaves the socket file the next one serves")

	stop := session(next, lc, time.Second)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	require.NoError(t, stop())
	assert.Len(t, lc.calls, 5)
	require.NoError(t, next.Close())

	// Refusals.
	other, err := ListenSocket(socketPath(t))
	require.NoError(t, err)
	defer other.Close()
	f, err = other.File()
	require.NoError(t, err)
	_, err = FromFile(f, path)
	require.ErrorContains(t, err, "--hypervisor-socket")
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer w.Close()
	_, err = FromFile(r, path)
	require.ErrorContains(t, err, "not a socket")
}

// A call that races a session's stop is answered, by that session or by
// the next one, never cut; a session stopped before it serves accepts
// nothing. (Before, a connection accepted as the session stopped reached
// a closed server: "ttrpc: closed".)
func TestACallRacingTheStopIsNeverCut(t *testing.T) {
	path := socketPath(t)
	sock, err := ListenSocket(path)
	require.NoError(t, err)
	defer sock.Close()
	lc := &fakeLifecycle{}

	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, sock.Serve(stopped, &Service{Sandboxes: lc}, time.Second), "a stopped session returns at once")

	ctx, cancelCalls := context.WithTimeout(context.Background(), time.Minute)
	defer cancelCalls()
	for i := range 40 {
		stop := session(sock, lc, time.Second)
		answered := make(chan error, 1)
		go func() { answered <- call(ctx, path, "race") }()
		if i%2 == 0 {
			time.Sleep(time.Duration(i) * 50 * time.Microsecond) // spreads the stop over the call's life
		}
		require.NoError(t, stop())
		next := session(sock, lc, time.Second)
		require.NoError(t, <-answered, "round %d", i)
		require.NoError(t, next())
	}
}
