package main

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// Plot geometry, in SVG user units.
const (
	plotW, plotH             = 640, 400
	marginL, marginR         = 70, 150
	marginT, marginB         = 30, 50
	innerW, innerH   float64 = plotW - marginL - marginR, plotH - marginT - marginB
)

var cloudColours = map[string]string{"aws": "#d97706", "azure": "#2563eb", "ibmcloud": "#059669"}

// PlotSVG draws S1's median time to ready against N, one solid line per
// cloud, its lower bound dashed in the same colour, min-max as a bar.
func PlotSVG(points []PlotPoint) string {
	byCloud := map[string][]PlotPoint{}
	var clouds []string
	maxN, maxY := 1.0, 1.0
	for _, p := range points {
		if _, ok := byCloud[p.Cloud]; !ok {
			clouds = append(clouds, p.Cloud)
		}
		byCloud[p.Cloud] = append(byCloud[p.Cloud], p)
		maxN = math.Max(maxN, float64(p.N))
		maxY = math.Max(maxY, math.Max(p.Max, p.BoundMs))
	}
	maxY = niceCeil(maxY)
	x := func(n int) float64 { return marginL + float64(n)/maxN*innerW }
	y := func(v float64) float64 { return marginT + innerH - v/maxY*innerH }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="18" font-size="14">S1 warm restart: time to ready (ms) against peer pods N</text>`+"\n", marginL)
	// Axes and ticks.
	fmt.Fprintf(&b, `<path d="M%.1f %.1f V%.1f H%.1f" stroke="black" fill="none"/>`+"\n", float64(marginL), float64(marginT), marginT+innerH, marginL+innerW)
	for i := 0; i <= 4; i++ {
		v := maxY * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginL-6, y(v)+4, Num(v))
		fmt.Fprintf(&b, `<path d="M%d %.1f H%.1f" stroke="#ddd"/>`+"\n", marginL, y(v), marginL+innerW)
	}
	var ns []int
	for _, p := range points {
		if !slices.Contains(ns, p.N) {
			ns = append(ns, p.N)
		}
	}
	for _, n := range ns {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", x(n), marginT+innerH+16, n)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">N (peer pods on the node)</text>`+"\n", marginL+innerW/2, plotH-10)
	for i, c := range clouds {
		ps := byCloud[c]
		slices.SortFunc(ps, func(a, b PlotPoint) int { return a.N - b.N })
		colour := cloudColours[c]
		if colour == "" {
			colour = "#555"
		}
		var line, bound []string
		for _, p := range ps {
			line = append(line, fmt.Sprintf("%.1f,%.1f", x(p.N), y(p.Median)))
			bound = append(bound, fmt.Sprintf("%.1f,%.1f", x(p.N), y(p.BoundMs)))
			fmt.Fprintf(&b, `<path d="M%.1f %.1f V%.1f" stroke="%s" stroke-width="3" opacity="0.4"/>`+"\n", x(p.N), y(p.Min), y(p.Max), colour)
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(p.N), y(p.Median), colour)
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(line, " "), colour)
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5" stroke-dasharray="5,4"/>`+"\n", strings.Join(bound, " "), colour)
		ly := marginT + 20 + float64(i)*36
		lx := marginL + innerW + 14
		fmt.Fprintf(&b, `<path d="M%.1f %.1f h24" stroke="%s" stroke-width="2"/><text x="%.1f" y="%.1f">%s</text>`+"\n", lx, ly, colour, lx+30, ly+4, html.EscapeString(c))
		fmt.Fprintf(&b, `<path d="M%.1f %.1f h24" stroke="%s" stroke-dasharray="5,4"/><text x="%.1f" y="%.1f">bound</text>`+"\n", lx, ly+16, colour, lx+30, ly+20)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to a round number: a power of ten times one of a
// few steps whose quarters are round too.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.2, 1.6, 2, 2.4, 3, 4, 5, 6, 8, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}
