package katafake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/ttrpc"

	"github.com/caa-project/caa/internal/agentproto"
)

// Agent is the shim's side of one sandbox's agent socket, as kata's Go shim
// holds it: one connection, dialled once and kept for the sandbox's life,
// on which it health-checks the agent periodically (kata: every 5 s, and
// one failed check fails the sandbox) and sends long-lived calls such as
// WaitProcess.
type Agent struct {
	conn net.Conn
	cl   *ttrpc.Client

	mu      sync.Mutex
	checks  int
	misses  []string
	longest time.Duration
	// window is when the current window of Longest began: a check sent
	// before it counts in the window before, even if answered in this one.
	window time.Time
}

// DialAgent opens the shim's one connection to an agent socket.
func DialAgent(ctx context.Context, socket string) (*Agent, error) {
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("dial the agent socket %s: %w", socket, err)
	}
	return NewAgent(c), nil
}

// NewAgent is the shim's side of an agent connection already open.
func NewAgent(c net.Conn) *Agent { return &Agent{conn: c, cl: ttrpc.NewClient(c)} }

// HealthCheck checks the agent every period until ctx ends. A check that
// fails, or gets no answer within timeout, is a miss (kata fails the
// sandbox on one). It records the longest time between a check and its
// answer: the stall the shim sees.
func (a *Agent) HealthCheck(ctx context.Context, period, timeout time.Duration) {
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		t0 := time.Now()
		st, err := agentproto.Check(cctx, a.cl)
		d := time.Since(t0)
		cancel()
		if ctx.Err() != nil {
			return // the caller stopped checking: not a miss
		}
		a.mu.Lock()
		a.checks++
		if !t0.Before(a.window) {
			a.longest = max(a.longest, d)
		}
		if err != nil || st != agentproto.Serving {
			a.misses = append(a.misses, fmt.Sprintf("check %d after %s: status %d, err %v", a.checks, d, st, err))
		}
		a.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(period):
		}
	}
}

// Checks counts the health checks answered or missed so far.
func (a *Agent) Checks() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.checks
}

// Misses are the missed checks so far, described.
func (a *Agent) Misses() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.misses...)
}

// Longest returns the longest check-to-answer time of the checks sent since
// the last call, and starts a new window.
func (a *Agent) Longest() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.longest
	a.longest = 0
	a.window = time.Now()
	return d
}

// WaitProcess sends kata's WaitProcess for a container on the shim's
// connection and returns the exit status the agent answers.
func (a *Agent) WaitProcess(ctx context.Context, containerID string) (int32, error) {
	return agentproto.WaitProcess(ctx, a.cl, containerID, "")
}

// Close closes the shim's connection.
func (a *Agent) Close() error { return a.cl.Close() }

// Stream is a raw byte stream through an agent socket to a forwarder that
// echoes it (the fake pod VM does for a connection opening with its
// magic): it writes a numbered byte pattern and checks that every byte
// comes back, in order.
type Stream struct {
	conn    net.Conn
	written atomic.Int64
	read    atomic.Int64
	werr    chan error
	rerr    chan error
	stop    chan struct{}
}

// streamByte is the stream's byte at offset off (not periodic in 256, so
// a lost or repeated block shows).
func streamByte(off int64) byte { return byte(off*7 + off/251) }

// StartStream opens a connection to socket, sends magic, and writes chunk
// bytes every interval until Finish.
func StartStream(ctx context.Context, socket string, magic []byte, chunk int, interval time.Duration) (*Stream, error) {
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("dial the agent socket %s: %w", socket, err)
	}
	if _, err := c.Write(magic); err != nil {
		c.Close()
		return nil, fmt.Errorf("stream: %w", err)
	}
	s := &Stream{conn: c, werr: make(chan error, 1), rerr: make(chan error, 1), stop: make(chan struct{})}
	go s.write(chunk, interval)
	go s.readBack()
	return s, nil
}

func (s *Stream) write(chunk int, interval time.Duration) {
	buf := make([]byte, chunk)
	var off int64
	for {
		select {
		case <-s.stop:
			s.werr <- nil
			return
		case <-time.After(interval):
		}
		for i := range buf {
			buf[i] = streamByte(off + int64(i))
		}
		if _, err := s.conn.Write(buf); err != nil {
			s.werr <- fmt.Errorf("stream write after %d bytes: %w", off, err)
			return
		}
		off += int64(len(buf))
		s.written.Store(off)
	}
}

func (s *Stream) readBack() {
	buf := make([]byte, 16<<10)
	var off int64
	for {
		n, err := s.conn.Read(buf)
		for i := range n {
			if buf[i] != streamByte(off+int64(i)) {
				s.rerr <- fmt.Errorf("stream byte %d: got %d, want %d", off+int64(i), buf[i], streamByte(off+int64(i)))
				return
			}
		}
		off += int64(n)
		s.read.Store(off)
		if err != nil {
			s.rerr <- fmt.Errorf("stream read after %d bytes: %w", off, err)
			return
		}
	}
}

// Written is the number of bytes written so far.
func (s *Stream) Written() int64 { return s.written.Load() }

// Finish stops writing and waits (up to within) until every byte written
// came back. It returns the bytes written and the bytes lost (written but
// not echoed: cut, or wrong, at the first wrong byte).
func (s *Stream) Finish(within time.Duration) (written, lost int64, err error) {
	close(s.stop)
	defer s.conn.Close()
	if werr := <-s.werr; werr != nil {
		err = werr
	}
	written = s.written.Load()
	deadline := time.After(within)
	for s.read.Load() < written {
		select {
		case rerr := <-s.rerr:
			return written, written - s.read.Load(), errors.Join(err, rerr)
		case <-deadline:
			return written, written - s.read.Load(), errors.Join(err, fmt.Errorf("stream: %d of %d bytes came back within %s", s.read.Load(), written, within))
		case <-time.After(time.Millisecond):
		}
	}
	return written, 0, err
}

// Shims are the shims of many sandboxes, checked and measured together.
type Shims struct {
	Agents []*Agent
	wg     sync.WaitGroup
}

// Check starts every shim's HealthCheck until ctx ends; Wait waits for
// them to end. The shims' first checks are spread over one period, as
// shims started with their sandboxes at different moments are: checks
// all sent at once would queue behind each other.
func (s *Shims) Check(ctx context.Context, period, timeout time.Duration) {
	for i, a := range s.Agents {
		offset := period * time.Duration(i) / time.Duration(len(s.Agents))
		s.wg.Go(func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(offset):
			}
			a.HealthCheck(ctx, period, timeout)
		})
	}
}

// Wait waits until every HealthCheck started by Check has returned.
func (s *Shims) Wait() { s.wg.Wait() }

// Longest is the longest check-to-answer time any shim saw since the last
// call; it starts a new window for each.
func (s *Shims) Longest() time.Duration {
	var d time.Duration
	for _, a := range s.Agents {
		d = max(d, a.Longest())
	}
	return d
}

// Counts are the checks and misses of every shim so far.
func (s *Shims) Counts() (checks, misses int) {
	for _, a := range s.Agents {
		checks += a.Checks()
		misses += len(a.Misses())
	}
	return checks, misses
}

// Close closes every shim's connection.
func (s *Shims) Close() {
	for _, a := range s.Agents {
		_ = a.Close()
	}
}

// CheckAgent opens a connection to an agent socket as the shim does, runs
// kata's health check once (within 5 s) and closes it: nil only when the
// agent answers SERVING.
func CheckAgent(ctx context.Context, socket string) error {
	a, err := DialAgent(ctx, socket)
	if err != nil {
		return err
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := agentproto.Check(ctx, a.cl)
	if err != nil {
		return err
	}
	if st != agentproto.Serving {
		return fmt.Errorf("the agent at %s answers status %d, not SERVING", socket, st)
	}
	return nil
}
