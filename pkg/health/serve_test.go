package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
)

// serve runs s in the background and returns a function that cancels it
// and returns what Serve returned.
func serve(t *testing.T, s *Server) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Serve did not return after its context was cancelled")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func TestServeShutsDownOnCancel(t *testing.T) {
	r := newRig(t, Config{})
	s, err := Listen(t.Context(), "127.0.0.1:0", Handler(r.status, r.reg), nil)
	require.NoError(t, err)
	addr := s.Addr().String()
	require.NotContains(t, addr, ":0", "the real port is reported")
	stop := serve(t, s)

	code, _, _ := get(t, "http://"+addr+"/healthz", "")
	assert.Equal(t, http.StatusOK, code)
	code, _, _ = get(t, "http://"+addr+"/metrics", "")
	assert.Equal(t, http.StatusOK, code)

	require.NoError(t, stop(), "a clean shutdown returns nil")
	_, err = net.DialTimeout("tcp", addr, time.Second)
	assert.Error(t, err, "the port is closed after shutdown")
}

func TestServeCutsSlowRequestsAtTheBound(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	slow := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
	})
	s, err := Listen(t.Context(), "127.0.0.1:0", slow, nil)
	require.NoError(t, err)
	s.ShutdownTimeout = 50 * time.Millisecond
	stop := serve(t, s)

	go func() {
		resp, err := http.Get("http://" + s.Addr().String() + "/")
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	err = stop()
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "within 50ms")
}

func TestServeErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()

	err = Serve(t.Context(), busy.Addr().String(), http.NotFoundHandler(), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "health: listen on "+busy.Addr().String())

	// A listener closed under the server: Serve reports it rather than
	// waiting for a cancel that may never come.
	s, err := Listen(t.Context(), "127.0.0.1:0", http.NotFoundHandler(), nil)
	require.NoError(t, err)
	require.NoError(t, s.ln.Close())
	err = s.Serve(t.Context())
	require.Error(t, err)
	assert.ErrorIs(t, err, net.ErrClosed)
}

func TestServeFunc(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	assert.NoError(t, Serve(ctx, "127.0.0.1:0", http.NotFoundHandler(), nil), "cancelled before it began: a clean stop")
}

// TestConcurrentUpdatesWhileServing is for -race: the reconciler's side
// writes from several goroutines while probes and scrapes read.
func TestConcurrentUpdatesWhileServing(t *testing.T) {
	r := newRig(t, Config{MaxListed: 5})
	s, err := Listen(t.Context(), "127.0.0.1:0", Handler(r.status, r.reg), nil)
	require.NoError(t, err)
	stop := serve(t, s)
	base := "http://" + s.Addr().String()

	const rounds = 50
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range rounds {
			r.status.Beat(r.clock.Add(time.Second))
			r.status.PassDone(Pass{At: r.clock.Now(), Duration: time.Millisecond, Pending: notes(i % 7), Failed: notes(i % 3),
				Actions: map[string]int{"Create": i % 7}, Records: map[ledger.Phase]int{ledger.PhaseRunning: i}})
		}
	})
	wg.Go(func() {
		for i := range rounds {
			r.status.SetBlocked(fmt.Sprint("blocked ", i%2))
			r.status.SetBlocked("")
		}
	})
	wg.Go(func() {
		for i := range rounds {
			r.m.ObserveCloudCall(OpGet, CloudResult(nil), time.Duration(i)*time.Millisecond)
			_ = r.status.Snapshot()
		}
	})
	for _, path := range []string{"/healthz", "/readyz", "/readyz?format=json", "/metrics"} {
		wg.Go(func() {
			for range rounds / 5 {
				// Not get: require must not stop the test from another goroutine.
				resp, err := http.Get(base + path)
				if !assert.NoError(t, err, path) {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.Contains(t, []int{http.StatusOK, http.StatusServiceUnavailable}, resp.StatusCode, path)
			}
		})
	}
	wg.Wait()
	require.NoError(t, stop(), "no request was in flight: a clean stop, even with unused connections open")

	snap := r.status.Snapshot()
	assert.Equal(t, rounds, snap.Passes)
	assert.Empty(t, snap.Blocked)
}

func TestAnUnusedConnectionDoesNotFailTheShutdown(t *testing.T) {
	s, err := Listen(t.Context(), "127.0.0.1:0", http.NotFoundHandler(), nil)
	require.NoError(t, err)
	s.ShutdownTimeout = 100 * time.Millisecond
	stop := serve(t, s)
	conn, err := net.Dial("tcp", s.Addr().String()) // connected, never a request
	require.NoError(t, err)
	defer conn.Close()
	require.Eventually(t, func() bool { // the server has accepted it
		_ = conn.SetReadDeadline(time.Now().Add(time.Millisecond))
		_, err := conn.Read(make([]byte, 1))
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout()
	}, 5*time.Second, 10*time.Millisecond)
	assert.NoError(t, stop(), "no request was cut")
}
