package hypervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/hypervisor/hypervisorpb"
	"github.com/caa-project/caa/pkg/sandbox"
)

// seenCalls records what the service reports of each call.
type seenCalls struct {
	mu    sync.Mutex
	calls []string
}

func (s *seenCalls) ObserveHypervisorCall(method, code string, took time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if took < 0 {
		code += " (negative duration)"
	}
	s.calls = append(s.calls, method+" "+code)
}

func (s *seenCalls) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// TestEveryAnsweredCallIsObserved: each call the shim makes is reported
// once with its method and the status code the shim got back.
func TestEveryAnsweredCallIsObserved(t *testing.T) {
	dir, err := os.MkdirTemp("", "hv")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	lc := &fakeLifecycle{}
	obs := &seenCalls{}
	sock, err := ListenSocket(filepath.Join(dir, "hypervisor.sock"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- sock.Serve(ctx, &Service{Sandboxes: lc, CaaVersion: "caa-test", Calls: obs}, time.Second)
	}()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
		assert.NoError(t, sock.Close())
	})
	sh := shim{filepath.Join(dir, "hypervisor.sock")}
	id := fmt.Sprintf("%064x", 7)
	call := func(f func(c hypervisorpb.HypervisorService) error) error {
		c, closeClient := sh.client(t)
		defer closeClient()
		return f(c)
	}
	bg := context.Background()
	require.NoError(t, call(func(c hypervisorpb.HypervisorService) error {
		_, err := c.Version(bg, &hypervisorpb.VersionRequest{})
		return err
	}))
	require.NoError(t, call(func(c hypervisorpb.HypervisorService) error {
		_, err := c.CreateVM(bg, &hypervisorpb.CreateVMRequest{Id: id})
		return err
	}))
	require.NoError(t, call(func(c hypervisorpb.HypervisorService) error {
		_, err := c.StartVM(bg, &hypervisorpb.StartVMRequest{Id: id})
		return err
	}))
	lc.mu.Lock()
	lc.err = fmt.Errorf("%w: sandbox %s", sandbox.ErrUnknownSandbox, id)
	lc.mu.Unlock()
	require.Error(t, call(func(c hypervisorpb.HypervisorService) error {
		_, err := c.StopVM(bg, &hypervisorpb.StopVMRequest{Id: id})
		return err
	}))
	require.Error(t, call(func(c hypervisorpb.HypervisorService) error {
		_, err := c.StartVM(bg, &hypervisorpb.StartVMRequest{Id: id})
		return err
	}))
	assert.Equal(t, []string{"Version OK", "CreateVM OK", "StartVM OK", "StopVM NotFound", "StartVM NotFound"}, obs.seen())
}
