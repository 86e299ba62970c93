package rollout

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"
)

// Picture geometry, in SVG user units.
const (
	svgWidth   = 960
	laneLeft   = 110 // room for the node names
	laneRight  = 20
	laneTop    = 80 // room for the title, the legend and the marks' labels
	laneHeight = 96
	bandHeight = 14 // the readiness strip under each lane's VM line
	// procBandHeight is the strip under it: a caa process reconciling.
	procBandHeight = 6
	axisHeight     = 40
)

// SVG draws tl as one lane per node: a strip that is green while the node
// has a serving caa and red while not, and above it the node's running VM
// count as a step line (its scale from 0 to the largest count seen), with
// a dashed vertical line for each mark. Times are seconds after start.
func SVG(tl Timeline, title string, start time.Time) string {
	first, last := tl.Span()
	if first.IsZero() {
		first, last = start, start.Add(time.Second)
	}
	if start.Before(first) {
		first = start
	}
	if !last.After(first) {
		last = first.Add(time.Second)
	}
	// A margin after the last event, so the final state shows as a band
	// and not a sliver.
	last = last.Add(last.Sub(first) / 20)
	plotW := float64(svgWidth - laneLeft - laneRight)
	x := func(t time.Time) float64 {
		return laneLeft + plotW*t.Sub(first).Seconds()/last.Sub(first).Seconds()
	}
	height := laneTop + laneHeight*len(tl.Nodes) + axisHeight
	ready, vms := tl.NodeReady(), tl.NodeVMs()
	maxVMs := 1
	for _, steps := range vms {
		for _, s := range steps {
			maxVMs = max(maxVMs, s.Value)
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", laneLeft, html.EscapeString(title))
	fmt.Fprintf(&b, `<text x="%d" y="38" fill="#555">green: the node has a Ready caa pod · red: it has none · line: running VMs (0–%d)</text>`+"\n", laneLeft, maxVMs)
	reconciling := tl.NodeReconciling()
	if len(tl.Procs) > 0 {
		fmt.Fprintf(&b, `<text x="%d" y="52" fill="#555">thin strip below: a caa process of the node reconciles (ready on /status, not handing over) · red: none does</text>`+"\n", laneLeft)
	}

	for i, node := range tl.Nodes {
		top := float64(laneTop + i*laneHeight)
		bandY := top + laneHeight - bandHeight - 12
		lineTop, lineBottom := top+8, bandY-6
		fmt.Fprintf(&b, `<text x="10" y="%.1f" font-weight="bold">%s</text>`+"\n", bandY+bandHeight-2, html.EscapeString(node))
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", laneLeft, lineBottom, svgWidth-laneRight, lineBottom)
		// The readiness strip, and under it the reconciling strip.
		strip := func(steps []Step, y float64, h int) {
			for j, s := range steps {
				from := s.At
				if from.Before(first) {
					from = first
				}
				to := last
				if j+1 < len(steps) {
					to = steps[j+1].At
				}
				color := "#d9534f"
				if s.Value == 1 {
					color = "#5cb85c"
				}
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="%s"/>`+"\n",
					x(from), y, math.Max(x(to)-x(from), 0.5), h, color)
			}
		}
		strip(ready[node], bandY, bandHeight)
		if len(tl.Procs) > 0 {
			strip(reconciling[node], bandY+bandHeight+2, procBandHeight)
		}
		// The VM count.
		y := func(v int) float64 { return lineBottom - (lineBottom-lineTop)*float64(v)/float64(maxVMs) }
		var pts []string
		prev := -1
		for _, s := range vms[node] {
			at := s.At
			if at.Before(first) {
				at = first
			}
			if prev >= 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(at), y(prev)))
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(at), y(s.Value)))
			prev = s.Value
		}
		if prev >= 0 {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(last), y(prev)))
			fmt.Fprintf(&b, `<polyline fill="none" stroke="#337ab7" stroke-width="2" points="%s"/>`+"\n", strings.Join(pts, " "))
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" fill="#337ab7">%d VMs</text>`+"\n", 10, lineTop+12, prev)
		}
	}

	// The time axis.
	axisY := float64(laneTop + laneHeight*len(tl.Nodes) + 5)
	fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#333"/>`+"\n", laneLeft, axisY, svgWidth-laneRight, axisY)
	step := tickStep(last.Sub(first))
	for t := math.Ceil(first.Sub(start).Seconds()/step) * step; ; t += step {
		at := start.Add(time.Duration(t * float64(time.Second)))
		if at.After(last) {
			break
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", x(at), axisY, x(at), axisY+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%gs</text>`+"\n", x(at), axisY+18, t)
	}
	for i, m := range tl.Marks {
		// Alternate label rows, so marks close in time stay legible.
		labelY := laneTop - 8 - 13*(i%2)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="4 3"/>`+"\n", x(m.At), labelY+2, x(m.At), axisY)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#555" font-size="11">%s</text>`+"\n", x(m.At)+3, labelY, html.EscapeString(m.Label))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// tickStep picks a tick interval (seconds) giving about ten ticks.
func tickStep(span time.Duration) float64 {
	for _, s := range []float64{0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300} {
		if span.Seconds()/s <= 12 {
			return s
		}
	}
	return 600
}
