package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMetricsAddrServesMetricsOnly (issue 42.10): as the remote hypervisor
// mode's DaemonSet runs it, health on a unix socket (CAA_HEALTH_ADDR) and
// scrapes on a TCP port of the node (--metrics-addr). The port serves
// /metrics and nothing else: /status (pod names, VM ids) and /readyz (what
// holds readiness) are only on the socket, where `caa status`, run in the
// container (kubectl exec), finds them through CAA_HEALTH_ADDR.
func TestMetricsAddrServesMetricsOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the built binary for seconds")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().String() // an apiserver away: caa waits, serving health
	require.NoError(t, l.Close())
	kubeconfig := writeKubeconfig(t, "http://"+dead)
	ledgerPath := shortPath(t)
	healthAddr := "unix:" + filepath.Join(filepath.Dir(ledgerPath), "health.sock")
	metricsAddr := freeAddr(t)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, caaBin, "run", "--node-name", "n", "--provider", "aws", "--cluster-id", "cluster-x",
		"--kubeconfig", kubeconfig, "--ledger", ledgerPath, "--metrics-addr", metricsAddr,
		"--aws-region", "us-east-1", "--aws-subnet-id", "subnet-1", "--aws-image", "ami-1", "--aws-instance-type", "m6a.large")
	cmd.Env = append(os.Environ(), "CAA_LEDGER=", "CAA_HEALTH_ADDR="+healthAddr)
	require.NoError(t, cmd.Start())
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + metricsAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool { c, _ := get("/metrics"); return c == http.StatusOK }, 20*time.Second, 50*time.Millisecond,
		"/metrics is served on --metrics-addr")
	_, body := get("/metrics")
	assert.Contains(t, body, "caa_")
	for _, p := range []string{"/status", "/readyz", "/healthz"} {
		code, body := get(p)
		assert.Equal(t, http.StatusNotFound, code, "%s on the node's port: %s", p, body)
	}

	st := exec.CommandContext(ctx, caaBin, "status", "-o", "json")
	st.Env = append(os.Environ(), "CAA_STATUS_ADDR=", "CAA_HEALTH_ADDR="+healthAddr)
	out, _ := st.Output() // not ready (the apiserver is away): exit 1, the status printed
	assert.Contains(t, string(out), `"ready": false`, "caa status reads /status on the health socket: %s", out)
	pr := exec.CommandContext(ctx, caaBin, "probe", "/healthz")
	pr.Env = append(os.Environ(), "CAA_HEALTH_ADDR="+healthAddr)
	require.NoError(t, pr.Run(), "the probes still answer on the socket")
}
