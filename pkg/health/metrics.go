package health

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/caa-project/caa/pkg/ledger"
)

// Pass results, the values of caa_reconcile_passes_total's result label.
const (
	ResultConverged = "converged" // ran to the end, nothing pending
	ResultPending   = "pending"   // ran to the end, some pods still pending
	ResultError     = "error"     // ended early
)

// otherLabel stands for every label value past a label's bound.
const otherLabel = "other"

// durationBuckets span a local ledger write (ms) to a slow cloud create or
// a startup pass under throttling (minutes). A function, not a shared
// slice, so no caller can change another's buckets.
func durationBuckets() []float64 {
	return []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
}

// Metrics are caa's Prometheus metrics, registered on one registry. The
// pass-level ones are fed by the Status given this Metrics in its Config;
// cloud calls are fed by ObserveCloudCall. A nil *Metrics accepts every
// call and records nothing, so tests and tools can go without.
type Metrics struct {
	passes         *prometheus.CounterVec
	passDuration   prometheus.Histogram
	actions        *prometheus.CounterVec
	cloudCalls     *prometheus.CounterVec
	cloudDuration  *prometheus.HistogramVec
	records        *prometheus.GaugeVec
	orphansDeleted prometheus.Counter
	timeToReady    prometheus.Gauge
	ready          prometheus.Gauge
	podsPending    prometheus.Gauge
	podsFailed     prometheus.Gauge
	notWatched     prometheus.Gauge
	vmsDegraded    prometheus.Gauge
	agentsSilent   prometheus.Gauge
	orphansPending prometheus.Gauge
	orphanOldest   prometheus.Gauge
	handovers      *prometheus.CounterVec
	handoverTook   prometheus.Gauge
	handoverGap    prometheus.Gauge
	preflights     *prometheus.CounterVec
	kataCalls      *prometheus.CounterVec
	kataDuration   *prometheus.HistogramVec
	sandboxes      *prometheus.GaugeVec

	kinds, ops, results, phases, sbPhases *labelBound
	kataMethods, kataCodes                *labelBound

	mu         sync.Mutex
	phasesSeen map[string]bool // every phase label ever set, to zero the absent
	sbSeen     map[string]bool // the same for the sandboxes' phases
}

// NewMetrics makes caa's metrics and registers them, with the Go runtime
// and process collectors, on reg. Registering twice on one registry fails.
func NewMetrics(reg *prometheus.Registry) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("health: metrics need a registry")
	}
	m := &Metrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "caa_reconcile_passes_total",
			Help: "Full reconcile passes, by result: converged, pending (ran to the end with pods still pending) or error (ended early).",
		}, []string{"result"}),
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "caa_reconcile_pass_duration_seconds",
			Help:    "How long a full reconcile pass took.",
			Buckets: durationBuckets(),
		}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "caa_reconcile_actions_total",
			Help: "Per-pod decisions taken in full passes, by kind (Create, Adopt, Delete, Wait, Fail, ...).",
		}, []string{"kind"}),
		cloudCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "caa_cloud_calls_total",
			Help: "Calls to the cloud provider, by operation and result (ok, not_found, throttled, auth, ...).",
		}, []string{"op", "result"}),
		cloudDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "caa_cloud_call_duration_seconds",
			Help:    "How long calls to the cloud provider took, by operation.",
			Buckets: durationBuckets(),
		}, []string{"op"}),
		records: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "caa_ledger_records",
			Help: "Ledger records (one per peer pod with a VM or a failure) by phase, as of the last pass.",
		}, []string{"phase"}),
		orphansDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "caa_orphans_deleted_total",
			Help: "Orphan VMs (tagged for this node, owned by no pod or record) deleted after their grace period.",
		}),
		timeToReady: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_time_to_ready_seconds",
			Help: "Seconds from the daemon's start to its first readiness (startup pass converged); 0 until then.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_ready",
			Help: "1 when /readyz answers 200, else 0.",
		}),
		podsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_pods_pending",
			Help: "Desired peer pods without a Running VM recorded, as of the last pass.",
		}),
		podsFailed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_pods_failed",
			Help: "Peer pods with a terminal per-pod failure (e.g. invalid spec), as of the last pass.",
		}),
		notWatched: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_records_not_watched",
			Help: "Ledger records whose pod exists with a runtime class caa does not watch (kept, never deleted for that), as of the last pass.",
		}),
		vmsDegraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_vms_degraded",
			Help: "Peer pods whose VM runs while the cloud reports it degraded (e.g. Azure provisioning state Failed after an extension failed): kept, never replaced, as of the last pass.",
		}),
		agentsSilent: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_sandboxes_silent",
			Help: "Running sandboxes whose agent has not answered for longer than --sandbox-ready-timeout (a hung guest, an expired VM certificate, a lost agent CA): reported, no longer holding readiness, as of the last sync.",
		}),
		orphansPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_orphans_pending",
			Help: "Orphan VMs seen and waiting out the grace period before deletion, as of the last pass.",
		}),
		orphanOldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_orphan_oldest_seconds",
			Help: "Seconds since caa first saw the oldest pending orphan VM; 0 when there is none.",
		}),
		handovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "caa_handovers_total",
			Help: "Ledger hand-overs this process took part in, by role (took_over, handed_over) and outcome (done, handed_back, aborted).",
		}, []string{"role", "outcome"}),
		handoverTook: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_handover_duration_seconds",
			Help: "Seconds the last hand-over took, from the new caa's request to its readiness; 0 before any.",
		}),
		handoverGap: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_handover_gap_seconds",
			Help: "Seconds the node had no reconciler during the last hand-over: from the old caa stopping work to the new caa's reconciler starting on the opened ledger; 0 before any.",
		}),
		preflights: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "caa_preflight_runs_total",
			Help: "Runs of the cloud preflight (credentials, permissions, resource ids), by result (passed, failed); a warm restart runs it after ready.",
		}, []string{"result"}),
		kataCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "caa_hypervisor_calls_total",
			Help: "kata's remote hypervisor calls (CreateVM, StartVM, StopVM, Version) answered, by method and status code (OK, InvalidArgument, Unavailable, ...).",
		}, []string{"method", "code"}),
		kataDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "caa_hypervisor_call_duration_seconds",
			Help:    "How long caa took to answer kata's remote hypervisor calls, by method, whatever the answer (StartVM includes the VM's boot).",
			Buckets: durationBuckets(),
		}, []string{"method"}),
		sandboxes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "caa_sandboxes",
			Help: "kata sandboxes in the ledger (remote hypervisor mode) by phase (Created, Creating, Running, Lost, Deleting, Failed), as of the last sync.",
		}, []string{"phase"}),
		kinds:       newLabelBound(16),
		ops:         newLabelBound(16),
		results:     newLabelBound(16),
		phases:      newLabelBound(8),
		sbPhases:    newLabelBound(8),
		kataMethods: newLabelBound(8),
		kataCodes:   newLabelBound(20),
		phasesSeen:  map[string]bool{},
		sbSeen:      map[string]bool{},
	}
	cs := []prometheus.Collector{
		m.passes, m.passDuration, m.actions, m.cloudCalls, m.cloudDuration, m.records,
		m.orphansDeleted, m.timeToReady, m.ready, m.podsPending, m.podsFailed,
		m.notWatched, m.vmsDegraded, m.agentsSilent, m.orphansPending, m.orphanOldest,
		m.handovers, m.handoverTook, m.handoverGap, m.preflights, m.kataCalls, m.kataDuration, m.sandboxes,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("health: register metrics: %w", err)
		}
	}
	// Series that exist from the start, so rate() and dashboards see a 0
	// rather than nothing before the first event.
	for _, r := range []string{ResultConverged, ResultPending, ResultError} {
		m.passes.WithLabelValues(r)
	}
	for _, r := range []string{PreflightPassed, PreflightFailed} {
		m.preflights.WithLabelValues(r)
	}
	for _, op := range []string{OpCreate, OpGet, OpList, OpDelete} {
		m.cloudCalls.WithLabelValues(m.ops.value(op), m.results.value(CallOK))
	}
	m.setRecords(nil)
	m.setSandboxes(nil)
	return m, nil
}

// ObserveHypervisorCall counts one answered call of kata's remote
// hypervisor API and how long it took. method is the API's method name and
// code the status code's name, both from fixed sets: never a sandbox id.
func (m *Metrics) ObserveHypervisorCall(method, code string, d time.Duration) {
	if m == nil {
		return
	}
	method = m.kataMethods.value(method)
	m.kataCalls.WithLabelValues(method, m.kataCodes.value(code)).Inc()
	m.kataDuration.WithLabelValues(method).Observe(d.Seconds())
}

// ObserveCloudCall counts one call to the cloud and how long it took. op
// is the provider method (OpCreate, OpGet, ...), result a short word such
// as CloudResult returns; never a VM id or pod name, which would make a
// series per pod.
func (m *Metrics) ObserveCloudCall(op, result string, d time.Duration) {
	if m == nil {
		return
	}
	op = m.ops.value(op)
	m.cloudCalls.WithLabelValues(op, m.results.value(result)).Inc()
	m.cloudDuration.WithLabelValues(op).Observe(d.Seconds())
}

func (m *Metrics) observePass(p Pass) {
	if m == nil {
		return
	}
	m.passes.WithLabelValues(p.result()).Inc()
	m.passDuration.Observe(p.Duration.Seconds())
	for kind, n := range p.Actions {
		if n > 0 {
			m.actions.WithLabelValues(m.kinds.value(kind)).Add(float64(n))
		}
	}
	if p.OrphansDeleted > 0 {
		m.orphansDeleted.Add(float64(p.OrphansDeleted))
	}
}

// setRecords sets the records gauge from counts; every known phase, and
// every phase set before, that counts lacks is set to 0 rather than left
// at a stale value.
func (m *Metrics) setRecords(counts map[ledger.Phase]int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	setByPhase(m.records, m.phasesSeen, m.phases, ledger.Phases, counts)
}

// setSandboxes sets the sandboxes gauge from counts, as setRecords does
// for the pod records: every phase absent from counts reads 0.
func (m *Metrics) setSandboxes(counts map[ledger.SandboxPhase]int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	setByPhase(m.sandboxes, m.sbSeen, m.sbPhases, ledger.SandboxPhases, counts)
}

// setByPhase sets gauge to counts by phase label (bounded by labels):
// each phase of known and each label in seen that counts lacks reads 0.
// The caller holds m.mu.
func setByPhase[P ~string](gauge *prometheus.GaugeVec, seen map[string]bool, labels *labelBound, known []P, counts map[P]int) {
	next := map[string]float64{}
	for _, p := range known {
		next[string(p)] = 0
	}
	for label := range seen {
		next[label] = 0
	}
	for p, n := range counts {
		next[labels.value(string(p))] += float64(n)
	}
	for label, v := range next {
		seen[label] = true
		gauge.WithLabelValues(label).Set(v)
	}
}

func (m *Metrics) setPods(pending, failed int) {
	if m == nil {
		return
	}
	m.podsPending.Set(float64(pending))
	m.podsFailed.Set(float64(failed))
}

func (m *Metrics) setWatch(notWatched int, orphans []Orphan, now time.Time) {
	if m == nil {
		return
	}
	m.notWatched.Set(float64(notWatched))
	m.orphansPending.Set(float64(len(orphans)))
	oldest := 0.0
	for _, o := range orphans {
		oldest = max(oldest, now.Sub(o.FirstSeen).Seconds())
	}
	m.orphanOldest.Set(oldest)
}

func (m *Metrics) setDegraded(n int) {
	if m == nil {
		return
	}
	m.vmsDegraded.Set(float64(n))
}

func (m *Metrics) setSilent(n int) {
	if m == nil {
		return
	}
	m.agentsSilent.Set(float64(n))
}

func (m *Metrics) setReady(ready bool) {
	if m == nil {
		return
	}
	v := 0.0
	if ready {
		v = 1
	}
	m.ready.Set(v)
}

func (m *Metrics) setTimeToReady(d time.Duration) {
	if m == nil {
		return
	}
	m.timeToReady.Set(d.Seconds())
}

// labelBound lets through the first max distinct values of a label and
// folds the rest into "other": a guard on series count, whatever callers
// pass.
type labelBound struct {
	mu   sync.Mutex
	max  int
	seen map[string]bool
}

func newLabelBound(maxValues int) *labelBound {
	return &labelBound{max: maxValues, seen: map[string]bool{}}
}

func (b *labelBound) value(v string) string {
	if v == "" {
		return "unknown"
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen[v] {
		return v
	}
	if len(b.seen) >= b.max {
		return otherLabel
	}
	b.seen[v] = true
	return v
}
