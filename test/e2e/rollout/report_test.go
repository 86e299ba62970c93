package rollout

import (
	"encoding/xml"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// synthetic is a two-node rollout: node-a updated first, then node-b, the
// old pod of each stopping before its new one turns ready.
func synthetic() Timeline {
	return Timeline{
		Nodes: []string{"node-a", "node-b"},
		Pods: []PodSample{
			{At: at(0), Pod: "a1", UID: "a1", Node: "node-a", Tag: "v1"},
			{At: at(0), Pod: "b1", UID: "b1", Node: "node-b", Tag: "v1"},
			{At: at(1), Pod: "a1", UID: "a1", Node: "node-a", Tag: "v1", Ready: true},
			{At: at(2), Pod: "b1", UID: "b1", Node: "node-b", Tag: "v1", Ready: true},
			{At: at(10), Pod: "a1", UID: "a1", Node: "node-a", Tag: "v1", Ready: true, Deleting: true},
			{At: at(11), Pod: "a1", UID: "a1", Node: "node-a", Tag: "v1", Deleting: true},
			{At: at(12), Pod: "a1", UID: "a1", Node: "node-a", Tag: "v1", Deleting: true, Gone: true},
			{At: at(12.5), Pod: "a2", UID: "a2", Node: "node-a", Tag: "v2"},
			{At: at(14), Pod: "a2", UID: "a2", Node: "node-a", Tag: "v2", Ready: true},
			{At: at(15), Pod: "b1", UID: "b1", Node: "node-b", Tag: "v1", Ready: true, Deleting: true},
			{At: at(16), Pod: "b1", UID: "b1", Node: "node-b", Tag: "v1", Deleting: true, Gone: true},
			{At: at(16.5), Pod: "b2", UID: "b2", Node: "node-b", Tag: "v2"},
			{At: at(19), Pod: "b2", UID: "b2", Node: "node-b", Tag: "v2", Ready: true},
		},
		VMs: []VMSample{
			{At: at(0), Running: map[string]int{"node-a": 0, "node-b": 0}},
			{At: at(2), Running: map[string]int{"node-a": 10, "node-b": 10}},
			{At: at(13), Running: map[string]int{"node-a": 10, "node-b": 7}},
			{At: at(18), Running: map[string]int{"node-a": 10, "node-b": 10}},
		},
		Marks: []Mark{{At: at(9), Label: "image caa:v2"}, {At: at(13), Label: "3 VMs killed on node-b"}},
		// What the processes answered on /status: each old caa stops
		// answering ready a little after it is told to stop, each new one
		// answers ready a little before its pod turns Ready.
		Procs: []ProcSample{
			{At: at(0.5), UID: "a1", Node: "node-a", Reason: "unreachable"},
			{At: at(0.9), UID: "a1", Node: "node-a", Ready: true, Reconciling: true},
			{At: at(1.9), UID: "b1", Node: "node-b", Ready: true, Reconciling: true},
			{At: at(10.2), UID: "a1", Node: "node-a", Reason: "stopping"},
			{At: at(12), UID: "a1", Node: "node-a", Gone: true},
			{At: at(12.6), UID: "a2", Node: "node-a", Reason: "unreachable"},
			{At: at(13.8), UID: "a2", Node: "node-a", Ready: true, Reconciling: true},
			{At: at(15.1), UID: "b1", Node: "node-b", Reason: "stopping"},
			{At: at(16), UID: "b1", Node: "node-b", Gone: true},
			{At: at(18.9), UID: "b2", Node: "node-b", Ready: true, Reconciling: true},
		},
	}
}

func TestNodeReconcilingAndItsWindows(t *testing.T) {
	tl := synthetic()
	rec := tl.NodeReconciling()
	assert.Equal(t, []Step{{Value: 0}, {At: at(0.9), Value: 1}, {At: at(10.2), Value: 0}, {At: at(13.8), Value: 1}}, rec["node-a"])
	ws := tl.NoReconciler(at(9), at(20))
	assert.Equal(t, []Window{{From: at(10.2), To: at(13.8)}}, ws["node-a"])
	assert.Equal(t, []Window{{From: at(15.1), To: at(18.9)}}, ws["node-b"])
	assert.Equal(t, []Window{{From: at(15.1), To: at(17), Open: true}}, tl.NoReconciler(at(9), at(17))["node-b"],
		"a window still open at the end is cut there and said to be open")
	assert.Empty(t, tl.NoReconciler(at(3), at(9)), "both nodes reconciled before the update")
}

func TestNodeReadySteps(t *testing.T) {
	ready := synthetic().NodeReady()
	assert.Equal(t, []Step{{Value: 0}, {At: at(1), Value: 1}, {At: at(10), Value: 0}, {At: at(14), Value: 1}}, ready["node-a"],
		"a pod being deleted stops serving at once, whatever its Ready says")
	assert.Equal(t, []Step{{Value: 0}, {At: at(2), Value: 1}, {At: at(15), Value: 0}, {At: at(19), Value: 1}}, ready["node-b"])
}

func TestNodeVMSteps(t *testing.T) {
	vms := synthetic().NodeVMs()
	assert.Equal(t, []Step{{At: at(0), Value: 0}, {At: at(2), Value: 10}}, vms["node-a"])
	assert.Equal(t, []Step{{At: at(0), Value: 0}, {At: at(2), Value: 10}, {At: at(13), Value: 7}, {At: at(18), Value: 10}}, vms["node-b"])
}

func TestMaxUnavailable(t *testing.T) {
	tl := synthetic()
	u := tl.MaxUnavailable(at(9), at(20))
	assert.Equal(t, 1, u.Max, "one node at a time")
	assert.Equal(t, at(10), u.At)
	assert.Equal(t, []string{"node-a"}, u.Nodes)

	assert.Equal(t, 2, tl.MaxUnavailable(at(0), at(20)).Max, "before v1 was ready both nodes were down")
	assert.Equal(t, 0, tl.MaxUnavailable(at(3), at(9)).Max, "a window without samples keeps the state before it")

	// A controller that stopped node-b before node-a's new pod was ready.
	tl.Pods = append(tl.Pods, PodSample{At: at(13), Pod: "b1", UID: "b1", Node: "node-b", Tag: "v1", Ready: true, Deleting: true})
	u = tl.MaxUnavailable(at(9), at(20))
	assert.Equal(t, 2, u.Max)
	assert.Equal(t, at(13), u.At)
	assert.Equal(t, []string{"node-a", "node-b"}, u.Nodes)
}

func TestReportMarkdown(t *testing.T) {
	r := Report{
		Title: "caa rollout: 2 nodes", Scenario: "Two nodes.", Start: at(9), Picture: "rollout-timeline.svg",
		Rows: []NodeRow{
			{Node: "node-a", OldPod: "a1", NewPod: "a2", OldStopAt: at(10), OldGoneAt: at(12), NewReadyAt: at(14), CaaReadyAt: at(13.8),
				NoReconciler: Window{From: at(10.2), To: at(13.8)}, PodGap: 4 * time.Second, CaaGap: 3 * time.Second,
				PeerPods: 11, Adopted: 10, Added: 1, CaaTimeToReady: 1200 * time.Millisecond},
			{Node: "node-b", OldPod: "b1", NewPod: "b2", OldStopAt: at(15), OldGoneAt: at(16), NewReadyAt: at(19),
				PeerPods: 10, Adopted: 7, Recreated: 3},
		},
		Facts: []string{"at most 1 node without a ready caa"},
	}
	md := r.Markdown()
	assert.Contains(t, md, "# caa rollout: 2 nodes\n")
	assert.Contains(t, md, "| node-a | a1 | +1.0s | a2 | +4.8s | 3.60s (+1.2s to +4.8s) | 3s | 4.00s | +5.0s | +3.0s | 11 | 10 | 0 | 1 | 1.20s |\n")
	assert.Contains(t, md, "| node-b | b1 | +6.0s | b2 | — | — | — | — | +10.0s | +7.0s | 10 | 7 | 3 | 0 | — |\n")
	assert.Contains(t, md, "- at most 1 node without a ready caa\n")
	assert.Contains(t, md, "](rollout-timeline.svg)")
	assert.Equal(t, "-2.0s", Report{Start: at(9)}.at(at(7)))
}

// goodOutcome fits synthetic(): 10 peer pods per node, 3 VMs of node-b
// killed at +13s and recreated at +17s, before node-b's new caa turned
// ready at +19s.
func goodOutcome() (Outcome, []NodeRow) {
	o := Outcome{Start: at(9), End: at(20), Allowed: 1, Creates: 23}
	for _, node := range []string{"node-a", "node-b"} {
		for i := range 10 {
			p := PeerPod{Name: fmt.Sprintf("%s-pod-%02d", node, i), Node: node,
				VMBefore: fmt.Sprintf("i-%s-%d", node, i), VMAfter: fmt.Sprintf("i-%s-%d", node, i)}
			if node == "node-b" && i < 3 {
				p.Killed, p.VMAfter, p.NewVMs = true, p.VMAfter+"-new", []time.Time{at(17)}
			}
			o.PeerPods = append(o.PeerPods, p)
		}
	}
	rows := []NodeRow{
		{Node: "node-a", OldStopAt: at(10), NewReadyAt: at(14), CaaReadyAt: at(13.8), PeerPods: 10, Adopted: 10, Reported: true, Converged: true},
		{Node: "node-b", OldStopAt: at(15), NewReadyAt: at(19), CaaReadyAt: at(18.8), PeerPods: 10, Adopted: 7, Recreated: 3, Reported: true, Converged: true},
	}
	return o, rows
}

func TestFactsOfAGoodRollout(t *testing.T) {
	o, rows := goodOutcome()
	assert.Equal(t, []string{
		"at most 1 node without a Ready caa pod at any moment of the rollout (the update strategy updates 1 at a time)",
		"the longest a node went without a Ready caa pod: 4.00s (node-a)",
		"time without a reconciling caa (no caa process answering ready on /status and not handing its ledger over), per node: " +
			"node-a 3.60s (+1.2s to +4.8s); node-b 3.80s (+6.1s to +9.9s); " +
			"each window ran from the old caa's pod deletion to the new caa's readiness",
		"VMs deleted: 0; VMs created: 23, as many as peer pods (20, of which 0 added during the rollout) plus killed VMs (3)",
		"17 of the 20 peer pods there before the rollout kept the same VM (every one whose VM was not killed); " +
			"the 3 whose VM was killed each got exactly one new VM before their node's new caa turned ready",
		"each of the 2 new caa processes reported a converged startup pass with nothing pending (/status, /metrics) at its first readiness",
		"no caa process exited, restarted or failed to start",
	}, Facts(synthetic(), o, rows))
}

// TestFactsSayWhatWasViolated feeds the report generator recordings that
// break each expectation: the sentence must say so, never the fixed text
// of a good run.
func TestFactsSayWhatWasViolated(t *testing.T) {
	tests := []struct {
		name   string
		change func(tl *Timeline, o *Outcome, rows []NodeRow)
		fact   int
		want   string
	}{{
		name: "two nodes without a ready caa at once",
		change: func(tl *Timeline, _ *Outcome, _ []NodeRow) {
			tl.Pods = append(tl.Pods, PodSample{At: at(13), Pod: "b1", UID: "b1", Node: "node-b", Tag: "v1", Ready: true, Deleting: true})
		},
		fact: 0,
		want: "VIOLATED: 2 nodes were without a Ready caa pod at once (node-a, node-b, first at +4.0s), more than the 1 the update strategy updates at a time",
	}, {
		name: "a node without a ready caa twice, and one never again",
		change: func(tl *Timeline, _ *Outcome, _ []NodeRow) {
			tl.Pods = slices.DeleteFunc(tl.Pods, func(s PodSample) bool { return s.UID == "b2" && s.Ready })
			tl.Pods = append(tl.Pods,
				PodSample{At: at(16), Pod: "a2", UID: "a2", Node: "node-a", Tag: "v2"},
				PodSample{At: at(16.5), Pod: "a2", UID: "a2", Node: "node-a", Tag: "v2", Ready: true})
		},
		fact: 1,
		want: "the longest a node went without a Ready caa pod: 5.00s (node-b); UNEXPECTED: without one more than once: node-a 2 times; " +
			"VIOLATED: still without a Ready caa pod when the rollout was seen complete: node-b",
	}, {
		name: "no update at all",
		change: func(tl *Timeline, _ *Outcome, _ []NodeRow) {
			tl.Pods = slices.DeleteFunc(tl.Pods, func(s PodSample) bool { return s.At.After(at(9)) })
		},
		fact: 1,
		want: "no node was ever without a Ready caa pod during the rollout",
	}, {
		name: "a node without a reconciler twice, another one too long",
		change: func(tl *Timeline, _ *Outcome, rows []NodeRow) {
			rows[1].CaaReadyAt = at(17.5)
			tl.Procs = append(tl.Procs,
				ProcSample{At: at(16.5), UID: "a2", Node: "node-a", Reason: "stalled"},
				ProcSample{At: at(17), UID: "a2", Node: "node-a", Ready: true, Reconciling: true})
			tl.Procs = slices.DeleteFunc(tl.Procs, func(s ProcSample) bool { return s.UID == "b2" })
			tl.Procs = append(tl.Procs, ProcSample{At: at(19.5), UID: "b2", Node: "node-b", Ready: true, Reconciling: true})
		},
		fact: 2,
		want: "VIOLATED: time without a reconciling caa (no caa process answering ready on /status and not handing its ledger over), per node: " +
			"node-a 3.60s (+1.2s to +4.8s); node-b 4.40s (+6.1s to +10.5s); " +
			"each window ran from the old caa's pod deletion to the new caa's readiness; " +
			"but: node-a had 2 such windows, node-b: until +10.5s, after its new caa was ready (+8.5s)",
	}, {
		name:   "a delete and too many creates",
		change: func(_ *Timeline, o *Outcome, _ []NodeRow) { o.Deletes, o.Creates = 1, 25 },
		fact:   3,
		want: "VIOLATED: VMs deleted: 1 (caa must not delete a VM here); " +
			"VIOLATED: VMs created: 25, not one per peer pod (20) plus one per killed VM (3) = 23",
	}, {
		name: "a pod lost its VM, a killed one got two, another one too late",
		change: func(_ *Timeline, o *Outcome, _ []NodeRow) {
			o.PeerPods[4].VMAfter = "i-other"
			o.PeerPods[10].NewVMs = append(o.PeerPods[10].NewVMs, at(17.5))
			o.PeerPods[11].NewVMs = []time.Time{at(19.25)}
		},
		fact: 4,
		want: "VIOLATED: 16 of the 17 peer pods whose VM was not killed kept it; not: node-a-pod-04 (VM i-node-a-4, then i-other); " +
			"VIOLATED: of the 3 whose VM was killed, node-b-pod-00 got 2 new VMs, node-b-pod-01 got its new VM 250ms after node-b's new caa turned ready",
	}, {
		name: "a new caa ready before its startup pass converged, another never ready",
		change: func(_ *Timeline, _ *Outcome, rows []NodeRow) {
			rows[0].Converged, rows[0].PendingAtReady = false, 2
			rows[1].NewReadyAt = time.Time{}
		},
		fact: 5,
		want: "VIOLATED: no report of a ready new caa from node-b (no new caa turned ready); " +
			"VIOLATED: ready before a converged startup pass: node-a (2 pods pending)",
	}, {
		name:   "a caa process restarted",
		change: func(_ *Timeline, o *Outcome, _ []NodeRow) { o.Trouble = []string{"caa-x Restarted on node-a (v2)"} },
		fact:   6,
		want:   "VIOLATED: 1 caa process event(s) of trouble: caa-x Restarted on node-a (v2)",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tl := synthetic()
			o, rows := goodOutcome()
			tt.change(&tl, &o, rows)
			facts := Facts(tl, o, rows)
			assert.Equal(t, tt.want, facts[tt.fact])

			r := Report{Title: "t", Start: o.Start, Rows: rows, Facts: facts}
			assert.Contains(t, r.Markdown(), "- "+tt.want+"\n", "the report prints the computed sentence")
		})
	}
}

func TestSVGIsWellFormedAndDrawsEveryLane(t *testing.T) {
	tl := synthetic()
	tl.Marks = append(tl.Marks, Mark{At: at(13), Label: `<b>&"quoted"`})
	svg := SVG(tl, "rollout <2 nodes>", at(9))

	dec := xml.NewDecoder(strings.NewReader(svg))
	counts := map[string]int{}
	var texts []string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "the SVG parses as XML")
		switch el := tok.(type) {
		case xml.StartElement:
			counts[el.Name.Local]++
		case xml.CharData:
			texts = append(texts, string(el))
		}
	}
	assert.Equal(t, 1, counts["svg"])
	assert.Equal(t, 2, counts["polyline"], "one VM line per node")
	// Each node's strip: not ready, ready, not ready, ready.
	assert.Equal(t, 1+4+4+4+4, counts["rect"], "the background, and four readiness and four reconciling segments per node")
	joined := strings.Join(texts, "|")
	for _, want := range []string{"node-a", "node-b", "rollout <2 nodes>", "image caa:v2", `<b>&"quoted"`, "10 VMs", "-8s", "0s", "2s", "10s"} {
		assert.Contains(t, joined, want)
	}
	assert.Contains(t, svg, `fill="#d9534f"`, "red for a node without a ready caa")
	assert.Contains(t, svg, `fill="#5cb85c"`, "green for a node with one")
}

func TestSVGOfAnEmptyTimeline(t *testing.T) {
	svg := SVG(Timeline{Nodes: []string{"n"}}, "empty", t0)
	require.NoError(t, xml.Unmarshal([]byte(svg), new(struct{})), "still a document")
}
