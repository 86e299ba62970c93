package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Row is one measured quantity of one case of a scenario: every run's
// value, and what it is judged against (a multiple of a lower bound, or an
// absolute limit), if anything.
type Row struct {
	Case   string    `json:"case"`
	Metric string    `json:"metric"`
	Unit   string    `json:"unit"`
	Runs   []float64 `json:"runs"`
	// Bound is the lower bound in Unit (0: none); BoundNote says how it
	// was made up.
	Bound     float64 `json:"bound,omitempty"`
	BoundNote string  `json:"boundNote,omitempty"`
	// MaxRatio > 0: the median must be <= MaxRatio x Bound.
	MaxRatio float64 `json:"maxRatio,omitempty"`
	// HasLimit: the median must be <= Limit (AtMost) or >= Limit; with
	// EveryRun, every run must (a correctness count, where one bad run is
	// a failure that the median would hide).
	HasLimit bool    `json:"hasLimit,omitempty"`
	Limit    float64 `json:"limit,omitempty"`
	AtMost   bool    `json:"atMost,omitempty"`
	EveryRun bool    `json:"everyRun,omitempty"`
	// Figure, when set, names the row's line in a pivot table (see
	// Scenario.Pivot) and Cell adds to its cell; Hide leaves it out.
	Figure string `json:"figure,omitempty"`
	Cell   string `json:"cell,omitempty"`
	Hide   bool   `json:"hide,omitempty"`
	// Upstream, in a Compare scenario, is upstream cloud-api-adaptor's runs
	// of the same measure (Runs are caa's); Why says in a sentence why the
	// two differ.
	Upstream []float64 `json:"upstream,omitempty"`
	Why      string    `json:"why,omitempty"`
}

// Stats returns the smallest, median and largest run.
func Stats(vs []float64) (lo, med, hi float64) {
	if len(vs) == 0 {
		return 0, 0, 0
	}
	v := slices.Clone(vs)
	slices.Sort(v)
	n := len(v)
	med = v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return v[0], med, v[n-1]
}

// Median of vs (0 for none).
func Median(vs []float64) float64 {
	_, m, _ := Stats(vs)
	return m
}

// Ratio is the median over the bound (0 when there is no bound).
func (r Row) Ratio() float64 {
	if r.Bound <= 0 || len(r.Runs) == 0 {
		return 0
	}
	return Median(r.Runs) / r.Bound
}

// Result is "pass", "MISS", or "measured" for a row with no target.
func (r Row) Result() string {
	if len(r.Runs) == 0 {
		return "not run"
	}
	lo, med, hi := Stats(r.Runs)
	ok, judged := true, false
	if r.MaxRatio > 0 && r.Bound > 0 {
		judged = true
		ok = r.Ratio() <= r.MaxRatio
	}
	if r.HasLimit {
		judged = true
		if r.EveryRun {
			med = hi // the worst run is judged
			if !r.AtMost {
				med = lo
			}
		}
		if r.AtMost {
			ok = ok && med <= r.Limit
		} else {
			ok = ok && med >= r.Limit
		}
	}
	switch {
	case !judged:
		return "measured"
	case ok:
		return "pass"
	}
	return "MISS"
}

// Target says in words what the row is judged against.
func (r Row) Target() string {
	var parts []string
	if r.MaxRatio > 0 {
		parts = append(parts, "<= "+strconv.FormatFloat(r.MaxRatio, 'g', 3, 64)+"x bound")
	}
	if r.HasLimit {
		op := ">="
		if r.AtMost {
			op = "<="
		}
		limit := op + " " + Num(r.Limit) + " " + r.Unit
		if r.EveryRun {
			limit += " in every run"
		}
		parts = append(parts, limit)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// Scenario is one scenario's rows and the facts that explain them.
type Scenario struct {
	ID      string   `json:"id"`
	Title   string   `json:"title"`
	Setup   string   `json:"setup"`
	Rows    []Row    `json:"rows"`
	Details []string `json:"details,omitempty"`
	// Took is how long the scenario ran; Ran, when set, says that it was
	// measured apart from the run the results' header describes.
	Took string `json:"took,omitempty"`
	Ran  string `json:"ran,omitempty"`
	// Pivot: without details (the README), one line per figure and one
	// column per cloud, the cloud being what each case starts with
	// ("aws, idle").
	Pivot bool `json:"pivot,omitempty"`
	// Compare: the rows set caa (Runs) against upstream's adaptor
	// (Upstream), with the ratio and why they differ (S12).
	Compare bool `json:"compare,omitempty"`
}

// Misses counts rows that missed their target.
func (s Scenario) Misses() int {
	n := 0
	for _, r := range s.Rows {
		if r.Result() == "MISS" {
			n++
		}
	}
	return n
}

// WriteMarkdown writes the scenario's heading, setup, table, how each
// bound was made up and, with details, the facts behind the rows.
func (s Scenario) WriteMarkdown(w io.Writer, level string, details bool) {
	fmt.Fprintf(w, "%s %s: %s\n\n", level, s.ID, s.Title)
	if s.Ran != "" {
		fmt.Fprintf(w, "%s\n\n", s.Ran)
	}
	if s.Setup != "" {
		fmt.Fprintf(w, "%s\n\n", s.Setup)
	}
	if s.Pivot && !details {
		s.writePivot(w)
		return
	}
	if s.Compare {
		s.writeCompare(w, details)
		return
	}
	fmt.Fprintln(w, "| case | metric | runs | median | min | max | lower bound | ratio | target | result |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---|---|")
	for _, r := range s.Rows {
		lo, med, hi := Stats(r.Runs)
		bound, ratio := "-", "-"
		if r.Bound > 0 {
			bound = Num(r.Bound) + " " + r.Unit
			ratio = fmt.Sprintf("%.2fx", r.Ratio())
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s %s | %s | %s | %s | %s | %s | %s |\n",
			r.Case, r.Metric, len(r.Runs), Num(med), r.Unit, Num(lo), Num(hi), bound, ratio, r.Target(), r.Result())
	}
	fmt.Fprintln(w)
	var notes []string
	for _, r := range s.Rows {
		if r.BoundNote != "" {
			notes = append(notes, fmt.Sprintf("- bound of %s, %s: %s", r.Case, r.Metric, r.BoundNote))
		}
	}
	if details {
		notes = append(notes, s.Details...)
	}
	for _, d := range notes {
		if !strings.HasPrefix(d, "- ") {
			d = "- " + d
		}
		fmt.Fprintln(w, d)
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
	}
}

// Num prints a value with as many digits as it deserves.
func Num(v float64) string {
	a := v
	if a < 0 {
		a = -a
	}
	switch {
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case a == 0:
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// CountsLine prints counts as "k1 n1, k2 n2" in key order.
func CountsLine[V int64 | float64](m map[string]V) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %v", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// writePivot writes the rows as one line per figure (a case without its
// leading cloud, and a metric) with the target, and one column per cloud
// holding the median (and its ratio to the bound, if any) and the result.
func (s Scenario) writePivot(w io.Writer) {
	var clouds, figures []string
	cells := map[[2]string]Row{}
	targets := map[string]string{}
	for _, r := range s.Rows {
		if r.Hide {
			continue
		}
		cl, rest, _ := strings.Cut(r.Case, ", ")
		fig := r.Metric
		if rest != "" {
			fig = rest + ": " + r.Metric
		}
		if r.Figure != "" {
			fig = r.Figure
		}
		if !slices.Contains(clouds, cl) {
			clouds = append(clouds, cl)
		}
		if !slices.Contains(figures, fig) {
			figures = append(figures, fig)
			targets[fig] = r.Target()
			if r.MaxRatio > 0 && r.BoundNote != "" && !r.HasLimit {
				targets[fig] = "<= " + strconv.FormatFloat(r.MaxRatio, 'g', 3, 64) + "x " + r.BoundNote
			}
		}
		cells[[2]string{fig, cl}] = r
	}
	fmt.Fprintf(w, "| figure | target | %s |\n", strings.Join(clouds, " | "))
	fmt.Fprintf(w, "|---|---|%s\n", strings.Repeat("---:|", len(clouds)))
	for _, fig := range figures {
		line := make([]string, 0, len(clouds))
		for _, cl := range clouds {
			r, ok := cells[[2]string{fig, cl}]
			if !ok {
				line = append(line, "-")
				continue
			}
			cell := Num(Median(r.Runs)) + " " + r.Unit
			if r.Cell != "" {
				cell += " " + r.Cell
			}
			if r.Bound > 0 {
				cell += fmt.Sprintf(" (%.2fx)", r.Ratio())
			}
			if res := r.Result(); res != "measured" {
				cell += " " + res
			}
			line = append(line, cell)
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", fig, targets[fig], strings.Join(line, " | "))
	}
	fmt.Fprintln(w)
}

// writeCompare writes a Compare scenario: per row caa's median, upstream's,
// the ratio caa/upstream and why they differ; with details, the notes.
func (s Scenario) writeCompare(w io.Writer, details bool) {
	fmt.Fprintln(w, "| case | metric | caa | upstream | caa/upstream | why |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---|")
	cell := func(runs []float64, unit string) string {
		if len(runs) == 0 {
			return "not run"
		}
		m := Median(runs)
		c := Num(m) + " " + unit
		if m == math.Trunc(m) {
			c = strconv.FormatFloat(m, 'f', 0, 64) + " " + unit // a count
		}
		if len(runs) > 1 {
			c += fmt.Sprintf(" (median of %d)", len(runs))
		}
		return c
	}
	for _, r := range s.Rows {
		ratio := "-"
		if a, u := Median(r.Runs), Median(r.Upstream); len(r.Runs) > 0 && len(r.Upstream) > 0 {
			switch {
			case u != 0:
				ratio = fmt.Sprintf("%.2fx", a/u)
			case a == 0:
				ratio = "equal"
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.Case, r.Metric, cell(r.Runs, r.Unit), cell(r.Upstream, r.Unit), ratio, r.Why)
	}
	fmt.Fprintln(w)
	if details && len(s.Details) > 0 {
		for _, d := range s.Details {
			if !strings.HasPrefix(d, "- ") {
				d = "- " + d
			}
			fmt.Fprintln(w, d)
		}
		fmt.Fprintln(w)
	}
}
