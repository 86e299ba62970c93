package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// s7Pods is the node's peer pods in S7: S1's first case, whose bound the
// gap is held to.
const s7Pods = 100

// s7 is the surge hand-over: a new caa started beside the running one on
// the same ledger takes it over, count times per cloud, 50 ms per cloud
// call. It measures the node's reconciler gap, the time a pod created
// during the hand-over waits for its VM, and the cloud writes.
func (b *bench) s7(ctx context.Context) (Scenario, error) {
	sc := Scenario{ID: "S7", Title: "surge hand-over, every VM alive",
		Setup: fmt.Sprintf("%d peer pods on one node, every VM alive, %s injected into every cloud call. A new caa starts beside the running one "+
			"on the same ledger (a DaemonSet update with maxSurge 1) and takes the ledger over, %d run(s) per cloud, each new caa the next run's old one. "+
			"Gap: from the old caa stopping work to the new caa's reconciler starting on the opened ledger, as the new caa reports it "+
			"(`/status` handover.gap, the old caa's stop time travelling in the hand-over); the new caa's startup pass then runs as any caa's does. One pod is created as soon as the old caa has the request; its VM's wait runs "+
			"from that pod's creation to its VM at the fake cloud.", s7Pods, s1Latency, b.count)}
	e, err := newEnv(ctx, filepath.Join(b.dir, "s7"), b.logf)
	if err != nil {
		return sc, err
	}
	defer e.close()
	const node, ns = "bench-s7", "s7"
	if _, err := e.c.CreateNode(ctx, node); err != nil {
		return sc, err
	}
	clusterID, err := kubeSystemUID(ctx, e)
	if err != nil {
		return sc, err
	}
	listClient, err := proxyClient(e.proxy, e.c.RestConfig().BearerToken)
	if err != nil {
		return sc, err
	}
	if err := createPods(ctx, e, ns, "p", node, 0, s7Pods, true); err != nil {
		return sc, err
	}
	podList, err := podListTime(ctx, listClient, node, s7Pods, 5)
	if err != nil {
		return sc, err
	}
	exec, err := execTime(ctx, b.caa, 5)
	if err != nil {
		return sc, err
	}
	extra := 0
	for _, name := range b.clouds {
		f, err := newFakeCloud(name)
		if err != nil {
			return sc, err
		}
		rows, details, made, err := b.s7Cloud(ctx, e, f, node, ns, clusterID, exec, podList, extra)
		f.close()
		if err != nil {
			return sc, fmt.Errorf("S7 %s: %w", name, err)
		}
		extra += made
		sc.Rows = append(sc.Rows, rows...)
		sc.Details = append(sc.Details, details...)
	}
	return sc, nil
}

// s7Cloud runs S7 on one cloud. extra is how many pods earlier clouds'
// runs added to the node (their VMs are made here in the setup).
func (b *bench) s7Cloud(ctx context.Context, e *env, f *fakeCloud, node, ns, clusterID string, exec, podList time.Duration, extra int) ([]Row, []string, int, error) {
	n := s7Pods + extra
	ledgerPath := filepath.Join(b.dir, "s7", f.name, "ledger.db")
	if err := mkdir(filepath.Dir(ledgerPath)); err != nil {
		return nil, nil, 0, err
	}
	if err := b.createAll(ctx, e, f, node, ledgerPath, n); err != nil {
		return nil, nil, 0, err
	}
	scan, err := ledgerOpenScan(ledgerPath, node, clusterID, n, 5)
	if err != nil {
		return nil, nil, 0, err
	}
	c := fmt.Sprintf("%s, N=%d", f.name, s7Pods)
	auth := authCalls[f.name]
	bound := WarmRestartBound(exec, podList, scan, auth, n, listPage[f.name], s1Latency)
	gap := Row{Case: c, Metric: "reconciler gap", Unit: "ms", MaxRatio: 1.25, Bound: ms(bound),
		BoundNote: fmt.Sprintf("S1's bound for this case: process start %s + pod list %s + ledger open and scan %s + (%d token + %d page(s)) x %s",
			round(exec), round(podList), round(scan), auth, Pages(n, listPage[f.name]), s1Latency)}
	wait := Row{Case: c, Metric: "new pod's VM during the hand-over", Unit: "ms", MaxRatio: 1.5,
		BoundNote: fmt.Sprintf("the run's gap + %s for each cloud call from the pod's creation to its VM (the new caa's startup listing, then the create's own calls); "+
			"latency only, so the target allows 1.5x for the pod's watch event, the work queue and the process", s1Latency)}
	writes := Row{Case: c, Metric: "cloud writes for the adopted VMs", Unit: "calls", HasLimit: true, AtMost: true, EveryRun: true}
	dups := Row{Case: c, Metric: "duplicate or deleted VMs", Unit: "VMs", HasLimit: true, AtMost: true, EveryRun: true}
	var took, bounds []float64

	old, err := StartCaa(b.caa, b.caaArgs(f, node, e.kubeconfig, ledgerPath, "--pod-name", "caa-0"), hermeticEnv(f.env...), b.logPath("s7-"+f.name))
	if err != nil {
		return nil, nil, 0, err
	}
	defer func() { _ = old.Stop() }()
	if _, err := old.WaitReady(ctx, 5*time.Minute); err != nil {
		return nil, nil, 0, err
	}
	f.core.SetFaults(cloud.Faults{Latency: s1Latency})
	defer f.core.SetFaults(cloud.Faults{})
	made := 0
	for i := range b.count {
		live := len(f.core.Live())
		name := fmt.Sprintf("caa-%d", i+1)
		next, err := StartCaa(b.caa, b.caaArgs(f, node, e.kubeconfig, ledgerPath, "--pod-name", name), hermeticEnv(f.env...), b.logPath("s7-"+f.name))
		if err != nil {
			return nil, nil, 0, err
		}
		// A pod arrives as the hand-over begins.
		if err := waitStatus(ctx, old, time.Minute, func(s health.Snapshot) bool {
			return s.Handover != nil && s.Handover.Role == health.RoleHandedOver && s.Handover.Outcome == health.HandoverUnderway
		}); err != nil {
			_ = next.Stop()
			return nil, nil, 0, fmt.Errorf("run %d: the old caa never got the request: %w", i+1, err)
		}
		f.core.ResetCounters()
		podAt := time.Now()
		if err := createPods(ctx, e, ns, "s7-"+f.name, node, made, made+1, true); err != nil {
			_ = next.Stop()
			return nil, nil, 0, err
		}
		made++
		if _, err := next.WaitReady(ctx, 5*time.Minute); err != nil {
			_ = next.Stop()
			return nil, nil, 0, fmt.Errorf("run %d: %w", i+1, err)
		}
		vmAt, err := waitLive(ctx, f.core, live+1, time.Minute)
		if err != nil {
			_ = next.Stop()
			return nil, nil, 0, fmt.Errorf("run %d: the new pod's VM: %w", i+1, err)
		}
		toVM := f.core.Counters()["total"]
		var snap health.Snapshot
		if err := waitStatus(ctx, next, 10*time.Second, func(s health.Snapshot) bool {
			snap = s
			return s.Handover != nil && s.Handover.Outcome == health.HandoverDone
		}); err != nil {
			_ = next.Stop()
			return nil, nil, 0, fmt.Errorf("run %d: no finished hand-over on the new caa: %w", i+1, err)
		}
		if err := old.Stop(); err != nil {
			return nil, nil, 0, err
		}
		old = next
		after := f.core.Counters()
		g := ms(time.Duration(snap.Handover.Gap))
		gap.Runs = append(gap.Runs, g)
		wait.Runs = append(wait.Runs, ms(vmAt.Sub(podAt)))
		bounds = append(bounds, g+ms(time.Duration(toVM)*s1Latency))
		took = append(took, ms(time.Duration(snap.Handover.Took)))
		creates := after[cloud.OpCreate]
		deletes := after[cloud.OpDelete]
		writes.Runs = append(writes.Runs, float64(creates-1+deletes))
		dups.Runs = append(dups.Runs, float64(len(f.core.Live())-(live+1)+int(deletes)))
	}
	wait.Bound = Median(bounds)
	details := []string{fmt.Sprintf("%s: the hand-over took (the new caa's request to its readiness, median) %s ms; the bound of the new pod's wait is the median of "+
		"each run's gap plus the latency of the calls made until its VM existed", c, Num(Median(took)))}
	return []Row{gap, wait, writes, dups}, details, b.count, nil
}

// waitStatus polls d's /status until ok holds.
func waitStatus(ctx context.Context, d *Daemon, within time.Duration, ok func(health.Snapshot) bool) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.health+"/status", nil)
		if err != nil {
			return err
		}
		if resp, err := d.client.Do(req); err == nil {
			var s health.Snapshot
			derr := json.NewDecoder(resp.Body).Decode(&s)
			_ = resp.Body.Close()
			if derr == nil && ok(s) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// waitLive polls the fake cloud until it holds want live VMs, and returns
// when it first did.
func waitLive(ctx context.Context, core *cloud.Cloud, want int, within time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		if len(core.Live()) >= want {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%d live VMs, want %d: %w", len(core.Live()), want, ctx.Err())
		case <-tick.C:
		}
	}
}
