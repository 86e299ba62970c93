package relayd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/caa-project/caa/internal/unixsock"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/relay"
)

// Config is what a Server works with.
type Config struct {
	// ClientFile is caa's client file (dir/ClientFile of the agent CA).
	ClientFile string
	// Refresh is how often the client file is checked for a change
	// (default 10 s; every Serve checks it too).
	Refresh time.Duration
	// DialTimeout bounds a shim connection's dial of the forwarder
	// (relay.Config.DialTimeout).
	DialTimeout time.Duration
	// Dial, when set, opens the relays' TCP connections (tests).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// AllowUIDs are the uids whose processes may use the control socket
	// (checked with SO_PEERCRED on each connection, besides the socket's
	// 0600 mode). Empty: the daemon's own uid and root (0). Otherwise
	// exactly these.
	AllowUIDs []uint32
	Log       *slog.Logger
}

// Server is the relay daemon's state: the relays it serves, by sandbox.
type Server struct {
	cfg   Config
	log   *slog.Logger
	certs *certStore
	boot  string
	allow []uint32 // sorted

	mu     sync.Mutex
	relays map[string]*served
	closed bool
	// retired sums the counts of the relays closed so far, control the
	// control requests (metrics.go).
	retired relay.Stats
	control map[controlKey]int
}

type served struct {
	e Entry
	r *relay.Relay
}

// NewServer checks that caa's client file can be read: without it no relay
// could reach a VM.
func NewServer(cfg Config) (*Server, error) {
	if cfg.ClientFile == "" {
		return nil, errors.New("relayd: Config.ClientFile is empty: pass <agent CA dir>/" + ClientFile)
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	allow := slices.Clone(cfg.AllowUIDs)
	if len(allow) == 0 {
		allow = []uint32{0, uint32(os.Getuid())}
	}
	slices.Sort(allow)
	allow = slices.Compact(allow)
	s := &Server{cfg: cfg, log: cfg.Log, certs: newCertStore(cfg.ClientFile), relays: map[string]*served{}, allow: allow}
	if _, err := s.certs.refresh(); err != nil {
		return nil, err
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	s.boot = hex.EncodeToString(b[:])
	return s, nil
}

// Boot identifies this run of the daemon.
func (s *Server) Boot() string { return s.boot }

// Listen opens the control socket at path, mode 0600. A stale socket file
// is replaced; one that a live daemon still serves is refused (a second
// relay daemon must not take the node's sockets from the first), as is any
// other file there.
func Listen(path string) (net.Listener, error) {
	ln, err := unixsock.Listen(path, unixsock.Options{Mode: 0o600})
	switch {
	case errors.Is(err, unixsock.ErrNotSocket):
		return nil, fmt.Errorf("relayd: %w: remove it or pass another --socket", err)
	case errors.Is(err, unixsock.ErrServed):
		return nil, fmt.Errorf("relayd: %w: another caa relay runs on this node; stop it first, or pass another --socket", err)
	case err != nil:
		return nil, fmt.Errorf("relayd: control socket %s: %w", path, err)
	}
	return ln, nil
}

// Serve answers control calls on ln until ctx is done, then closes every
// relay: the daemon's own shutdown ends the shims' connections (that is
// what its rare upgrades cost; caa's never reach here).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	defer func() {
		ln.Close()
		wg.Wait()
		s.closeAll()
	}()
	// Ends the refresh loop and the calls in flight before the wait above,
	// also when ln was closed under Serve.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(s.cfg.Refresh)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.refreshCerts()
			}
		}
	}()
	err := unixsock.Accept(ctx, ln, s.log, func(c net.Conn) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.handle(ctx, c)
		}()
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (s *Server) refreshCerts() {
	changed, err := s.certs.refresh()
	switch {
	case err != nil:
		s.log.Warn("caa's client file unreadable; keeping the certificates read before", "err", err)
	case changed:
		s.log.Info("caa's client certificates read again; new connections use them", "file", s.cfg.ClientFile)
	}
}

// Allowed returns the uids whose processes may use the control socket.
func (s *Server) Allowed() []uint32 { return slices.Clone(s.allow) }

// admit checks the peer of a control connection: only the allowed uids may
// tell the daemon what to serve or stop. The socket's mode already keeps
// others out; this holds when the mode was widened or the socket's
// directory is shared with another user's process.
func (s *Server) admit(c net.Conn) error {
	p, err := unixsock.Peer(c)
	if err != nil {
		s.log.Warn("control connection refused: its peer's credentials are unreadable", "err", err)
		return fmt.Errorf("refused: the peer's credentials are unreadable: %w", err)
	}
	if slices.Contains(s.allow, p.UID) {
		return nil
	}
	s.log.Warn("control connection refused: its peer's uid is not allowed",
		"peerPid", p.PID, "peerUid", p.UID, "peerGid", p.GID, "allowedUids", s.allow)
	return fmt.Errorf("refused: uid %d (pid %d) may not use the relay daemon's control socket; it accepts uids %v (caa relay --allow-uid)",
		p.UID, p.PID, s.allow)
}

// handle serves one control connection: one request, one answer. The
// client hanging up cancels the request.
func (s *Server) handle(ctx context.Context, c net.Conn) {
	defer c.Close()
	if err := s.admit(c); err != nil {
		s.countControl("", controlRefused)
		// Take the request off the socket first (briefly), so the
		// client's write does not fail and it reads why it was refused.
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		var ignored Request
		_ = json.NewDecoder(io.LimitReader(c, 64<<10)).Decode(&ignored)
		_ = json.NewEncoder(c).Encode(Response{Error: err.Error()})
		return
	}
	var req Request
	dec := json.NewDecoder(io.LimitReader(c, 64<<10))
	if err := dec.Decode(&req); err != nil {
		_ = json.NewEncoder(c).Encode(Response{Boot: s.boot, Error: "bad request: " + err.Error()})
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // the client closes its side when it gives up
		var b [1]byte
		_, _ = c.Read(b[:])
		cancel()
	}()
	resp := s.Do(rctx, req)
	_ = json.NewEncoder(c).Encode(resp)
}

// Do runs one request; the control socket's handler and tests call it.
func (s *Server) Do(ctx context.Context, req Request) Response {
	resp := Response{Boot: s.boot}
	var err error
	switch req.Op {
	case OpServe:
		resp.Kept, resp.HeardAgo, err = s.serve(req)
	case OpStop:
		err = s.stop(req.Sandbox)
	case OpList:
		resp.Entries = s.list()
	case OpReach:
		err = s.reach(ctx, req)
	default:
		err = fmt.Errorf("unknown op %q: want %s, %s, %s or %s", req.Op, OpServe, OpStop, OpList, OpReach)
	}
	result := controlOK
	if err != nil {
		resp.Error = err.Error()
		result = controlError
	}
	s.countControl(req.Op, result)
	return resp
}

func checkServe(req Request) error {
	switch {
	case !ledger.ValidSandboxID(req.Sandbox):
		return fmt.Errorf("sandbox %q: want 1-128 letters, digits, '.', '_' or '-'", req.Sandbox)
	case req.Socket == "" || !filepath.IsAbs(req.Socket):
		return fmt.Errorf("socket %q: want the agent socket's absolute path", req.Socket)
	case req.Addr == "":
		return errors.New("addr is empty: want the forwarder's VM_IP:15150")
	}
	if _, _, err := net.SplitHostPort(req.Addr); err != nil {
		return fmt.Errorf("addr %q: %w", req.Addr, err)
	}
	return nil
}

// serve starts serving a sandbox's agent socket. The same arguments again
// keep the listener and its connections (caa's restart registers every
// live sandbox again); other arguments replace the relay; a socket path
// served for another sandbox is refused.
func (s *Server) serve(req Request) (kept bool, heard time.Duration, err error) {
	if err := checkServe(req); err != nil {
		return false, 0, err
	}
	want := Entry{Sandbox: req.Sandbox, Socket: req.Socket, Addr: req.Addr, ServerName: req.ServerName}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, 0, errors.New("the relay daemon is shutting down")
	}
	old := s.relays[req.Sandbox]
	if old != nil && old.e == want {
		return true, heardAgo(old.r), nil
	}
	for id, sv := range s.relays {
		if id != req.Sandbox && sv.e.Socket == req.Socket {
			return false, 0, fmt.Errorf("socket %s is served for sandbox %s: stop it first", req.Socket, id)
		}
	}
	s.refreshCerts()
	if old != nil {
		delete(s.relays, req.Sandbox)
		_ = old.r.Close()
		s.retire(old.r)
		s.log.Info("agent relay replaced", "sandbox", req.Sandbox, "was", old.e.Addr, "now", req.Addr)
	}
	if err := os.MkdirAll(filepath.Dir(req.Socket), 0o700); err != nil {
		return false, 0, fmt.Errorf("agent socket directory: %w", err)
	}
	expect := req.ServerName
	if expect == "" { // the VM's IP: its certificate must name it
		expect, _, _ = net.SplitHostPort(req.Addr)
	}
	tc, err := s.certs.tlsConfig(expect)
	if err != nil {
		return false, 0, err
	}
	r, err := relay.Start(context.Background(), relay.Config{
		SocketPath: req.Socket, Addr: req.Addr, TLS: tc, ServerName: req.ServerName,
		DialTimeout: s.cfg.DialTimeout, Dial: s.cfg.Dial, Log: s.log.With("sandbox", req.Sandbox),
	})
	if err != nil {
		return false, 0, err
	}
	s.relays[req.Sandbox] = &served{e: want, r: r}
	s.log.Info("serving agent socket", "sandbox", req.Sandbox, "socket", req.Socket, "forwarder", req.Addr)
	return false, 0, nil
}

// heardAgo is Entry.HeardAgo of r: 0 without evidence, at least 1 ns with.
func heardAgo(r *relay.Relay) time.Duration {
	age, ok := r.Heard()
	if !ok {
		return 0
	}
	return max(age, 1)
}

// stop closes a sandbox's socket and its connections; an unknown sandbox
// is no error (stop is idempotent).
func (s *Server) stop(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sv := s.relays[id]
	if sv == nil {
		return nil
	}
	delete(s.relays, id)
	s.log.Info("agent socket stopped", "sandbox", id, "socket", sv.e.Socket)
	// Closed under the lock (as serve replaces one), so a scrape sees its
	// counts either live or retired, never neither.
	err := sv.r.Close()
	s.retire(sv.r)
	return err
}

func (s *Server) list() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Entry, 0, len(s.relays))
	for _, sv := range s.relays {
		e := sv.e
		e.Open = sv.r.Stats().Open
		e.HeardAgo = heardAgo(sv.r)
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Sandbox < out[j].Sandbox })
	return out
}

func (s *Server) reach(ctx context.Context, req Request) error {
	s.mu.Lock()
	sv := s.relays[req.Sandbox]
	s.mu.Unlock()
	if sv == nil {
		return fmt.Errorf("sandbox %q is not served: Serve it first", req.Sandbox)
	}
	wait := req.Wait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return sv.r.WaitReachable(ctx)
}

func (s *Server) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, sv := range s.relays {
		_ = sv.r.Close()
		s.retire(sv.r)
	}
	s.relays = map[string]*served{}
}
