package health

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func hello() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
}

// A unix: address serves on a socket file, owner-only, and needs no port.
func TestUnixAddressServesOnASocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "hl")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "health.sock")
	s, err := Listen(t.Context(), UnixPrefix+path, hello(), nil)
	require.NoError(t, err)
	serve(t, s)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	cl := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	resp, err := cl.Get("http://caa/readyz")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, "ok", string(b))

	_, err = Listen(t.Context(), UnixPrefix+path, hello(), nil)
	require.Error(t, err, "a socket another server answers on is not taken")
	_, err = Listen(t.Context(), UnixPrefix, hello(), nil)
	require.ErrorContains(t, err, "empty unix socket path")
}

// ListenWhenFree waits while another process holds the port (the old caa
// of a surge on the host network) and serves it once that one lets go; a
// bad address fails at once.
func TestListenWhenFreeWaitsForThePort(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := held.Addr().String()
	got := make(chan *Server, 1)
	go func() {
		s, err := ListenWhenFree(t.Context(), addr, hello(), nil, 10*time.Millisecond)
		assert.NoError(t, err)
		got <- s
	}()
	select {
	case <-got:
		t.Fatal("listened on a port another process holds")
	case <-time.After(100 * time.Millisecond): // several retries
	}
	require.NoError(t, held.Close())
	s := <-got
	require.NotNil(t, s)
	serve(t, s)
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	_, err = ListenWhenFree(t.Context(), "256.0.0.1:1", hello(), nil, 10*time.Millisecond)
	require.Error(t, err, "not a port in use: no retry")
	ctx, cancel := context.WithCancel(t.Context())
	held2, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held2.Close()
	cancel()
	_, err = ListenWhenFree(ctx, held2.Addr().String(), hello(), nil, 10*time.Millisecond)
	require.ErrorIs(t, err, context.Canceled)
}
