// Package relay serves one sandbox's agent socket on the node and relays every
// connection the kata shim makes to it to the forwarder in the sandbox's pod VM,
// over mutual TLS.
//
// Wire (confirmed 2026-12-01 in confidential-containers/cloud-api-adaptor at
// fbdde756): the forwarder (src/cloud-api-adaptor/pkg/forwarder/forwarder.go)
// serves kata's agent ttrpc protocol directly on a TLS listener on port 15150;
// there is no HTTP or other handshake before the ttrpc frames (the adaptor's
// proxy, pkg/adaptor/proxy/proxy.go, uses the "/agent" URL only for its host
// and port). The forwarder requires a client certificate from its client CA and
// TLS 1.2 at least. So the relay copies bytes: the shim's ttrpc frames go
// unchanged through a TLS connection per shim connection. kata's shim dials the
// agent socket as a plain unix socket (kata-containers at 7c6ba40c,
// src/runtime/virtcontainers/pkg/agent/protocols/client/client.go,
// RemoteSockDialer).
//
// Upstream's proxy terminates ttrpc instead and rewrites one call,
// CreateContainer, for two features caa does not offer (a CDI annotation for
// GPU pods, CSI cloud volumes; pkg/adaptor/proxy/service.go); every other call
// passes through unchanged there as here.
package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/ttrpc"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/internal/unixsock"
)

// Config says where to listen and where to relay to.
type Config struct {
	// SocketPath is the agent socket kata's shim dials (CreateVM's answer).
	SocketPath string
	// Addr is the forwarder, VM_IP:15150.
	Addr string
	// TLS is caa's client side (pki.CA.ClientTLS); it is cloned, not changed.
	TLS *tls.Config
	// ServerName is the name the VM's certificate was issued for (its VM
	// name: the user data is made before the VM has an IP); empty verifies
	// the IP of Addr instead.
	ServerName string
	// DialTimeout bounds one attempt to reach the forwarder for a shim
	// connection (default 30s): the shim's call fails rather than hangs.
	DialTimeout time.Duration
	// Dial, if set, opens the TCP connection under the TLS (tests use it to
	// dial from another network namespace); default a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	Log  *slog.Logger
}

// Relay is one sandbox's agent socket.
type Relay struct {
	cfg Config
	tls *tls.Config
	ln  net.Listener
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	born   time.Time // the origin of heardAt: time.Since reads the monotonic clock

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	pairs    map[*pair]struct{} // the relayed connections open now
	closed   bool
	accepted int
	relayed  int
	failed   int
	open     int
}

// Stats counts the relay's connections.
type Stats struct {
	// Accepted shim connections; Relayed reached the forwarder; Failed did
	// not (closed at once); Open are relaying now.
	Accepted, Relayed, Failed, Open int
}

// Start listens on cfg.SocketPath at once (a stale socket file from before a
// restart is removed; a socket another relay still serves, or any other
// file there, is an error) and relays each
// accepted connection until Close or ctx ends.
func Start(ctx context.Context, cfg Config) (*Relay, error) {
	switch {
	case cfg.SocketPath == "":
		return nil, errors.New("relay: Config.SocketPath is empty")
	case cfg.Addr == "":
		return nil, errors.New("relay: Config.Addr is empty: pass VM_IP:15150")
	case cfg.TLS == nil:
		return nil, errors.New("relay: Config.TLS is nil: pass pki.CA.ClientTLS()")
	}
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return nil, fmt.Errorf("relay: Config.Addr %q: %w", cfg.Addr, err)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 30 * time.Second
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("socket", cfg.SocketPath, "forwarder", cfg.Addr)
	ln, err := unixsock.Listen(cfg.SocketPath, unixsock.Options{DirMode: 0o750})
	switch {
	case errors.Is(err, unixsock.ErrNotSocket):
		return nil, fmt.Errorf("relay: %w: remove it or choose another agent socket path", err)
	case errors.Is(err, unixsock.ErrServed):
		return nil, fmt.Errorf("relay: agent socket %w; a live relay is never replaced: stop it first "+
			"(a relay daemon still serving it: `caa relay` of deploy/components/relay)", err)
	case err != nil:
		return nil, fmt.Errorf("relay: listen on %s: %w", cfg.SocketPath, err)
	}
	// Close removes the file; a crashed caa leaves it, and Start removes it.
	tc := cfg.TLS.Clone()
	if cfg.ServerName != "" {
		tc.ServerName = cfg.ServerName
	}
	if tc.ServerName == "" {
		host, _, _ := net.SplitHostPort(cfg.Addr)
		tc.ServerName = host
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &Relay{cfg: cfg, tls: tc, ln: ln, log: log, ctx: rctx, cancel: cancel, born: time.Now(),
		conns: map[net.Conn]struct{}{}, pairs: map[*pair]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	context.AfterFunc(rctx, func() { _ = r.Close() })
	return r, nil
}

func (r *Relay) accept() {
	defer r.wg.Done()
	_ = unixsock.Accept(r.ctx, r.ln, r.log, func(c net.Conn) {
		if !r.track(c) {
			c.Close()
			return
		}
		r.mu.Lock()
		r.accepted++
		r.mu.Unlock()
		r.wg.Add(1)
		go r.serve(c)
	})
}

// track registers c so Close closes it; false once the relay is closed.
func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

func (r *Relay) serve(shim net.Conn) {
	defer r.wg.Done()
	defer r.untrack(shim)
	defer shim.Close()
	vm, err := r.dial(r.ctx, r.cfg.DialTimeout)
	if err != nil {
		r.mu.Lock()
		r.failed++
		r.mu.Unlock()
		r.log.Warn("agent connection not relayed: forwarder unreachable", "err", err)
		return
	}
	if !r.track(vm) {
		vm.Close()
		return
	}
	defer r.untrack(vm)
	defer vm.Close()
	p := &pair{}
	r.mu.Lock()
	r.relayed++
	r.open++
	r.pairs[p] = struct{}{}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.open--
		delete(r.pairs, p)
		r.mu.Unlock()
	}()

	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.CopyBuffer(vm, onlyReader{shim}, make([]byte, copyBuffer))
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.CopyBuffer(onlyWriter{shim}, &heardReader{src: vm, r: r, p: p}, make([]byte, copyBuffer))
		done <- struct{}{}
	}()
	// Either side ending ends the pair: ttrpc has no half-closed use.
	<-done
	shim.Close()
	vm.Close()
	<-done
}

// copyBuffer is each direction's buffer of a relayed connection, held for
// the connection's life (a sandbox's, for its shim's connection): io.Copy's
// 32 KiB twice was most of what a sandbox cost the relaying process (bench
// S11). kata's agent calls are small; a larger message or a stream takes a
// few more reads, and TLS keeps what a read leaves of a record.
const copyBuffer = 8 << 10

// onlyReader and onlyWriter hide a connection's WriteTo and ReadFrom, which
// io.CopyBuffer would take over the buffer it is given (and allocate its
// own 32 KiB in).
type onlyReader struct{ io.Reader }

type onlyWriter struct{ io.Writer }

// pair is one relayed shim connection; heardAt is when its VM side last
// sent bytes, in nanoseconds since the relay's birth (0: not yet).
type pair struct{ heardAt atomic.Int64 }

// heardReader notes each read that brought bytes from the VM: decrypted
// bytes from the forwarder prove the VM reachable over mutual TLS at that
// moment. One clock read per TLS record is noise beside its decryption.
type heardReader struct {
	src io.Reader
	r   *Relay
	p   *pair
}

func (h *heardReader) Read(b []byte) (int, error) {
	n, err := h.src.Read(b)
	if n > 0 {
		h.p.heardAt.Store(max(int64(time.Since(h.r.born)), 1))
	}
	return n, err
}

// Heard says how long ago the VM last sent bytes on a relayed connection
// that is still open (an answer to the shim's health check, a stream's
// data), as measured on the monotonic clock. ok is false when no open
// connection has heard from its VM: none is open (a connection the VM cut
// is no evidence), or the open ones carried nothing back yet. The age
// grows while the VM stays silent, so a frozen VM's evidence ages out.
func (r *Relay) Heard() (age time.Duration, ok bool) {
	r.mu.Lock()
	var last int64
	for p := range r.pairs {
		last = max(last, p.heardAt.Load())
	}
	r.mu.Unlock()
	if last == 0 {
		return 0, false
	}
	return time.Since(r.born) - time.Duration(last), true
}

// dial opens one mutual-TLS connection to the forwarder, retrying for up to
// timeout (the VM may still be booting).
func (r *Relay) dial(ctx context.Context, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		c, err := r.dialOnce(ctx)
		if err == nil {
			return c, nil
		}
		last = err
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("relay: reach forwarder %s: %w (last error: %v)", r.cfg.Addr, ctx.Err(), last)
		case <-t.C:
		}
	}
}

func (r *Relay) dialOnce(ctx context.Context) (net.Conn, error) {
	dial := r.cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	}
	raw, err := dial(ctx, "tcp", r.cfg.Addr)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, r.tls)
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return c, nil
}

// WaitReachable returns once the forwarder answers: a mutual-TLS connection
// is made and kata's agent health check through it says SERVING (so the VM
// accepted caa's client certificate, which TLS 1.3 reports only after the
// handshake, and the agent behind the forwarder is up). It retries until ctx
// ends, then returns the last reason. The first retries come quickly (a
// forwarder that is seconds from listening is the usual case on StartVM,
// and each refused probe costs one connect); they slow to one every 2s.
func (r *Relay) WaitReachable(ctx context.Context) error {
	var last error
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		if r.isClosed() {
			return errors.New("relay: closed")
		}
		err := r.probe(ctx)
		if err == nil {
			return nil
		}
		// A probe cut short by ctx says less than the one before it.
		if ctx.Err() == nil || last == nil {
			last = err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("relay: forwarder %s not reachable: %w (last error: %v)", r.cfg.Addr, ctx.Err(), last)
		case <-t.C:
		}
	}
}

// Probe makes one WaitReachable attempt: nil if the forwarder and the agent
// behind it answer now. For a periodic check of a running sandbox's VM.
func (r *Relay) Probe(ctx context.Context) error {
	if err := r.probe(ctx); err != nil {
		return fmt.Errorf("relay: forwarder %s: %w", r.cfg.Addr, err)
	}
	return nil
}

func (r *Relay) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := r.dialOnce(ctx)
	if err != nil {
		return err
	}
	cl := ttrpc.NewClient(c)
	defer cl.Close()
	st, err := agentproto.Check(ctx, cl)
	if err != nil {
		return err
	}
	if st != agentproto.Serving {
		return fmt.Errorf("agent health status %d, not SERVING", st)
	}
	return nil
}

// Stats returns the relay's counts so far.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Stats{Accepted: r.accepted, Relayed: r.relayed, Failed: r.failed, Open: r.open}
}

// Done is closed once the relay is closed (Close or ctx).
func (r *Relay) Done() <-chan struct{} { return r.ctx.Done() }

func (r *Relay) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Close stops listening, removes the socket file and closes every relayed
// connection, so the shim sees its agent connection end. It waits for the
// relay's goroutines; it is idempotent.
func (r *Relay) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.wg.Wait()
		return nil
	}
	r.closed = true
	conns := make([]net.Conn, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	r.cancel()
	err := r.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	r.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("relay: close %s: %w", r.cfg.SocketPath, err)
	}
	return nil
}
