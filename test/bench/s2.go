package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// S2's numbers, from the issue.
const (
	s2Pods   = 1000
	s2Killed = 100
	s2Rate   = 5.0
	s2Burst  = 20
	s2Boot   = 5 * time.Second
)

// s2 is the recreate storm on EC2 (whose listing shows a killed VM as
// terminated, so caa recreates at once; on Azure and IBM a vanished VM is
// first confirmed missing for --confirm-missing, 30 s by default).
func (b *bench) s2(ctx context.Context) (Scenario, error) {
	schedule := CreateSchedule(s2Killed, s2Rate, s2Burst)
	sc := Scenario{ID: "S2", Title: "recreate storm",
		Setup: fmt.Sprintf("%d peer pods on one node (EC2 fake), %d VMs killed while caa is down; the fake throttles creates and deletes above "+
			"%.0f/s with burst %d (Retry-After 1 s) and boots a VM in %s; caa runs with `--create-rate %.0f --create-burst %d`; no latency injected. "+
			"caa's startup pass holds `/readyz` until the new VMs have booted (reason VMBooting, looked at again every second, bounded by "+
			"`--boot-timeout`), so both times share one bound.", s2Pods, s2Killed, s2Rate, s2Burst, s2Boot, s2Rate, s2Burst)}
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
	ready := Row{Case: fmt.Sprintf("%d of %d killed", s2Killed, s2Pods), Metric: "time to ready", Unit: "s", MaxRatio: 1.2,
		Bound:     (schedule + s2Boot).Seconds(),
		BoundNote: fmt.Sprintf("create schedule (%d at once, %d more at %.0f/s = %s) + boot %s", s2Burst, s2Killed-s2Burst, s2Rate, schedule, s2Boot)}
	running := Row{Case: ready.Case, Metric: "every VM running", Unit: "s", MaxRatio: 1.2, Bound: ready.Bound,
		BoundNote: "the same"}
	creates := Row{Case: ready.Case, Metric: "create calls", Unit: "calls"}
	dups := Row{Case: ready.Case, Metric: "pods with >1 live VM", Unit: "pods", HasLimit: true, AtMost: true}
	warned := Row{Case: ready.Case, Metric: "throttling in pod events", Unit: "events", HasLimit: true, AtMost: true}
	var throttled, lag []float64
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
		f.core.SetFaults(cloud.Faults{ThrottleRate: s2Rate, ThrottleBurst: s2Burst, ThrottleWriteOnly: true,
			RetryAfter: time.Second, BootDelay: s2Boot})
		f.core.ResetCounters()
		since := time.Now()
		d, err := StartCaa(b.caa, b.caaArgs(f, node, e.kubeconfig, ledgerPath, "--create-rate", "5", "--create-burst", "20"),
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
		creates.Runs = append(creates.Runs, float64(counters[cloud.OpCreate]))
		dups.Runs = append(dups.Runs, float64(duplicates(f.core)))
		warned.Runs = append(warned.Runs, float64(events))
		throttled = append(throttled, float64(counters["throttled"]))
		lag = append(lag, (ttr - tRun).Seconds())
	}
	sc.Rows = append(sc.Rows, ready, running, creates, dups, warned)
	sc.Details = append(sc.Details, fmt.Sprintf("calls the fake cloud throttled per run (median): %s; caa absorbs them (Retry-After) without a pod event",
		Num(Median(throttled))),
		fmt.Sprintf("`/readyz` turned 200 %s s (median; negative: before) after the last recreated VM was running in the cloud", Num(Median(lag))))
	return sc, nil
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
