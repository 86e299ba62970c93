package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/caa-project/caa/pkg/reconcile"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

func TestAuditJitterAveragesTheInterval(t *testing.T) {
	// reconcile.AuditJitter draws u uniform in [0, 1); over an even grid of
	// u its waits average the interval, so the long-run rate is one audit
	// per interval and six an hour at the default.
	const steps = 1000
	var sum time.Duration
	for i := range steps {
		sum += reconcile.AuditJitter(10*time.Minute, (float64(i)+0.5)/steps)
	}
	assert.InDelta(t, float64(10*time.Minute), float64(sum/steps), float64(time.Millisecond))
	assert.InDelta(t, 6, AuditsPerHour(10*time.Minute), 1e-9)
	assert.InDelta(t, 240, AuditsPerHour(15*time.Second), 1e-9)
	assert.Zero(t, AuditsPerHour(0))

	// 10 calls in a minute with audits every 15 s are 600 an hour, and a
	// fortieth of that with audits every 10 minutes.
	assert.InDelta(t, 15, ScaleToInterval(10, time.Minute, 15*time.Second, 10*time.Minute), 1e-9)
}

func TestKindsOfCalls(t *testing.T) {
	calls := map[string]int64{
		cloud.OpList: 2, cloud.OpGet: 3, cloud.OpCreate: 1, armfake.OpNICCreate: 1, armfake.OpOperation: 4,
		vpcfake.OpIAMToken: 1, "total": 12, ec2fake.OpDryRun: 1, armfake.OpNICList: 1,
	}
	assert.EqualValues(t, 6, sumKind(calls, kindRead), "list, get and the NIC listing")
	assert.EqualValues(t, 2, sumKind(calls, kindWrite))
	assert.EqualValues(t, 4, sumKind(calls, kindPoll))
	assert.EqualValues(t, 1, sumKind(calls, kindAuth))
	assert.EqualValues(t, 1, sumKind(calls, kindDryRun))
	assert.EqualValues(t, 3, listings(calls))
	assert.Equal(t, kindRead, kindOf("something-new"), "a call S6 cannot place counts as a read")
	assert.Equal(t, kindPoll, kindOf(lroPrefix+cloud.OpGet), "the SDK's GET of a resource it just wrote")
	assert.Equal(t, kindRead, kindOf(opLookup))
	assert.Zero(t, listings(map[string]int64{opLookup: 1}), "a lookup by name or token is no listing")
	assert.Equal(t, ec2fake.OpLookup, opLookup, "EC2 fake counts its token lookup under the same name")
}

func TestClassUseAndPercentOfRefill(t *testing.T) {
	byClass, unmetered := ClassUse("azure", map[string]float64{cloud.OpList: 6, cloud.OpGet: 2, armfake.OpNICList: 6, armfake.OpOperation: 9})
	assert.Equal(t, map[string]float64{armfake.ClassList: 6, armfake.ClassGet: 2}, byClass)
	assert.Equal(t, map[string]float64{armfake.OpNICList: 6}, unmetered, "the fake meters no NIC call; polls are no read")

	byClass, _ = ClassUse("aws", map[string]float64{cloud.OpCreate: 1, ec2fake.OpLookup: 1, cloud.OpGet: 1})
	assert.Equal(t, map[string]float64{ec2fake.ClassRun: 1, ec2fake.ClassRunInstances: 1, ec2fake.ClassDescribe: 2}, byClass)

	// 1,000 nodes at 6 reads an hour draw 1.67 a second: 8.3% of
	// DescribeInstances' 20 a second, 33% of Azure's list refill of 300 a
	// minute.
	perSecond := 1000 * 6 / 3600.0
	assert.InDelta(t, 8.333, PercentOfRefill(perSecond, ec2fake.PublishedLimits()[ec2fake.ClassDescribe]), 1e-3)
	assert.InDelta(t, 33.33, PercentOfRefill(perSecond, armfake.PublishedLimits()[armfake.ClassList]), 1e-2)
	assert.InDelta(t, 5, RefillPerSecond(cloud.PerMinute(900, 300)), 1e-9)
}

func TestWriteBoundRateAndExtend(t *testing.T) {
	limits := ec2fake.PublishedLimits()
	rate, binding := WriteBoundRate(map[string]float64{ec2fake.ClassRun: 1, ec2fake.ClassRunInstances: 1, ec2fake.ClassDescribe: 2},
		writeClasses("aws"), limits)
	assert.InDelta(t, 2, rate, 1e-9, "a launch a pod: the instance bucket's 2 a second binds before the request bucket's 5")
	assert.Equal(t, ec2fake.ClassRunInstances, binding)
	rate, binding = WriteBoundRate(map[string]float64{ec2fake.ClassDescribe: 2}, writeClasses("aws"), limits)
	assert.Zero(t, rate)
	assert.Empty(t, binding)

	assert.Equal(t, []string{ec2fake.ClassDescribe}, readClasses("aws"))
	assert.Equal(t, []string{vpcfake.ClassRead, vpcfake.ClassSearch}, readClasses("ibmcloud"))

	assert.InDelta(t, 1, Extend(1, 0, 720, 30000), 1e-9, "no growth per VM: the same calls")
	assert.InDelta(t, 31, Extend(1.3, 0.001, 300, 30000), 1e-9)
	assert.Zero(t, Extend(1, -1, 0, 10), "never below zero")
}

func TestPivotPutsCloudsInColumns(t *testing.T) {
	sc := Scenario{ID: "S6", Title: "fleet", Pivot: true, Rows: []Row{
		{Case: "aws, idle", Metric: "reads", Unit: "reads", Runs: []float64{6}, HasLimit: true, AtMost: true, Limit: 8},
		{Case: "azure, idle", Metric: "reads", Unit: "reads", Runs: []float64{12}, HasLimit: true, AtMost: true, Limit: 8},
		{Case: "azure, startup, 5000 others", Metric: "time", Unit: "ms", Runs: []float64{110}, Bound: 100, MaxRatio: 1.1,
			BoundNote: "the median with 0 others"},
	}}
	var b strings.Builder
	sc.WriteMarkdown(&b, "####", false)
	out := b.String()
	assert.Contains(t, out, "| figure | target | aws | azure |")
	assert.Contains(t, out, "| idle: reads | <= 8.00 reads | 6.00 reads pass | 12.0 reads MISS |")
	assert.Contains(t, out, "| startup, 5000 others: time | <= 1.1x the median with 0 others | - | 110 ms (1.10x) pass |")
	b.Reset()
	sc.WriteMarkdown(&b, "##", true)
	assert.Contains(t, b.String(), "| case | metric |", "results.md keeps the full table")
}

func TestBudgetClockNeverRunsBack(t *testing.T) {
	c := newBudgetClock()
	t0 := c.now()
	c.rest()
	t1 := c.now()
	assert.GreaterOrEqual(t, t1.Sub(t0), time.Hour, "a rest is an hour of quiet")
	c.setFast(true)
	t2, t3 := c.now(), c.now()
	assert.GreaterOrEqual(t, t3.Sub(t2), time.Hour, "fast: each reading an hour on")
	c.setFast(false)
	c.setSpeed(40)
	t4 := c.now()
	c.setSpeed(1)
	t5 := c.now()
	assert.False(t, t4.Before(t3))
	assert.False(t, t5.Before(t4), "changing speed never moves the clock back")
}

func TestMergeReplacesOnlyTheScenariosRun(t *testing.T) {
	dir := t.TempDir()
	old := Results{Count: 5, LoadBefore: "0.5", Scenarios: []Scenario{{ID: "S1", Title: "old one"}, {ID: "S6", Title: "old six"}}}
	assert.NoError(t, old.Write(io.Discard, dir))
	started := time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC)
	got, err := mergeInto(dir, Results{Count: 1, Started: started, LoadBefore: "3", LoadAfter: "4", Machine: Machine{CPUs: 2},
		Scenarios: []Scenario{{ID: "S6", Title: "new six", Took: "12m0s"}, {ID: "S7", Title: "new"}}})
	assert.NoError(t, err)
	assert.Equal(t, 5, got.Count, "the header stays the run's that measured the rest")
	assert.Equal(t, []string{"old one", "new six", "new"}, []string{got.Scenarios[0].Title, got.Scenarios[1].Title, got.Scenarios[2].Title})
	assert.Empty(t, got.Scenarios[0].Ran)
	assert.Contains(t, got.Scenarios[1].Ran, "2026-11-30 22:00 UTC")
	assert.Contains(t, got.Scenarios[1].Ran, "-scenarios s6 -merge")
	assert.Contains(t, got.Scenarios[1].Ran, "in 12m0s, on a shared 2-CPU machine; load average before: 3; after: 4")

	fresh, err := mergeInto(t.TempDir(), Results{Count: 1, Scenarios: []Scenario{{ID: "S6"}}})
	assert.NoError(t, err)
	assert.Equal(t, 1, fresh.Count, "no results file: the run stands alone")
}

// S6-kata, new to a results file, goes right after S6 (its informer rows),
// not at the end; its rerun command names the flag's spelling.
func TestMergePutsAVariantBesideItsScenario(t *testing.T) {
	dir := t.TempDir()
	old := Results{Count: 5, Scenarios: []Scenario{{ID: "S1"}, {ID: "S6"}, {ID: "S7"}}}
	assert.NoError(t, old.Write(io.Discard, dir))
	got, err := mergeInto(dir, Results{Count: 1, Scenarios: []Scenario{{ID: "S6-kata"}, {ID: "S10"}}})
	assert.NoError(t, err)
	var ids []string
	for _, s := range got.Scenarios {
		ids = append(ids, s.ID)
	}
	assert.Equal(t, []string{"S1", "S6", "S6-kata", "S7", "S10"}, ids)
	assert.Contains(t, got.Scenarios[2].Ran, "-scenarios s6-kata -merge")
}

func TestBusiestBucketLeadsThePivot(t *testing.T) {
	rows := busiest([]Row{
		{Case: "azure, idle", Metric: "vm-list bucket", Unit: "%", Runs: []float64{0}},
		{Case: "azure, idle", Metric: "graph-per-user bucket", Unit: "%", Runs: []float64{55.6}},
	}, "idle: busiest read bucket")
	sc := Scenario{Pivot: true, Rows: rows}
	var b strings.Builder
	sc.WriteMarkdown(&b, "####", false)
	assert.Contains(t, b.String(), "| idle: busiest read bucket | - | 55.6 % (graph-per-user) |")
	assert.NotContains(t, b.String(), "vm-list")
	b.Reset()
	sc.WriteMarkdown(&b, "##", true)
	assert.Contains(t, b.String(), "vm-list", "results.md keeps every bucket")
}

func TestMergeByCloudKeepsTheCloudsNotRun(t *testing.T) {
	prev := Scenario{ID: "S6", Pivot: true, Ran: "Measured at ten.", Rows: []Row{
		{Case: "aws, idle", Metric: "reads"}, {Case: "azure, idle", Metric: "reads", Runs: []float64{6}},
	}, Details: []string{"aws: not measured: port taken", "azure, idle: 6 audits"}}
	next := Scenario{ID: "S6", Pivot: true, Ran: "Measured at eleven.", Rows: []Row{
		{Case: "aws, idle", Metric: "reads", Runs: []float64{6}}, {Case: "azure, idle", Metric: "reads"},
	}, Details: []string{"aws, idle: 7 audits", "azure: not measured: port taken"}}
	got := mergeByCloud(prev, next)
	assert.Equal(t, []float64{6}, got.Rows[0].Runs)
	assert.Equal(t, []float64{6}, got.Rows[1].Runs)
	assert.Equal(t, []string{"aws, idle: 7 audits", "azure, idle: 6 audits"}, got.Details)
	assert.Equal(t, "Measured at eleven. Only aws from that run; azure from the run before it: Measured at ten.", got.Ran)
	prev.Setup, next.Setup = "24 caa processes.", "12 caa processes."
	assert.Equal(t, "Measured at eleven. Only aws from that run; azure from the run before it: Measured at ten. "+
		"The setup below is that run's; azure ran with the setup before it: 24 caa processes.", mergeByCloud(prev, next).Ran,
		"a smaller fleet's run says what the rows it kept were measured with")
	all := Scenario{ID: "S6", Pivot: true, Rows: []Row{{Case: "aws, idle", Runs: []float64{5}}}}
	assert.Equal(t, all, mergeByCloud(Scenario{Rows: []Row{{Case: "aws, idle"}}}, all), "every cloud measured again: the new run whole")
}

// TestClusterRowsScaleListingsByPages: the cluster caa's listing grows
// by pages of the cluster's VMs (two hits a VM on IBM), the node audits
// by nodes, and the fleet's draw is a share of each bucket's refill.
func TestClusterRowsScaleListingsByPages(t *testing.T) {
	cfg := s6Config{nodes: 24, pods: 30, idleAudit: 15 * time.Second, idleWindow: 45 * time.Second}
	m := &s6Measured{name: "ibmcloud", limits: vpcfake.PublishedLimits()}
	cm := &s6ClusterMeasured{
		// Alone: 2 listings of 720 VMs, each 2 searches (1,440 hits).
		alone: map[string]int64{opSearch: 4, vpcfake.OpIAMToken: 1}, listingsAlone: 2,
		// With the fleet: 3 listings (6 searches) and 72 audits that read
		// nothing.
		idle: map[string]int64{opSearch: 6}, audits: 72, listings: 3,
	}
	rows, _ := s6ClusterRows(cfg, m, cm, map[string]float64{opSearch: 6})
	get := func(c, metric string) float64 {
		for _, r := range rows {
			if r.Case == c && r.Metric == metric {
				return r.Runs[0]
			}
		}
		t.Fatalf("no row %q %q", c, metric)
		return 0
	}
	// At the bench's size: 2 searches a listing, 6 listings an hour.
	assert.InDelta(t, 12, get("ibmcloud, idle with the cluster caa, 24 nodes x 30 pods", "fleet's cloud reads per hour"), 1e-9)
	// At 30,000 VMs: 60 pages of 500 VMs instead of 2.
	at := "ibmcloud, idle with the cluster caa, 1000 nodes x 30 pods"
	assert.InDelta(t, 6*2*30, get(at, "fleet's cloud reads per hour"), 1e-9)
	assert.InDelta(t, 100*360.0/3600/10, get(at, vpcfake.ClassSearch+" bucket"), 1e-9, "of Global Search's 10 a second")
	// Without it: 6 searches per node per hour, 1,000 nodes.
	assert.InDelta(t, 6000, get("ibmcloud, idle without the cluster caa, 1000 nodes x 30 pods", "fleet's cloud reads per hour"), 1e-9)
}

// TestClusterRowsScaleAzureByParts: Azure's cluster listing is grouped by
// node: a count and one query per part of the nodes (azure.ClusterParts),
// so 30,000 VMs cost 7 queries a listing, not 30 pages.
func TestClusterRowsScaleAzureByParts(t *testing.T) {
	cfg := s6Config{nodes: 24, pods: 30, idleAudit: 15 * time.Second, idleWindow: 45 * time.Second}
	m := &s6Measured{name: "azure", limits: armfake.PublishedLimits()}
	cm := &s6ClusterMeasured{
		// Alone: 2 listings of 720 VMs, each a count and one grouped query.
		alone: map[string]int64{opGraph: 4}, listingsAlone: 2,
		idle: map[string]int64{opGraph: 6}, audits: 72, listings: 3,
	}
	rows, _ := s6ClusterRows(cfg, m, cm, map[string]float64{opGraph: 6})
	var got, pct float64
	for _, r := range rows {
		if r.Case == "azure, idle with the cluster caa, 1000 nodes x 30 pods" && r.Metric == "fleet's cloud reads per hour" {
			got = r.Runs[0]
		}
		if r.Case == "azure, idle with the cluster caa, 1000 nodes x 30 pods" && r.Metric == armfake.ClassGraphUser+" bucket" {
			pct = r.Runs[0]
		}
	}
	assert.InDelta(t, 6*7, got, 1e-9, "6 listings an hour of a count and 6 parts")
	assert.InDelta(t, 100*42.0/3600/3, pct, 1e-9, "of Resource Graph's 15 queries per 5 s")
}
