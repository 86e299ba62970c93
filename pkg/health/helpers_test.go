package health

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
)

// fakeClock is the injected clock: tests move time, never sleep.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// rig is a Status with metrics on a fresh registry, served by httptest.
type rig struct {
	clock  *fakeClock
	reg    *prometheus.Registry
	m      *Metrics
	status *Status
	srv    *httptest.Server
}

func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	r := &rig{clock: newClock(), reg: prometheus.NewRegistry()}
	m, err := NewMetrics(r.reg)
	require.NoError(t, err)
	r.m = m
	cfg.Metrics, cfg.Now = m, r.clock.Now
	r.status = NewStatus(cfg)
	r.srv = httptest.NewServer(Handler(r.status, r.reg))
	t.Cleanup(r.srv.Close)
	return r
}

// get fetches path with an optional Accept header and returns the status
// code, the content type and the body.
func (r *rig) get(t *testing.T, path, accept string) (int, string, string) {
	t.Helper()
	return get(t, r.srv.URL+path, accept)
}

func get(t *testing.T, url, accept string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
}

func note(pod, reason, msg string) PodNote {
	return PodNote{UID: "uid-" + pod, Pod: pod, Reason: reason, Message: msg}
}

// notes makes n pending pods named default/p00, default/p01, ...
func notes(n int) []PodNote {
	out := make([]PodNote, n)
	for i := range out {
		out[i] = note(fmt.Sprintf("default/p%02d", i), "Creating", "creating VM")
	}
	return out
}

func converged(at time.Time, running int) Pass {
	return Pass{At: at, Duration: time.Second, Actions: map[string]int{"None": running},
		Records: map[ledger.Phase]int{ledger.PhaseRunning: running}}
}

var errList = errors.New("aws list: RequestTimeout")
