package health

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProfileHandlerServesHeapProfile(t *testing.T) {
	srv := httptest.NewServer(ProfileHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/debug/pprof/heap?gc=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.NotEmpty(t, body, "a heap profile (gzipped protobuf)")
	// The health endpoints are not on the profile mux, nor the profiles on
	// the health mux.
	resp2, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	resp2.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp2.StatusCode)
}

func TestHealthHandlerServesNoProfiles(t *testing.T) {
	srv := httptest.NewServer(Handler(NewStatus(Config{}), nil))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/debug/pprof/heap")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

func TestCheckProfileAddr(t *testing.T) {
	for addr, want := range map[string]bool{"": true, "127.0.0.1:6060": true, "localhost:6060": true, "[::1]:6060": true, ":6060": false, "10.0.0.1:6060": false} {
		lo, err := CheckProfileAddr(addr)
		require.NoError(t, err, addr)
		assert.Equal(t, want, lo, addr)
	}
	_, err := CheckProfileAddr("6060")
	require.ErrorContains(t, err, "--pprof-addr")
}
