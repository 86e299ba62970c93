package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// S6's rows for the remote hypervisor mode: the cloud calls a sandbox
// costs when kata starts and stops it, and a node's calls when idle, from
// one node's caa in that mode (the rig of S8) on the fake EC2 with its
// published limits; the fleet's figures follow linearly, as S6's informer
// rows do (a node in this mode makes no call for another node's VMs).
func (b *bench) s6kata(ctx context.Context) (sc Scenario, err error) {
	cfg := b.s6cfg
	k := cfg.pods
	sc = Scenario{ID: "S6-kata", Title: "the fleet in the remote hypervisor mode: cloud calls per sandbox, beside S6's informer rows",
		Setup: fmt.Sprintf("One node's caa in the remote hypervisor mode (the rig of S8: the real binary, fake pod VMs, real tunnels and relays) on the fake EC2 "+
			"with its published request limits, no latency. **Per sandbox created**: the fake shim's CreateVM and StartVM for %d sandboxes, %d at once; the "+
			"calls counted at the fake over them, per sandbox. **Per sandbox deleted**: StopVM for each, until the cloud shows every VM terminated. "+
			"**Idle**: %d sandboxes running, caa with `--audit-interval %s` (in this mode the period of the sync that lists the node's VMs) for %s; the reads "+
			"per sync (reads over the syncs caa counted in the window, `caa_reconcile_passes_total`) times %s syncs an hour at the default 10m0s. **1,000 nodes**: %d nodes x %d sandboxes, "+
			"linear in nodes (no node lists another's VMs), as a percentage of the DescribeInstances bucket's refill (20 a second). "+
			"**Idle with the cluster caa**: then `caa cluster` (one replica, `--interval` the same %s) runs beside the node, which syncs from its view once "+
			"fresh (`--cluster-view`, which the cluster-scope component sets); the node's own reads (its `caa_cloud_calls_total`) over %s per sync, and at 1,000 nodes those "+
			"of every node plus the cluster caa's listing of every VM, in pages of 1,000, every 10 min (its default). "+
			"The targets are S6's for the informer mode's pods (S6's rows `aws, churn, per pod created` and `aws, idle`).",
			k, s11Batch, k, cfg.idleAudit, cfg.idleWindow, Num(AuditsPerHour(s6Audit)), s6ScaleNodes, s6ScalePods, cfg.idleAudit, cfg.idleWindow)}
	if b.notRoot(&sc, "S6-kata") {
		return sc, nil
	}
	h := &nsHarness{}
	defer h.cleanup()
	defer recoverHarness(&err)
	clock := &restClock{}
	budget := ec2fake.NewBudget(clock.now)
	r, err := b.newKataRig(ctx, h, "s6kata", k, budget, false)
	defer r.close()
	if err != nil {
		return sc, err
	}
	if err := r.start(ctx, "--audit-interval", cfg.idleAudit.String(), "--cluster-view"); err != nil {
		return sc, err
	}
	ids := make([]string, k)
	for i := range k {
		ids[i] = sandboxID(1, i)
	}
	// Created: in batches, as a node's pods come.
	r.f.resetCounters()
	budget.ResetCounts()
	for from := 0; from < k; from += s11Batch {
		batch := min(s11Batch, k-from)
		if err := firstErr(batch, func(j int) error {
			i := from + j
			if _, err := r.createVM(ctx, ids[i], i); err != nil {
				return err
			}
			return r.startVM(ctx, ids[i])
		}); err != nil {
			return sc, err
		}
	}
	created := callsByOp(r.f.counters())

	// Idle: the syncs caa counts (each a pass, caa_reconcile_passes_total)
	// over the window.
	mb, err := r.d.Metrics(ctx)
	if err != nil {
		return sc, err
	}
	r.f.resetCounters()
	if err := sleepCtx(ctx, cfg.idleWindow); err != nil {
		return sc, err
	}
	idle := callsByOp(r.f.counters())
	ma, err := r.d.Metrics(ctx)
	if err != nil {
		return sc, err
	}
	syncs := int(sumPrefix(ma, "caa_reconcile_passes_total") - sumPrefix(mb, "caa_reconcile_passes_total"))

	// Idle with the cluster caa beside the node: its syncs use the view.
	cv, err := b.s6kataClusterIdle(ctx, r, cfg)
	if err != nil {
		return sc, err
	}

	// Deleted.
	r.f.resetCounters()
	start, _, errs := each(k, func(i int) error { return r.stopVM(ctx, ids[i]) })
	for _, err := range errs {
		if err != nil {
			return sc, fmt.Errorf("StopVM: %w", err)
		}
	}
	if _, err := r.waitVMsGone(ctx, ids, 5*time.Minute); err != nil {
		return sc, err
	}
	deleted := callsByOp(r.f.counters())
	throttled := budget.Throttled() // counted since the creates began
	b.logf("S6-kata: %d sandboxes stopped in %s", k, time.Since(start).Round(time.Millisecond))

	per := func(m map[string]int64, ops ...string) float64 {
		var n int64
		for _, op := range ops {
			n += m[op]
		}
		return float64(n) / float64(k)
	}
	limit := func(c, metric, unit string, v, l float64) Row {
		return Row{Case: c, Metric: metric, Unit: unit, Runs: []float64{v}, HasLimit: true, AtMost: true, Limit: l}
	}
	readOps := []string{cloud.OpGet, cloud.OpList, ec2fake.OpLookup}
	perSync := 0.0
	if syncs > 0 {
		perSync = float64(reads3(idle)) / float64(syncs)
	}
	perHour := perSync * AuditsPerHour(s6Audit)
	pct := func(nodes int) float64 { return float64(nodes) * perHour / 3600 / 20 * 100 }
	c := "aws, kata, per sandbox created"
	d := "aws, kata, per sandbox deleted"
	sc.Rows = []Row{
		limit(c, "cloud reads", "reads", per(created, readOps...), s6CreateReads),
		limit(c, "VM writes", "writes", per(created, cloud.OpCreate, cloud.OpDelete), 1),
		limit(c, "listings", "calls", per(created, cloud.OpList), 0),
		limit(d, "cloud reads", "reads", per(deleted, readOps...), s6DeleteReads),
		limit(d, "VM writes", "writes", per(deleted, cloud.OpCreate, cloud.OpDelete), 1),
		limit(d, "listings", "calls", per(deleted, cloud.OpList), 0),
		limit(fmt.Sprintf("aws, kata, idle without the cluster caa, %d sandboxes", k), "cloud reads per node per hour", "reads", perHour, s6IdleReadsPerHour),
		{Case: fmt.Sprintf("aws, kata, idle without the cluster caa, %d nodes x %d sandboxes", s6ScaleNodes, s6ScalePods), Metric: "DescribeInstances bucket",
			Unit: "% of refill", Runs: []float64{pct(s6ScaleNodes)}},
		{Case: fmt.Sprintf("aws, kata, idle without the cluster caa, %d nodes x %d sandboxes", s6ScaleNodes, s6ScalePods), Metric: "fleet's cloud reads per hour", Unit: "reads",
			Runs: []float64{perHour * s6ScaleNodes}},
		limit(fmt.Sprintf("aws, kata, idle with the cluster caa, %d sandboxes", k), "node's cloud reads per sync", "reads", cv.nodePerSync, 0),
		limit(fmt.Sprintf("aws, kata, idle with the cluster caa, %d nodes x %d sandboxes", s6ScaleNodes, s6ScalePods), "DescribeInstances bucket", "% of refill",
			cv.fleetHour(s6ScaleNodes, s6ScalePods)/3600/20*100, s6IdlePercent),
		{Case: fmt.Sprintf("aws, kata, idle with the cluster caa, %d nodes x %d sandboxes", s6ScaleNodes, s6ScalePods), Metric: "fleet's cloud reads per hour", Unit: "reads",
			Runs: []float64{cv.fleetHour(s6ScaleNodes, s6ScalePods)}},
		limit("aws, kata, created, idle and deleted", "throttling replies (429) to caa", "replies", float64(throttled), 0),
	}
	sc.Details = append(sc.Details,
		fmt.Sprintf("calls while creating: %s; idle (%s, %d syncs): %s; while deleting: %s", CountsLine(created), cfg.idleWindow, syncs, CountsLine(idle), CountsLine(deleted)),
		fmt.Sprintf("idle with the cluster caa (`caa cluster --interval %s`, its listings of this node's %d VMs; the node caa had said it audits from the "+
			"cluster caa's cloud view): in %s, %d node syncs made %s reads of the node's own (its `caa_cloud_calls_total`), the cluster caa %s listings; "+
			"all calls at the fake: %s. At %d nodes x %d sandboxes: the node syncs' reads (%s a sync, %s syncs an hour each) and the cluster caa's "+
			"listing, %d pages of 1,000 VMs (DescribeInstances' MaxResults), %s times an hour at its default --interval %s",
			cfg.idleAudit, k, cfg.idleWindow, cv.syncs, Num(cv.nodeReads), Num(cv.listings), CountsLine(cv.calls), s6ScaleNodes, s6ScalePods,
			Num(cv.nodePerSync), Num(AuditsPerHour(s6Audit)), (s6ScaleNodes*s6ScalePods+999)/1000, Num(float64(time.Hour)/float64(s6ClusterInterval)), s6ClusterInterval),
		"the informer mode's S6 rows count, per pod created, also caa's one look at a new VM 30 s after its create; the remote hypervisor mode reads "+
			"a new VM until it runs (StartVM waits for it) and never again but in the sync's one listing of the node's VMs")
	return sc, nil
}

// s6kataView is what the idle window with the cluster caa counted.
type s6kataView struct {
	syncs               int
	nodeReads, listings float64
	nodePerSync         float64
	calls               map[string]int64
}

// fleetHour is the fleet's reads an hour with the cluster caa: every node's
// syncs, and the cluster caa's listing of every VM in pages of 1,000.
func (v *s6kataView) fleetHour(nodes, perNode int) float64 {
	pages := float64((nodes*perNode + 999) / 1000)
	return float64(nodes)*v.nodePerSync*AuditsPerHour(s6Audit) + pages*float64(time.Hour)/float64(s6ClusterInterval)
}

// s6kataClusterIdle runs `caa cluster` beside the kata node until the
// node's syncs use its view, then counts the node's own reads over the
// idle window (from its metrics: the cluster caa's listings reach the same
// fake). The cluster caa is stopped on return.
func (b *bench) s6kataClusterIdle(ctx context.Context, r *kataRig, cfg s6Config) (*s6kataView, error) {
	if err := r.e.c.EnsureNamespace(ctx, s6ClusterNamespace); err != nil {
		return nil, err
	}
	args := []string{"--kubeconfig", r.e.kubeconfig, "--identity", "bench-s6kata", "--lease-namespace", s6ClusterNamespace,
		"--interval", cfg.idleAudit.String(), "--node-gone-grace", "24h", "--log-format", "json"}
	cc, err := startCaaCommand(b.caa, "cluster", append(args, r.f.flags...), hermeticEnv(r.f.env...), b.logPath("s6kata-cluster"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = cc.Stop() }()
	nodeLog := b.logPath(r.label)
	deadline := time.Now().Add(2*time.Minute + 3*cfg.idleAudit)
	for {
		data, _ := os.ReadFile(nodeLog)
		if strings.Contains(string(data), "auditing from the cluster caa's cloud view") {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("S6-kata: the node never synced from the cluster caa's view; see %s and %s", nodeLog, cc.logPath)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return nil, err
		}
	}
	reads := func(m map[string]float64) float64 {
		return sumPrefix(m, `caa_cloud_calls_total{op="get"`) + sumPrefix(m, `caa_cloud_calls_total{op="list"`)
	}
	listings := func() (float64, error) {
		m, err := cc.Metrics(ctx)
		if err != nil {
			return 0, err
		}
		return m[`caa_cluster_listings_total{result="ok"}`], nil
	}
	mb, err := r.d.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	l0, err := listings()
	if err != nil {
		return nil, err
	}
	r.f.resetCounters()
	if err := sleepCtx(ctx, cfg.idleWindow); err != nil {
		return nil, err
	}
	v := &s6kataView{calls: callsByOp(r.f.counters())}
	ma, err := r.d.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	l1, err := listings()
	if err != nil {
		return nil, err
	}
	v.syncs = int(sumPrefix(ma, "caa_reconcile_passes_total") - sumPrefix(mb, "caa_reconcile_passes_total"))
	v.nodeReads, v.listings = reads(ma)-reads(mb), l1-l0
	if v.syncs > 0 {
		v.nodePerSync = v.nodeReads / float64(v.syncs)
	}
	return v, nil
}
