// Package handover lets a new caa take a node's ledger over from the caa
// already running beside it, so that a DaemonSet update with maxSurge 1
// leaves the node without a reconciler only for the time the new caa needs
// to open the ledger and run its startup pass.
//
// The two processes talk over a unix socket beside the ledger
// (SocketPath), owner-only, served by whichever caa holds the ledger. The
// conversation is one connection of newline-delimited JSON messages:
//
//	successor                          holder
//	request {peer}            ->
//	                                    stops taking work, lets its calls in
//	                                    flight finish (or abandons them after
//	                                    a bound: their intents are durable),
//	                                    closes the ledger
//	                          <-        released {peer, epoch, sockets}
//	                                    (with the listening sockets it
//	                                    passes, SCM_RIGHTS: kata's
//	                                    hypervisor socket)
//	opens the ledger, runs
//	its startup pass
//	ready                     ->
//	                          <-        retired   (the holder is inert now)
//
// Anything else ends in a handback, so a broken successor never leaves the
// node without a reconciler:
//
//   - the connection drops before ready (the successor crashed, exited, was
//     killed): the holder reopens the ledger and resumes;
//   - no ready within the holder's bound: the holder sends abort; the
//     successor stops, closes the ledger and answers returned (or dies);
//     the holder reopens the ledger and resumes.
//
// A holder that is busy (a hand-over already under way, or not holding
// the ledger at all) answers refused {reason}; the successor tries again
// later. A successor that finds nobody on the socket opens the ledger
// itself: the holder is gone (a crash, a node reboot) or predates this
// protocol, and the ledger's file lock decides.
//
// The package carries only the conversation; what "stop", "close" and
// "resume" mean is the daemon's.
package handover

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/caa-project/caa/internal/unixsock"
)

// SocketPath is the hand-over socket of the ledger at ledgerPath.
func SocketPath(ledgerPath string) string { return ledgerPath + ".handover.sock" }

// Peer names one side of a hand-over, for logs, events and /status.
type Peer struct {
	Pod     string `json:"pod,omitempty"`
	Version string `json:"version,omitempty"`
	PID     int    `json:"pid,omitempty"`
	// Namespace and UID name the asker's pod for the holder's identity
	// check (from the downward API); the holder trusts neither: it checks
	// them against the socket's peer credentials and the apiserver.
	Namespace string `json:"namespace,omitempty"`
	UID       string `json:"uid,omitempty"`
	// Token is the asker's service account token (bound to its pod), which
	// the holder has the apiserver review (TokenReview): the proof of the
	// asker's pod that needs no hostPID. Never logged (String leaves it
	// out); the holder runs under the same service account, so it gains
	// nothing by it.
	Token string `json:"token,omitempty"`
}

func (p Peer) String() string {
	name := p.Pod
	if name == "" {
		name = "caa"
	}
	return fmt.Sprintf("%s (pid %d, version %s)", name, p.PID, p.Version)
}

// Message types.
const (
	msgRequest  = "request"
	msgReleased = "released"
	msgRefused  = "refused"
	msgReady    = "ready"
	msgRetired  = "retired"
	msgAbort    = "abort"
	msgReturned = "returned"
	// msgKept answers an abort that came after the successor turned ready
	// where the cluster can see it: it keeps the ledger, and the holder
	// retires instead of taking it back.
	msgKept = "kept"
)

type message struct {
	Type   string `json:"type"`
	Peer   *Peer  `json:"peer,omitempty"`
	Reason string `json:"reason,omitempty"`
	Epoch  uint64 `json:"epoch,omitempty"`
	// At is, in released, when the holder stopped work; in ready, when the
	// successor's reconciler started: the node's gap lies between them.
	At time.Time `json:"at,omitzero"`
	// Sockets names, in order, the descriptors a released message carries.
	Sockets []string `json:"sockets,omitempty"`
}

// Socket is a listening socket the holder passes with the release, so
// that the successor serves the same socket: connections made during the
// hand-over wait in its backlog instead of being refused.
type Socket struct {
	Name string
	File *os.File
}

// Errors a successor sees.
var (
	// ErrNoHolder: nobody answers on the socket; open the ledger directly.
	ErrNoHolder = errors.New("no caa answers on the hand-over socket")
	// ErrRefused: the holder declined for now (its reason is in the text);
	// ask again later.
	ErrRefused = errors.New("hand-over refused")
	// ErrHolderGone: the holder went away mid-conversation, before it
	// released the ledger; its file lock went with it, so open directly.
	ErrHolderGone = errors.New("the running caa went away during the hand-over")
	// ErrAborted: the holder took the ledger back (the successor was too
	// slow to turn ready); close the ledger and call Returned.
	ErrAborted = errors.New("hand-over aborted by the running caa")
)

// Errors a holder sees.
var (
	// ErrSuccessorGone: the successor's connection dropped before it said
	// ready; it no longer holds the ledger (its process closed the
	// connection or died), so take the ledger back.
	ErrSuccessorGone = errors.New("the new caa went away before it turned ready")
	// ErrKept: the successor answered an abort with kept: it had turned
	// ready already and keeps the ledger; the holder retires.
	ErrKept = errors.New("the new caa was already ready and keeps the ledger")
)

// conn is one side of the conversation.
type conn struct {
	c   net.Conn
	r   *bufio.Reader
	wmu sync.Mutex
}

func newConn(c net.Conn) *conn { return &conn{c: c, r: bufio.NewReader(c)} }

func (c *conn) send(m message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = c.c.Write(append(b, '\n'))
	return err
}

// sendFDs sends m with the descriptors fds attached to its bytes.
func (c *conn) sendFDs(m message, fds []int) error {
	uc, ok := c.c.(*net.UnixConn)
	if len(fds) == 0 || !ok {
		return c.send(m)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _, err = uc.WriteMsgUnix(append(b, '\n'), syscall.UnixRights(fds...), nil)
	return err
}

// recvFirst reads the holder's answer to a request, with the descriptors
// that came with it, before anything went through c.r: a buffered read
// would drop them. Bytes read past the answer stay for c.r.
func (c *conn) recvFirst(ctx context.Context) (message, []*os.File, error) {
	uc, ok := c.c.(*net.UnixConn)
	if !ok {
		m, err := c.recvCtx(ctx)
		return m, nil, err
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { defer close(fired); _ = c.c.SetReadDeadline(time.Now()) })
	defer func() {
		if !stop() {
			<-fired
			_ = c.c.SetReadDeadline(time.Time{})
		}
	}()
	var line []byte
	var files []*os.File
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4*maxSockets))
	for {
		n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
		if oobn > 0 {
			files = append(files, parseRights(oob[:oobn])...)
		}
		if n > 0 {
			line = append(line, buf[:n]...)
		}
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			c.r = bufio.NewReader(io.MultiReader(bytes.NewReader(line[i+1:]), c.c))
			var m message
			if err := json.Unmarshal(line[:i], &m); err != nil {
				closeAll(files)
				return message{}, nil, fmt.Errorf("hand-over: bad message %q: %w", line[:i], err)
			}
			return m, files, nil
		}
		if err != nil {
			closeAll(files)
			if ctx.Err() != nil {
				return message{}, nil, ctx.Err()
			}
			return message{}, nil, err
		}
		if len(line) > 1<<20 {
			closeAll(files)
			return message{}, nil, errors.New("hand-over: answer too long")
		}
	}
}

// maxSockets bounds the descriptors an answer may carry.
const maxSockets = 4

// parseRights returns the descriptors in a control message as files.
func parseRights(oob []byte) []*os.File {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var files []*os.File
	for _, cm := range msgs {
		fds, err := syscall.ParseUnixRights(&cm)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			syscall.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), "handed-over socket"))
		}
	}
	return files
}

func closeAll(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// recv reads one message; io.EOF (or any read error) means the peer went.
func (c *conn) recv() (message, error) {
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		return message{}, err
	}
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		return message{}, fmt.Errorf("hand-over: bad message %q: %w", line, err)
	}
	return m, nil
}

// recvCtx reads one message, giving up when ctx ends first; the
// connection stays usable (a holder that stopped waiting for ready still
// has to send abort on it).
func (c *conn) recvCtx(ctx context.Context) (message, error) {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = c.c.SetReadDeadline(time.Now())
	})
	m, err := c.recv()
	if !stop() {
		<-fired
		_ = c.c.SetReadDeadline(time.Time{})
		if err != nil {
			return message{}, ctx.Err()
		}
	}
	return m, err
}

// Listener is the holder's end: it accepts hand-over requests on the socket.
type Listener struct {
	ln *unixsock.Listener
}

// Listen binds the hand-over socket at path, owner-only. A socket file
// nobody answers on is stale and replaced; one that answers belongs to a
// live holder, and Listen refuses to take it. Closing removes the file only
// while it is still this listener's: after a hand-over the path belongs to
// the successor's listener.
func Listen(path string) (*Listener, error) {
	ln, err := unixsock.Listen(path, unixsock.Options{Mode: 0o600})
	if errors.Is(err, unixsock.ErrServed) {
		return nil, fmt.Errorf("hand-over socket %s is answered by another process: %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("hand-over socket %s: %w", path, err)
	}
	return &Listener{ln: ln}, nil
}

// Path is the socket's path.
func (l *Listener) Path() string { return l.ln.Path() }

// Close stops accepting; it removes the socket file only if the file is
// still this listener's.
func (l *Listener) Close() error { return l.ln.Close() }

// Serve accepts requests until ctx ends or the listener closes, and hands
// each one, read and parsed, to handle on its own goroutine. A connection
// that sends no request within 5s is dropped. Other accept errors are
// retried (unixsock.Accept), so it returns nil, once the listener is
// closed and every handle has returned.
func (l *Listener) Serve(ctx context.Context, handle func(*Request)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	// Accept closes the listener when ctx ends and returns only once it is
	// closed; it ends only so (ctx's error, or the listener closed).
	_ = unixsock.Accept(ctx, l.ln, nil, func(c net.Conn) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cn := newConn(c)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			m, err := cn.recv()
			_ = c.SetReadDeadline(time.Time{})
			if err != nil || m.Type != msgRequest || m.Peer == nil {
				_ = c.Close()
				return
			}
			handle(&Request{From: *m.Peer, Cred: peerCred(c), c: cn})
		}()
	})
	return nil
}

// Request is one successor's request, as the holder sees it. The holder
// answers with exactly one of Refuse or Release, then (after Release)
// WaitReady and, if that times out, Abort.
type Request struct {
	From Peer
	// Cred is what the kernel says about the asker's process
	// (SO_PEERCRED), read when it connected; the PID is 0 when that
	// process is outside this caa's pid namespace.
	Cred Cred
	// Verified is the asker's identity as the holder verified it (its
	// pod's UID, from the kernel or the apiserver, never from the asker's
	// word): what a failed hand-over's cooldown is keyed on. Empty until
	// verified.
	Verified string
	c        *conn
}

// Alive reports whether the asker is still connected, without waiting: a
// request that sat in a frozen holder's queue may come from an asker that
// gave up long ago, and the holder must not stop work for it.
func (r *Request) Alive() bool { return connAlive(r.c) }

// Refuse declines the request with a reason the successor reports.
func (r *Request) Refuse(reason string) {
	_ = r.c.send(message{Type: msgRefused, Reason: reason})
	_ = r.c.c.Close()
}

// Release tells the successor the ledger is closed and free; epoch is
// the last epoch the holder opened it under, me names the holder, and
// stopped is when it stopped taking work.
// The sockets go with it (the holder keeps its own descriptors, and closes
// the Files it gave once sent).
func (r *Request) Release(me Peer, epoch uint64, stopped time.Time, sockets ...Socket) error {
	m := message{Type: msgReleased, Peer: &me, Epoch: epoch, At: stopped}
	var fds []int
	for _, s := range sockets {
		m.Sockets = append(m.Sockets, s.Name)
		fds = append(fds, int(s.File.Fd()))
	}
	err := r.c.sendFDs(m, fds)
	for _, s := range sockets {
		_ = s.File.Close()
	}
	if err != nil {
		_ = r.c.c.Close()
		return fmt.Errorf("%w: %w", ErrSuccessorGone, err)
	}
	return nil
}

// WaitReady waits for the successor to say it is ready and returns when
// its reconciler started; the holder then closes its listener (the
// successor binds the socket next) and calls Retire, and stays inert from
// then on. WaitReady returns ErrSuccessorGone when the connection drops
// first, and ctx's error when ctx ends first (the holder then calls Abort).
func (r *Request) WaitReady(ctx context.Context) (acting time.Time, err error) {
	for {
		m, err := r.c.recvCtx(ctx)
		if err != nil {
			if ctx.Err() != nil {
				// A holder that was frozen past its deadline wakes up to a
				// timer that already fired: a ready that arrived meanwhile
				// is in the socket's buffer, and it counts.
				if m, ok := r.c.buffered(); ok && m.Type == msgReady {
					return m.At, nil
				}
				return time.Time{}, ctx.Err()
			}
			return time.Time{}, fmt.Errorf("%w: %w", ErrSuccessorGone, err)
		}
		if m.Type == msgReady {
			return m.At, nil
		}
	}
}

// Retire tells a ready successor that the holder is inert, and ends the
// conversation.
func (r *Request) Retire() {
	_ = r.c.send(message{Type: msgRetired})
	_ = r.c.c.Close()
}

// Abort takes the ledger back from a successor that did not turn ready in
// time: it says abort with reason and waits, up to ctx, for the successor
// to answer returned or to go away. Either way the holder then reopens the
// ledger (the file lock settles a successor that is merely hung).
func (r *Request) Abort(ctx context.Context, reason string) error {
	defer r.c.c.Close()
	if err := r.c.send(message{Type: msgAbort, Reason: reason}); err != nil {
		return nil // gone already: nothing holds the ledger on its side
	}
	for {
		m, err := r.c.recvCtx(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("hand-over: the new caa did not give the ledger back: %w", ctx.Err())
			}
			return nil
		}
		if m.Type == msgReturned {
			return nil
		}
		if m.Type == msgKept {
			return ErrKept
		}
		// A ready that crossed the abort on the wire is void: the abort won.
	}
}

// Handover is the successor's side of an accepted hand-over.
type Handover struct {
	// From is the holder that released the ledger; Epoch the epoch it had
	// opened the ledger under.
	From    Peer
	Epoch   uint64
	Stopped time.Time // when the holder stopped work
	// Sockets are the listening sockets the holder passed (the successor
	// owns the Files: it takes or closes each).
	Sockets []Socket

	c       *conn
	aborted chan string   // the holder's abort reason, once
	retired chan struct{} // closed when the holder says retired
	gone    chan struct{} // closed when the connection ends
}

// Retired is closed when the holder says retired.
func (h *Handover) Retired() <-chan struct{} { return h.retired }

// Gone is closed when the conversation ends (the holder went away, or
// after an abort).
func (h *Handover) Gone() <-chan struct{} { return h.gone }

// SayReady tells the holder the successor is ready (its reconciler started
// at acting) without waiting for the answer: the caller watches Retired,
// Aborted and Gone. An error means the holder is gone.
func (h *Handover) SayReady(acting time.Time) error {
	return h.c.send(message{Type: msgReady, At: acting})
}

// Keep answers an abort that came after this successor turned ready where
// the cluster sees it: it keeps the ledger, and the holder retires.
func (h *Handover) Keep() {
	_ = h.c.send(message{Type: msgKept})
	_ = h.c.c.Close()
}

// Ask connects to the holder on path and asks it to hand over, waiting up
// to ctx for the answer. It returns ErrNoHolder when nobody answers on the
// socket, ErrRefused with the holder's reason, and ErrHolderGone when the
// holder went away before releasing.
func Ask(ctx context.Context, path string, me Peer) (*Handover, error) {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	c, err := d.DialContext(dctx, "unix", path)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %w", ErrNoHolder, err)
	}
	cn := newConn(c)
	if err := cn.send(message{Type: msgRequest, Peer: &me}); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("%w: %w", ErrHolderGone, err)
	}
	m, files, err := cn.recvFirst(ctx)
	if err != nil {
		_ = c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %w", ErrHolderGone, err)
	}
	switch m.Type {
	case msgReleased:
	case msgRefused:
		closeAll(files)
		_ = c.Close()
		return nil, fmt.Errorf("%w: %s", ErrRefused, m.Reason)
	default:
		closeAll(files)
		_ = c.Close()
		return nil, fmt.Errorf("hand-over: unexpected answer %q", m.Type)
	}
	h := &Handover{Epoch: m.Epoch, Stopped: m.At, c: cn, aborted: make(chan string, 1), retired: make(chan struct{}), gone: make(chan struct{})}
	// Each named descriptor is a passed socket; unnamed extras are closed.
	for i, f := range files {
		if i < len(m.Sockets) {
			h.Sockets = append(h.Sockets, Socket{Name: m.Sockets[i], File: f})
		} else {
			_ = f.Close()
		}
	}
	if m.Peer != nil {
		h.From = *m.Peer
	}
	go h.read()
	return h, nil
}

func (h *Handover) read() {
	defer close(h.gone)
	retired := false
	for {
		m, err := h.c.recv()
		if err != nil {
			return
		}
		switch m.Type {
		case msgAbort:
			h.aborted <- m.Reason
			return
		case msgRetired:
			if !retired {
				retired = true
				close(h.retired)
			}
		}
	}
}

// Aborted delivers the holder's reason if it takes the ledger back. The
// successor must then stop its work, close the ledger and call Returned.
func (h *Handover) Aborted() <-chan string { return h.aborted }

// Ready tells the holder the successor is ready (its reconciler started
// at acting) and waits, up to ctx, for it to retire. It returns nil when
// the holder retired or went away (it cannot take the ledger back then),
// and ErrAborted when the holder's abort came first: the successor must
// give the ledger back.
func (h *Handover) Ready(ctx context.Context, acting time.Time) error {
	if err := h.c.send(message{Type: msgReady, At: acting}); err != nil {
		select {
		case r := <-h.aborted:
			h.aborted <- r
			return fmt.Errorf("%w: %s", ErrAborted, r)
		default:
		}
		return nil // the holder is gone: the ledger is ours
	}
	select {
	case <-h.retired:
		_ = h.c.c.Close()
		return nil
	case r := <-h.aborted:
		h.aborted <- r
		return fmt.Errorf("%w: %s", ErrAborted, r)
	case <-h.gone:
		select {
		case r := <-h.aborted:
			h.aborted <- r
			return fmt.Errorf("%w: %s", ErrAborted, r)
		default:
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Returned tells the holder the ledger is closed again (after Aborted)
// and ends the conversation.
func (h *Handover) Returned() {
	_ = h.c.send(message{Type: msgReturned})
	_ = h.c.c.Close()
}

// Close ends the conversation without a word; the holder reads it as the
// successor going away.
func (h *Handover) Close() { _ = h.c.c.Close() }
