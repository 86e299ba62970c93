package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

const (
	s5Pods = 100 // a node's worth: the kubelet's default max-pods is 110
	// s5Slice is the length of one sample of the steady-state rate.
	s5Slice = 30 * time.Second
	// probePeriod is the kubelet's default probe period; a naive caa
	// would list its node's pods on each readiness and liveness probe.
	probePeriod = 10 * time.Second
)

// s5 measures what caa costs the apiserver in steady state, beside a
// naive design that lists the node's pods on every probe.
func (b *bench) s5(ctx context.Context) (Scenario, error) {
	slices := max(int(b.s5Window/s5Slice), 1)
	sc := Scenario{ID: "S5", Title: "apiserver cost per node",
		Setup: fmt.Sprintf("%d peer pods on the node (EC2 fake), caa with `--resync 15s`; requests and response bytes counted by a proxy "+
			"in front of the apiserver, by verb, over %s after ready in %d slices of %s (each slice one run). The naive design runs beside it "+
			"through its own proxy: one LIST of the node's pods (field selector, no resourceVersion) per readiness and per liveness probe "+
			"every %s.", s5Pods, time.Duration(slices)*s5Slice, slices, s5Slice, probePeriod)}
	e, err := newEnv(ctx, filepath.Join(b.dir, "s5"), b.logf)
	if err != nil {
		return sc, err
	}
	defer e.close()
	const node, ns = "bench-s5", "s5"
	if _, err := e.c.CreateNode(ctx, node); err != nil {
		return sc, err
	}
	if err := createPods(ctx, e, ns, "p", node, 0, s5Pods, true); err != nil {
		return sc, err
	}
	f, err := newFakeCloud("aws")
	if err != nil {
		return sc, err
	}
	defer f.close()
	ledgerPath := filepath.Join(b.dir, "s5", "ledger", "ledger.db")
	if err := mkdir(filepath.Dir(ledgerPath)); err != nil {
		return sc, err
	}
	if err := b.createAll(ctx, e, f, node, ledgerPath, s5Pods); err != nil {
		return sc, err
	}
	naiveProxy, err := StartProxy(e.c.URL(), e.c.RestConfig().CAData)
	if err != nil {
		return sc, err
	}
	defer naiveProxy.Close()
	naiveClient, err := proxyClient(naiveProxy, e.c.RestConfig().BearerToken)
	if err != nil {
		return sc, err
	}

	startup := e.proxy.Snapshot()
	d, err := StartCaa(b.caa, b.caaArgs(f, node, e.kubeconfig, ledgerPath, "--resync", "15s"), hermeticEnv(f.env...), b.logPath("s5"))
	if err != nil {
		return sc, err
	}
	defer func() { _ = d.Stop() }()
	if _, err := d.WaitReady(ctx, 5*time.Minute); err != nil {
		return sc, err
	}
	toReady := Diff(e.proxy.Snapshot(), startup)

	probeCtx, stopProbes := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 { // readiness and liveness
		wg.Go(func() { naiveProber(probeCtx, naiveClient, node) })
	}
	defer func() { stopProbes(); wg.Wait() }()
	// Slices start half a probe period after the probes, so no probe is
	// cut in two by a slice boundary (counted in one, its bytes in the next).
	select {
	case <-ctx.Done():
		return sc, ctx.Err()
	case <-time.After(probePeriod / 2):
	}

	caaReq := Row{Case: "caa", Metric: "requests", Unit: "req/min"}
	caaBytes := Row{Case: "caa", Metric: "response bytes", Unit: "KiB/min"}
	caaGets := Row{Case: "caa", Metric: "pod GETs", Unit: "req/min", HasLimit: true, AtMost: true}
	naiveReq := Row{Case: "naive (LIST per probe)", Metric: "requests", Unit: "req/min"}
	naiveBytes := Row{Case: "naive (LIST per probe)", Metric: "response bytes", Unit: "KiB/min"}
	caaSum, naiveSum := map[string]Traffic{}, map[string]Traffic{}
	perMin := float64(time.Minute) / float64(s5Slice)
	for range slices {
		c0, n0 := e.proxy.Snapshot(), naiveProxy.Snapshot()
		select {
		case <-ctx.Done():
			return sc, ctx.Err()
		case <-time.After(s5Slice):
		}
		c := Diff(e.proxy.Snapshot(), c0)
		n := Diff(naiveProxy.Snapshot(), n0)
		cr, cb := totals(c)
		nr, nb := totals(n)
		caaReq.Runs = append(caaReq.Runs, cr*perMin)
		caaBytes.Runs = append(caaBytes.Runs, cb/1024*perMin)
		caaGets.Runs = append(caaGets.Runs, float64(c["get pods"].Requests)*perMin)
		naiveReq.Runs = append(naiveReq.Runs, nr*perMin)
		naiveBytes.Runs = append(naiveBytes.Runs, nb/1024*perMin)
		add(caaSum, c)
		add(naiveSum, n)
	}
	m, err := d.Metrics(ctx)
	if err != nil {
		return sc, err
	}
	passes := 0.0
	for k, v := range m {
		if strings.HasPrefix(k, "caa_reconcile_passes_total") {
			passes += v
		}
	}
	sc.Rows = append(sc.Rows, caaReq, caaBytes, caaGets, naiveReq, naiveBytes)
	sc.Details = append(sc.Details,
		"caa, start to ready: "+trafficLine(toReady),
		"caa, steady state (whole window): "+trafficLine(caaSum),
		"naive, steady state (whole window): "+trafficLine(naiveSum),
		fmt.Sprintf("caa finished %v reconcile passes by the end of the window; a resync lists the cloud and reads the informer's cache, "+
			"never the apiserver", passes))
	return sc, nil
}

// naiveProber lists the node's pods once per probe period until ctx ends.
func naiveProber(ctx context.Context, client kubernetes.Interface, node string) {
	tick := time.NewTicker(probePeriod)
	defer tick.Stop()
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	for {
		_, _ = client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: sel})
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func totals(m map[string]Traffic) (reqs, bytes float64) {
	for _, t := range m {
		reqs += float64(t.Requests)
		bytes += float64(t.Bytes)
	}
	return reqs, bytes
}

func add(sum, m map[string]Traffic) {
	for k, t := range m {
		s := sum[k]
		s.Requests += t.Requests
		s.Bytes += t.Bytes
		sum[k] = s
	}
}

// trafficLine prints "verb resource: n requests, b bytes" for each key.
func trafficLine(m map[string]Traffic) string {
	reqs := map[string]int64{}
	for k, t := range m {
		reqs[k+fmt.Sprintf(" (%d B)", t.Bytes)] = t.Requests
	}
	return CountsLine(reqs)
}
