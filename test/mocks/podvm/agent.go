// Package podvmfake is a fake peer-pods pod VM for tests: it boots from caa's
// user data the way the real image reads it (podvm.Parse), plays the
// agent-protocol-forwarder (mutual TLS with the certificate and client CA from
// the user data) and runs a fake kata agent behind it. With a network namespace
// as the VM, it also builds the VM's end of the pod network's VXLAN tunnel.
package podvmfake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/ttrpc"

	"github.com/caa-project/caa/internal/agentproto"
)

// Agent is a fake kata agent: a ttrpc server with kata's health check
// (/grpc.Health/Check) and a long-lived wait (/grpc.AgentService/WaitProcess,
// which answers when the test releases the container or the agent stops).
type Agent struct {
	dir    string
	socket string
	ln     net.Listener
	srv    *ttrpc.Server

	mu       sync.Mutex
	serving  bool
	checks   int
	conns    int
	waits    int
	waiting  map[string]chan int32
	waitCond *sync.Cond
	stopped  chan struct{}
}

// StartAgent serves a fake agent on a unix socket in a new temporary directory.
func StartAgent() (*Agent, error) {
	dir, err := os.MkdirTemp("", "caa-fake-agent-")
	if err != nil {
		return nil, err
	}
	a := &Agent{dir: dir, socket: filepath.Join(dir, "agent.sock"), serving: true, waiting: map[string]chan int32{}, stopped: make(chan struct{})}
	a.waitCond = sync.NewCond(&a.mu)
	a.srv, err = ttrpc.NewServer()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	a.srv.RegisterService(agentproto.HealthService, &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		agentproto.CheckMethod: a.check,
	}})
	a.srv.RegisterService(agentproto.AgentService, &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		agentproto.WaitProcessMethod: a.waitProcess,
	}})
	ln, err := net.Listen("unix", a.socket)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	a.ln = countingListener{Listener: ln, a: a}
	go func() { _ = a.srv.Serve(context.Background(), a.ln) }()
	return a, nil
}

func (a *Agent) check(ctx context.Context, unmarshal func(any) error) (any, error) {
	req := agentproto.EmptyCheckRequest()
	if err := unmarshal(req); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.checks++
	st := int32(agentproto.Serving)
	if !a.serving {
		st = 2 // NOT_SERVING
	}
	return agentproto.NewHealthCheckResponse(st), nil
}

func (a *Agent) waitProcess(ctx context.Context, unmarshal func(any) error) (any, error) {
	req := agentproto.EmptyWaitProcessRequest()
	if err := unmarshal(req); err != nil {
		return nil, err
	}
	id := agentproto.ContainerID(req)
	ch := make(chan int32, 1)
	a.mu.Lock()
	a.waits++
	a.waiting[id] = ch
	a.waitCond.Broadcast()
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.waiting, id)
		a.mu.Unlock()
	}()
	select {
	case st := <-ch:
		return agentproto.NewWaitProcessResponse(st), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-a.stopped:
		return nil, errors.New("fake agent stopped")
	}
}

// Socket is the agent's unix socket.
func (a *Agent) Socket() string { return a.socket }

// SetServing sets what the health check answers.
func (a *Agent) SetServing(ok bool) {
	a.mu.Lock()
	a.serving = ok
	a.mu.Unlock()
}

// Checks and Waits count the calls received so far.
func (a *Agent) Checks() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.checks
}

// Waits counts WaitProcess calls received so far.
func (a *Agent) Waits() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waits
}

// AwaitWaiting blocks until a WaitProcess for containerID is in progress.
func (a *Agent) AwaitWaiting(ctx context.Context, containerID string) error {
	stop := context.AfterFunc(ctx, func() {
		a.mu.Lock()
		a.waitCond.Broadcast()
		a.mu.Unlock()
	})
	defer stop()
	a.mu.Lock()
	defer a.mu.Unlock()
	for a.waiting[containerID] == nil {
		if ctx.Err() != nil {
			return fmt.Errorf("no WaitProcess for %s: %w", containerID, ctx.Err())
		}
		a.waitCond.Wait()
	}
	return nil
}

// Release ends the WaitProcess for containerID with exit status st; false if
// none is in progress.
func (a *Agent) Release(containerID string, st int32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	ch := a.waiting[containerID]
	if ch == nil {
		return false
	}
	ch <- st
	delete(a.waiting, containerID)
	return true
}

// countingListener counts the agent's connections.
type countingListener struct {
	net.Listener
	a *Agent
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.a.mu.Lock()
		l.a.conns++
		l.a.mu.Unlock()
	}
	return c, err
}

// Conns is how many connections reached the agent.
func (a *Agent) Conns() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conns
}

// Close stops the agent and ends every call in progress.
func (a *Agent) Close() error {
	select {
	case <-a.stopped:
		return nil
	default:
	}
	close(a.stopped)
	err := a.srv.Close()
	os.RemoveAll(a.dir)
	return err
}
