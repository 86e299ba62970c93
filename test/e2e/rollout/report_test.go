package rollout

import (
	"encoding/xml"
	"io"
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
	}
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
			{Node: "node-a", OldPod: "a1", NewPod: "a2", OldStopAt: at(10), OldGoneAt: at(12), NewReadyAt: at(14),
				PeerPods: 10, Adopted: 10, CaaTimeToReady: 1200 * time.Millisecond},
			{Node: "node-b", OldPod: "b1", NewPod: "b2", OldStopAt: at(15), OldGoneAt: at(16), NewReadyAt: at(19),
				PeerPods: 10, Adopted: 7, Recreated: 3},
		},
		Facts: []string{"at most 1 node without a ready caa"},
	}
	md := r.Markdown()
	assert.Contains(t, md, "# caa rollout: 2 nodes\n")
	assert.Contains(t, md, "| node-a | a1 | +1.0s | +3.0s | a2 | +5.0s | 4.00s | 10 | 10 | 0 | 1.20s |\n")
	assert.Contains(t, md, "| node-b | b1 | +6.0s | +7.0s | b2 | +10.0s | 4.00s | 10 | 7 | 3 | — |\n")
	assert.Contains(t, md, "- at most 1 node without a ready caa\n")
	assert.Contains(t, md, "](rollout-timeline.svg)")
	assert.Equal(t, "-2.0s", Report{Start: at(9)}.at(at(7)))
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
	assert.Equal(t, 1+4+4, counts["rect"], "the background and four readiness segments per node")
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
