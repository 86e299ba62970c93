// Command bench runs caa's benchmark scenarios (S1 warm restart, S2
// recreate storm, S4 memory, S5 apiserver cost, S6 the fleet, S7 the surge
// hand-over, S8 the remote hypervisor mode, S9 a rolling update of caa
// with the agent sockets in caa relay) with the real caa binary,
// a real kube-apiserver and the fake clouds, joins them with the ledger's
// Go benchmarks (S3, summarised by internal/benchreport), and writes the
// results, their raw data, the S1 plot and the README's Benchmarks section.
// `make bench` runs it; `make bench-quick` is the short version.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// bench is one run of the program: its settings and where it works.
type bench struct {
	caa string
	// caaAWS is caa built with the EC2 provider only (-tags caa_aws), as
	// an AWS node would run it; empty when -caa names a binary.
	caaAWS   string
	count    int
	ns       []int
	clouds   []string
	others   []int
	s5Window time.Duration
	s6cfg    s6Config
	// s10N: S10's sandboxes at once; s11Ns, s11Slots, s11Cycles: S11's
	// sandbox counts, the slots its cycles reuse and the cycles.
	s10N      int
	s11Ns     []int
	s11Cycles int
	s11Heap   string
	// s12Idle is S12's idle window (20 s with -quick).
	s12Idle time.Duration
	dir     string
	logf    func(string, ...any)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
	}
	os.Exit(code)
}

func run(ctx context.Context, args []string) (int, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var (
		caaBin    = fs.String("caa", "", "caa binary (default: build one)")
		count     = fs.Int("count", 5, "runs per case")
		quick     = fs.Bool("quick", false, "development run: count 1, N up to 1,000, short windows; no README")
		nsFlag    = fs.String("n", "100,1000,5000", "S1: peer pods on the node")
		clouds    = fs.String("clouds", "aws,azure,ibmcloud", "S1: clouds")
		others    = fs.String("others", "0,5000,10000", "S4: pods on other nodes")
		window    = fs.Duration("s5-window", 2*time.Minute, "S5: steady-state window")
		scenarios = fs.String("scenarios", "s1,s2,s4,s5,s6,s6-kata,s7,s8,s9,s10,s11", "scenarios to run (s6-kata, s8, s9, s10, s11 and s12 need root; s12, caa beside upstream's cloud-api-adaptor, "+
			"also UPSTREAM_SRC, and runs only when named)")
		s10N      = fs.Int("s10-sandboxes", 100, "S10 and S12: sandboxes started at once (10 with -quick)")
		s11Ns     = fs.String("s11-sandboxes", "0,10,100", "S11: sandbox counts measured, growing; the last is the slots the cycles reuse (0,10 with -quick)")
		s11Cycles = fs.Int("s11-cycles", 1000, "S11: StartVM/StopVM cycles over the slots (100 with -quick)")
		s11Heap   = fs.String("s11-heap-profiles", "", "S11: run caa with --pprof-addr and save its heap profiles before and after the cycles in this directory "+
			"(s11-heap-before.pb.gz, s11-heap-after.pb.gz; compare with go tool pprof -base)")
		s6Nodes  = fs.Int("s6-nodes", 0, "S6: caa processes in the fleet (default 24; 5 with -quick)")
		s6Pods   = fs.Int("s6-pods", 0, "S6: peer pods per node (default 30; 10 with -quick)")
		s6Others = fs.String("s6-others", "", "S6: VMs of other nodes for the startup cases, growing (default 0,5000,20000; 0,2000 with -quick)")
		merge    = fs.Bool("merge", false, "keep the other scenarios of <out>/results.json and replace only those run (e.g. -scenarios s6 -merge)")
		out      = fs.String("out", "docs/bench", "directory for results.md, results.json and the S1 plot")
		gobench  = fs.String("gobench", "", "S3: benchreport's summary of the Go benchmarks (markdown)")
		loadFile = fs.String("load-before", "", "file holding /proc/loadavg from before `make bench` began")
		readme   = fs.String("readme", "", "README to regenerate between the bench markers from <out>/results.json")
		onlyMD   = fs.Bool("readme-only", false, "only regenerate -readme from the results file; run nothing")
		keep     = fs.Bool("keep", false, "keep the work directory (caa logs, ledgers, server logs)")
		cpuprof  = fs.String("cpuprofile", "", "write a CPU profile of this process (the fake clouds and the proxy) to this file")
	)
	if err := fs.Parse(args); err != nil {
		return 2, nil
	}
	if *onlyMD {
		return 0, regenerate(*out, *readme)
	}
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			return 1, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return 1, err
		}
		defer pprof.StopCPUProfile()
	}
	b := &bench{caa: *caaBin, count: *count, clouds: split(*clouds), s5Window: *window,
		logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+f+"\n", a...) }}
	var err error
	if b.ns, err = ints(*nsFlag); err != nil {
		return 2, err
	}
	if b.others, err = ints(*others); err != nil {
		return 2, err
	}
	b.s6cfg = s6Full()
	b.s10N, b.s11Cycles, b.s11Heap, b.s12Idle = *s10N, *s11Cycles, *s11Heap, s12IdleWindow
	if b.s11Ns, err = ints(*s11Ns); err != nil {
		return 2, err
	}
	if *quick {
		b.s10N, b.s11Ns, b.s11Cycles = min(b.s10N, 10), []int{0, 10}, min(b.s11Cycles, 100)
		b.s12Idle = 20 * time.Second
		b.count, b.s5Window = 1, 30*time.Second
		b.ns = []int{100, 1000}
		b.others = []int{0, 2000}
		b.s6cfg = s6Quick()
	}
	if *s6Nodes > 0 {
		b.s6cfg.nodes = *s6Nodes
	}
	if *s6Pods > 0 {
		b.s6cfg.pods = *s6Pods
	}
	if *s6Others != "" {
		if b.s6cfg.others, err = ints(*s6Others); err != nil {
			return 2, err
		}
	}
	res := Results{Count: b.count, Started: time.Now(), Machine: machine(), Quick: *quick}
	res.LoadBefore = loadavg()
	if *loadFile != "" {
		// make bench wrote the file as it began: its load average, and
		// its time as the start of the whole run.
		data, err := os.ReadFile(*loadFile)
		if err != nil {
			return 1, fmt.Errorf("-load-before: %w", err)
		}
		res.LoadBefore = firstFields(string(data), 3)
		if st, err := os.Stat(*loadFile); err == nil {
			res.Started = st.ModTime()
		}
	}
	if b.dir, err = os.MkdirTemp("", "caa-bench-"); err != nil {
		return 1, err
	}
	if !*keep {
		defer os.RemoveAll(b.dir)
	}
	if b.caa == "" {
		b.caa = filepath.Join(b.dir, "caa")
		b.logf("building caa")
		if err := cluster.BuildCaa(ctx, b.caa, ""); err != nil {
			return 1, err
		}
		b.caaAWS = filepath.Join(b.dir, "caa-aws")
		if err := cluster.BuildCaa(ctx, b.caaAWS, "", "caa_aws"); err != nil {
			return 1, err
		}
	}
	if *gobench != "" {
		data, err := os.ReadFile(*gobench)
		if err != nil {
			return 1, fmt.Errorf("-gobench: %w", err)
		}
		res.GoBench = string(data)
	}
	for _, s := range split(*scenarios) {
		var sc Scenario
		start := time.Now()
		switch s {
		case "s1":
			sc, res.Plot, err = b.s1(ctx)
		case "s2":
			sc, err = b.s2(ctx)
		case "s4":
			sc, err = b.s4(ctx)
		case "s5":
			sc, err = b.s5(ctx)
		case "s6":
			sc, err = b.s6(ctx)
		case "s7":
			sc, err = b.s7(ctx)
		case "s8":
			sc, err = b.s8(ctx)
		case "s9":
			sc, err = b.s9(ctx)
		case "s10":
			sc, err = b.s10(ctx)
		case "s11":
			sc, err = b.s11(ctx)
		case "s12":
			sc, err = b.s12(ctx)
		case "s6-kata", "s6kata":
			sc, err = b.s6kata(ctx)
		default:
			return 2, fmt.Errorf("-scenarios: unknown %q", s)
		}
		if err != nil {
			return 1, fmt.Errorf("%s: %w (logs in %s)", s, err, b.dir)
		}
		b.logf("%s done in %s", s, time.Since(start).Round(time.Second))
		sc.Took = time.Since(start).Round(time.Second).String()
		res.Scenarios = append(res.Scenarios, sc)
	}
	res.Finished = time.Now()
	res.LoadAfter = loadavg()
	if *merge {
		if res, err = mergeInto(*out, res); err != nil {
			return 1, err
		}
	}
	if err := res.Write(os.Stdout, *out); err != nil {
		return 1, err
	}
	if *readme != "" && !*quick {
		if err := regenerate(*out, *readme); err != nil {
			return 1, err
		}
	}
	if n := res.Misses(); n > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d target(s) missed; see %s\n", n, filepath.Join(*out, "results.md"))
		return 1, nil
	}
	return 0, nil
}

// caaArgs are the flags of every caa run; extra flags come last and win.
func (b *bench) caaArgs(f *fakeCloud, node, kubeconfig, ledgerPath string, extra ...string) []string {
	args := append([]string{"--node-name", node, "--kubeconfig", kubeconfig, "--ledger", ledgerPath,
		"--log-format", "json"}, f.flags...)
	return append(args, extra...)
}

// logPath is where a caa run writes its output (one file per label).
func (b *bench) logPath(label string) string { return filepath.Join(b.dir, "caa-"+label+".log") }

// regenerate rewrites the README section from the results file.
func regenerate(out, readme string) error {
	data, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		return fmt.Errorf("read results: %w", err)
	}
	var res Results
	if err := json.Unmarshal(data, &res); err != nil {
		return fmt.Errorf("parse results: %w", err)
	}
	text, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(readme), out)
	if err != nil {
		return err
	}
	updated, err := Splice(string(text), res.ReadmeSection(filepath.ToSlash(rel)))
	if err != nil {
		return fmt.Errorf("%s: %w", readme, err)
	}
	return os.WriteFile(readme, []byte(updated), 0o644)
}

// firstFields is the first n whitespace-separated fields of s.
func firstFields(s string, n int) string {
	f := strings.Fields(s)
	if len(f) > n {
		f = f[:n]
	}
	return strings.Join(f, " ")
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func ints(s string) ([]int, error) {
	var out []int
	for _, p := range split(s) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a count", p)
		}
		out = append(out, n)
	}
	return out, nil
}
