package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"

	"github.com/caa-project/caa/internal/unixsock"
)

// Socket is kata's hypervisor socket held for a process's whole life. The
// sessions that hold the ledger serve it in turn (Serve); between two of
// them (a hand-over taken back, the startup pass of a new caa) and across
// a surge hand-over, which passes the listening socket itself to the next
// caa (File, FromFile), a shim's connection waits in the kernel's backlog
// instead of finding no socket: kata's Go shim dials once per call, and a
// refused dial fails that call.
type Socket struct {
	ln   *net.UnixListener
	path string
	own  *unixsock.Listener // set when this process bound the file
	// passed: the socket went to another process, which serves the path
	// now; closing here must leave the file alone.
	passed atomic.Bool
}

// ListenSocket binds kata's socket at path (0600 in a 0700 directory made
// if missing), replacing a stale socket file that no process serves (a
// restart after SIGKILL). A socket another process still serves is
// refused, and so is a file that is not a socket.
func ListenSocket(path string) (*Socket, error) {
	ln, err := unixsock.Listen(path, unixsock.Options{Mode: 0o600})
	if err != nil {
		return nil, fmt.Errorf("hypervisor socket %s: %w", path, err)
	}
	return &Socket{ln: ln.UnixListener, path: path, own: ln}, nil
}

// FromFile takes over a listening socket another caa passed (File). It
// must be a listening unix stream socket bound to path, the socket this
// caa is configured to serve: anything else is closed and refused, so a
// predecessor configured with another path (or a wrong descriptor) never
// becomes kata's socket here.
func FromFile(f *os.File, path string) (*Socket, error) {
	defer func() { _ = f.Close() }() // FileListener duplicates it
	if err := checkListening(f); err != nil {
		return nil, fmt.Errorf("the hypervisor socket passed by the running caa: %w", err)
	}
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("the hypervisor socket passed by the running caa: %w", err)
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		_ = l.Close()
		return nil, fmt.Errorf("the hypervisor socket passed by the running caa is a %T, not a unix socket", l)
	}
	if got := ul.Addr().String(); got != path {
		_ = ul.Close()
		return nil, fmt.Errorf("the running caa passed the hypervisor socket %s, but this caa serves %s (--hypervisor-socket): binding its own", got, path)
	}
	return &Socket{ln: ul, path: path}, nil
}

// checkListening refuses a descriptor that is not a listening stream socket.
func checkListening(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var typ, acc int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		typ, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TYPE)
		if serr == nil {
			acc, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("not a socket: %w", serr)
	}
	if typ != syscall.SOCK_STREAM || acc != 1 {
		return errors.New("not a listening stream socket")
	}
	return nil
}

// Path is the socket's path.
func (s *Socket) Path() string { return s.path }

// File duplicates the listening socket for another process (a hand-over):
// from then on the path is that process's to serve, and Close here leaves
// the file in place. This process keeps its own descriptor, so a
// hand-over taken back serves the same socket again, connections that
// waited in its backlog included.
func (s *Socket) File() (*os.File, error) {
	f, err := s.ln.File()
	if err != nil {
		return nil, fmt.Errorf("hypervisor socket %s: %w", s.path, err)
	}
	s.passed.Store(true)
	return f, nil
}

// Close closes this process's descriptor. The socket file is removed only
// when this process bound it, never passed it on, and the path still names
// it.
func (s *Socket) Close() error {
	if s.own != nil && !s.passed.Load() {
		return s.own.Close()
	}
	return s.ln.Close()
}

// quietAfter is how long a connection that has sent nothing counts as a
// call on its way: a shim writes its request as soon as it connects.
const quietAfter = time.Second

// Serve serves svc on the socket until ctx is done. It then stops
// accepting (new connections wait in the backlog for whoever serves the
// socket next), lets every call already received, or on its way on a
// connection just accepted, be answered within drain, and then closes the
// connections it accepted. The socket itself stays open. A call still
// running after drain is cut: kata sees that call fail.
func (s *Socket) Serve(ctx context.Context, svc *Service, drain time.Duration) error {
	srv, err := ttrpc.NewServer()
	if err != nil {
		return fmt.Errorf("ttrpc server: %w", err)
	}
	register(srv, svc)
	if ctx.Err() != nil {
		return nil // stopped before serving: accept nothing
	}
	_ = s.ln.SetDeadline(time.Time{}) // a previous session's stop
	g := &gate{ln: s.ln, conns: map[*tracked]struct{}{}, ended: make(chan struct{})}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		g.Close()
		// Every connection accepted is tracked once the accept loop has
		// ended: only then does the drain know them all.
		select {
		case <-g.ended:
		case <-done:
		}
		deadline := time.Now().Add(drain)
		for g.busy() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // a poll of the connections' state
		}
		if n := g.busyCount(); n > 0 {
			svc.log().Warn("hypervisor calls still running after the drain are cut", "calls", n, "drain", drain)
		}
		_ = srv.Close()
	}()
	// The calls' context outlives ctx: a call in flight is cut by the
	// drain's end, not by the stop.
	err = srv.Serve(context.WithoutCancel(ctx), g)
	close(done)
	<-stopped
	if ctx.Err() == nil {
		_ = srv.Close() // serving failed: close what it accepted
	}
	if ctx.Err() != nil || errors.Is(err, ttrpc.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// gate is the socket as one session sees it: Close stops this session's
// accepting without closing the socket.
type gate struct {
	ln     *net.UnixListener
	mu     sync.Mutex
	closed bool
	conns  map[*tracked]struct{}
	seq    atomic.Int64 // orders the connections' reads and writes
	// ended is closed when Accept first reports the gate closed: the
	// accept loop is over.
	ended   chan struct{}
	endOnce sync.Once
}

func (g *gate) Accept() (net.Conn, error) {
	c, err := g.ln.Accept()
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		if g.closed {
			g.endOnce.Do(func() { close(g.ended) })
			return nil, net.ErrClosed
		}
		return nil, err
	}
	// A connection accepted as the gate closes is still served: the drain
	// waits for it.
	t := &tracked{Conn: c, g: g, at: time.Now()}
	g.conns[t] = struct{}{}
	return t, nil
}

func (g *gate) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		_ = g.ln.SetDeadline(time.Now()) // wakes a blocked Accept; the socket stays open
	}
	return nil
}

func (g *gate) Addr() net.Addr { return g.ln.Addr() }

func (g *gate) busy() bool { return g.busyCount() > 0 }

func (g *gate) busyCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for t := range g.conns {
		if t.busy() {
			n++
		}
	}
	return n
}

// tracked is an accepted connection whose calls the drain waits for. ttrpc
// answers a unary call with one write after reading the whole request, so
// a connection whose last read came after its last write has a call
// unanswered.
type tracked struct {
	net.Conn
	g           *gate
	at          time.Time
	seq         atomic.Int64 // last event: positive a read, negative a write
	read, wrote atomic.Bool
	once        sync.Once
}

func (t *tracked) Read(b []byte) (int, error) {
	n, err := t.Conn.Read(b)
	if n > 0 {
		t.read.Store(true)
		t.seq.Store(t.g.seq.Add(1))
	}
	return n, err
}

func (t *tracked) Write(b []byte) (int, error) {
	n, err := t.Conn.Write(b)
	if n > 0 {
		t.wrote.Store(true)
		t.seq.Store(-t.g.seq.Add(1))
	}
	return n, err
}

func (t *tracked) Close() error {
	t.once.Do(func() {
		t.g.mu.Lock()
		delete(t.g.conns, t)
		t.g.mu.Unlock()
	})
	return t.Conn.Close()
}

func (t *tracked) busy() bool {
	if !t.read.Load() {
		return time.Since(t.at) < quietAfter
	}
	return t.seq.Load() > 0
}
