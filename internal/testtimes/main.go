// Command testtimes sits behind `go test -json`: it prints what go test
// would have printed (every Output line, unchanged, so CI and people read
// the usual "ok"/"FAIL" lines) and, at the end, where the time went: each
// package's wall time and the slowest top-level tests. `make test` pipes
// through it and keeps the report in .cache/test-times; docs/test-times.md
// holds a dated copy from a clean clone.
//
// When a test failed, its assertion reports (testify's Error Trace, Error
// and Messages, with the line that names the test file) are printed once
// more at the end, after the last package: a failing test's own output can
// be thousands of log lines, and a CI excerpt shows the end.
//
// It exits 1 when any package or test failed, so a pipeline fails even in
// a shell without pipefail.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// event is the part of test2json's record that the report needs.
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// timing is one package's or one test's outcome.
type timing struct {
	Package string
	Test    string
	Seconds float64
	Result  string // pass, fail, skip
}

// failure is a failed test's assertion reports.
type failure struct {
	Package, Test string
	Reports       []string
}

// summary is what a run left: every package and every top-level test.
type summary struct {
	Packages []timing
	Tests    []timing
	Failed   bool
	Failures []failure
	First    time.Time
	Last     time.Time
}

// read copies the output to out as go test without -v prints it (a test's
// lines only when it fails; the package's own lines always, but for the
// bare PASS) and gathers the timings. A line that is not JSON (go vet's or
// the build's own text) is copied as it is.
func read(in io.Reader, out io.Writer) (summary, error) {
	var s summary
	held := map[[2]string][]string{} // a running test's lines, by package and test
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			if _, err := fmt.Fprintf(out, "%s\n", line); err != nil {
				return s, fmt.Errorf("write output: %w", err)
			}
			continue
		}
		if !e.Time.IsZero() {
			if s.First.IsZero() || e.Time.Before(s.First) {
				s.First = e.Time
			}
			if e.Time.After(s.Last) {
				s.Last = e.Time
			}
		}
		key := [2]string{e.Package, e.Test}
		switch e.Action {
		case "output", "build-output":
			if e.Test != "" {
				held[key] = append(held[key], e.Output)
				continue
			}
			if e.Output == "PASS\n" {
				continue
			}
			if _, err := io.WriteString(out, e.Output); err != nil {
				return s, fmt.Errorf("write output: %w", err)
			}
		case "build-fail":
			s.Failed = true
		case "pass", "fail", "skip":
			lines := held[key]
			delete(held, key)
			if e.Action == "fail" {
				s.Failed = true
				if _, err := io.WriteString(out, strings.Join(lines, "")); err != nil {
					return s, fmt.Errorf("write output: %w", err)
				}
				if e.Test != "" {
					s.Failures = append(s.Failures, failure{Package: e.Package, Test: e.Test, Reports: assertions(lines)})
				}
			}
			t := timing{Package: e.Package, Test: e.Test, Seconds: e.Elapsed, Result: e.Action}
			switch {
			case e.Test == "":
				s.Packages = append(s.Packages, t)
			case !strings.Contains(e.Test, "/"):
				s.Tests = append(s.Tests, t)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return s, fmt.Errorf("read go test -json: %w", err)
	}
	return s, nil
}

// Limits on what a failure summary repeats.
const (
	maxReportLines = 40  // per test
	maxLineLen     = 500 // characters of one line
)

// assertions picks testify's reports out of a test's lines: the line that
// names the file and line ("    x_test.go:12: "), then the indented
// "Error:", "Test:" and "Messages:" lines and their continuations (the
// trace is left out: the file:line names the place).
func assertions(lines []string) []string {
	var out []string
	for i := 0; i < len(lines) && len(out) < maxReportLines; i++ {
		if !strings.Contains(lines[i], "\tError Trace:\t") {
			continue
		}
		if i > 0 {
			out = append(out, clip(lines[i-1]))
		}
		for ; i < len(lines) && strings.HasPrefix(lines[i], "        \t") && len(out) < maxReportLines; i++ {
			if !strings.Contains(lines[i], "\tError Trace:\t") {
				out = append(out, clip(lines[i]))
			}
		}
	}
	return out
}

func clip(line string) string {
	line = strings.TrimRight(line, "\n")
	if len(line) > maxLineLen {
		line = line[:maxLineLen] + " [...]"
	}
	return line
}

// writeFailures prints each failed test's assertion reports. go test
// -json gives a subtest's lines to the subtest, so a parent that failed
// only through its subtests has none of its own: it is left out when one
// of them is listed.
func writeFailures(w io.Writer, fs []failure) error {
	if len(fs) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("testtimes: the failed tests' assertions, again:\n")
	for _, f := range fs {
		if len(f.Reports) == 0 && slices.ContainsFunc(fs, func(o failure) bool {
			return o.Package == f.Package && strings.HasPrefix(o.Test, f.Test+"/")
		}) {
			continue
		}
		fmt.Fprintf(&b, "--- %s (%s)\n", f.Test, f.Package)
		if len(f.Reports) == 0 {
			b.WriteString("    no testify report (t.Fatal or a panic): its output is above\n")
		}
		for _, r := range f.Reports {
			b.WriteString(r + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// slowest sorts by time, slowest first, and keeps n (all when n <= 0).
func slowest(ts []timing, n int) []timing {
	ts = slices.Clone(ts)
	slices.SortStableFunc(ts, func(a, b timing) int {
		switch {
		case a.Seconds > b.Seconds:
			return -1
		case a.Seconds < b.Seconds:
			return 1
		}
		return strings.Compare(a.Package+a.Test, b.Package+b.Test)
	})
	if n > 0 && len(ts) > n {
		ts = ts[:n]
	}
	return ts
}

// report writes the markdown report: the run's span, the packages by wall
// time and the slowest n top-level tests.
func report(w io.Writer, s summary, n int, load string) error {
	b := &strings.Builder{}
	var sum float64
	for _, p := range s.Packages {
		sum += p.Seconds
	}
	fmt.Fprintf(b, "Run ended %s on %d cores", s.Last.UTC().Format(time.RFC3339), runtime.NumCPU())
	if load != "" {
		fmt.Fprintf(b, "; load average before: %s", load)
	}
	fmt.Fprintf(b, ".\nWall time from the first event to the last: %s; packages' own times added up: %s (they overlap: go test runs packages side by side).\n\n",
		s.Last.Sub(s.First).Round(time.Second), (time.Duration(sum * float64(time.Second))).Round(time.Second))
	fmt.Fprintf(b, "| package | seconds | result |\n|---|---:|---|\n")
	for _, p := range slowest(s.Packages, 0) {
		if p.Seconds < 0.5 && p.Result == "pass" {
			continue // the many quick ones say nothing about where time goes
		}
		fmt.Fprintf(b, "| %s | %.1f | %s |\n", p.Package, p.Seconds, p.Result)
	}
	fmt.Fprintf(b, "\nThe %d slowest top-level tests (a parallel test's time overlaps others'):\n\n| test | package | seconds | result |\n|---|---|---:|---|\n", n)
	for _, t := range slowest(s.Tests, n) {
		fmt.Fprintf(b, "| %s | %s | %.1f | %s |\n", t.Test, t.Package, t.Seconds, t.Result)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func main() {
	out := flag.String("report", "", "also write the markdown report to this file")
	n := flag.Int("top", 30, "how many of the slowest tests to list")
	loadFile := flag.String("load-before", "", "a copy of /proc/loadavg from before the run, quoted in the report")
	flag.Parse()
	if err := run(os.Stdin, os.Stdout, *out, *n, *loadFile); err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(1)
	}
}

var errFailed = errors.New("some packages or tests failed (their output is above)")

func run(in io.Reader, stdout io.Writer, out string, n int, loadFile string) error {
	s, err := read(in, stdout)
	if err != nil {
		return err
	}
	var load string
	if loadFile != "" {
		if b, err := os.ReadFile(loadFile); err == nil {
			f := strings.Fields(string(b))
			load = strings.Join(f[:min(3, len(f))], " ")
		}
	}
	if out != "" {
		f, err := os.Create(out)
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		if err := report(f, s, n, load); err != nil {
			f.Close()
			return fmt.Errorf("report %s: %w", out, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("report %s: %w", out, err)
		}
		fmt.Fprintf(stdout, "testtimes: the slowest packages and tests are in %s\n", out)
	}
	if s.Failed {
		if err := writeFailures(stdout, s.Failures); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
		return errFailed
	}
	return nil
}
