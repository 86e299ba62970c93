package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/health"
)

// `caa probe` is the exec probe of the remote hypervisor mode: it reads
// the daemon's health address from CAA_HEALTH_ADDR, as the daemon does,
// reaches a unix socket, and exits 0 only on a 2xx/3xx answer, saying
// why otherwise. `caa status` reaches the same socket.
func TestProbeAsksTheDaemonOverItsUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "pr")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	addr := health.UnixPrefix + filepath.Join(dir, "health.sock")
	var ready atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready: handed over to caa-new\n")
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"ready":true,"reason":""}`)
	})
	s, err := health.Listen(t.Context(), addr, mux, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	probe := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(t.Context(), append([]string{"probe"}, args...), &out, &errb)
		return code, errb.String()
	}
	t.Setenv("CAA_HEALTH_ADDR", addr)
	code, msg := probe("/readyz")
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, msg, "HTTP 503: not ready: handed over to caa-new")
	ready.Store(true)
	code, msg = probe("/readyz")
	assert.Equal(t, 0, code, msg)
	code, msg = probe("--addr", health.UnixPrefix+filepath.Join(dir, "none.sock"), "/readyz")
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, msg, "no caa daemon answers")
	code, msg = probe("--addr", health.UnixPrefix, "/readyz")
	assert.Equal(t, exitUsage, code, msg)

	var out, errb bytes.Buffer
	code = run(t.Context(), []string{"status", "--addr", addr, "-o", "json"}, &out, &errb)
	assert.Equal(t, 0, code, errb.String())
	assert.Contains(t, out.String(), `"ready": true`)
}
