package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPagesAndBounds(t *testing.T) {
	assert.Equal(t, 1, Pages(0, 1000), "an empty listing still costs a call")
	assert.Equal(t, 1, Pages(1000, 1000))
	assert.Equal(t, 2, Pages(1001, 1000))
	assert.Equal(t, 50, Pages(5000, 100))
	got := WarmRestartBound(20*time.Millisecond, 80*time.Millisecond, 10*time.Millisecond, 1, 5000, 100, 50*time.Millisecond)
	assert.Equal(t, 20*time.Millisecond+80*time.Millisecond+10*time.Millisecond+51*50*time.Millisecond, got)
	assert.Equal(t, 16*time.Second, CreateSchedule(100, 5, 20), "20 at once, 80 more at 5/s")
	assert.Equal(t, time.Duration(0), CreateSchedule(20, 5, 20))
	assert.InDelta(t, 0.5, Slope([]float64{0, 5, 10}, []float64{30, 32.5, 35}), 1e-9)
	assert.Zero(t, Slope([]float64{1}, []float64{1}))
	ms := time.Millisecond
	assert.Equal(t, (100+5+50+80+50*4)*ms, SandboxRestartBound(100*ms, 5*ms, 50*ms, 80*ms, 4*ms, 100, 2), "100 calls on 2 CPUs: 50 in a row")
	assert.Equal(t, (100+5+50+80+7*4)*ms, SandboxRestartBound(100*ms, 5*ms, 50*ms, 80*ms, 4*ms, 20, 3))
	assert.Equal(t, (100+5+50+80+4)*ms, SandboxRestartBound(100*ms, 5*ms, 50*ms, 80*ms, 4*ms, 0, 0), "one call at least")
}

func TestRowJudgesTheMedian(t *testing.T) {
	r := Row{Runs: []float64{130, 100, 400}, Bound: 100, MaxRatio: 1.25}
	assert.Equal(t, "MISS", r.Result(), "median 130 is 1.3x the bound")
	r.Runs = []float64{120, 100, 400}
	assert.Equal(t, "pass", r.Result(), "one slow run does not move the median")
	assert.InDelta(t, 1.2, r.Ratio(), 1e-9)

	zero := Row{Runs: []float64{0, 0, 1}, HasLimit: true, AtMost: true}
	assert.Equal(t, "pass", zero.Result())
	zero.Runs = []float64{1, 1, 0}
	assert.Equal(t, "MISS", zero.Result())
	assert.Equal(t, "<= 0 ", zero.Target())

	every := Row{Runs: []float64{0, 0, 1}, HasLimit: true, AtMost: true, EveryRun: true, Unit: "pods"}
	assert.Equal(t, "MISS", every.Result(), "one bad run of a correctness count is a miss")
	assert.Equal(t, "<= 0 pods in every run", every.Target())
	every = Row{Runs: []float64{3, 9, 0}, HasLimit: true, Limit: 1, EveryRun: true}
	assert.Equal(t, "MISS", every.Result(), "the smallest run must reach an at-least limit")
	every.Runs = []float64{3, 9, 1}
	assert.Equal(t, "pass", every.Result())

	atLeast := Row{Runs: []float64{4000}, HasLimit: true, Limit: 5000, Unit: "records/s"}
	assert.Equal(t, "MISS", atLeast.Result())
	assert.Equal(t, "measured", Row{Runs: []float64{1}}.Result())
	assert.Equal(t, "not run", Row{}.Result())
	lo, med, hi := Stats([]float64{4, 1, 3, 2})
	assert.Equal(t, []float64{1, 2.5, 4}, []float64{lo, med, hi})
}

func TestS2AbsorbedSaysWhatTheRunsShow(t *testing.T) {
	got := s2Absorbed([]float64{40, 52, 47}, []float64{140, 152, 147}, []float64{100, 100, 100}, []float64{0, 0, 0}, []float64{0, 0, 0}, 100, 1000)
	assert.Equal(t, "the fake cloud throttled caa in every run: 40 to 52 throttled responses (median 47) out of 140 to 152 create calls; "+
		"every run created exactly 100 VMs, one per killed VM, and ended with one live VM for each of the 1000 pods; "+
		"no pod got a warning event for it", got)
	got = s2Absorbed([]float64{60}, []float64{160}, []float64{100}, []float64{0}, []float64{0}, 100, 1000)
	assert.Contains(t, got, "in every run: 60 throttled responses (median 60) out of 160 create calls;", "one run: no range")

	got = s2Absorbed([]float64{0, 0}, []float64{100, 100}, []float64{100, 101}, []float64{0, 1}, []float64{0, 2}, 100, 1000)
	assert.Contains(t, got, "throttled no call in any run, so this run shows nothing about absorbing throttling")
	assert.Contains(t, got, "NOT one VM per pod: run 2 created 101 VMs with 1 pod(s) holding more than one")
	assert.Contains(t, got, "throttling reached the pods' events (up to 2 warnings in a run)")
	assert.NotContains(t, got, "every run created exactly")
}

func TestScenarioMarkdown(t *testing.T) {
	s := Scenario{ID: "S9", Title: "example", Setup: "one pod.", Rows: []Row{
		{Case: "aws, N=100", Metric: "time to ready", Unit: "ms", Runs: []float64{110, 100, 120}, Bound: 80, MaxRatio: 1.25, BoundNote: "list 80 ms"},
		{Case: "aws, N=100", Metric: "cloud writes", Unit: "calls", Runs: []float64{0, 0, 0}, HasLimit: true, AtMost: true},
	}, Details: []string{"calls: list 1"}}
	var b bytes.Buffer
	s.WriteMarkdown(&b, "##", true)
	out := b.String()
	assert.Contains(t, out, "## S9: example\n\none pod.\n")
	assert.Contains(t, out, "| aws, N=100 | time to ready | 3 | 110 ms | 100 | 120 | 80.0 ms | 1.38x | <= 1.25x bound | MISS |")
	assert.Contains(t, out, "| aws, N=100 | cloud writes | 3 | 0 calls | 0 | 0 | - | - | <= 0 calls | pass |")
	assert.Contains(t, out, "- bound of aws, N=100, time to ready: list 80 ms\n- calls: list 1\n")
	assert.Equal(t, 1, s.Misses())
	b.Reset()
	s.WriteMarkdown(&b, "####", false)
	assert.NotContains(t, b.String(), "calls: list 1", "the README leaves the details to results.md")
	assert.Contains(t, b.String(), "- bound of aws, N=100, time to ready: list 80 ms\n")
}

func TestSpliceReplacesOnlyBetweenTheMarkers(t *testing.T) {
	doc := "# t\n\n## Benchmarks\nintro\n" + beginMarker + "\nold\n" + endMarker + "\n\n## Layout\nkeep\n"
	got, err := Splice(doc, "new table")
	require.NoError(t, err)
	assert.Equal(t, "# t\n\n## Benchmarks\nintro\n"+beginMarker+"\nnew table\n"+endMarker+"\n\n## Layout\nkeep\n", got)
	_, err = Splice("no markers", "x")
	assert.Error(t, err)
}

func TestTargetTablePicksBenchreportsTargets(t *testing.T) {
	summary := "Machine: x\n\n| benchmark | unit |\n|---|---|\n| Get | ns/op |\n\n| target | measured median |\n|---|---:|\n| open | 116 ms/op |\n\ntrailer\n"
	assert.Equal(t, "| target | measured median |\n|---|---:|\n| open | 116 ms/op |", targetTable(summary))
	assert.Empty(t, targetTable(""))
}

func TestPlotSVGDrawsEachCloudAndItsBound(t *testing.T) {
	svg := PlotSVG([]PlotPoint{
		{Cloud: "aws", N: 100, Median: 100, Min: 90, Max: 110, BoundMs: 80},
		{Cloud: "aws", N: 1000, Median: 300, Min: 280, Max: 320, BoundMs: 250},
		{Cloud: "ibmcloud", N: 100, Median: 150, Min: 140, Max: 160, BoundMs: 120},
	})
	assert.True(t, strings.HasPrefix(svg, "<svg "))
	assert.True(t, strings.HasSuffix(svg, "</svg>\n"))
	assert.Equal(t, 4, strings.Count(svg, "<polyline"), "a median line and a bound line per cloud")
	assert.Contains(t, svg, ">aws</text>")
	assert.Contains(t, svg, ">ibmcloud</text>")
	assert.Contains(t, svg, ">400</text>", "the y axis ends at a round number above the largest max")
	assert.Contains(t, svg, ">100</text>", "and has round quarters")
}

func TestClassifyNamesVerbAndResource(t *testing.T) {
	cases := map[string]string{
		"GET /api/v1/pods?fieldSelector=spec.nodeName%3Dn":            "list pods",
		"GET /api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dn": "watch pods",
		"GET /api/v1/namespaces/s1/pods/p-00001":                      "get pods",
		"GET /api/v1/namespaces/kube-system":                          "get namespaces",
		"GET /api/v1/nodes/bench":                                     "get nodes",
		"PATCH /api/v1/nodes/bench":                                   "patch nodes",
		"POST /api/v1/namespaces/s1/events":                           "create events",
		"PUT /api/v1/namespaces/s1/pods/p/status":                     "update pods/status",
		"DELETE /api/v1/namespaces/s1/pods":                           "deletecollection pods",
		"GET /apis/node.k8s.io/v1/runtimeclasses/kata-remote":         "get runtimeclasses",
		"GET /apis/events.k8s.io/v1/namespaces/s1/events?watch=1":     "watch events",
		"GET /readyz": "get /readyz",
	}
	for req, want := range cases {
		method, target, _ := strings.Cut(req, " ")
		u, err := url.Parse(target)
		require.NoError(t, err)
		assert.Equal(t, want, Classify(method, u), req)
	}
}

func TestProxyCountsRequestsAndBytesByVerb(t *testing.T) {
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(strings.Repeat("x", 100)))
	}))
	defer upstream.Close()
	ca := pemOf(upstream)
	p, err := StartProxy(upstream.URL, ca)
	require.NoError(t, err)
	defer p.Close()
	client := clientFor(t, p)
	for _, path := range []string{"/api/v1/pods", "/api/v1/pods", "/api/v1/namespaces/a/pods/b"} {
		readAll(t, client, p.URL+path)
	}
	before := p.Snapshot()
	assert.Equal(t, Traffic{Requests: 2, Bytes: 200}, before["list pods"])
	assert.Equal(t, Traffic{Requests: 1, Bytes: 100}, before["get pods"])
	readAll(t, client, p.URL+"/api/v1/pods")
	assert.Equal(t, map[string]Traffic{"list pods": {Requests: 1, Bytes: 100}}, Diff(p.Snapshot(), before))
	p.Reset()
	assert.Empty(t, Diff(p.Snapshot(), map[string]Traffic{}))
}

func TestParseMetrics(t *testing.T) {
	m, err := parseMetrics(strings.NewReader("# HELP x\ncaa_time_to_ready_seconds 0.25\ncaa_reconcile_passes_total{result=\"converged\"} 3\n"))
	require.NoError(t, err)
	assert.Equal(t, 0.25, m["caa_time_to_ready_seconds"])
	assert.Equal(t, 3.0, m[`caa_reconcile_passes_total{result="converged"}`])
}

func pemOf(s *httptest.Server) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
}

func clientFor(t *testing.T, p *Proxy) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(p.CAPEM))
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}

// readAll gets url and reads the whole body, as a client does before it
// counts on a reply.
func readAll(t *testing.T, c *http.Client, url string) {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
}
