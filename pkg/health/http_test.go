package health

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
)

// TestReadyzTransitions walks one daemon's life through /readyz, in text
// and in JSON, step by step (invariant I5).
func TestReadyzTransitions(t *testing.T) {
	r := newRig(t, Config{})
	pending := []PodNote{note("default/b", "Creating", "VM booting"), note("default/a", "Creating", "creating VM")}
	failed := []PodNote{note("default/c", "InvalidSpec", "unknown instance type t9.huge")}

	steps := []struct {
		name     string
		do       func(now time.Time)
		wantCode int
		wantText []string // lines or fragments the text body must hold
		notText  []string
		check    func(t *testing.T, rd Readiness)
	}{{
		name:     "before the startup pass",
		do:       func(time.Time) {},
		wantCode: http.StatusServiceUnavailable,
		wantText: []string{"not ready: the startup pass has not finished\n"},
		check: func(t *testing.T, rd Readiness) {
			assert.False(t, rd.Ready)
			assert.False(t, rd.Converged)
			assert.Empty(t, rd.Pending)
		},
	}, {
		name: "startup pass with pods pending and one failed",
		do: func(now time.Time) {
			r.status.PassDone(Pass{At: now, Pending: pending, Failed: failed})
		},
		wantCode: http.StatusServiceUnavailable,
		wantText: []string{
			"not ready: the startup pass has not converged: 2 pods pending\n",
			"pending: 2 (readiness waits for them: the startup pass has not converged)\n  default/a: Creating: creating VM\n  default/b: Creating: VM booting\n",
			"failed: 1 (never holds readiness back: a bad spec is its pod's to fix)\n  default/c: InvalidSpec: unknown instance type t9.huge\n",
		},
		check: func(t *testing.T, rd Readiness) {
			assert.Equal(t, 2, rd.PendingTotal)
			assert.Equal(t, []PodNote{pending[1], pending[0]}, rd.Pending, "sorted by pod")
			assert.Equal(t, failed, rd.Failed)
		},
	}, {
		name:     "a pass that ended early proves nothing",
		do:       func(now time.Time) { r.status.PassDone(Pass{At: now, Err: errList, Pending: pending[:1]}) },
		wantCode: http.StatusServiceUnavailable,
		wantText: []string{"not ready: the last pass ended early: aws list: RequestTimeout\n", "pending: 1 (readiness waits for them"},
	}, {
		name:     "converged, a failed pod does not block",
		do:       func(now time.Time) { p := converged(now, 2); p.Failed = failed; r.status.PassDone(p) },
		wantCode: http.StatusOK,
		wantText: []string{"ready: 2 running, 0 pending, 1 failed\n", "failed: 1 (never holds readiness back"},
		notText:  []string{"not ready", "pending:"},
		check: func(t *testing.T, rd Readiness) {
			assert.True(t, rd.Ready)
			assert.Empty(t, rd.Reason)
			assert.Equal(t, 2, rd.Records[ledger.PhaseRunning])
		},
	}, {
		name: "a later pass with new pods pending stays ready",
		do: func(now time.Time) {
			r.status.PassDone(Pass{At: now, Pending: []PodNote{note("default/d", "Creating", "creating VM")}})
		},
		wantCode: http.StatusOK,
		wantText: []string{"ready: 2 running, 1 pending, 0 failed\n", "pending: 1 (not holding readiness back: the startup pass has converged)\n  default/d: Creating: creating VM\n"},
	}, {
		name:     "a later pass that ended early stays ready",
		do:       func(now time.Time) { r.status.PassDone(Pass{At: now, Err: errList}) },
		wantCode: http.StatusOK,
	}, {
		name: "a pass blocked by the daemon's credentials",
		do: func(now time.Time) {
			r.status.PassDone(Pass{At: now, Err: errList, Blocked: "cloud credentials rejected: aws create: not authorized"})
		},
		wantCode: http.StatusServiceUnavailable,
		wantText: []string{"not ready: cloud credentials rejected: aws create: not authorized\n"},
		notText:  []string{"blocked:"}, // said once, on the first line
		check: func(t *testing.T, rd Readiness) {
			assert.True(t, rd.Converged, "convergence stays latched")
			assert.Equal(t, "cloud credentials rejected: aws create: not authorized", rd.Blocked)
		},
	}, {
		name:     "the next clean pass clears a pass's reason",
		do:       func(now time.Time) { r.status.PassDone(converged(now, 3)) },
		wantCode: http.StatusOK,
		wantText: []string{"ready: 3 running, 0 pending, 0 failed\n"},
	}, {
		name:     "a reason set outside a pass blocks",
		do:       func(time.Time) { r.status.SetBlocked("ledger: fsync: input/output error") },
		wantCode: http.StatusServiceUnavailable,
		wantText: []string{"not ready: ledger: fsync: input/output error\n"},
	}, {
		name:     "and a clean pass does not clear it",
		do:       func(now time.Time) { r.status.PassDone(converged(now, 3)) },
		wantCode: http.StatusServiceUnavailable,
	}, {
		name:     "until its owner does",
		do:       func(time.Time) { r.status.SetBlocked("") },
		wantCode: http.StatusOK,
	}}

	for _, st := range steps {
		st.do(r.clock.Add(10 * time.Second))
		t.Run(st.name, func(t *testing.T) {
			code, ctype, text := r.get(t, "/readyz", "")
			assert.Equal(t, st.wantCode, code)
			assert.Equal(t, "text/plain; charset=utf-8", ctype)
			for _, w := range st.wantText {
				assert.Contains(t, text, w)
			}
			for _, w := range st.notText {
				assert.NotContains(t, text, w)
			}

			code, ctype, body := r.get(t, "/readyz?format=json", "")
			assert.Equal(t, st.wantCode, code)
			assert.Equal(t, "application/json", ctype)
			var rd Readiness
			require.NoError(t, json.Unmarshal([]byte(body), &rd))
			assert.Equal(t, st.wantCode == http.StatusOK, rd.Ready)
			assert.Equal(t, rd.Ready, testutil.ToFloat64(r.m.ready) == 1, "caa_ready agrees")
			assert.Contains(t, body, `"pending":[`, "lists are [] rather than null")
			if st.check != nil {
				st.check(t, rd)
			}
		})
	}
	// Readiness came at the fourth step, 40s after the start, and is not
	// stamped again by its later returns.
	assert.Equal(t, 40.0, testutil.ToFloat64(r.m.timeToReady))
	assert.Equal(t, Duration(40*time.Second), r.status.Snapshot().TimeToReady)
}

func TestReadyzBlockedBeforeStartup(t *testing.T) {
	r := newRig(t, Config{})
	r.status.PassDone(Pass{At: r.clock.Now(), Err: errList, Blocked: "cloud credentials rejected: aws list: not authorized", Pending: notes(2)})
	code, _, text := r.get(t, "/readyz", "")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, "not ready: cloud credentials rejected: aws list: not authorized\n"+
		"startup pass: not converged\n"+
		"pending: 2 (readiness waits for them: the startup pass has not converged)\n"+
		"  default/p00: Creating: creating VM\n  default/p01: Creating: creating VM\n", text)
}

// TestReadyzBodySaysWhatHoldsReadiness pins the whole text body in the
// three states a reader must not confuse: pods pending before the startup
// pass converged (they hold readiness), converged but blocked by a
// daemon-level reason (503, yet the pending pods are not the cause), and
// ready. Each sentence must be true under the status code it comes with.
func TestReadyzBodySaysWhatHoldsReadiness(t *testing.T) {
	failed := []PodNote{note("default/c", "InvalidSpec", "unknown instance type t9.huge")}
	withFailed := func(p Pass) Pass { p.Failed = failed; return p }
	const failedLines = "failed: 1 (never holds readiness back: a bad spec is its pod's to fix)\n" +
		"  default/c: InvalidSpec: unknown instance type t9.huge\n"
	tests := []struct {
		name     string
		passes   func(now time.Time) []Pass
		wantCode int
		wantBody string
	}{{
		name: "startup pending",
		passes: func(now time.Time) []Pass {
			return []Pass{withFailed(Pass{At: now, Pending: notes(2)})}
		},
		wantCode: http.StatusServiceUnavailable,
		wantBody: "not ready: the startup pass has not converged: 2 pods pending\n" +
			"pending: 2 (readiness waits for them: the startup pass has not converged)\n" +
			"  default/p00: Creating: creating VM\n  default/p01: Creating: creating VM\n" + failedLines,
	}, {
		name: "converged, then blocked",
		passes: func(now time.Time) []Pass {
			return []Pass{converged(now, 2), withFailed(Pass{At: now.Add(time.Minute), Err: errList, Pending: notes(1),
				Blocked: "cloud credentials rejected: aws create: not authorized"})}
		},
		wantCode: http.StatusServiceUnavailable,
		wantBody: "not ready: cloud credentials rejected: aws create: not authorized\n" +
			"pending: 1 (not what holds readiness back: the startup pass has converged; the reason above does)\n" +
			"  default/p00: Creating: creating VM\n" + failedLines,
	}, {
		name: "ready",
		passes: func(now time.Time) []Pass {
			return []Pass{converged(now, 2), withFailed(Pass{At: now.Add(time.Minute), Pending: notes(1),
				Records: map[ledger.Phase]int{ledger.PhaseRunning: 2}})}
		},
		wantCode: http.StatusOK,
		wantBody: "ready: 2 running, 1 pending, 1 failed\n" +
			"pending: 1 (not holding readiness back: the startup pass has converged)\n" +
			"  default/p00: Creating: creating VM\n" + failedLines,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, Config{})
			for _, p := range tt.passes(r.clock.Now()) {
				r.status.PassDone(p)
			}
			code, _, text := r.get(t, "/readyz", "")
			assert.Equal(t, tt.wantCode, code)
			assert.Equal(t, tt.wantBody, text)
		})
	}
}

func TestReadyzTruncates(t *testing.T) {
	tests := []struct {
		name      string
		maxListed int
		pending   int
		wantShown int
		wantMore  string
	}{
		{"default bound", 0, 25, 20, "  ... and 5 more\n"},
		{"at the bound", 0, 20, 20, ""},
		{"small bound", 3, 4, 3, "  ... and 1 more\n"},
		{"under the bound", 3, 2, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, Config{MaxListed: tt.maxListed})
			r.status.PassDone(Pass{Pending: notes(tt.pending), Failed: notes(tt.pending)})

			code, _, text := r.get(t, "/readyz", "")
			assert.Equal(t, http.StatusServiceUnavailable, code)
			assert.Equal(t, 2*tt.wantShown, strings.Count(text, ": Creating: creating VM\n"), "both lists are bounded")
			assert.Contains(t, text, "pending: "+strconv.Itoa(tt.pending)+" (")
			if tt.wantMore != "" {
				assert.Equal(t, 2, strings.Count(text, tt.wantMore))
			} else {
				assert.NotContains(t, text, "more")
			}
			assert.NotContains(t, text, notes(tt.pending + 1)[tt.wantShown].Pod+":", "the bound keeps the first pods in order")

			_, _, body := r.get(t, "/readyz", "application/json")
			var rd Readiness
			require.NoError(t, json.Unmarshal([]byte(body), &rd))
			assert.Len(t, rd.Pending, tt.wantShown)
			assert.Len(t, rd.Failed, tt.wantShown)
			assert.Equal(t, tt.pending, rd.PendingTotal)
			assert.Equal(t, tt.pending, rd.FailedTotal)
			assert.Len(t, r.status.Snapshot().Pending, tt.pending, "the snapshot is not bounded")
		})
	}
}

func TestReadyzFormat(t *testing.T) {
	r := newRig(t, Config{})
	tests := []struct {
		path, accept string
		wantType     string
	}{
		{"/readyz", "", "text/plain; charset=utf-8"},
		{"/readyz", "text/plain", "text/plain; charset=utf-8"},
		{"/readyz", "application/json", "application/json"},
		{"/readyz", "text/html, application/json;q=0.9", "application/json"},
		{"/readyz?format=json", "", "application/json"},
		{"/readyz?format=text", "application/json", "text/plain; charset=utf-8"},
	}
	for _, tt := range tests {
		t.Run(tt.path+" "+tt.accept, func(t *testing.T) {
			_, ctype, _ := r.get(t, tt.path, tt.accept)
			assert.Equal(t, tt.wantType, ctype)
		})
	}
}

func TestHealthz(t *testing.T) {
	r := newRig(t, Config{Stale: time.Minute, StartGrace: 30 * time.Second})
	steps := []struct {
		name     string
		do       func()
		wantCode int
		wantBody string
	}{
		{"just started", func() {}, http.StatusOK, "starting: no heartbeat yet, 0s since start (grace 30s)\n"},
		{"never beat", func() { r.clock.Add(31 * time.Second) }, http.StatusServiceUnavailable, "no heartbeat from the reconcile loop in 31s since start (grace 30s)\n"},
		{"first beat", func() { r.status.Beat(r.clock.Now()) }, http.StatusOK, "ok: last heartbeat 0s ago\n"},
		{"fresh", func() { r.clock.Add(59 * time.Second) }, http.StatusOK, "ok: last heartbeat 59s ago\n"},
		{"stale", func() { r.clock.Add(2 * time.Second) }, http.StatusServiceUnavailable, "reconcile loop stalled: last heartbeat 1m1s ago (bound 1m0s)\n"},
		{"beating again", func() { r.status.Beat(r.clock.Now()) }, http.StatusOK, "ok: last heartbeat 0s ago\n"},
	}
	for _, st := range steps {
		st.do()
		t.Run(st.name, func(t *testing.T) {
			code, ctype, body := r.get(t, "/healthz", "")
			assert.Equal(t, st.wantCode, code)
			assert.Equal(t, "text/plain; charset=utf-8", ctype)
			assert.Equal(t, st.wantBody, body)
		})
	}
}

func TestHandlerRoutes(t *testing.T) {
	r := newRig(t, Config{})
	code, _, _ := r.get(t, "/nope", "")
	assert.Equal(t, http.StatusNotFound, code)

	resp, err := http.Post(r.srv.URL+"/readyz", "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	req, err := http.NewRequestWithContext(t.Context(), http.MethodHead, r.srv.URL+"/healthz", nil)
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "probes may use HEAD")
	assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
}
