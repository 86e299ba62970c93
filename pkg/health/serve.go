package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/caa-project/caa/internal/unixsock"
)

// DefaultShutdownTimeout bounds a graceful shutdown: probes and scrapes are
// short, and the daemon's own SIGTERM grace period must cover the ledger's
// close after this.
const DefaultShutdownTimeout = 5 * time.Second

// Server is the health endpoint's HTTP server, listening before it serves
// so that a caller that asked for ":0" can learn the port.
type Server struct {
	// ShutdownTimeout bounds the graceful shutdown (default
	// DefaultShutdownTimeout); past it, open connections are closed.
	ShutdownTimeout time.Duration

	ln  net.Listener
	srv *http.Server
	log *slog.Logger
	// active counts connections serving a request: a shutdown that runs
	// out of time with none active cut no request (net/http waits up to
	// 5 s for a connection a client opened and never used).
	active atomic.Int64
}

// Listen opens addr (host:port; port 0 picks one) for h. A nil log
// discards.
func Listen(ctx context.Context, addr string, h http.Handler, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := listen(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("health: listen on %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler: h,
		// Probes and scrapes are small; tight limits keep a slow or
		// hostile client from holding connections open.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	s := &Server{ShutdownTimeout: DefaultShutdownTimeout, ln: ln, srv: srv, log: log}
	srv.ConnState = func(_ net.Conn, state http.ConnState) {
		switch state {
		case http.StateActive:
			s.active.Add(1)
		case http.StateIdle, http.StateHijacked:
			s.active.Add(-1)
		}
	}
	return s, nil
}

// UnixPrefix marks an address as a unix socket's path ("unix:/run/caa/health.sock"):
// the probes then need no port, which two caa pods of a surge on the host
// network would both want.
const UnixPrefix = "unix:"

func listen(ctx context.Context, addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, UnixPrefix); ok {
		if path == "" {
			return nil, errors.New("empty unix socket path")
		}
		// Owner-only; a stale file (SIGKILL) is replaced, a served one refused.
		return unixsock.Listen(path, unixsock.Options{Mode: 0o600})
	}
	var lc net.ListenConfig
	return lc.Listen(ctx, "tcp", addr)
}

// ListenWhenFree is Listen for a port another process may hold for a while
// (the old caa of a surge on the host network holds the metrics port until
// it ends): it tries again every retry until the port is free or ctx ends.
// Any other error is returned at once.
func ListenWhenFree(ctx context.Context, addr string, h http.Handler, log *slog.Logger, retry time.Duration) (*Server, error) {
	warned := false
	for {
		s, err := Listen(ctx, addr, h, log)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return s, err
		}
		if !warned && log != nil {
			log.Warn("the address is in use (the caa this one replaces still serves it); serving it once it is free", "addr", addr, "retry", retry)
			warned = true
		}
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// Addr is the address the server listens on, with the port it got.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves until ctx is done, then shuts down gracefully within
// ShutdownTimeout. It returns nil after a clean shutdown; an error when
// serving failed or the shutdown had to cut connections.
func (s *Server) Serve(ctx context.Context) error {
	addr := s.Addr().String()
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(s.ln) }()
	s.log.Info("health endpoints serving", "addr", addr)

	select {
	case err := <-served:
		return fmt.Errorf("health: serve on %s: %w", addr, err)
	case <-ctx.Done():
	}
	timeout := s.ShutdownTimeout
	if timeout <= 0 {
		timeout = DefaultShutdownTimeout
	}
	// ctx is done already: the shutdown needs a deadline of its own.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		_ = s.srv.Close() // past the bound: cut what is left
		if errors.Is(err, context.DeadlineExceeded) && s.active.Load() <= 0 {
			s.log.Debug("health endpoints closed connections that never sent a request", "addr", addr)
		} else {
			return fmt.Errorf("health: shut down %s within %s: %w", addr, timeout, err)
		}
	}
	s.log.Info("health endpoints stopped", "addr", addr)
	return nil
}

// Serve listens on addr and serves h until ctx is done (see Server.Serve).
func Serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger) error {
	s, err := Listen(ctx, addr, h, log)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}
