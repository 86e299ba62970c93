package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// proc is one process of a container: its init process or an exec.
type proc struct {
	cid, execID string
	cmd         *exec.Cmd
	stdin       io.WriteCloser
	stdout      *stream
	stderr      *stream

	mu      sync.Mutex
	started bool
	done    chan struct{} // closed when the process has exited and status is set
	status  int32
}

func newProc(cid, execID string, args, env []string, cwd string, terminal bool) *proc {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	if info, err := os.Stat(cwd); err == nil && info.IsDir() {
		cmd.Dir = cwd
	} else {
		cmd.Dir = "/"
	}
	// Its own process group, so a signal reaches what it started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &proc{cid: cid, execID: execID, cmd: cmd, stdout: newStream(), stderr: newStream(), done: make(chan struct{})}
	if terminal {
		// No terminal here: the shim reads a terminal's output from
		// stdout alone, so stderr goes there too.
		p.stderr = p.stdout
	}
	return p
}

// start starts the process once; its output streams fill until it closes
// them.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return errors.New("already started")
	}
	stdin, err := p.cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr io.ReadCloser
	if p.stderr != p.stdout {
		if stderr, err = p.cmd.StderrPipe(); err != nil {
			return err
		}
	} else {
		p.cmd.Stderr = p.cmd.Stdout
	}
	if err := p.cmd.Start(); err != nil {
		return err
	}
	p.started = true
	p.stdin = stdin
	var readers sync.WaitGroup
	readers.Go(func() { p.stdout.fill(stdout) })
	if stderr != nil {
		readers.Go(func() { p.stderr.fill(stderr) })
	}
	go func() {
		// Wait closes the pipes: read them to the end first.
		readers.Wait()
		err := p.cmd.Wait()
		p.status = exitStatus(p.cmd.ProcessState, err)
		close(p.done)
	}()
	return nil
}

// exitStatus is the status kata's agent reports: the exit code, or 128 plus
// the signal that ended the process.
func exitStatus(ps *os.ProcessState, err error) int32 {
	if ps == nil {
		return 255
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	return int32(ps.ExitCode())
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.started {
		return 0
	}
	return p.cmd.Process.Pid
}

// signal sends sig to the process's group; a process already gone is not
// an error (the shim signals after exits too).
func (p *proc) signal(sig syscall.Signal) error {
	pid := p.pid()
	if pid == 0 {
		return status.Errorf(codes.FailedPrecondition, "process %s of %s not started", p.execID, p.cid)
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := syscall.Kill(-pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// killWait ends the process and waits (briefly) for its status.
func (p *proc) killWait() {
	if p.pid() == 0 {
		return
	}
	_ = p.signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

func (p *proc) writeStdin(b []byte) (int, error) {
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	if w == nil {
		return 0, errors.New("not started")
	}
	return w.Write(b)
}

func (p *proc) closeStdin() {
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	if w != nil {
		_ = w.Close()
	}
}

// stream is a process's output, kept until the shim reads it.
type stream struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	eof    bool
	notify chan struct{} // closed and replaced on each change
}

func newStream() *stream { return &stream{notify: make(chan struct{})} }

func (s *stream) fill(r io.Reader) {
	b := make([]byte, 32<<10)
	for {
		n, err := r.Read(b)
		s.mu.Lock()
		s.buf.Write(b[:n])
		if err != nil {
			s.eof = true
		}
		close(s.notify)
		s.notify = make(chan struct{})
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// read returns up to max bytes once there are some; at the end of the
// output it fails, which ends the shim's copy as the agent's EOF does.
func (s *stream) read(ctx context.Context, max int) ([]byte, error) {
	if max <= 0 {
		max = 32 << 10
	}
	for {
		s.mu.Lock()
		if s.buf.Len() > 0 {
			data := bytes.Clone(s.buf.Next(max))
			s.mu.Unlock()
			return data, nil
		}
		if s.eof {
			s.mu.Unlock()
			return nil, status.Error(codes.Unknown, "EOF")
		}
		ch := s.notify
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
