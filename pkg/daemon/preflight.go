package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"log/slog"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/ledger/ledgerapi"
	"github.com/caa-project/caa/pkg/provider"
)

// The preflight and the warm restart.
//
// A passed preflight is remembered in the ledger's meta as a fingerprint
// of what it checked: the cloud's settings (every --<provider>-* flag) and
// the credential route and identity (the environment the cloud's SDK
// reads). At the next start, when the fingerprint is unchanged, the
// preflight leaves the path to ready and runs again once caa is ready (a
// warm restart, the usual rolling update); a failure it finds then is
// reported as a blocking one would be (readiness reason, Node event, log).
// When the fingerprint changed, or none is recorded, the preflight passes
// before the ledger is asked for, so no cloud write is ever made with
// settings whose preflight has not passed once.

// preflightRecheckAfter bounds the wait for readiness before a warm
// restart's re-check runs anyway: a node whose startup pass waits for a
// slow boot still gets its settings checked.
const preflightRecheckAfter = time.Minute

// preflightFingerprint digests what the preflight of f's cloud checks.
// environ is os.Environ's form; readFile reads the files whose content is
// the identity (an API key file). The result is one SHA-256 digest; the
// secrets that go into it are digested first, and the ones that rotate
// without a change of identity (session tokens, client secrets) count only
// as set or not.
func preflightFingerprint(providerName string, fs *pflag.FlagSet, environ []string, readFile func(string) ([]byte, error)) string {
	h := sha256.New()
	field := func(k, v string) { fmt.Fprintf(h, "%s=%q\n", k, v) }
	field("provider", providerName)
	if fs != nil {
		prefix := providerName + "-"
		fs.VisitAll(func(fl *pflag.Flag) { // in name order
			if !strings.HasPrefix(fl.Name, prefix) {
				return
			}
			v := fl.Value.String()
			field("--"+fl.Name, v)
			if strings.HasSuffix(fl.Name, "-api-key-file") && v != "" {
				if b, err := readFile(v); err == nil {
					field("--"+fl.Name+" content", digest(strings.TrimSpace(string(b))))
				} else {
					field("--"+fl.Name+" content", "unreadable")
				}
			}
		})
	}
	env := slices.Clone(environ)
	slices.Sort(env)
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if v == "" || !credentialEnv(providerName, k) {
			continue
		}
		switch {
		case rotatingSecret(k):
			field("env "+k, "set")
		case strings.HasSuffix(k, "API_KEY") || strings.HasSuffix(k, "APIKEY"):
			field("env "+k, digest(strings.TrimSpace(v)))
		default:
			field("env "+k, v)
		}
	}
	return "sha256:" + hexSum(h)
}

// credentialEnv reports whether the environment variable k steers the
// cloud SDK's credentials, region or endpoints for providerName.
func credentialEnv(providerName, k string) bool {
	var prefixes []string
	switch providerName {
	case "aws":
		prefixes = []string{"AWS_"}
	case "azure":
		prefixes = []string{"AZURE_", "IDENTITY_ENDPOINT", "IDENTITY_HEADER", "MSI_ENDPOINT", "IMDS_ENDPOINT"}
	case "ibmcloud":
		prefixes = []string{"IBMCLOUD_", "VPC_"}
	}
	for _, p := range prefixes {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// rotatingSecret: a secret that changes without the identity changing (a
// session token every hour, a client secret at rotation).
func rotatingSecret(k string) bool {
	for _, s := range []string{"SECRET", "PASSWORD", "TOKEN", "IDENTITY_HEADER"} {
		if strings.Contains(k, s) && !strings.HasSuffix(k, "_FILE") && !strings.HasSuffix(k, "_FILENAME") {
			return true
		}
	}
	return false
}

func digest(s string) string {
	h := sha256.New()
	h.Write([]byte(s))
	return hexSum(h)
}

func hexSum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

// recordedPreflight is the fingerprint of the last passed preflight in the
// ledger at path, read from the caa that holds it (over its socket) or
// from the file; "" when neither answers within timeout, when there is no
// ledger yet, or when the ledger is not this node's, cluster's and the
// Node's (the open that follows refuses those with the reason).
func recordedPreflight(ctx context.Context, path, node, cluster, nodeLedger string, timeout time.Duration) string {
	return readRecordedMeta(ctx, path, timeout).preflight(node, cluster, nodeLedger)
}

// recordedMeta is the ledger's meta as a start finds it before it asks
// for the ledger; ok is false when there is none to read.
type recordedMeta struct {
	m  ledger.Meta
	ok bool
}

// readRecordedMeta reads the meta of the ledger at path, from its holder's
// socket or the file, within timeout. A start reads it while it asks the
// apiserver for the cluster and Node (it needs neither to read, only to
// judge what it read).
func readRecordedMeta(ctx context.Context, path string, timeout time.Duration) recordedMeta {
	if _, err := os.Stat(path); err != nil {
		return recordedMeta{}
	}
	r, err := ledgerapi.Open(ctx, path, timeout)
	if err != nil {
		return recordedMeta{}
	}
	defer func() { _ = r.Close() }()
	m, err := r.Meta(ctx)
	if err != nil {
		return recordedMeta{}
	}
	return recordedMeta{m: m, ok: true}
}

// preflight is the recorded fingerprint when the ledger is this node's,
// cluster's and the Node's, else "".
func (r recordedMeta) preflight(node, cluster, nodeLedger string) string {
	if !r.ok || r.m.Node != node || r.m.Cluster != cluster || (nodeLedger != "" && r.m.ID != nodeLedger) {
		return ""
	}
	return r.m.Preflight
}

// preflightRun is one way of running the provider's preflight until it
// passes: before the ledger is asked for (blocking), or after ready.
type preflightRun struct {
	log *slog.Logger
	p   provider.Provider
	// reason sets, or clears with "", the readiness reason.
	reason func(string)
	// event reports a failure as a Warning event on the Node.
	event func(reason string)
	// after: the re-check of a warm restart, which pods do not wait for.
	after bool
	// count counts a run and its result (nil: not counted).
	count func(passed bool)
}

// untilPassed runs the provider's side-effect-free startup checks, when it
// has them, until they pass or ctx is done. Each distinct failure is one
// log line at ERROR, one Warning event on the Node, and the readiness
// reason, so a missing permission or a wrong resource id is named; the
// checks are retried from 5s to 5 min apart, since an operator fixes a
// permission without restarting caa.
func (r preflightRun) untilPassed(ctx context.Context, first string) error {
	pf, ok := r.p.(provider.Preflighter)
	if !ok {
		return nil
	}
	if first != "" {
		r.reason(first)
	}
	backoff, last := 5*time.Second, ""
	for {
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := pf.Preflight(callCtx)
		cancel()
		if r.count != nil && (err == nil || ctx.Err() == nil) {
			r.count(err == nil)
		}
		if err == nil {
			if last != "" {
				r.reason("")
				r.log.Info("cloud preflight passed", "provider", r.p.Name())
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		reason := "cloud preflight failed: " + err.Error()
		r.reason(reason)
		if reason != last {
			msg := "cloud preflight failed; no pod is touched until it passes"
			if r.after {
				msg = "cloud preflight failed on settings that passed it before; caa stays not ready until it passes"
			}
			r.log.Error(msg, "provider", r.p.Name(), "retryIn", backoff, "err", err)
			r.event(reason)
			last = reason
		}
		if err := sleepCtx(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, 5*time.Minute)
	}
}

// recheck is a warm restart's preflight: it waits for readiness (at most
// preflightRecheckAfter), then runs the checks until they pass, holding
// readiness with the reason while they fail.
func (r preflightRun) recheck(ctx context.Context, status *health.Status) {
	t := time.NewTimer(preflightRecheckAfter)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-status.Readied():
	case <-t.C:
	}
	start := time.Now()
	if err := r.untilPassed(ctx, ""); err == nil {
		r.log.Info("cloud preflight checked again after the start: passed", "provider", r.p.Name(),
			"took", time.Since(start).Round(time.Millisecond))
	}
}

// recordedPreflightTimeout bounds the read of the recorded fingerprint: a
// ledger held by a process that does not answer is a cold start.
const recordedPreflightTimeout = 500 * time.Millisecond

// preflightGate decides how this start runs the preflight, whose current
// fingerprint is fp, and returns the fingerprint to record in the ledger's
// meta once it has passed (at the ledger's open): on a warm restart it starts the re-check in the
// background and returns at once; otherwise it returns when the preflight
// passed, or ctx is done.
func preflightGate(ctx context.Context, f *Options, log *slog.Logger, status *health.Status, p provider.Provider,
	clusterID, nodeLedger string, recorded recordedMeta, fp string, event func(string), serve func(string, func() error)) (string, error) {
	run := preflightRun{log: log, p: p, event: event, count: status.CountPreflight}
	if recorded.preflight(f.node, clusterID, nodeLedger) == fp {
		log.Info("cloud settings unchanged since the last passed preflight: it runs again once ready, off the path to ready",
			"fingerprint", fp)
		run.reason, run.after = status.SetPreflight, true
		serve("cloud preflight re-check", func() error { run.recheck(ctx, status); return nil })
		return fp, nil
	}
	run.reason = status.SetBlocked
	if err := run.untilPassed(ctx, "starting: checking the cloud's credentials and settings (preflight)"); err != nil {
		return "", err
	}
	return fp, nil
}

// profileToReady writes a CPU profile of the start, up to the first
// moment of readiness (or the returned stop), to path: a development aid
// for the time to ready (env CAA_CPU_PROFILE_TO_READY; read with `go tool
// pprof`).
func profileToReady(path string, status *health.Status, log *slog.Logger) (stop func()) {
	f, err := os.Create(path)
	if err != nil {
		log.Warn("no CPU profile", "err", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		log.Warn("no CPU profile", "err", err)
		return func() {}
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			_ = f.Close()
			log.Info("CPU profile to ready written", "file", path)
		})
	}
	go func() { <-status.Readied(); stop() }()
	return stop
}
