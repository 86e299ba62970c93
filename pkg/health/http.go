package health

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/caa-project/caa/pkg/ledger"
)

// Handler serves /healthz and /readyz from status and, when reg is not
// nil, /metrics from reg. /readyz answers JSON to ?format=json or an
// Accept of application/json, text otherwise.
func Handler(status *Status, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		ok, msg := status.Live()
		writeText(w, code(ok), msg+"\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		rd := status.Readiness()
		if wantsJSON(r) {
			writeJSON(w, code(rd.Ready), rd)
			return
		}
		writeText(w, code(rd.Ready), readinessText(rd))
	})
	if reg != nil {
		// Registry in the options counts failed scrapes on reg itself;
		// ContinueOnError serves what gathered rather than nothing.
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
			Registry:      reg,
			ErrorHandling: promhttp.ContinueOnError,
		}))
	}
	return mux
}

// MetricsHandler serves reg at GET /metrics and nothing else (404): the
// handler of a scrape address that must not show /status or /readyz.
func MetricsHandler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		Registry:      reg,
		ErrorHandling: promhttp.ContinueOnError,
	}))
	return mux
}

func code(ok bool) int {
	if ok {
		return http.StatusOK
	}
	return http.StatusServiceUnavailable
}

func wantsJSON(r *http.Request) bool {
	if f := r.URL.Query().Get("format"); f != "" {
		return f == "json"
	}
	return strings.Contains(r.Header.Get("Accept"), "application/json")
}

// readinessText is the /readyz body for people: a first line a probe log
// can show alone, then what is pending and what failed.
func readinessText(rd Readiness) string {
	var b strings.Builder
	if rd.Ready {
		b.WriteString("ready")
		if n, ok := rd.Records[ledger.PhaseRunning]; ok {
			fmt.Fprintf(&b, ": %d running,", n)
		} else {
			b.WriteString(":")
		}
		fmt.Fprintf(&b, " %d pending, %d failed\n", rd.PendingTotal, rd.FailedTotal)
	} else {
		fmt.Fprintf(&b, "not ready: %s\n", rd.Reason)
	}
	if rd.Blocked != "" && rd.Blocked != rd.Reason {
		fmt.Fprintf(&b, "blocked: %s\n", rd.Blocked)
	}
	if rd.Blocked != "" && !rd.Converged {
		// The first line gave the blocking reason; startup is a second one.
		b.WriteString("startup pass: not converged\n")
	}
	if rd.PendingTotal > 0 {
		writeNotes(&b, "pending", pendingNote(rd), rd.Pending, rd.PendingTotal)
	}
	if rd.FailedTotal > 0 {
		writeNotes(&b, "failed", " (never holds readiness back: a bad spec is its pod's to fix)", rd.Failed, rd.FailedTotal)
	}
	return b.String()
}

// pendingNote says whether the pending pods are what keeps /readyz at 503.
// Once the startup pass has converged they never are, but the answer may
// still be 503 for a daemon-level reason, which the note then points to.
func pendingNote(rd Readiness) string {
	switch {
	case !rd.Converged:
		return " (readiness waits for them: the startup pass has not converged)"
	case rd.Ready:
		return " (not holding readiness back: the startup pass has converged)"
	default:
		return " (not what holds readiness back: the startup pass has converged; the reason above does)"
	}
}

func writeNotes(b *strings.Builder, title, note string, notes []PodNote, total int) {
	fmt.Fprintf(b, "%s: %d%s\n", title, total, note)
	for _, n := range notes {
		fmt.Fprintf(b, "  %s\n", n)
	}
	if more := total - len(notes); more > 0 {
		fmt.Fprintf(b, "  ... and %d more\n", more)
	}
}

func writeText(w http.ResponseWriter, status int, body string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body)) // a probe that hung up needs no answer
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil { // only plain data here; keep the status code honest anyway
		writeText(w, status, fmt.Sprintf("encode status: %v\n", err))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
