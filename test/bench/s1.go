package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// s1Latency is the latency injected into every cloud call in S1.
const s1Latency = 50 * time.Millisecond

// PlotPoint is one S1 case for the plot.
type PlotPoint struct {
	Cloud   string  `json:"cloud"`
	N       int     `json:"n"`
	Median  float64 `json:"medianMs"`
	Min     float64 `json:"minMs"`
	Max     float64 `json:"maxMs"`
	BoundMs float64 `json:"boundMs"`
}

// fastCreate are the flags of the setup run that creates every VM: the
// bench's fakes have no limits, so nothing needs pacing.
var fastCreate = []string{"--create-rate", "10000", "--create-burst", "10000", "--create-concurrency", "64"}

// s1 is the warm restart: every pod's VM alive, caa restarted count times
// per (N, cloud), 50 ms per cloud call.
func (b *bench) s1(ctx context.Context) (Scenario, []PlotPoint, error) {
	sc := Scenario{ID: "S1", Title: "warm restart, every VM alive",
		Setup: fmt.Sprintf("N peer pods on one node, every VM alive, %s injected into every cloud call; caa restarted %d times per case "+
			"(SIGTERM, then a new process on the same ledger). Time to ready: from just before the exec to the first `/readyz` 200, "+
			"polled every %s. VMs per listing page: EC2 %d, Azure %d (assumed: the API has no page-size parameter), IBM %d "+
			"(Global Search, 1,000 hits a page, an instance and its boot volume per VM).",
			s1Latency, b.count, readyPoll, listPage["aws"], listPage["azure"], listPage["ibmcloud"])}
	e, err := newEnv(ctx, filepath.Join(b.dir, "s1"), b.logf)
	if err != nil {
		return sc, nil, err
	}
	defer e.close()
	const node, ns = "bench-s1", "s1"
	if _, err := e.c.CreateNode(ctx, node); err != nil {
		return sc, nil, err
	}
	clusterID, err := kubeSystemUID(ctx, e)
	if err != nil {
		return sc, nil, err
	}
	listClient, err := proxyClient(e.proxy, e.c.RestConfig().BearerToken)
	if err != nil {
		return sc, nil, err
	}
	fakes := map[string]*fakeCloud{}
	for _, name := range b.clouds {
		f, err := newFakeCloud(name)
		if err != nil {
			return sc, nil, err
		}
		defer f.close()
		fakes[name] = f
	}
	exec, err := execTime(ctx, b.caa, 5)
	if err != nil {
		return sc, nil, err
	}
	var points []PlotPoint
	have := 0
	for _, n := range b.ns {
		start := time.Now()
		if err := createPods(ctx, e, ns, "p", node, have, n, true); err != nil {
			return sc, nil, err
		}
		b.logf("S1: %d peer pods on %s (%s)", n, node, time.Since(start).Round(time.Millisecond))
		have = n
		e.proxy.Reset()
		podList, err := podListTime(ctx, listClient, node, n, 5)
		if err != nil {
			return sc, nil, err
		}
		for _, name := range b.clouds {
			f := fakes[name]
			ledgerPath := filepath.Join(b.dir, "s1", name, "ledger.db")
			if err := mkdir(filepath.Dir(ledgerPath)); err != nil {
				return sc, nil, err
			}
			if err := b.createAll(ctx, e, f, node, ledgerPath, n); err != nil {
				return sc, nil, fmt.Errorf("S1 %s N=%d setup: %w", name, n, err)
			}
			scan, err := ledgerOpenScan(ledgerPath, node, clusterID, n, 5)
			if err != nil {
				return sc, nil, err
			}
			f.core.SetFaults(cloud.Faults{Latency: s1Latency})
			c := fmt.Sprintf("%s, N=%d", name, n)
			auth := authCalls[name]
			ready := Row{Case: c, Metric: "time to ready", Unit: "ms", MaxRatio: 1.25,
				Bound: ms(WarmRestartBound(exec, podList, scan, auth, n, listPage[name], s1Latency)),
				BoundNote: fmt.Sprintf("process start %s + pod list %s + ledger open and scan %s + (%d token + %d page(s)) x %s",
					round(exec), round(podList), round(scan), auth, Pages(n, listPage[name]), s1Latency)}
			writes := Row{Case: c, Metric: "cloud writes", Unit: "calls", HasLimit: true, AtMost: true}
			var own, cpus, serve, listTime, passTime []float64
			byOp, verbs := map[string][]float64{}, map[string][]float64{}
			for i := range b.count {
				f.core.ResetCounters()
				f.busy.Store(0)
				f.served.Store(0)
				before := e.proxy.Snapshot()
				d, err := StartCaa(b.caa, b.caaArgs(f, node, e.kubeconfig, ledgerPath), hermeticEnv(f.env...), b.logPath("s1-"+name))
				if err != nil {
					return sc, nil, err
				}
				ttr, err := d.WaitReady(ctx, 5*time.Minute)
				if err != nil {
					_ = d.Stop()
					return sc, nil, fmt.Errorf("S1 %s run %d: %w", c, i+1, err)
				}
				cpu, err := d.CPUTime()
				if err != nil {
					_ = d.Stop()
					return sc, nil, err
				}
				m, err := d.Metrics(ctx)
				if err != nil {
					_ = d.Stop()
					return sc, nil, err
				}
				counters := f.core.Counters()
				serve = append(serve, ms(time.Duration(f.busy.Load())-time.Duration(f.served.Load())*s1Latency))
				listTime = append(listTime, 1000*sumPrefix(m, `caa_cloud_call_duration_seconds_sum{op="list"`))
				passTime = append(passTime, 1000*sumPrefix(m, "caa_reconcile_pass_duration_seconds_sum"))
				traffic := Diff(e.proxy.Snapshot(), before)
				if err := d.Stop(); err != nil {
					return sc, nil, err
				}
				ready.Runs = append(ready.Runs, ms(ttr))
				own = append(own, m["caa_time_to_ready_seconds"]*1000)
				cpus = append(cpus, ms(cpu))
				writes.Runs = append(writes.Runs, float64(cloudWrites(counters)))
				for op, v := range callsByOp(counters) {
					byOp[op] = append(byOp[op], float64(v))
				}
				for k, t := range traffic {
					verbs[k] = append(verbs[k], float64(t.Requests))
				}
			}
			sc.Rows = append(sc.Rows, ready, writes)
			sc.Details = append(sc.Details, fmt.Sprintf("%s: caa's own time to ready (`caa_time_to_ready_seconds`, from its status start) median %s ms; caa's CPU time (user+system) to ready median %s ms; "+
				"cloud calls to ready by op (median) %s; apiserver requests to ready (median) %s", c, Num(Median(own)), Num(Median(cpus)),
				CountsLine(medians(byOp)), CountsLine(medians(verbs))))
			sc.Details = append(sc.Details, fmt.Sprintf("%s, where the time goes (medians): caa's startup pass %s ms, of which its cloud List call %s ms "+
				"(%d sequential call(s) x %s = %s ms of injected latency); the fake cloud's own serving time, summed over calls %s ms",
				c, Num(Median(passTime)), Num(Median(listTime)), auth+Pages(n, listPage[name])*listFactor[name], s1Latency,
				Num(ms(time.Duration(auth+Pages(n, listPage[name])*listFactor[name])*s1Latency)), Num(Median(serve))))
			lo, med, hi := Stats(ready.Runs)
			points = append(points, PlotPoint{Cloud: name, N: n, Median: med, Min: lo, Max: hi, BoundMs: ready.Bound})
			f.core.SetFaults(cloud.Faults{})
			// The SDK's own cost of the listing, which the latency-only
			// bound leaves out: a bound no client of that SDK can beat.
			sdk, err := sdkListTime(ctx, f, provider.Selector{Cluster: clusterID, Node: node}, n, 5)
			if err != nil {
				return sc, nil, err
			}
			sc.Details = append(sc.Details, fmt.Sprintf("%s: the provider's listing of the %d VMs through the cloud SDK, run in the bench's process with no injected latency "+
				"(the SDK's request and decode, caa's reading of the page, the fake's serving; median of 5): %s ms; time to ready against the bound plus that: %sx", c, n, Num(ms(sdk)), Num(med/(ready.Bound+ms(sdk)))))
		}
	}
	return sc, points, nil
}

// authCalls are the calls to the cloud's token service that precede any
// listing: IBM's IAM token (through the fake, with its latency). Azure's
// managed identity endpoint is on the node, not the cloud's API; AWS signs
// requests with no token call.
var authCalls = map[string]int{"ibmcloud": 1}

// listPage is how many VMs one page of caa's node listing carries, for the
// bound's count of sequential pages: EC2's DescribeInstances (1,000),
// Azure Resource Graph's rows (1,000), and IBM Global Search's 1,000 hits
// of which each VM takes two (the instance and its boot volume, both
// tagged). pageSizes is the fakes' own page of their list APIs.
var listPage = map[string]int{"aws": 1000, "azure": 1000, "ibmcloud": 500}

// listFactor is how many listings caa's provider pages through one after
// the other. Every provider runs its second listing (Azure's NICs, IBM's
// boot volumes) beside the first, so it is one everywhere.
var listFactor = map[string]int{"aws": 1, "azure": 1, "ibmcloud": 1}

// sumPrefix adds every metric sample whose name starts with prefix.
func sumPrefix(m map[string]float64, prefix string) float64 {
	total := 0.0
	for k, v := range m {
		if strings.HasPrefix(k, prefix) {
			total += v
		}
	}
	return total
}

// execTime is the median wall time of `caa version`: starting the
// process, which every run pays before it can do anything.
func execTime(ctx context.Context, bin string, runs int) (time.Duration, error) {
	var ds []float64
	for range runs {
		start := time.Now()
		if out, err := exec.CommandContext(ctx, bin, "version").CombinedOutput(); err != nil {
			return 0, fmt.Errorf("caa version: %w: %s", err, out)
		}
		ds = append(ds, float64(time.Since(start)))
	}
	return time.Duration(Median(ds)), nil
}

// createAll brings the cloud to one live VM per pod with a caa run that is
// not measured (a first start, or new pods after a larger N), then stops it.
func (b *bench) createAll(ctx context.Context, e *env, f *fakeCloud, node, ledgerPath string, n int) error {
	if err := forgetLedger(ctx, e.client, node); err != nil {
		return err
	}
	start := time.Now()
	d, err := StartCaa(b.caa, append(b.caaArgs(f, node, e.kubeconfig, ledgerPath), fastCreate...), hermeticEnv(f.env...), b.logPath("setup-"+f.name))
	if err != nil {
		return err
	}
	if _, err := d.WaitReady(ctx, 15*time.Minute); err != nil {
		_ = d.Stop()
		return err
	}
	if err := d.Stop(); err != nil {
		return err
	}
	live := 0
	for _, in := range f.core.Live() {
		if in.Tags["caa-node"] == node {
			live++
		}
	}
	// IBM keeps its tags on boot volumes; count its instances instead.
	if f.name == "ibmcloud" {
		live = len(f.core.Live())
	}
	if live != n {
		return fmt.Errorf("%s: %d live VMs after the setup run, want %d", f.name, live, n)
	}
	b.logf("S1: %s has %d VMs (setup %s)", f.name, n, time.Since(start).Round(time.Millisecond))
	return nil
}

// ledgerOpenScan is the median time of a writable open (as caa's),
// a read of every record and a close.
func ledgerOpenScan(path, node, clusterID string, want, runs int) (time.Duration, error) {
	var ds []float64
	for range runs {
		start := time.Now()
		l, err := ledger.Open(ledger.Options{Path: path, Node: node, Cluster: clusterID, Timeout: 10 * time.Second})
		if err != nil {
			return 0, err
		}
		recs, err := l.List(ledger.Filter{})
		cerr := l.Close()
		if err != nil || cerr != nil {
			return 0, fmt.Errorf("scan ledger %s: %v %v", path, err, cerr)
		}
		ds = append(ds, float64(time.Since(start)))
		if len(recs) != want {
			return 0, fmt.Errorf("ledger %s has %d records, want %d", path, len(recs), want)
		}
	}
	return time.Duration(Median(ds)), nil
}

func kubeSystemUID(ctx context.Context, e *env) (string, error) {
	ns, err := e.client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read kube-system: %w", err)
	}
	return string(ns.UID), nil
}

func medians(m map[string][]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = Median(v)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func round(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
