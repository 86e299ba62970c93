// Package cli holds what every caa command shares around its own work:
// the errors that pick the exit code, flag defaults read from the
// environment, the structured logger the flags ask for, and the
// apiserver client.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// UsageError marks an error that is the caller's to fix in the command
// line; caa exits 2 for it.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// LoggedError is a failure a daemon has already logged in its own format
// (--log-format): main prints nothing more, only exits non-zero.
type LoggedError struct{ Err error }

func (e LoggedError) Error() string { return e.Err.Error() }
func (e LoggedError) Unwrap() error { return e.Err }

// EnvOr is the environment variable key, or def when it is unset or empty.
func EnvOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// EnvDuration is key parsed as a duration, or def.
func EnvDuration(key string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(key)); err == nil {
		return d
	}
	return def
}

// EnvFloat is key parsed as a number, or def.
func EnvFloat(key string, def float64) float64 {
	if n, err := strconv.ParseFloat(os.Getenv(key), 64); err == nil {
		return n
	}
	return def
}

// EnvInt is key parsed as a whole number, or def.
func EnvInt(key string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(key)); err == nil {
		return n
	}
	return def
}

// JoinLine joins errors into one line, so a usage error is one line on
// stderr like every other failure; nil when there are none.
func JoinLine(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}

// NewLogger is the logger --log-format and --log-level ask for, writing
// to w; an error names the flag and its choices.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: readableDurations}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// readableDurations writes durations as "1.5s", not integer nanoseconds
// (what slog's JSON handler does by default).
func readableDurations(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// RestConfig is the apiserver client configuration: from the kubeconfig
// file when one is given, else the pod's in-cluster service account.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

// KubeClient is the apiserver client of a caa command: userAgent names
// it, and qps (burst twice that) is its client-side request rate.
func KubeClient(kubeconfig, userAgent string, qps float64) (kubernetes.Interface, error) {
	cfg, err := RestConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config (set --kubeconfig outside a cluster): %w", err)
	}
	cfg.UserAgent = userAgent
	// Protobuf, as the kubelet speaks: decoding a node's pods (thousands,
	// on a busy node) costs a fraction of the CPU and garbage of JSON.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.QPS, cfg.Burst = float32(qps), int(2*qps)
	return kubernetes.NewForConfig(cfg)
}

// RouteKlog sends client-go's klog lines through log, so that they come
// out in caa's format (one JSON object a line with --log-format json)
// instead of klog's own text in the middle of caa's log. klog's logger is
// the process's: only the binary's commands call this (their Options'
// KlogTo), once, before their first apiserver call.
func RouteKlog(log *slog.Logger) {
	klog.SetSlogLogger(log.With("source", "client-go"))
}
