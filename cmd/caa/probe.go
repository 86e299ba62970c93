package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/health"
)

// newProbeCommand is the kubelet's exec probe: it asks the daemon of this
// container for one health path, over the same address the daemon serves
// (CAA_HEALTH_ADDR, a unix socket in the remote hypervisor mode, where a
// host port would clash between the two caa pods of a surge).
func newProbeCommand() *cobra.Command {
	var addr string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "probe PATH",
		Short: "Exit 0 when the daemon answers PATH (/readyz, /healthz) with 2xx or 3xx: an exec probe",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			code, body, err := healthGet(cmd.Context(), addr, args[0], timeout)
			if err != nil {
				return err
			}
			if code < 200 || code >= 400 {
				return exitError{msg: fmt.Sprintf("%s answered HTTP %d: %s", args[0], code, firstLine(body)), code: exitFailure}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", cli.EnvOr("CAA_HEALTH_ADDR", ":8000"), "the daemon's health address, host:port or unix:PATH (env CAA_HEALTH_ADDR, as the daemon reads it)")
	cmd.Flags().DurationVar(&timeout, "timeout", 4*time.Second, "how long to wait for the answer")
	return cmd
}

// healthGet fetches path from the daemon at addr: "host:port", a URL, or
// "unix:PATH".
func healthGet(ctx context.Context, addr, path string, timeout time.Duration) (int, string, error) {
	base, client, err := healthClient(addr)
	if err != nil {
		return 0, "", cli.UsageError{Err: err}
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return 0, "", cli.UsageError{Err: fmt.Errorf("--addr %q: %w", addr, err)}
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("no caa daemon answers at %s: %w", addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b), nil
}

// healthClient returns the base URL and client for a health address.
func healthClient(addr string) (string, *http.Client, error) {
	if path, ok := strings.CutPrefix(addr, health.UnixPrefix); ok {
		if path == "" {
			return "", nil, fmt.Errorf("--addr %q: no socket path after %q", addr, health.UnixPrefix)
		}
		var d net.Dialer
		tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}}
		return "http://caa", &http.Client{Transport: tr}, nil
	}
	if !strings.Contains(addr, "://") {
		if strings.HasPrefix(addr, ":") {
			addr = "127.0.0.1" + addr
		}
		addr = "http://" + addr
	}
	return strings.TrimSuffix(addr, "/"), http.DefaultClient, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
