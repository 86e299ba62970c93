package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// S2's numbers. The fake cloud's write budget is stricter than caa's own
// limiter (rate and burst), as a shared cloud account is when other nodes
// spend it too: caa's limiter lets writes through faster than the cloud
// takes them, so the cloud throttles, and the run shows caa absorbing it
// (its own backoff: EC2 says nothing of when to come back) with every VM
// still created once.
const (
	s2Pods       = 1000
	s2Killed     = 100
	s2CaaRate    = 5.0
	s2CaaBurst   = 20
	s2CloudRate  = 3.0
	s2CloudBurst = 10
	s2Boot       = 5 * time.Second
)

// s2 is the recreate storm on EC2 (whose listing shows a killed VM as
// terminated, so caa recreates at once; on Azure and IBM a vanished VM is
// first confirmed missing for --confirm-missing, 30 s by default).
func (b *bench) s2(ctx context.Context) (Scenario, error) {
	// Two token buckets in a row: n writes get through no sooner than
	// either bucket alone would let them.
	caaSchedule := CreateSchedule(s2Killed, s2CaaRate, s2CaaBurst)
	cloudSchedule := CreateSchedule(s2Killed, s2CloudRate, s2CloudBurst)
	schedule := max(caaSchedule, cloudSchedule)
	sc := Scenario{ID: "S2", Title: "recreate storm",
		Setup: fmt.Sprintf("%d peer pods on one node (EC2 fake), %d VMs killed while caa is down; caa runs with `--create-rate %s --create-burst %d`, "+
			"and the fake cloud is stricter: it throttles creates and deletes above %s/s with burst %d (with no Retry-After, as EC2), so caa's limiter "+
			"lets through more than the cloud accepts and throttling has to be absorbed. The fake boots a VM in %s; no latency injected. "+
			"caa's startup pass holds `/readyz` until the new VMs have booted (reason VMBooting, looked at again every second, bounded by "+
			"`--boot-timeout`), so both times share one bound.",
			s2Pods, s2Killed, count(s2CaaRate), s2CaaBurst, count(s2CloudRate), s2CloudBurst, s2Boot)}
	e, err := newEnv(ctx, filepath.Join(b.dir, "s2"), b.logf)
	if err != nil {
		return sc, err
	}
	defer e.close()
	const node, ns = "bench-s2", "s2"
	if _, err := e.c.CreateNode(ctx, node); err != nil {
		return sc, err
	}
	if err := createPods(ctx, e, ns, "p", node, 0, s2Pods, true); err != nil {
		return sc, err
	}
	f, err := newFakeCloud("aws")
	if err != nil {
		return sc, err
	}
	defer f.close()
	ledgerPath := filepath.Join(b.dir, "s2", "ledger", "ledger.db")
	if err := mkdir(filepath.Dir(ledgerPath)); err != nil {
		return sc, err
	}
	if err := b.createAll(ctx, e, f, node, ledgerPath, s2Pods); err != nil {
		return sc, err
	}
	c := fmt.Sprintf("%d of %d killed", s2Killed, s2Pods)
	ready := Row{Case: c, Metric: "time to ready", Unit: "s", MaxRatio: 1.2,
		Bound: (schedule + s2Boot).Seconds(),
		BoundNote: fmt.Sprintf("the slower of two token buckets in a row: the cloud's (%d at once, %d more at %s/s = %s; caa's alone: %s) + boot %s",
			s2CloudBurst, s2Killed-s2CloudBurst, count(s2CloudRate), cloudSchedule, caaSchedule, s2Boot)}
	running := Row{Case: c, Metric: "every VM running", Unit: "s", MaxRatio: 1.2, Bound: ready.Bound, BoundNote: "the same"}
	throttled := Row{Case: c, Metric: "throttled responses to caa", Unit: "calls", HasLimit: true, Limit: 1, EveryRun: true}
	calls := Row{Case: c, Metric: "create calls", Unit: "calls"}
	created := Row{Case: c, Metric: "VMs created", Unit: "VMs", HasLimit: true, AtMost: true, Limit: s2Killed, EveryRun: true}
	dups := Row{Case: c, Metric: "pods with >1 live VM", Unit: "pods", HasLimit: true, AtMost: true, EveryRun: true}
	warned := Row{Case: c, Metric: "throttling in pod events", Unit: "events", HasLimit: true, AtMost: true, EveryRun: true}
	var lag []float64
	for i := range b.count {
		f.core.SetFaults(cloud.Faults{})
		victims := 0
		for _, in := range f.core.Live() {
			if victims == s2Killed {
				break
			}
			if err := f.core.Kill(in.ID); err != nil {
				return sc, err
			}
			victims++
		}
		f.core.SetFaults(cloud.Faults{ThrottleRate: s2CloudRate, ThrottleBurst: s2CloudBurst, ThrottleWriteOnly: true,
			RetryAfter: time.Second, BootDelay: s2Boot})
		f.core.ResetCounters()
		since := time.Now()
		d, err := StartCaa(b.caa, b.caaArgs(f, node, e.kubeconfig, ledgerPath,
			"--create-rate", count(s2CaaRate), "--create-burst", strconv.Itoa(s2CaaBurst)),
			hermeticEnv(f.env...), b.logPath("s2"))
		if err != nil {
			return sc, err
		}
		allRunning := make(chan time.Duration, 1)
		go func() { allRunning <- waitAllRunning(ctx, f.core, s2Pods, d.started) }()
		ttr, err := d.WaitReady(ctx, 5*time.Minute)
		if err != nil {
			_ = d.Stop()
			return sc, fmt.Errorf("S2 run %d: %w", i+1, err)
		}
		tRun := <-allRunning
		if tRun < 0 {
			_ = d.Stop()
			return sc, fmt.Errorf("S2 run %d: VMs never all running", i+1)
		}
		events, err := throttleEvents(ctx, e, ns, since)
		if err != nil {
			_ = d.Stop()
			return sc, err
		}
		if err := d.Stop(); err != nil {
			return sc, err
		}
		counters := f.core.Counters()
		ready.Runs = append(ready.Runs, ttr.Seconds())
		running.Runs = append(running.Runs, tRun.Seconds())
		throttled.Runs = append(throttled.Runs, float64(counters["throttled"]))
		calls.Runs = append(calls.Runs, float64(counters[cloud.OpCreate]))
		created.Runs = append(created.Runs, float64(counters["created"]))
		dups.Runs = append(dups.Runs, float64(duplicates(f.core)))
		warned.Runs = append(warned.Runs, float64(events))
		lag = append(lag, (ttr - tRun).Seconds())
	}
	sc.Rows = append(sc.Rows, ready, running, throttled, calls, created, dups, warned)
	sc.Details = append(sc.Details, s2Absorbed(throttled.Runs, calls.Runs, created.Runs, dups.Runs, warned.Runs, s2Killed, s2Pods),
		fmt.Sprintf("`/readyz` turned 200 %s s (median; negative: before) after the last recreated VM was running in the cloud", Num(Median(lag))))
	return sc, nil
}

// s2Absorbed says in one sentence, from the runs' counts, whether the
// cloud throttled caa and whether caa still ended with one VM per pod.
func s2Absorbed(throttled, calls, created, dups, events []float64, killed, pods int) string {
	if len(throttled) == 0 {
		return "no run"
	}
	var b strings.Builder
	lo, med, hi := Stats(throttled)
	switch {
	case hi == 0:
		b.WriteString("the fake cloud throttled no call in any run, so this run shows nothing about absorbing throttling")
	case lo == 0:
		fmt.Fprintf(&b, "the fake cloud throttled caa in only some runs (median %s, max %s throttled responses)", count(med), count(hi))
	default:
		fmt.Fprintf(&b, "the fake cloud throttled caa in every run: %s throttled responses (median %s) out of %s create calls",
			span(lo, hi), count(med), span(slices.Min(calls), slices.Max(calls)))
	}
	var wrong []string
	for i := range created {
		if created[i] != float64(killed) || dups[i] > 0 {
			wrong = append(wrong, fmt.Sprintf("run %d created %s VMs with %s pod(s) holding more than one", i+1, count(created[i]), count(dups[i])))
		}
	}
	if len(wrong) == 0 {
		fmt.Fprintf(&b, "; every run created exactly %d VMs, one per killed VM, and ended with one live VM for each of the %d pods", killed, pods)
	} else {
		fmt.Fprintf(&b, "; NOT one VM per pod: %s", strings.Join(wrong, "; "))
	}
	if n := slices.Max(events); n > 0 {
		fmt.Fprintf(&b, "; throttling reached the pods' events (up to %s warnings in a run)", count(n))
	} else {
		b.WriteString("; no pod got a warning event for it")
	}
	return b.String()
}

// count prints a count: no decimals where there are none.
func count(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// span prints the range of counts over the runs, one number when they agree.
func span(lo, hi float64) string {
	if lo == hi {
		return count(lo)
	}
	return count(lo) + " to " + count(hi)
}

// waitAllRunning polls the cloud until want VMs are Running, and returns
// the time since start (negative if ctx ends first).
func waitAllRunning(ctx context.Context, c *cloud.Cloud, want int, start time.Time) time.Duration {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Minute)
	for {
		n := 0
		for _, in := range c.Live() {
			if in.State == provider.StateRunning {
				n++
			}
		}
		if n == want {
			return time.Since(start)
		}
		select {
		case <-ctx.Done():
			return -1
		case <-deadline:
			return -1
		case <-tick.C:
		}
	}
}

// duplicates counts pods with more than one live VM.
func duplicates(c *cloud.Cloud) int {
	per := map[string]int{}
	for _, in := range c.Live() {
		per[in.Tags[provider.TagPodUID]]++
	}
	n := 0
	for _, v := range per {
		if v > 1 {
			n++
		}
	}
	return n
}

// throttleEvents counts events on pods in ns since t that speak of
// throttling (or any VMCreateFailed: with throttling injected, that is
// what a leak would look like).
func throttleEvents(ctx context.Context, e *env, ns string, t time.Time) (int, error) {
	list, err := e.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list events: %w", err)
	}
	n := 0
	for _, ev := range list.Items {
		if ev.LastTimestamp.Time.Before(t.Truncate(time.Second)) && ev.EventTime.Time.Before(t) {
			continue
		}
		msg := strings.ToLower(ev.Message)
		if ev.Type == corev1.EventTypeWarning && (ev.Reason == "VMCreateFailed" || strings.Contains(msg, "throttl") || strings.Contains(msg, "limit")) {
			n++
		}
	}
	return n, nil
}
