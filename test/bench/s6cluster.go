package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/provider/azure"
)

// S6 with the cluster caa: one `caa cluster` (a single replica, so the
// leader at once) beside the fleet, listing every VM of the cluster once
// per interval and publishing each node's view; the nodes' audits then
// read nothing while their ledgers agree with their views.

const (
	// s6ClusterNamespace holds the cluster caa's Lease.
	s6ClusterNamespace = "caa-system"
	// s6ClusterInterval is `caa cluster`'s default --interval.
	s6ClusterInterval = 10 * time.Minute
	// s6ClusterListings is how many listings the cluster caa makes alone
	// before the fleet joins it: its own cost per listing.
	s6ClusterListings = 2
)

// s6ClusterPage is, per cloud, the VMs one page of the cluster caa's
// listing holds (EC2 DescribeInstances' MaxResults, 1,000; Global
// Search's limit, 1,000 hits, two per VM: the instance and its boot
// volume), for the extrapolation. Azure's listing is grouped by node and
// grows by azure.ClusterParts instead.
var s6ClusterPage = map[string]float64{"aws": 1000, "azure": 1000, "ibmcloud": 500}

// s6ClusterMeasured is what the cluster phase counted.
type s6ClusterMeasured struct {
	// alone: the cluster caa's calls over its listings with no node caa
	// running; listingsAlone of them.
	alone         map[string]int64
	listingsAlone float64
	// idle: every call of the fleet and the cluster caa in the idle
	// window, the node audits and cluster listings finished in it.
	idle     map[string]int64
	audits   float64
	listings float64
}

// s6ClusterIdle measures the idle fleet with the cluster caa beside it.
// It leaves the fleet stopped, as it found it.
func (b *bench) s6ClusterIdle(ctx context.Context, e *env, fl *fleet, f *fakeCloud, cfg s6Config, clock *budgetClock) (*s6ClusterMeasured, error) {
	if err := e.c.EnsureNamespace(ctx, s6ClusterNamespace); err != nil {
		return nil, err
	}
	args := []string{"--kubeconfig", e.kubeconfig, "--identity", "bench-" + f.name, "--lease-namespace", s6ClusterNamespace,
		"--interval", cfg.idleAudit.String(), "--node-gone-grace", "24h", "--log-format", "json"}
	cc, err := startCaaCommand(b.caa, "cluster", append(args, f.flags...), hermeticEnv(f.env...), b.logPath("s6-"+f.name+"-cluster"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = cc.Stop() }()
	listings := func() (float64, error) {
		m, err := cc.Metrics(ctx)
		if err != nil {
			return 0, err
		}
		return m[`caa_cluster_listings_total{result="ok"}`], nil
	}
	waitListings := func(n float64, limit time.Duration) (float64, error) {
		deadline := time.Now().Add(limit)
		for {
			got, err := listings()
			if err == nil && got >= n {
				return got, nil
			}
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("%s: the cluster caa made %v listings in %s, want %v (err %v); see %s", f.name, got, limit, n, err, cc.logPath)
			}
			if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
				return 0, err
			}
		}
	}
	out := &s6ClusterMeasured{}

	// Alone: its own cost per listing.
	l0, err := waitListings(1, 2*time.Minute)
	if err != nil {
		return nil, err
	}
	f.resetCounters()
	l1, err := waitListings(l0+s6ClusterListings, time.Duration(s6ClusterListings+2)*cfg.idleAudit)
	if err != nil {
		return nil, err
	}
	out.alone, out.listingsAlone = f.counters(), l1-l0

	// With the fleet, once every node audits against its view.
	clock.setFast(true)
	err = fl.startAll(ctx, "--audit-interval", cfg.idleAudit.String(), "--cluster-view")
	if err == nil {
		err = waitViews(ctx, fl, 2*time.Minute)
	}
	clock.setFast(false)
	if err != nil {
		return nil, fmt.Errorf("idle with the cluster caa: %w", err)
	}
	p0, err := fl.passes(ctx)
	if err != nil {
		return nil, err
	}
	l0, err = listings()
	if err != nil {
		return nil, err
	}
	f.resetCounters()
	clock.setSpeed(float64(s6Audit) / float64(cfg.idleAudit))
	if err := sleepCtx(ctx, cfg.idleWindow); err != nil {
		return nil, err
	}
	out.idle = f.counters()
	clock.setSpeed(1)
	p1, err := fl.passes(ctx)
	if err != nil {
		return nil, err
	}
	l1, err = listings()
	if err != nil {
		return nil, err
	}
	out.audits, out.listings = p1-p0, l1-l0
	if err := fl.stopAll(); err != nil {
		return nil, err
	}
	return out, nil
}

// waitViews waits until every node's caa has said it audits from the
// cluster caa's view. A caa that exited because its health port was taken
// meanwhile (see fleet.waitReady) is started again.
func waitViews(ctx context.Context, fl *fleet, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for i := range fl.daemons {
		restarts := 0
		for {
			d := fl.daemons[i]
			log, _ := os.ReadFile(d.logPath)
			if strings.Contains(string(log), "auditing from the cluster caa's cloud view") {
				break
			}
			if d.exited() && restarts < 2 && strings.Contains(tail(d.logPath, 3), "address already in use") {
				restarts++
				fl.b.logf("S6 %s: %s's health port was taken; starting it again", fl.f.name, fl.nodes[i])
				if err := fl.start(i, fl.extra[i]...); err != nil {
					return err
				}
				if _, err := fl.waitReady(ctx, i, time.Minute); err != nil {
					return err
				}
				continue
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s never audited from the cluster caa's view in %s; see %s", fl.nodes[i], limit, d.logPath)
			}
			if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
				return err
			}
		}
	}
	// The views are on the Nodes too.
	for _, node := range fl.nodes {
		n, err := fl.e.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Annotations["caa.dev/cloud-view"] == "" {
			return fmt.Errorf("node %s has no cloud view", node)
		}
	}
	return nil
}

// s6ClusterRows turns the cluster phase's counts into rows: the fleet's
// reads an hour with the cluster caa at the bench's size and at 1,000
// nodes x 30 pods, each as a percentage of the account-wide read buckets,
// beside the same figure without it (noCluster, reads per node per hour
// by op at that size).
func s6ClusterRows(cfg s6Config, m *s6Measured, cm *s6ClusterMeasured, noCluster map[string]float64) ([]Row, []string) {
	name := m.name
	var rows []Row
	var details []string
	atMost := func(c, metric, unit string, limit float64, v ...float64) Row {
		return Row{Case: c, Metric: metric, Unit: unit, Runs: v, HasLimit: true, AtMost: true, Limit: limit}
	}

	// The cluster caa's own reads per listing, and the node caas' per
	// audit (the window's reads less the listings').
	perListing := scaleMap(ofKind(toFloat(cm.alone), kindRead), 1/max(cm.listingsAlone, 1))
	windowReads := ofKind(toFloat(cm.idle), kindRead)
	nodeReads := map[string]float64{}
	for op, v := range windowReads {
		if rest := v - perListing[op]*cm.listings; rest > 0 {
			nodeReads[op] = rest
		}
	}
	perAudit := scaleMap(nodeReads, 1/max(cm.audits, 1))
	listingsPerHour := float64(time.Hour) / float64(s6ClusterInterval)

	// The fleet an hour at a size: the listings (their listing calls
	// growing by pages of the cluster's VMs, any other call by VMs) and
	// every node's audits.
	v0 := float64(cfg.nodes * cfg.pods)
	page := s6ClusterPage[name]
	fleetHour := func(nodes, vms float64) map[string]float64 {
		listing := map[string]float64{}
		for op, v := range perListing {
			k := vms / v0
			if isListingOp(op) {
				k = math.Ceil(vms/page) / math.Ceil(v0/page)
				if name == "azure" {
					// Grouped by node: a count, then a query per part.
					k = float64(1+azure.ClusterParts(int(nodes), int(vms))) / float64(1+azure.ClusterParts(cfg.nodes, int(v0)))
				}
			}
			listing[op] = v * k
		}
		return addMaps(scaleMap(listing, listingsPerHour), scaleMap(perAudit, nodes*AuditsPerHour(s6Audit)))
	}
	details = append(details, fmt.Sprintf("%s, idle with the cluster caa: alone, %s listings of the %d VMs cost %s reads by op (%s per listing); "+
		"with the %d node caas (`--audit-interval %s`, the cluster caa's `--interval` the same; each had said it audits from the view), %s audits "+
		"and %s listings in %s, reads by op %s, so per node audit %s",
		name, Num(cm.listingsAlone), cfg.nodes*cfg.pods, CountsLine(ofKind(cm.alone, kindRead)), CountsLine(roundMap(perListing)),
		cfg.nodes, cfg.idleAudit, Num(cm.audits), Num(cm.listings), cfg.idleWindow,
		CountsLine(ofKind(cm.idle, kindRead)), CountsLine(roundMap(perAudit))))

	for _, size := range []struct {
		nodes, pods int
	}{{cfg.nodes, cfg.pods}, {s6ScaleNodes, s6ScalePods}} {
		c := fmt.Sprintf("%s, idle with the cluster caa, %d nodes x %d pods", name, size.nodes, size.pods)
		hour := fleetHour(float64(size.nodes), float64(size.nodes*size.pods))
		rows = append(rows, Row{Case: c, Metric: "fleet's cloud reads per hour", Unit: "reads", Runs: []float64{sumMap(hour)}})
		byClass, _ := ClassUse(name, hour)
		var bucketRows []Row
		for _, class := range readClasses(name) {
			bucketRows = append(bucketRows, atMost(c, class+" bucket", "% of refill", s6IdlePercent,
				PercentOfRefill(byClass[class]/3600, m.limits[class])))
		}
		rows = append(rows, busiest(bucketRows, strings.TrimPrefix(c, name+", ")+": busiest read bucket")...)
		shape := fmt.Sprintf("linear in pages of %s VMs", Num(page))
		if name == "azure" {
			shape = fmt.Sprintf("a count and %d grouped queries, azure.ClusterParts", azure.ClusterParts(size.nodes, size.nodes*size.pods))
		}
		details = append(details, fmt.Sprintf("%s: reads an hour by op %s (listings every %s, %s; node audits every %s)",
			c, CountsLine(roundMap(hour)), s6ClusterInterval, shape, s6Audit))
	}
	// Without it, at 1,000 nodes, for the comparison in one place.
	c := fmt.Sprintf("%s, idle without the cluster caa, %d nodes x %d pods", name, s6ScaleNodes, s6ScalePods)
	hour := scaleMap(noCluster, s6ScaleNodes)
	rows = append(rows, Row{Case: c, Metric: "fleet's cloud reads per hour", Unit: "reads", Runs: []float64{sumMap(hour)}})
	byClass, _ := ClassUse(name, hour)
	var bucketRows []Row
	for _, class := range readClasses(name) {
		bucketRows = append(bucketRows, Row{Case: c, Metric: class + " bucket", Unit: "% of refill", Runs: []float64{PercentOfRefill(byClass[class]/3600, m.limits[class])}})
	}
	rows = append(rows, busiest(bucketRows, strings.TrimPrefix(c, name+", ")+": busiest read bucket")...)
	if name == "ibmcloud" {
		details = append(details, "ibmcloud: the buckets' refills are assumptions, not IBM's figures: IBM Cloud publishes no per-account "+
			"rate for the VPC API nor for Global Search; the fake meters VPC reads at EC2's DescribeInstances refill (20 a second) and "+
			"Global Search at 10 a second (test/mocks/ibmcloud/budget.go)")
	}
	return rows, details
}

// isListingOp reports whether op pages through a collection.
func isListingOp(op string) bool { return slices.Contains(listingOps, op) }
