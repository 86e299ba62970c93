// Command benchreport turns `go test -bench -count N` output into a markdown
// summary: every benchmark's min / median / max per unit, then each target
// of the project set beside its measured median and, where one is stated,
// its lower bound. It reads stdin and writes stdout; `make bench` runs it.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// target is one promise the project makes about a benchmark. Median is
// compared with Limit; when Bound names another benchmark, the ratio to
// that benchmark's median (the physical floor) is printed too.
type target struct {
	What   string
	Bench  string
	Unit   string
	AtMost bool // true: median must be <= Limit; false: >= Limit
	Limit  float64
	Bound  string // benchmark whose median (same unit) is the lower bound
	// MaxRatio, when set, is the target as a multiple of the bound.
	MaxRatio float64
	// PerCall, when set, makes the bound the benchmark's own median
	// calls/op times this latency: calls in sequence can go no faster.
	PerCall float64
	Note    string
}

var targets = []target{
	{
		What: "open + full scan, 100k records", Bench: "BenchmarkOpenScan100k", Unit: "ms/op", AtMost: true, Limit: 200,
		Note: "read-only open, decode every record, close",
	},
	{
		What: "batched durable writes", Bench: "BenchmarkPutBatched", Unit: "records/s", Limit: 5000,
		Note: "100 records per fsynced transaction",
	},
	{
		What: "durable single put", Bench: "BenchmarkPutDurable", Unit: "ns/op", Bound: "BenchmarkFsyncFloor", MaxRatio: 3,
		Note: "one fsynced transaction per record; bound: bbolt's two page writes, each followed by fdatasync",
	},
}

func init() {
	// Every provider benchmark at 50 ms per call: the floor is its calls in
	// sequence times the latency (IBM's List runs two listings side by side,
	// so its floor is half its calls).
	for _, cloud := range []string{"AWS", "Azure", "IBMCloud"} {
		for _, op := range []string{"List1000", "CreateDelete"} {
			t := target{
				What: cloud + " " + op + " at 50 ms/call", Bench: "Benchmark" + cloud + "/latency=50ms/" + op,
				Unit: "ns/op", PerCall: 50e6, Note: "bound: calls/op x 50 ms",
			}
			if cloud == "IBMCloud" && op == "List1000" {
				t.PerCall, t.Note = 25e6, "bound: calls/op x 50 ms / 2, two listings in flight"
			}
			targets = append(targets, t)
		}
	}
}

// sample is every value seen for one benchmark and unit.
type sample map[string]map[string][]float64

func main() {
	s, order, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	if len(order) == 0 {
		fmt.Fprintln(os.Stderr, "benchreport: no benchmark lines on stdin")
		os.Exit(1)
	}
	if failed := report(os.Stdout, s, order); failed > 0 {
		fmt.Fprintf(os.Stderr, "benchreport: %d target(s) missed\n", failed)
		os.Exit(1)
	}
}

// parse reads lines like
//
//	BenchmarkGet-2   500000   2345 ns/op   120 B/op   3 allocs/op   1.2 ms/op
func parse(r io.Reader) (sample, []string, error) {
	s := sample{}
	var order []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := trimProcs(f[0])
		if s[name] == nil {
			s[name] = map[string][]float64{}
			order = append(order, name)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: value %q: %w", name, f[i], err)
			}
			s[name][f[i+1]] = append(s[name][f[i+1]], v)
		}
	}
	return s, order, sc.Err()
}

// trimProcs drops the -GOMAXPROCS suffix go test adds to a name.
func trimProcs(name string) string {
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			return name[:i]
		}
	}
	return name
}

func stats(vs []float64) (lo, med, hi float64) {
	v := slices.Clone(vs)
	slices.Sort(v)
	n := len(v)
	med = v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return v[0], med, v[n-1]
}

func report(w io.Writer, s sample, order []string) (failed int) {
	fmt.Fprintf(w, "Machine: %s/%s, %d CPUs (GOMAXPROCS %d).\n\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0))
	fmt.Fprintln(w, "| benchmark | unit | runs | min | median | max |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|")
	for _, name := range order {
		units := make([]string, 0, len(s[name]))
		for u := range s[name] {
			units = append(units, u)
		}
		slices.Sort(units)
		for _, u := range units {
			lo, med, hi := stats(s[name][u])
			fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s |\n", strings.TrimPrefix(name, "Benchmark"), u, len(s[name][u]), num(lo), num(med), num(hi))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | measured median | target | lower bound | ratio to bound | result |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---|")
	for _, t := range targets {
		vs := s[t.Bench][t.Unit]
		if len(vs) == 0 {
			fmt.Fprintf(w, "| %s | not run | | | | skipped |\n", t.What)
			continue
		}
		_, med, _ := stats(vs)
		goal, bound, ratio, result := "-", "-", "-", "measured"
		if t.Limit > 0 {
			op := ">="
			ok := med >= t.Limit
			if t.AtMost {
				op, ok = "<=", med <= t.Limit
			}
			goal = op + " " + num(t.Limit) + " " + t.Unit
			result = "pass"
			if !ok {
				result = "MISS"
				failed++
			}
		}
		var bv []float64
		if t.PerCall > 0 {
			if calls := s[t.Bench]["calls/op"]; len(calls) > 0 {
				_, c, _ := stats(calls)
				bv = []float64{c * t.PerCall}
			}
		} else {
			bv = s[t.Bound][t.Unit]
		}
		if len(bv) > 0 {
			_, bmed, _ := stats(bv)
			bound = withUnit(bmed, t.Unit)
			ratio = fmt.Sprintf("%.2fx", med/bmed)
			if t.MaxRatio > 0 {
				goal, result = fmt.Sprintf("<= %.2gx bound", t.MaxRatio), "pass"
				if med/bmed > t.MaxRatio {
					result = "MISS"
					failed++
				}
			}
		}
		fmt.Fprintf(w, "| %s (%s) | %s | %s | %s | %s | %s |\n", t.What, t.Note, withUnit(med, t.Unit), goal, bound, ratio, result)
	}
	return failed
}

// withUnit prints a value with its unit, nanoseconds as milliseconds.
func withUnit(v float64, unit string) string {
	if unit == "ns/op" {
		return num(v/1e6) + " ms/op"
	}
	return num(v) + " " + unit
}

func num(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
