package relayd_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/relayd"
	"github.com/caa-project/caa/pkg/relayd/relaydtest"
)

// unixGet fetches path from an HTTP server on a unix socket.
func unixGet(ctx context.Context, sock, path string) (int, string, error) {
	var d net.Dialer
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", sock) }}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://relay"+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// sample reads one sample of a family from a /metrics body; labels are
// name=value pairs the sample must carry.
func sample(t *testing.T, body, name string, labels ...string) float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err)
	f, ok := fams[name]
	require.True(t, ok, "%s missing from /metrics", name)
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			match = match && got[labels[i]] == labels[i+1]
		}
		if match {
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("%s%v missing from /metrics", name, labels)
	return 0
}

// TestRelayHealthAndMetrics runs `caa relay` (Run) with a health socket:
// /healthz answers at once, /readyz says 503 and why until caa's client
// file is there, then 200; /metrics counts the served sockets, the shims'
// connections relayed and failed, and the control requests by result.
func TestRelayHealthAndMetrics(t *testing.T) {
	dir, err := os.MkdirTemp("", "rh") // unix socket paths are capped at 108 bytes
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctl, hsock := filepath.Join(dir, "relay.sock"), filepath.Join(dir, "health.sock")
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	o := relayd.NewOptions("test")
	o.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--socket", ctl, "--health-addr", "unix:" + hsock, "--refresh", "50ms"}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() { done <- relayd.Run(runCtx, o, &logs) }()
	defer func() { stop(); <-done }()

	poll := func(path string, want int) string {
		t.Helper()
		var code int
		var body string
		require.Eventually(t, func() bool {
			code, body, err = unixGet(ctx, hsock, path)
			return err == nil && code == want
		}, 20*time.Second, 10*time.Millisecond, "%s: want %d, last %d %q (%v)", path, want, code, body, err)
		return body
	}
	poll("/healthz", http.StatusOK)
	assert.Contains(t, poll("/readyz", http.StatusServiceUnavailable), "waiting for caa's client file")
	assert.Equal(t, 0.0, sample(t, poll("/metrics", http.StatusOK), "caa_relay_ready"))

	ca, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	require.NoError(t, relayd.WriteClientFile(dir, ca))
	poll("/readyz", http.StatusOK)
	client := &relayd.Client{Socket: ctl}
	require.Eventually(t, func() bool { _, _, err := client.List(ctx); return err == nil }, 20*time.Second, 10*time.Millisecond)

	fw := relaydtest.StartForwarder(t, ca, "podvm-a")
	sock := filepath.Join(dir, "pods", "sb1", "agent.ttrpc")
	_, err = client.Serve(ctx, "sb1", sock, fw.Addr(), "podvm-a")
	require.NoError(t, err)
	require.NoError(t, client.Reach(ctx, "sb1"))
	_, err = agentproto.Check(ctx, shim(t, sock))
	require.NoError(t, err)
	_, err = client.Do(ctx, relayd.Request{Op: "reach", Sandbox: "nope"})
	require.Error(t, err)

	m := poll("/metrics", http.StatusOK)
	assert.Equal(t, 1.0, sample(t, m, "caa_relay_ready"))
	assert.Equal(t, 1.0, sample(t, m, "caa_relay_sockets"))
	assert.Equal(t, 1.0, sample(t, m, "caa_relay_connections_open"))
	assert.Equal(t, 1.0, sample(t, m, "caa_relay_connections_total", "result", "relayed"))
	assert.Equal(t, 0.0, sample(t, m, "caa_relay_connections_total", "result", "failed"))
	assert.Equal(t, 1.0, sample(t, m, "caa_relay_control_requests_total", "op", "reach", "result", "error"))
	assert.GreaterOrEqual(t, sample(t, m, "caa_relay_control_requests_total", "op", "serve", "result", "ok"), 1.0)
	assert.Positive(t, sample(t, m, "go_goroutines"))

	// Stopping the socket keeps its counts (a counter never goes down).
	require.NoError(t, client.Stop(ctx, "sb1"))
	m = poll("/metrics", http.StatusOK)
	assert.Equal(t, 0.0, sample(t, m, "caa_relay_sockets"))
	assert.Equal(t, 0.0, sample(t, m, "caa_relay_connections_open"))
	assert.Equal(t, 1.0, sample(t, m, "caa_relay_connections_total", "result", "relayed"), "kept after the socket stopped")
	assert.NotContains(t, m, "sb1", "no sandbox id in a series")
}

// TestRelayCountsFailedConnections: a shim connection whose VM does not
// answer is counted failed, and the counts stay once the socket stops.
func TestRelayCountsFailedConnections(t *testing.T) {
	d := startDaemon(t) // a 2 s dial bound
	reg := prometheus.NewRegistry()
	reg.MustRegister(d.srv.Collector())
	ctx := ctxT(t)
	fw := relaydtest.StartForwarder(t, d.ca, "podvm-a")
	sock := d.sock("sb1")
	_, err := d.client.Serve(ctx, "sb1", sock, fw.Addr(), "podvm-a")
	require.NoError(t, err)
	fw.Close()
	c, err := net.Dial("unix", sock)
	require.NoError(t, err)
	_, _ = c.Read(make([]byte, 1)) // closed by the relay once its dial gives up
	c.Close()
	failed := func() float64 {
		return testutil.ToFloat64(prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
			mc := make(chan prometheus.Metric, 64)
			d.srv.Collector().Collect(mc)
			close(mc)
			for m := range mc {
				if strings.Contains(m.Desc().String(), "caa_relay_connections_total") {
					var pb dto.Metric
					_ = m.Write(&pb)
					if pb.GetLabel()[0].GetValue() == "failed" {
						ch <- m
					}
				}
			}
		}))
	}
	require.Eventually(t, func() bool { return failed() == 1 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, d.client.Stop(ctx, "sb1"))
	assert.Equal(t, 1.0, failed(), "kept after the socket stopped")
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems, "names and help follow Prometheus conventions")
}

// TestRelayHealthFlagsChecked: one address for both endpoints is refused
// by name.
func TestRelayHealthFlagsChecked(t *testing.T) {
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	o := relayd.NewOptions("test")
	o.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--health-addr", ":8001", "--metrics-addr", ":8001"}))
	err := relayd.Run(context.Background(), o, io.Discard)
	require.ErrorContains(t, err, "--metrics-addr")
}
