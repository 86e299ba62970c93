package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunWithNoFlagsIsOneLine: every problem of the command line, on one
// line with the caa: prefix, exit 2.
func TestRunWithNoFlagsIsOneLine(t *testing.T) {
	r := caa(t, "run")
	oneLineError(t, r, exitUsage, "--node-name is empty", "--provider")
}

// TestDaemonErrorsFollowTheLogFormat: a failure before the ledger opens is
// logged once, in JSON when asked, and not printed again as plain text.
func TestDaemonErrorsFollowTheLogFormat(t *testing.T) {
	r := caa(t, "run", "--node-name", "n", "--provider", "aws", "--log-format", "json",
		"--kubeconfig", filepath.Join(t.TempDir(), "missing"), "--health-addr", "127.0.0.1:0", "--ledger", shortPath(t))
	assert.Equal(t, exitFailure, r.code)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	last := lines[len(lines)-1]
	var entry map[string]any
	require.NoError(t, json.Unmarshal([]byte(last), &entry), "the failure is a JSON line: %q", last)
	assert.Equal(t, "ERROR", entry["level"])
	assert.Contains(t, entry["err"], "--kubeconfig")
	assert.NotContains(t, r.stderr, "\ncaa: ", "not printed twice")
	for _, l := range lines {
		assert.True(t, json.Valid([]byte(l)), "every line is JSON: %q", l)
	}
}

// TestApiserverAwayAtStart: caa serves /healthz (200) and /readyz (503
// with the reason) at once, keeps retrying instead of exiting, creates no
// ledger file while it cannot check the Node, and exits cleanly on SIGTERM.
func TestApiserverAwayAtStart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the built binary for seconds")
	}
	// An apiserver address that refuses connections.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().String()
	require.NoError(t, l.Close())
	kubeconfig := writeKubeconfig(t, "http://"+dead)
	ledgerPath := shortPath(t)
	healthAddr := freeAddr(t)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, caaBin, "run", "--node-name", "n", "--provider", "aws", "--cluster-id", "cluster-x",
		"--kubeconfig", kubeconfig, "--ledger", ledgerPath, "--health-addr", healthAddr,
		"--aws-region", "us-east-1", "--aws-subnet-id", "subnet-1", "--aws-image", "ami-1", "--aws-instance-type", "m6a.large")
	cmd.Env = append(os.Environ(), "CAA_LEDGER=")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	logs := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs <- sc.Text()
		}
		close(logs)
	}()

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + healthAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool { c, _ := get("/healthz"); return c == http.StatusOK }, 20*time.Second, 50*time.Millisecond,
		"/healthz is served while the apiserver is away")
	code, body := get("/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "Kubernetes API")

	// It keeps retrying (several attempts logged) rather than exiting.
	attempts := 0
	deadline := time.After(20 * time.Second)
	for attempts < 3 {
		select {
		case line, ok := <-logs:
			require.True(t, ok, "caa exited while the apiserver was away")
			if strings.Contains(line, "retrying") {
				attempts++
			}
		case <-deadline:
			t.Fatalf("only %d retries logged", attempts)
		}
	}
	_, err = os.Stat(ledgerPath)
	assert.ErrorIs(t, err, os.ErrNotExist, "no ledger file before the Node check")
	code, _ = get("/healthz")
	assert.Equal(t, http.StatusOK, code, "alive while retrying")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "a clean exit on SIGTERM")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// TestClientGoLogsInCaasFormat: what client-go logs (here the apiserver's
// Warning header, which client-go writes through klog) comes out as one of
// caa's JSON lines, not as klog's text among them.
func TestClientGoLogsInCaasFormat(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Warning", `299 - "test-warning-from-apiserver"`)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"not yet","code":503}`)
	}))
	defer api.Close()
	kubeconfig := writeKubeconfig(t, api.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, caaBin, "run", "--node-name", "n", "--provider", "aws", "--cluster-id", "cluster-x",
		"--kubeconfig", kubeconfig, "--ledger", shortPath(t), "--health-addr", "127.0.0.1:0", "--log-format", "json",
		"--aws-region", "us-east-1", "--aws-subnet-id", "subnet-1", "--aws-image", "ami-1", "--aws-instance-type", "m6a.large")
	cmd.Env = append(os.Environ(), "CAA_LEDGER=")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "test-warning-from-apiserver") {
			continue
		}
		var entry map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &entry), "client-go's line is one of caa's JSON lines: %q", line)
		assert.Equal(t, "client-go", entry["source"])
		assert.Equal(t, "n", entry["node"], "with caa's own attributes")
		return
	}
	t.Fatalf("caa exited or closed stderr before client-go logged the apiserver's warning (ctx: %v)", ctx.Err())
}

// writeKubeconfig writes a kubeconfig for an apiserver at server, with no
// credentials, and returns its path.
func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`, server)), 0o600))
	return path
}
