package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

const (
	s4Pods      = 1000
	s4OtherNode = 10 // the other pods are spread over this many nodes
	s4LimitMiB  = 64
	// s4FlatMiB is the most peak RSS may grow per 1,000 pods on other
	// nodes for the curve to count as flat (caa caches only its node).
	s4FlatMiB = 0.5
)

// s4 measures caa's peak RSS with 1,000 peer pods on its node while the
// cluster's other nodes hold more and more pods.
func (b *bench) s4(ctx context.Context) (Scenario, error) {
	sc := Scenario{ID: "S4", Title: "memory",
		Setup: fmt.Sprintf("%d peer pods on caa's node (EC2 fake, VMs alive); the other pods are plain pods spread over %d other nodes. "+
			"Peak RSS is the kernel's VmHWM of the caa process after it turned ready and then finished one more full pass (`--audit-interval 5s`: every 2.5-7.5 s). "+
			"Two builds of caa: the default one with all three clouds, and one with the EC2 provider only (`make build CLOUDS=aws`), "+
			"as an AWS node would run.", s4Pods, s4OtherNode)}
	e, err := newEnv(ctx, filepath.Join(b.dir, "s4"), b.logf)
	if err != nil {
		return sc, err
	}
	defer e.close()
	const node, ns = "bench-s4", "s4"
	if _, err := e.c.CreateNode(ctx, node); err != nil {
		return sc, err
	}
	if err := createPods(ctx, e, ns, "p", node, 0, s4Pods, true); err != nil {
		return sc, err
	}
	f, err := newFakeCloud("aws")
	if err != nil {
		return sc, err
	}
	defer f.close()
	ledgerPath := filepath.Join(b.dir, "s4", "ledger", "ledger.db")
	if err := mkdir(filepath.Dir(ledgerPath)); err != nil {
		return sc, err
	}
	if err := b.createAll(ctx, e, f, node, ledgerPath, s4Pods); err != nil {
		return sc, err
	}
	type variant struct{ label, bin string }
	variants := []variant{{"all clouds", b.caa}}
	if b.caaAWS != "" {
		variants = append(variants, variant{"EC2 only (-tags caa_aws)", b.caaAWS})
	}
	rows := make([][]Row, len(variants))
	have := 0
	for _, m := range b.others {
		start := time.Now()
		// Each other node gets an equal share, named by node so that
		// growing m only adds pods.
		for k := range s4OtherNode {
			from, to := have/s4OtherNode, m/s4OtherNode
			if err := createPods(ctx, e, "others", fmt.Sprintf("n%d", k), fmt.Sprintf("other-%d", k), from, to, false); err != nil {
				return sc, err
			}
		}
		have = m
		b.logf("S4: %d pods on other nodes (%s)", m, time.Since(start).Round(time.Millisecond))
		for vi, v := range variants {
			row, parts, err := b.peakRSS(ctx, e, f, v.bin, node, ledgerPath)
			if err != nil {
				return sc, err
			}
			row.Case = fmt.Sprintf("%s, %d pods on other nodes", v.label, m)
			rows[vi] = append(rows[vi], row)
			sc.Details = append(sc.Details, fmt.Sprintf("%s, at the same moment (MiB, median): resident now %s, of which anonymous (heap, stacks) %s "+
				"and file-backed (the binary's text and data, the ledger's mmap) %s", row.Case,
				Num(Median(parts["VmRSS:"])), Num(Median(parts["RssAnon:"])), Num(Median(parts["RssFile:"]))))
		}
	}
	for vi, v := range variants {
		sc.Rows = append(sc.Rows, rows[vi]...)
		if len(b.others) < 2 {
			continue
		}
		var xs, ys []float64
		for i, m := range b.others {
			xs = append(xs, float64(m)/1000)
			ys = append(ys, Median(rows[vi][i].Runs))
		}
		sc.Rows = append(sc.Rows, Row{Case: v.label + ", growth with other nodes' pods", Metric: "slope of median peak RSS",
			Unit: "MiB per 1,000 pods", Runs: []float64{Slope(xs, ys)}, HasLimit: true, AtMost: true, Limit: s4FlatMiB})
	}
	return sc, nil
}

// peakRSS runs bin count times on the node and returns its peak RSS row
// and, by /proc field, what was resident at the same moment.
func (b *bench) peakRSS(ctx context.Context, e *env, f *fakeCloud, bin, node, ledgerPath string) (Row, map[string][]float64, error) {
	row := Row{Metric: "peak RSS", Unit: "MiB", HasLimit: true, AtMost: true, Limit: s4LimitMiB}
	parts := map[string][]float64{}
	for i := range b.count {
		// Full passes (the audit, which lists the node's VMs) every 2.5-7.5 s;
		// --resync alone reads only the pod cache and the ledger.
		d, err := StartCaa(bin, b.caaArgs(f, node, e.kubeconfig, ledgerPath, "--resync", "5s", "--audit-interval", "5s"), hermeticEnv(f.env...), b.logPath("s4"))
		if err != nil {
			return row, nil, err
		}
		if _, err := d.WaitReady(ctx, 5*time.Minute); err != nil {
			_ = d.Stop()
			return row, nil, fmt.Errorf("S4 run %d: %w", i+1, err)
		}
		if err := waitPasses(ctx, d, 2); err != nil {
			_ = d.Stop()
			return row, nil, err
		}
		kib, err := d.PeakRSS()
		if err != nil {
			_ = d.Stop()
			return row, nil, err
		}
		for _, field := range []string{"VmRSS:", "RssAnon:", "RssFile:"} {
			v, err := procStatusKiB(d.Pid(), field)
			if err != nil {
				_ = d.Stop()
				return row, nil, err
			}
			parts[field] = append(parts[field], float64(v)/1024)
		}
		if err := d.Stop(); err != nil {
			return row, nil, err
		}
		row.Runs = append(row.Runs, float64(kib)/1024)
	}
	return row, parts, nil
}

// waitPasses waits until caa has finished n reconcile passes.
func waitPasses(ctx context.Context, d *Daemon, n float64) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		m, err := d.Metrics(ctx)
		if err != nil {
			return err
		}
		total := 0.0
		for k, v := range m {
			if strings.HasPrefix(k, "caa_reconcile_passes_total") {
				total += v
			}
		}
		if total >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("caa did not finish %v passes within a minute", n)
}
