package health

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

// TestMetricsEndpoint scrapes /metrics after some of everything and checks
// each caa metric is there with its type, plus the runtime collectors.
func TestMetricsEndpoint(t *testing.T) {
	r := newRig(t, Config{})
	r.m.ObserveCloudCall(OpCreate, CallOK, 2*time.Second)
	r.m.ObserveCloudCall(OpList, CloudResult(provider.ErrThrottled), 50*time.Millisecond)
	r.m.ObserveHypervisorCall("StartVM", "OK", 40*time.Second)
	r.status.PassDone(Pass{At: r.clock.Now(), Duration: 3 * time.Second, Pending: notes(2), Failed: notes(1),
		Actions: map[string]int{"Create": 2, "Adopt": 1}, CloudWrites: 3, OrphansDeleted: 1,
		Records: map[ledger.Phase]int{ledger.PhaseCreating: 2, ledger.PhaseRunning: 1, ledger.PhaseFailed: 1}})
	r.status.PassDone(converged(r.clock.Add(time.Minute), 3))
	r.status.SetHandover(Handover{Role: RoleHandedOver, Peer: "caa-new", Outcome: HandoverDone, Took: Duration(2 * time.Second), Gap: Duration(time.Second)})

	code, _, body := r.get(t, "/metrics", "")
	require.Equal(t, 200, code)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err)

	want := map[string]dto.MetricType{
		"caa_reconcile_passes_total":           dto.MetricType_COUNTER,
		"caa_reconcile_pass_duration_seconds":  dto.MetricType_HISTOGRAM,
		"caa_reconcile_actions_total":          dto.MetricType_COUNTER,
		"caa_cloud_calls_total":                dto.MetricType_COUNTER,
		"caa_cloud_call_duration_seconds":      dto.MetricType_HISTOGRAM,
		"caa_ledger_records":                   dto.MetricType_GAUGE,
		"caa_orphans_deleted_total":            dto.MetricType_COUNTER,
		"caa_time_to_ready_seconds":            dto.MetricType_GAUGE,
		"caa_ready":                            dto.MetricType_GAUGE,
		"caa_pods_pending":                     dto.MetricType_GAUGE,
		"caa_pods_failed":                      dto.MetricType_GAUGE,
		"caa_records_not_watched":              dto.MetricType_GAUGE,
		"caa_vms_degraded":                     dto.MetricType_GAUGE,
		"caa_sandboxes_silent":                 dto.MetricType_GAUGE,
		"caa_orphans_pending":                  dto.MetricType_GAUGE,
		"caa_orphan_oldest_seconds":            dto.MetricType_GAUGE,
		"caa_handovers_total":                  dto.MetricType_COUNTER,
		"caa_handover_duration_seconds":        dto.MetricType_GAUGE,
		"caa_handover_gap_seconds":             dto.MetricType_GAUGE,
		"caa_hypervisor_calls_total":           dto.MetricType_COUNTER,
		"caa_hypervisor_call_duration_seconds": dto.MetricType_HISTOGRAM,
		"caa_preflight_runs_total":             dto.MetricType_COUNTER,
		"caa_sandboxes":                        dto.MetricType_GAUGE,
		"go_goroutines":                        dto.MetricType_GAUGE,
		"process_start_time_seconds":           dto.MetricType_GAUGE,
	}
	for name, typ := range want {
		f, ok := families[name]
		if assert.True(t, ok, "%s missing from /metrics", name) {
			assert.Equal(t, typ, f.GetType(), name)
			assert.NotEmpty(t, f.GetHelp(), name)
		}
	}
	for name := range families {
		if strings.HasPrefix(name, "caa_") {
			_, ok := want[name]
			assert.True(t, ok, "%s is served but not checked here", name)
		}
	}

	assert.Equal(t, 1.0, testutil.ToFloat64(r.m.passes.WithLabelValues(ResultPending)))
	assert.Equal(t, 1.0, testutil.ToFloat64(r.m.passes.WithLabelValues(ResultConverged)))
	assert.Equal(t, 0.0, testutil.ToFloat64(r.m.passes.WithLabelValues(ResultError)))
	assert.Equal(t, 2.0, testutil.ToFloat64(r.m.actions.WithLabelValues("Create")))
	assert.Equal(t, 3.0, testutil.ToFloat64(r.m.actions.WithLabelValues("None")))
	assert.Equal(t, 1.0, testutil.ToFloat64(r.m.orphansDeleted))
	assert.Equal(t, 1.0, testutil.ToFloat64(r.m.cloudCalls.WithLabelValues(OpList, CallThrottled)))
	assert.Equal(t, 0.0, testutil.ToFloat64(r.m.podsPending))
	assert.Equal(t, 60.0, testutil.ToFloat64(r.m.timeToReady))
	assert.Equal(t, 1.0, testutil.ToFloat64(r.m.kataCalls.WithLabelValues("StartVM", "OK")))
	assert.Equal(t, uint64(2), families["caa_reconcile_pass_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleCount())

	// The gauge follows the last pass; phases it no longer names read 0.
	err = testutil.GatherAndCompare(r.reg, strings.NewReader(`
# HELP caa_ledger_records Ledger records (one per peer pod with a VM or a failure) by phase, as of the last pass.
# TYPE caa_ledger_records gauge
caa_ledger_records{phase="Creating"} 0
caa_ledger_records{phase="Deleting"} 0
caa_ledger_records{phase="Failed"} 0
caa_ledger_records{phase="Running"} 3
`), "caa_ledger_records")
	assert.NoError(t, err)

	problems, err := testutil.GatherAndLint(r.reg, names(want)...)
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names and help follow Prometheus conventions")
}

func names(m map[string]dto.MetricType) []string {
	var out []string
	for n := range m {
		if strings.HasPrefix(n, "caa_") {
			out = append(out, n)
		}
	}
	return out
}

func TestMetricsStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	// Before anything happens: each pass result, each cloud op's ok and
	// each phase exist at 0, so rate() and dashboards see a line.
	assert.Equal(t, 3, testutil.CollectAndCount(m.passes))
	assert.Equal(t, 4, testutil.CollectAndCount(m.cloudCalls))
	assert.Equal(t, len(ledger.Phases), testutil.CollectAndCount(m.records))
	assert.Equal(t, 0, testutil.CollectAndCount(m.actions))
	assert.Equal(t, 0.0, testutil.ToFloat64(m.ready))
}

func TestNewMetricsErrors(t *testing.T) {
	_, err := NewMetrics(nil)
	assert.Error(t, err)

	reg := prometheus.NewRegistry()
	_, err = NewMetrics(reg)
	require.NoError(t, err)
	_, err = NewMetrics(reg)
	var are prometheus.AlreadyRegisteredError
	assert.ErrorAs(t, err, &are, "a second set on one registry is refused, not merged")
}

func TestLabelsAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	// A caller that passed VM ids as ops would make a series per VM.
	for i := range 100 {
		m.ObserveCloudCall(fmt.Sprintf("vm-%d", i), CallOK, time.Millisecond)
	}
	m.ObserveCloudCall("", "", time.Millisecond)
	// The four provider ops were let through at start; 12 more fit, the
	// rest fold into other, and an empty op reads unknown.
	assert.Equal(t, 12+2, testutil.CollectAndCount(m.cloudDuration))
	assert.Equal(t, 4+12+2, testutil.CollectAndCount(m.cloudCalls))
	assert.Equal(t, 100-12.0, testutil.ToFloat64(m.cloudCalls.WithLabelValues(otherLabel, CallOK)))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.cloudCalls.WithLabelValues("unknown", "unknown")))

	kinds := map[string]int{}
	for i := range 40 {
		kinds[fmt.Sprintf("Kind%d", i)] = 1
	}
	m.observePass(Pass{Actions: kinds})
	assert.Equal(t, 16+1, testutil.CollectAndCount(m.actions))
	assert.Equal(t, 24.0, testutil.ToFloat64(m.actions.WithLabelValues(otherLabel)))
}

func TestRecordsGaugeZeroesWhatIsGone(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	m.setRecords(map[ledger.Phase]int{ledger.PhaseRunning: 2, "Weird": 1})
	assert.Equal(t, 1.0, testutil.ToFloat64(m.records.WithLabelValues("Weird")))
	m.setRecords(map[ledger.Phase]int{ledger.PhaseCreating: 1})
	assert.Equal(t, 0.0, testutil.ToFloat64(m.records.WithLabelValues("Weird")), "not left at a stale value")
	assert.Equal(t, 0.0, testutil.ToFloat64(m.records.WithLabelValues(string(ledger.PhaseRunning))))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.records.WithLabelValues(string(ledger.PhaseCreating))))

	// A pass without counts leaves them as they were.
	s := NewStatus(Config{Metrics: m, Now: newClock().Now})
	s.PassDone(Pass{})
	assert.Equal(t, 1.0, testutil.ToFloat64(m.records.WithLabelValues(string(ledger.PhaseCreating))))
}

// TestSandboxesGaugeFollowsThePasses: caa_sandboxes shows every phase
// from the start, follows each pass that counts, and a pass without counts
// leaves it as it was.
func TestSandboxesGaugeFollowsThePasses(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	assert.Equal(t, len(ledger.SandboxPhases), testutil.CollectAndCount(m.sandboxes), "every phase from the start")
	s := NewStatus(Config{Metrics: m, Now: newClock().Now})
	s.PassDone(Pass{Sandboxes: map[ledger.SandboxPhase]int{ledger.SandboxRunning: 3, ledger.SandboxLost: 1}})
	assert.Equal(t, 3.0, testutil.ToFloat64(m.sandboxes.WithLabelValues(string(ledger.SandboxRunning))))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.sandboxes.WithLabelValues(string(ledger.SandboxLost))))
	s.PassDone(Pass{Sandboxes: map[ledger.SandboxPhase]int{ledger.SandboxRunning: 2}})
	assert.Equal(t, 0.0, testutil.ToFloat64(m.sandboxes.WithLabelValues(string(ledger.SandboxLost))), "not left at a stale value")
	s.PassDone(Pass{})
	assert.Equal(t, 2.0, testutil.ToFloat64(m.sandboxes.WithLabelValues(string(ledger.SandboxRunning))))
}

func TestNilMetricsAcceptEverything(t *testing.T) {
	var m *Metrics
	assert.NotPanics(t, func() {
		m.ObserveCloudCall(OpGet, CallOK, time.Second)
		s := NewStatus(Config{Metrics: m})
		s.PassDone(Pass{Records: map[ledger.Phase]int{ledger.PhaseRunning: 1}})
		s.SetBlocked("x")
	})
	p := &stubProvider{}
	assert.Same(t, p, InstrumentProvider(p, nil).(*stubProvider), "nothing to count: the provider itself")
}

func TestCloudResult(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, CallOK},
		{provider.ErrNotFound, CallNotFound},
		{&provider.Error{Kind: provider.ErrThrottled, Provider: "aws", Op: "create", Code: "RequestLimitExceeded"}, CallThrottled},
		{fmt.Errorf("delete vm-1: %w", &provider.Error{Kind: provider.ErrAuth, Provider: "azure", Op: "delete"}), CallAuth},
		{provider.ErrInvalidSpec, CallInvalidSpec},
		{provider.ErrQuota, CallQuota},
		{provider.ErrCapacity, CallCapacity},
		{provider.ErrConflict, CallConflict},
		{context.Canceled, CallCanceled},
		{fmt.Errorf("get: %w", context.DeadlineExceeded), CallTimeout},
		{&provider.Error{Provider: "ibmcloud", Op: "list", Code: "InternalError"}, CallError},
		{errors.New("connection reset"), CallError},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			assert.Equal(t, tt.want, CloudResult(tt.err))
		})
	}
}

// stubProvider answers every call with its err field.
type stubProvider struct{ err error }

func (p *stubProvider) Name() string { return "stub" }
func (p *stubProvider) Create(context.Context, provider.Spec) (provider.VM, error) {
	return provider.VM{ID: "vm-1"}, p.err
}
func (p *stubProvider) Get(context.Context, string) (provider.VM, error) { return provider.VM{}, p.err }
func (p *stubProvider) List(context.Context, provider.Selector) ([]provider.VM, error) {
	return []provider.VM{{ID: "vm-1"}}, p.err
}
func (p *stubProvider) Delete(context.Context, string) error { return p.err }

func TestInstrumentProvider(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	stub := &stubProvider{}
	p := InstrumentProvider(stub, m)
	ctx := t.Context()

	assert.Equal(t, "stub", p.Name())
	vm, err := p.Create(ctx, provider.Spec{})
	assert.NoError(t, err)
	assert.Equal(t, "vm-1", vm.ID)
	vms, err := p.List(ctx, provider.Selector{})
	assert.NoError(t, err)
	assert.Len(t, vms, 1)

	stub.err = &provider.Error{Kind: provider.ErrNotFound, Provider: "stub", Op: "get"}
	_, err = p.Get(ctx, "vm-1")
	assert.Same(t, stub.err, err, "errors pass through unchanged")
	stub.err = provider.ErrThrottled
	assert.ErrorIs(t, p.Delete(ctx, "vm-1"), provider.ErrThrottled)

	for _, c := range []struct{ op, result string }{
		{OpCreate, CallOK}, {OpList, CallOK}, {OpGet, CallNotFound}, {OpDelete, CallThrottled},
	} {
		assert.Equal(t, 1.0, testutil.ToFloat64(m.cloudCalls.WithLabelValues(c.op, c.result)), c.op)
	}
	assert.Equal(t, 4, testutil.CollectAndCount(m.cloudDuration), "one duration series per op")
}

func TestUnwatchedRecordsAndPendingOrphansAreVisible(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := NewStatus(Config{Metrics: m, Now: func() time.Time { return now }})
	s.PassDone(Pass{
		At:         now,
		NotWatched: []PodNote{{Pod: "team/web", Reason: "RuntimeClassNotWatched"}},
		Orphans: []Orphan{
			{ID: "i-1", Pod: "team/old", FirstSeen: now.Add(-90 * time.Second)},
			{ID: "i-2", FirstSeen: now.Add(-10 * time.Second)},
		},
	})
	assert.InDelta(t, 1, testutil.ToFloat64(m.notWatched), 0)
	assert.InDelta(t, 2, testutil.ToFloat64(m.orphansPending), 0)
	assert.InDelta(t, 90, testutil.ToFloat64(m.orphanOldest), 0)
	snap := s.Snapshot()
	require.Len(t, snap.NotWatched, 1)
	assert.Equal(t, "team/web", snap.NotWatched[0].Pod)
	require.Len(t, snap.Orphans, 2)
	assert.Equal(t, "i-1", snap.Orphans[0].ID)
}
