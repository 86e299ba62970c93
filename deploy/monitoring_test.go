package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/caa-project/caa/pkg/cluster"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/relayd"
)

// exported is every series family caa's processes serve on /metrics (the
// node caa's and the cluster caa's registries, built by their own code),
// with the label names seen on it. Each labelled family is given one
// series first, so its label names show.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := health.NewMetrics(reg)
	require.NoError(t, err)
	m.ObserveCloudCall(health.OpCreate, health.CallAuth, time.Second)
	m.ObserveHypervisorCall("StartVM", "OK", time.Second)
	st := health.NewStatus(health.Config{Metrics: m})
	st.SetHandover(health.Handover{Role: health.RoleTookOver, Outcome: health.HandoverAborted})
	cm := cluster.NewMetrics(reg)
	cm.Listings.WithLabelValues("ok").Inc()
	cm.Deletes.WithLabelValues("ok").Inc()
	cm.Published.WithLabelValues("ok").Inc()
	families, err := reg.Gather()
	require.NoError(t, err)
	families = append(families, relayFamilies(t)...)
	out := map[string][]string{}
	for _, f := range families {
		labels := []string{}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if !slices.Contains(labels, l.GetName()) {
					labels = append(labels, l.GetName())
				}
			}
		}
		out[f.GetName()] = labels
		if f.GetType().String() == "HISTOGRAM" {
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				out[f.GetName()+suffix] = append(slices.Clone(labels), "le")
			}
		}
	}
	return out
}

// relayFamilies are the series the real `caa relay` serves on /metrics,
// read from the binary the repository builds, run with its health socket.
func relayFamilies(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	bin := repoCaa(t, "aws")
	dir, err := os.MkdirTemp("", "mr") // unix socket paths are capped at 108 bytes
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	ca, err := pki.LoadOrCreateCA(dir)
	require.NoError(t, err)
	require.NoError(t, relayd.WriteClientFile(dir, ca))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hsock := filepath.Join(dir, "health.sock")
	cmd := exec.CommandContext(ctx, bin, "relay", "--socket", filepath.Join(dir, "relay.sock"), "--agent-ca-dir", dir,
		"--health-addr", "unix:"+hsock)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var d net.Dialer
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", hsock) }}}
	var body []byte
	// The sample line, not the HELP text (which starts "1 when ..."): the
	// relay's own series appear only once it serves its control socket.
	require.Eventually(t, func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://relay/metrics", nil)
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, err = io.ReadAll(resp.Body)
		return err == nil && resp.StatusCode == http.StatusOK && strings.Contains(string(body), "\ncaa_relay_ready 1\n")
	}, 30*time.Second, 20*time.Millisecond, "caa relay never served a ready /metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err)
	var out []*dto.MetricFamily
	for name, f := range fams {
		if strings.HasPrefix(name, "caa_relay_") {
			out = append(out, f)
		}
	}
	require.NotEmpty(t, out)
	return out
}

var (
	// seriesRef is a metric name in an expression, with its selector's
	// braces when it has them.
	seriesRef = regexp.MustCompile(`\b((?:caa|go|process)_[a-z0-9_]+)(\{[^}]*\})?`)
	// labelKey is a label matcher's name inside a selector.
	labelKey = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
)

// targetLabels are put on every series by the scrape (the PodMonitor's
// defaults), not by caa.
var targetLabels = []string{"namespace", "pod", "container", "endpoint", "instance", "job"}

// checker is what checkExpr reports to: a *testing.T, or a recorder.
type checker interface {
	Helper()
	Errorf(format string, args ...any)
}

// failures records what a check reported, to test the check itself.
type failures struct{ msgs []string }

func (f *failures) Helper() {}
func (f *failures) Errorf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

// checkExpr fails t unless every series expr names is one caa exports and
// every label it matches on is that series' or the scrape's.
func checkExpr(t checker, where, expr string, series map[string][]string) {
	t.Helper()
	refs := seriesRef.FindAllStringSubmatch(expr, -1)
	assert.NotEmpty(t, refs, "%s: names no caa series: %s", where, expr)
	for _, ref := range refs {
		labels, ok := series[ref[1]]
		if !assert.True(t, ok, "%s: %s is not a series caa exports", where, ref[1]) {
			continue
		}
		for _, k := range labelKey.FindAllStringSubmatch(ref[2], -1) {
			assert.True(t, slices.Contains(labels, k[1]) || slices.Contains(targetLabels, k[1]),
				"%s: %s has no label %q (it has %v)", where, ref[1], k[1], labels)
		}
	}
}

// TestAlertRulesNameCaasSeries: each alert is complete (an expression, a
// severity, a summary) and asks only about series and labels caa exports,
// so no alert stays silent because of a misspelt name.
func TestAlertRulesNameCaasSeries(t *testing.T) {
	series := exported(t)
	b, err := os.ReadFile("monitoring/prometheusrule.yaml")
	require.NoError(t, err)
	var rule struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Alert       string            `json:"alert"`
					Expr        string            `json:"expr"`
					For         string            `json:"for"`
					Labels      map[string]string `json:"labels"`
					Annotations map[string]string `json:"annotations"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.UnmarshalStrict(b, &rule))
	assert.Equal(t, "monitoring.coreos.com/v1", rule.APIVersion)
	assert.Equal(t, "PrometheusRule", rule.Kind)
	var alerts []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			checkExpr(t, r.Alert, r.Expr, series)
			assert.Contains(t, []string{"critical", "warning", "info"}, r.Labels["severity"], r.Alert)
			assert.NotEmpty(t, r.Annotations["summary"], r.Alert)
			if r.For != "" {
				_, err := time.ParseDuration(r.For)
				assert.NoError(t, err, "%s: for", r.Alert)
			}
			assert.Equal(t, strings.Count(r.Expr, "("), strings.Count(r.Expr, ")"), "%s: unbalanced parentheses", r.Alert)
		}
	}
	// what an on-call is paged for (issue 43): caa not ready, orphans
	// pending, cloud auth refused, aborted hand-overs, silent agents, VMs of
	// unknown nodes
	for _, a := range []string{"CaaNotReady", "CaaOrphanVMsPending", "CaaCloudAuthRefused", "CaaHandoverAborted", "CaaSilentAgents", "CaaUnknownNodeVMs", "CaaRelayNotReady"} {
		assert.Contains(t, alerts, a)
	}
}

// TestDashboardLoadsAndNamesCaasSeries: the dashboard is JSON Grafana can
// import (a title, a uid, panels with queries) and each query asks about
// series and labels caa exports.
func TestDashboardLoadsAndNamesCaasSeries(t *testing.T) {
	series := exported(t)
	b, err := os.ReadFile("monitoring/dashboard.json")
	require.NoError(t, err)
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	assert.NotEmpty(t, d.Title)
	assert.NotEmpty(t, d.UID)
	require.NotEmpty(t, d.Panels)
	ids := map[int]bool{}
	for _, p := range d.Panels {
		assert.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		assert.Contains(t, []string{"timeseries", "stat"}, p.Type, p.Title)
		require.NotEmpty(t, p.Targets, p.Title)
		for _, q := range p.Targets {
			checkExpr(t, p.Title, q.Expr, series)
		}
	}
	for _, v := range d.Templating.List {
		if v.Definition != "" {
			checkExpr(t, "variable "+v.Name, v.Definition, series)
		}
	}
}

// TestCheckExprCatchesMistakes: the check above fails on a misspelt series
// and on a label caa does not put on it.
func TestCheckExprCatchesMistakes(t *testing.T) {
	series := exported(t)
	for _, expr := range []string{`caa_redy == 0`, `rate(caa_cloud_calls_total{reslt="auth"}[5m])`, `vector(1)`} {
		f := &failures{}
		checkExpr(f, "probe", expr, series)
		assert.NotEmpty(t, f.msgs, "%s should fail the check", expr)
	}
	f := &failures{}
	checkExpr(f, "probe", `sum by (pod) (rate(caa_cloud_calls_total{result="auth", pod=~"x"}[5m]))`, series)
	assert.Empty(t, f.msgs, "a correct expression passes")
}

// TestMonitoringRenders: `kubectl apply -k deploy/monitoring` gets the
// PodMonitors (caa's pods, the relay's), the PrometheusRule and the
// dashboard's ConfigMap, labelled for Grafana's sidecar, in caa's
// namespace, the dashboard unchanged; the relay's monitor scrapes the port
// the relay's DaemonSet declares.
func TestMonitoringRenders(t *testing.T) {
	needBinaries(t)
	bin := kubectl(t)
	objs := manifests{name: "monitoring", all: decode(t, render(t, bin, "monitoring"))}
	for _, kind := range []string{"PrometheusRule", "ConfigMap"} {
		o := objs.one(t, kind)
		assert.Equal(t, "caa-system", o.GetNamespace(), kind)
	}
	cm := objs.configMap(t)
	assert.Equal(t, "caa-dashboard", cm.Name)
	assert.Equal(t, "1", cm.Labels["grafana_dashboard"])
	file, err := os.ReadFile("monitoring/dashboard.json")
	require.NoError(t, err)
	assert.Equal(t, string(file), cm.Data["dashboard.json"])
	monitors := map[string]map[string]any{}
	for _, o := range objs.all {
		if o.GetKind() == "PodMonitor" {
			assert.Equal(t, "caa-system", o.GetNamespace())
			monitors[o.GetName()] = o.Object
		}
	}
	require.Len(t, monitors, 2, "caa's pods and the relay's")
	sel, _, err := unstructured.NestedSlice(monitors["caa"], "spec", "selector", "matchExpressions")
	require.NoError(t, err)
	assert.Equal(t, []any{map[string]any{"key": "app.kubernetes.io/name", "operator": "In", "values": []any{"caa", "caa-cluster"}}}, sel,
		"the node caa and the cluster caa")

	relaySel, _, err := unstructured.NestedStringMap(monitors["caa-relay"], "spec", "selector", "matchLabels")
	require.NoError(t, err)
	require.NotEmpty(t, relaySel)
	eps, _, err := unstructured.NestedSlice(monitors["caa-relay"], "spec", "podMetricsEndpoints")
	require.NoError(t, err)
	require.Len(t, eps, 1)
	rendered := decode(t, withComponentList(t, bin, "overlays/aws", "components/no-surge", "components/kata-remote-hypervisor", "components/relay"))
	found := false
	for _, o := range rendered {
		if o.GetKind() != "DaemonSet" || o.GetName() != "caa-relay" {
			continue
		}
		found = true
		labels, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
		for k, v := range relaySel {
			assert.Equal(t, v, labels[k], "the relay's pods match the monitor's selector")
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		require.Len(t, containers, 1)
		ports, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "ports")
		require.Len(t, ports, 1)
		assert.Equal(t, eps[0].(map[string]any)["port"], ports[0].(map[string]any)["name"], "the monitor scrapes the relay's declared port")
	}
	assert.True(t, found, "the relay component renders caa-relay")
}
