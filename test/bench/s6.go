package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// S6's fixed figures.
const (
	// s6Audit is caa's default --audit-interval, the one the idle
	// figures are for.
	s6Audit = 10 * time.Minute
	// s6BootCheck is caa's look at a new VM once it should have booted
	// (reconcile.Reconciler.BootCheck's default; no flag sets it).
	s6BootCheck = 30 * time.Second
	// s6BootDelay keeps a VM created during the churn Pending for a
	// while, so that the create's answer shows it booting, as a real
	// cloud's does.
	s6BootDelay = 10 * time.Second
	// The fleet the extrapolation is for.
	s6ScaleNodes = 1000
	s6ScalePods  = 30
	// Targets.
	s6IdleReadsPerHour = 8.0
	s6IdlePercent      = 1.0
	s6CreateReads      = 2.0
	s6DeleteReads      = 1.0
	s6StartupRatio     = 1.1
)

// s6Config sizes S6.
type s6Config struct {
	nodes, pods int
	// others are the VMs of other nodes seeded for the startup cases.
	others []int
	// idleAudit is the short --audit-interval of the idle phase; it
	// lasts idleWindow. quiet is the window with audits 10 minutes away.
	idleAudit, idleWindow, quiet time.Duration
	// churnPerNode pods are created on each node, churnRate a second,
	// then deleted at the same pace.
	churnPerNode int
	churnRate    float64
	// startupRuns of one node's startup per case, but no new run once a
	// case has taken levelTime.
	startupRuns int
	levelTime   time.Duration
	// startLimit is how long the whole fleet, started at once, may take
	// to be ready.
	startLimit time.Duration
}

func s6Full() s6Config {
	return s6Config{nodes: 24, pods: 30, others: []int{0, 5000, 20000}, idleAudit: 15 * time.Second, idleWindow: 45 * time.Second,
		quiet: 15 * time.Second, churnPerNode: 2, churnRate: 4, startupRuns: 3, levelTime: time.Minute, startLimit: 45 * time.Second}
}

func s6Quick() s6Config {
	return s6Config{nodes: 5, pods: 10, others: []int{0, 2000}, idleAudit: 10 * time.Second, idleWindow: 30 * time.Second,
		quiet: 5 * time.Second, churnPerNode: 1, churnRate: 4, startupRuns: 1, levelTime: 30 * time.Second, startLimit: 30 * time.Second}
}

// budgetClock is the clock of a fake's budget. While fast, every reading
// is an hour past the one before, so every bucket is full at every call:
// the fleet's setup (unmeasured) creates its VMs without waiting out the
// write buckets. rest moves it an hour on at once, as if the account had
// been quiet for an hour. At speed k it runs k times the wall clock: the
// idle phase, whose audits come k times as often as at the default
// interval, has the buckets refill k times as fast to match.
type budgetClock struct {
	mu sync.Mutex
	// at is the clock's reading at the wall time wall; it runs speed
	// times the wall clock from there.
	at, wall time.Time
	speed    float64
	fast     bool
}

func newBudgetClock() *budgetClock {
	now := time.Now()
	return &budgetClock{at: now, wall: now, speed: 1}
}

func (c *budgetClock) read() time.Time {
	return c.at.Add(time.Duration(c.speed * float64(time.Since(c.wall))))
}

func (c *budgetClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fast {
		c.at = c.at.Add(time.Hour)
	}
	return c.read()
}

func (c *budgetClock) setFast(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fast = on
}

func (c *budgetClock) setSpeed(k float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at, c.wall, c.speed = c.read(), time.Now(), k
}

func (c *budgetClock) rest() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = c.at.Add(time.Hour)
}

// fleet is one caa per node on one fake cloud.
type fleet struct {
	b       *bench
	e       *env
	f       *fakeCloud
	nodes   []string
	ledgers []string
	daemons []*Daemon
	// extra are the flags each node's caa was last started with.
	extra [][]string
}

func (fl *fleet) start(i int, extra ...string) error {
	if fl.extra == nil {
		fl.extra = make([][]string, len(fl.nodes))
	}
	fl.extra[i] = extra
	d, err := StartCaa(fl.b.caa, fl.b.caaArgs(fl.f, fl.nodes[i], fl.e.kubeconfig, fl.ledgers[i], extra...),
		hermeticEnv(fl.f.env...), fl.b.logPath("s6-"+fl.f.name+"-"+fl.nodes[i]))
	if err != nil {
		return err
	}
	fl.daemons[i] = d
	return nil
}

// startAll starts every node's caa, then waits for each to be ready.
func (fl *fleet) startAll(ctx context.Context, extra ...string) error {
	ready, _, err := fl.startAtOnce(ctx, 3*time.Minute, extra...)
	if err == nil && ready < len(fl.nodes) {
		err = fmt.Errorf("%d of %d nodes ready after 3m0s; see %s", ready, len(fl.nodes), fl.daemons[0].logPath)
	}
	return err
}

// startAtOnce starts every node's caa and waits, until limit has passed,
// for each to be ready; it returns how many were, and when the last of
// them was. A caa that exits is an error.
func (fl *fleet) startAtOnce(ctx context.Context, limit time.Duration, extra ...string) (ready int, last time.Duration, err error) {
	start := time.Now()
	for i := range fl.nodes {
		if err := fl.start(i, extra...); err != nil {
			return 0, 0, err
		}
	}
	for i := range fl.daemons {
		wait := limit - time.Since(start)
		if wait <= 0 {
			wait = readyPoll
		}
		if _, err := fl.waitReady(ctx, i, wait); err != nil {
			if fl.daemons[i].exited() {
				return ready, last, fmt.Errorf("%s: %w", fl.nodes[i], err)
			}
			continue
		}
		ready, last = ready+1, time.Since(start)
	}
	return ready, last, nil
}

// waitReady waits for node i's caa to be ready. A caa that exited because
// its health port was taken meanwhile (the bench picks a free port before
// the exec, and other processes on the machine may take it) is started
// again on another, at most twice.
func (fl *fleet) waitReady(ctx context.Context, i int, limit time.Duration) (time.Duration, error) {
	for try := 0; ; try++ {
		d := fl.daemons[i]
		ttr, err := d.WaitReady(ctx, limit)
		if err == nil || try == 2 || !d.exited() || !strings.Contains(tail(d.logPath, 3), "address already in use") {
			return ttr, err
		}
		fl.b.logf("S6 %s: %s's health port was taken; starting it again", fl.f.name, fl.nodes[i])
		if err := fl.start(i, fl.extra[i]...); err != nil {
			return 0, err
		}
	}
}

// waitAll waits for every running caa to be ready.
func (fl *fleet) waitAll(ctx context.Context, limit time.Duration) error {
	for i, d := range fl.daemons {
		if d == nil {
			continue
		}
		if _, err := fl.waitReady(ctx, i, limit); err != nil {
			return fmt.Errorf("%s: %w", fl.nodes[i], err)
		}
	}
	return nil
}

func (fl *fleet) stop(i int) error {
	d := fl.daemons[i]
	fl.daemons[i] = nil
	if d == nil {
		return nil
	}
	return d.Stop()
}

// stopAll stops every running caa at once.
func (fl *fleet) stopAll() error {
	errs := make([]error, len(fl.daemons))
	var wg sync.WaitGroup
	for i := range fl.daemons {
		wg.Go(func() { errs[i] = fl.stop(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// passes is the reconcile passes the running daemons have finished.
func (fl *fleet) passes(ctx context.Context) (float64, error) {
	n := 0.0
	for _, d := range fl.daemons {
		if d == nil {
			continue
		}
		m, err := d.Metrics(ctx)
		if err != nil {
			return 0, err
		}
		n += sumPrefix(m, "caa_reconcile_passes_total")
	}
	return n, nil
}

// waitPreflights waits until every running daemon's cloud preflight has
// passed once (caa_preflight_runs_total{result="passed"}), the re-check a
// warm restart runs after ready included.
func (fl *fleet) waitPreflights(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for i, d := range fl.daemons {
		if d == nil {
			continue
		}
		for {
			m, err := d.Metrics(ctx)
			if err != nil {
				return err
			}
			if m[`caa_preflight_runs_total{result="passed"}`] >= 1 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: the cloud preflight has not passed %s after the start; see %s", fl.nodes[i], limit, d.logPath)
			}
			if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// usage is the running daemons' CPU time so far and resident memory now.
func (fl *fleet) usage() (cpu time.Duration, rssKiB int64) {
	for _, d := range fl.daemons {
		if d == nil {
			continue
		}
		if c, err := d.CPUTime(); err == nil {
			cpu += c
		}
		if r, err := procStatusKiB(d.Pid(), "VmRSS:"); err == nil {
			rssKiB += r
		}
	}
	return cpu, rssKiB
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// waitQuiet returns once the fake has counted no call for quiet (at most
// limit in all).
func waitQuiet(ctx context.Context, f *fakeCloud, quiet, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	last, since := f.counters()["total"], time.Now()
	for time.Since(since) < quiet {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: the fake cloud still counted calls after %s", f.name, limit)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
		if n := f.counters()["total"]; n != last {
			last, since = n, time.Now()
		}
	}
	return nil
}

// waitCounter waits until the fake's counter reaches want.
func waitCounter(ctx context.Context, f *fakeCloud, counter string, want int64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for f.counters()[counter] < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: counter %s at %d after %s, want %d", f.name, counter, f.counters()[counter], limit, want)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// s6Measured is what one cloud's S6 run counted, for the rows.
type s6Measured struct {
	name   string
	limits map[string]cloud.Limit
	// idle: calls in the idle window, audits finished in it; quiet:
	// calls in the window with no audit due.
	idle, quiet      map[string]int64
	audits           float64
	idleCPU          time.Duration
	idleRSSKiB       int64
	idleThrottled    int64
	creates, deletes map[string]int64
	churnPods        int
	churnThrottled   int64
	// The whole fleet's start at once, and the throttling replies in it
	// and in the rolling restart.
	fleetStart          time.Duration
	fleetReady          int
	fleetStartThrottled int64
	restartThrottled    int64
	restarts            []map[string]int64
	restartBytes        []float64
	startup             map[int][]startupRun
	setupTime           time.Duration
	// cluster is the idle phase with the cluster caa.
	cluster *s6ClusterMeasured
}

// startupRun is one node's startup with others VMs of other nodes.
type startupRun struct {
	ttr time.Duration
	// serve is the fake's own time serving the calls, summed.
	serve time.Duration
	calls map[string]int64
	bytes int64
}

// s6 runs the fleet on each cloud in turn.
func (b *bench) s6(ctx context.Context) (Scenario, error) {
	cfg := b.s6cfg
	sc := Scenario{ID: "S6", Title: "the fleet: cloud calls of many nodes on one account", Pivot: true,
		Setup: fmt.Sprintf("%d caa processes, one per node, on one kube-apiserver and one fake cloud per provider with the cloud's published "+
			"request limits on (each fake's `PublishedLimits`, metered by `cloud.Budget`); %d peer pods per node. Calls and response bytes are "+
			"counted at the fake, by operation. Reads are every call that is not a write, a poll of a long-running operation (counted apart, "+
			"by the fake's operation name) or an IAM token. "+
			"**Idle**: the fleet runs with `--audit-interval %s` for %s; the calls per audit (calls over audits finished, from caa's "+
			"`caa_reconcile_passes_total`) times %s audits an hour (the default %s, jittered ±50%%: the waits average %s) plus the calls "+
			"of a %s window with no audit due (scaled to an hour) give the reads per node per hour; during the window the budget's clock "+
			"runs as many times faster as the audits come, so the buckets meet them as at the default interval. "+
			"The fleet's setup (not measured) runs on a budget clock that skips an hour per call, so no write bucket holds it back. "+
			"**Churn**: %d pods per node created, %s a second over the fleet, then deleted at the same pace; the fake boots a VM in %s, and "+
			"the counts include caa's one look at a new VM %s after its create. "+
			"**Rolling restart**: each node's caa stopped and started in turn, waiting for ready. "+
			"**Startup**: one node's caa started alone while the account holds VMs of %d other nodes (seeded into the fake's core with caa's "+
			"tags), the fleet's own VMs, and %s seeded ones; up to %d runs per case, the account rested before each. "+
			"**1,000 nodes**: linear in nodes, and in the account's VMs with the growth per VM the startup cases measured; a fleet's draw on "+
			"each account-wide bucket as a percentage of what the bucket gets back a second.",
			cfg.nodes, cfg.pods, cfg.idleAudit, cfg.idleWindow, Num(AuditsPerHour(s6Audit)), s6Audit, s6Audit, cfg.quiet,
			cfg.churnPerNode, Num(cfg.churnRate), s6BootDelay, s6BootCheck, s6OtherNodes, joinInts(cfg.others), cfg.startupRuns)}
	e, err := newEnv(ctx, filepath.Join(b.dir, "s6"), b.logf)
	if err != nil {
		return sc, err
	}
	defer e.close()
	clusterID, err := kubeSystemUID(ctx, e)
	if err != nil {
		return sc, err
	}
	nodes := make([]string, cfg.nodes)
	start := time.Now()
	for k := range nodes {
		nodes[k] = fmt.Sprintf("fleet-%02d", k)
		if _, err := e.c.CreateNode(ctx, nodes[k]); err != nil {
			return sc, err
		}
		if err := createPods(ctx, e, "s6", fmt.Sprintf("n%02d", k), nodes[k], 0, cfg.pods, true); err != nil {
			return sc, err
		}
	}
	b.logf("S6: %d nodes with %d peer pods each (%s)", cfg.nodes, cfg.pods, time.Since(start).Round(time.Millisecond))
	failed := 0
	for _, name := range b.clouds {
		start := time.Now()
		m, err := b.s6Cloud(ctx, e, cfg, name, nodes, clusterID)
		if err != nil {
			if ctx.Err() != nil {
				return sc, err
			}
			// One cloud's failure leaves the others' figures standing; the
			// row without runs reads "not run".
			b.logf("S6 %s: %v", name, err)
			sc.Rows = append(sc.Rows, Row{Case: name + ", idle", Metric: "cloud reads per node per hour", Unit: "reads"})
			sc.Details = append(sc.Details, fmt.Sprintf("%s: not measured: %v", name, firstLine(err.Error())))
			failed++
			continue
		}
		rows, details := s6Rows(cfg, m)
		sc.Rows = append(sc.Rows, rows...)
		sc.Details = append(sc.Details, details...)
		sc.Details = append(sc.Details, fmt.Sprintf("%s: the whole cloud's run took %s (the fleet's setup %s)", name,
			time.Since(start).Round(time.Second), m.setupTime.Round(time.Second)))
		b.logf("S6 %s done in %s", name, time.Since(start).Round(time.Second))
	}
	if failed == len(b.clouds) {
		return sc, fmt.Errorf("S6 ran on no cloud (logs in %s)", b.dir)
	}
	return sc, nil
}

// firstLine is s up to its first line break.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// s6Cloud runs every phase of S6 on one cloud.
func (b *bench) s6Cloud(ctx context.Context, e *env, cfg s6Config, name string, nodes []string, clusterID string) (*s6Measured, error) {
	clock := newBudgetClock()
	budget, err := publishedBudget(name, clock.now)
	if err != nil {
		return nil, err
	}
	f, err := newBudgetedFake(name, budget)
	if err != nil {
		return nil, err
	}
	defer f.close()
	m := &s6Measured{name: name, limits: budget.Limits(), startup: map[int][]startupRun{}}
	fl := &fleet{b: b, e: e, f: f, nodes: nodes, daemons: make([]*Daemon, len(nodes))}
	defer func() { _ = fl.stopAll() }()
	for _, node := range nodes {
		path := filepath.Join(b.dir, "s6", name, node, "ledger.db")
		if err := mkdir(filepath.Dir(path)); err != nil {
			return nil, err
		}
		fl.ledgers = append(fl.ledgers, path)
		// The nodes carried another cloud's ledger before this one.
		if err := forgetLedger(ctx, e.client, node); err != nil {
			return nil, err
		}
	}
	defaultAudit := []string{"--audit-interval", s6Audit.String()}

	// Setup, not measured: every node creates its VMs, the budget's clock
	// running fast so that no bucket holds a create back.
	start := time.Now()
	clock.setFast(true)
	if err := fl.startAll(ctx, fastCreate...); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if err := fl.stopAll(); err != nil {
		return nil, err
	}
	clock.setFast(false)
	if live := len(f.core.Live()); live != len(nodes)*cfg.pods {
		return nil, fmt.Errorf("setup: %d live VMs, want %d", live, len(nodes)*cfg.pods)
	}
	m.setupTime = time.Since(start)
	b.logf("S6 %s: %d VMs made by the fleet's first start (%s)", name, len(nodes)*cfg.pods, m.setupTime.Round(time.Millisecond))

	// Idle: short audits, scaled to the default interval. The start is
	// not measured (the budget clock runs fast through it).
	clock.setFast(true)
	if err := fl.startAll(ctx, "--audit-interval", cfg.idleAudit.String()); err != nil {
		return nil, fmt.Errorf("idle: %w", err)
	}
	clock.setFast(false)
	// A warm restart's preflight runs again right after ready: its reads
	// belong to the restart, not to the idle window.
	if err := fl.waitPreflights(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	if err := waitQuiet(ctx, f, time.Second, time.Minute); err != nil {
		return nil, err
	}
	p0, err := fl.passes(ctx)
	if err != nil {
		return nil, err
	}
	cpu0, _ := fl.usage()
	f.resetCounters()
	budget.ResetCounts()
	clock.setSpeed(float64(s6Audit) / float64(cfg.idleAudit))
	if err := sleepCtx(ctx, cfg.idleWindow); err != nil {
		return nil, err
	}
	m.idle = f.counters()
	clock.setSpeed(1)
	p1, err := fl.passes(ctx)
	if err != nil {
		return nil, err
	}
	cpu1, rss := fl.usage()
	m.audits, m.idleCPU, m.idleRSSKiB = p1-p0, cpu1-cpu0, rss
	m.idleThrottled = budget.Throttled()
	if err := fl.stopAll(); err != nil {
		return nil, err
	}
	b.logf("S6 %s: idle window done: %d calls, %v audits", name, m.idle["total"], m.audits)

	// Idle again, with the cluster caa beside the fleet.
	clock.rest()
	budget.ResetCounts()
	if m.cluster, err = b.s6ClusterIdle(ctx, e, fl, f, cfg, clock); err != nil {
		return nil, err
	}
	b.logf("S6 %s: idle with the cluster caa done: %v listings, %v audits", name, m.cluster.listings, m.cluster.audits)

	// Churn, with the default audit interval: no audit is due for at
	// least half of it after a start. The start of the whole fleet at
	// once, on a rested account, is counted too.
	clock.rest()
	budget.ResetCounts()
	ready, last, err := fl.startAtOnce(ctx, cfg.startLimit, defaultAudit...)
	if err != nil {
		return nil, fmt.Errorf("churn: %w", err)
	}
	m.fleetReady, m.fleetStart, m.fleetStartThrottled = ready, last, budget.Throttled()
	if ready < len(nodes) {
		// The rest get ready on a clock that refills every bucket at once
		// (not measured).
		b.logf("S6 %s: %d of %d nodes ready %s after an all-at-once start; the rest on a rested budget", name, ready, len(nodes), cfg.startLimit)
		clock.setFast(true)
		err := fl.waitAll(ctx, 3*time.Minute)
		clock.setFast(false)
		if err != nil {
			return nil, fmt.Errorf("churn: %w", err)
		}
	}
	// The warm restarts' preflight re-checks (after ready; a throttled
	// one retries later) belong to the start, not to the quiet window.
	if err := fl.waitPreflights(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	if err := waitQuiet(ctx, f, time.Second, time.Minute); err != nil {
		return nil, err
	}
	clock.rest()
	f.resetCounters()
	budget.ResetCounts()
	if err := sleepCtx(ctx, cfg.quiet); err != nil {
		return nil, err
	}
	m.quiet = f.counters()
	if err := b.s6Churn(ctx, e, f, cfg, nodes, m); err != nil {
		return nil, err
	}
	m.churnThrottled = budget.Throttled()
	b.logf("S6 %s: churn done: %d pods created and deleted", name, m.churnPods)

	// Rolling restart, one node at a time.
	budget.ResetCounts()
	for i := range nodes {
		before, sent := f.counters(), f.sent.Load()
		if err := fl.stop(i); err != nil {
			return nil, err
		}
		if err := fl.start(i, defaultAudit...); err != nil {
			return nil, err
		}
		if _, err := fl.waitReady(ctx, i, 5*time.Minute); err != nil {
			return nil, fmt.Errorf("rolling restart: %w", err)
		}
		if err := waitQuiet(ctx, f, 500*time.Millisecond, time.Minute); err != nil {
			return nil, err
		}
		m.restarts = append(m.restarts, subCounts(f.counters(), before))
		m.restartBytes = append(m.restartBytes, float64(f.sent.Load()-sent))
	}
	m.restartThrottled = budget.Throttled()
	if err := fl.stopAll(); err != nil {
		return nil, err
	}
	b.logf("S6 %s: rolling restart of %d nodes done", name, len(nodes))

	// One node's startup as the account's other VMs grow.
	have := 0
	for _, others := range cfg.others {
		if others < have {
			return nil, fmt.Errorf("others must grow: %d after %d", others, have)
		}
		start := time.Now()
		if err := seedOthers(f, clusterID, have, others); err != nil {
			return nil, err
		}
		have = others
		b.logf("S6 %s: %d VMs of other nodes seeded (%s)", name, others, time.Since(start).Round(time.Millisecond))
		level := time.Now()
		for r := 0; r < cfg.startupRuns && (r == 0 || time.Since(level) < cfg.levelTime); r++ {
			clock.rest()
			f.resetCounters()
			sent, busy := f.sent.Load(), f.busy.Load()
			if err := fl.start(0, defaultAudit...); err != nil {
				return nil, err
			}
			ttr, err := fl.waitReady(ctx, 0, 10*time.Minute)
			if err != nil {
				return nil, fmt.Errorf("startup with %d others: %w", others, err)
			}
			if err := waitQuiet(ctx, f, 500*time.Millisecond, time.Minute); err != nil {
				return nil, err
			}
			run := startupRun{ttr: ttr, calls: f.counters(), bytes: f.sent.Load() - sent, serve: time.Duration(f.busy.Load() - busy)}
			if err := fl.stop(0); err != nil {
				return nil, err
			}
			m.startup[others] = append(m.startup[others], run)
			b.logf("S6 %s: startup with %d others: %s, %d calls, %d KiB", name, others, ttr.Round(time.Millisecond),
				run.calls["total"], run.bytes/1024)
		}
	}
	return m, nil
}

// s6Churn creates churnPerNode pods on every node, waits for their VMs
// and caa's look at each once booted, then deletes them and waits for the
// VMs to go; the calls of each half land in m.
func (b *bench) s6Churn(ctx context.Context, e *env, f *fakeCloud, cfg s6Config, nodes []string, m *s6Measured) error {
	f.core.SetFaults(cloud.Faults{BootDelay: s6BootDelay})
	defer f.core.SetFaults(cloud.Faults{})
	type pod struct{ name string }
	var made []pod
	every := time.Duration(float64(time.Second) / cfg.churnRate)
	tick := time.NewTicker(every)
	defer tick.Stop()
	f.resetCounters()
	for r := range cfg.churnPerNode {
		for k, node := range nodes {
			name := fmt.Sprintf("churn-%s-%s-%d", f.name, strings.TrimPrefix(node, "fleet-"), r)
			if _, err := e.c.CreatePeerPod(ctx, "s6", name, nodes[k], nil); err != nil {
				return err
			}
			made = append(made, pod{name})
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
	}
	if err := waitCounter(ctx, f, "created", int64(len(made)), 3*time.Minute); err != nil {
		return err
	}
	// Every VM is made: caa looks at each once more, BootCheck after its
	// create.
	if err := sleepCtx(ctx, s6BootCheck+2*time.Second); err != nil {
		return err
	}
	if err := waitQuiet(ctx, f, 2*time.Second, time.Minute); err != nil {
		return err
	}
	m.creates = f.counters()
	f.resetCounters()
	for _, p := range made {
		if err := e.c.DeletePod(ctx, "s6", p.name); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	if err := waitCounter(ctx, f, "deleted", int64(len(made)), 3*time.Minute); err != nil {
		return err
	}
	if err := waitQuiet(ctx, f, 2*time.Second, time.Minute); err != nil {
		return err
	}
	m.deletes = f.counters()
	m.churnPods = len(made)
	return nil
}

// s6Rows turns one cloud's counts into rows and details.
func s6Rows(cfg s6Config, m *s6Measured) ([]Row, []string) {
	name := m.name
	var rows []Row
	var details []string
	n := float64(cfg.nodes)
	atMost := func(c, metric, unit string, limit float64, v ...float64) Row {
		return Row{Case: c, Metric: metric, Unit: unit, Runs: v, HasLimit: true, AtMost: true, Limit: limit}
	}
	measured := func(c, metric, unit string, v ...float64) Row {
		return Row{Case: c, Metric: metric, Unit: unit, Runs: v}
	}

	// Idle.
	idleReads := ofKind(toFloat(m.idle), kindRead)
	quietReads := ofKind(toFloat(m.quiet), kindRead)
	perAudit := scaleMap(idleReads, 1/max(m.audits, 1))
	between := scaleMap(quietReads, float64(time.Hour)/float64(cfg.quiet)/n)
	perHour := addMaps(scaleMap(perAudit, AuditsPerHour(s6Audit)), between)
	idleTotal := sumMap(perHour)
	c := name + ", idle"
	rows = append(rows, atMost(c, "cloud reads per node per hour", "reads", s6IdleReadsPerHour, idleTotal))
	details = append(details,
		fmt.Sprintf("%s: %s audits in %s by %d nodes (`--audit-interval %s`); reads in that window by op: %s, so per audit %s; "+
			"with no audit due (%s): %s; scaling the window's reads by the ratio of the intervals instead gives %s reads per node per hour",
			c, Num(m.audits), cfg.idleWindow, cfg.nodes, cfg.idleAudit, CountsLine(ofKind(m.idle, kindRead)), CountsLine(roundMap(perAudit)),
			cfg.quiet, CountsLine(ofKind(m.quiet, kindRead)),
			Num(ScaleToInterval(sumMap(idleReads), cfg.idleWindow, cfg.idleAudit, s6Audit)/n)),
		fmt.Sprintf("%s: the fleet's %d caa used %s%% of one CPU over the window (its audits %s times as frequent as by default) and %s MiB "+
			"resident in all (%s MiB each); %s", c, cfg.nodes, Num(100*m.idleCPU.Seconds()/cfg.idleWindow.Seconds()),
			Num(float64(s6Audit)/float64(cfg.idleAudit)), Num(float64(m.idleRSSKiB)/1024), Num(float64(m.idleRSSKiB)/1024/n),
			fits(m.idleCPU.Seconds()/cfg.idleWindow.Seconds()/n, float64(m.idleRSSKiB)/n)))

	// Startup with other nodes' VMs, and the growth per VM (by op, from
	// the medians) for the extrapolation.
	levels := slices.Sorted(maps.Keys(m.startup))
	var base [3]float64
	var xs []float64
	medByOp := map[string][]float64{} // op -> median per level
	for li, others := range levels {
		runs := m.startup[others]
		var ttr, calls, kib, serve []float64
		byOp := map[string][]float64{}
		for _, r := range runs {
			ttr = append(ttr, ms(r.ttr))
			serve = append(serve, ms(r.serve))
			calls = append(calls, float64(r.calls["total"]))
			kib = append(kib, float64(r.bytes)/1024)
			for op, v := range opCalls(r.calls) {
				byOp[op] = append(byOp[op], float64(v))
			}
		}
		c := fmt.Sprintf("%s, startup, %d VMs of other nodes", name, others)
		vals := [3][]float64{ttr, calls, kib}
		metrics := [3]string{"time to ready", "cloud calls", "response bytes"}
		units := [3]string{"ms", "calls", "KiB"}
		for i := range vals {
			r := Row{Case: c, Metric: metrics[i], Unit: units[i], Runs: vals[i]}
			if li == 0 {
				base[i] = Median(vals[i])
			} else if base[i] > 0 {
				r.Bound, r.MaxRatio = base[i], s6StartupRatio
				r.BoundNote = fmt.Sprintf("the median with %d VMs of other nodes", levels[0])
			}
			rows = append(rows, r)
		}
		meds := medians(byOp)
		details = append(details, fmt.Sprintf("%s: calls by op (median of %d run(s)): %s; the fake cloud's own time serving them, summed: %s ms (median)",
			c, len(runs), CountsLine(meds), Num(Median(serve))))
		xs = append(xs, float64(others))
		for op := range meds {
			if _, seen := medByOp[op]; !seen {
				medByOp[op] = make([]float64, li) // 0 at the levels before
			}
		}
		for op := range medByOp {
			medByOp[op] = append(medByOp[op], meds[op])
		}
	}
	slope := map[string]float64{}
	for op, ys := range medByOp {
		if s := Slope(xs, ys); s != 0 && kindOf(op) == kindRead {
			slope[op] = s
		}
	}

	// Extrapolation to 1,000 nodes x 30 pods.
	v0, v := float64(cfg.nodes*cfg.pods), float64(s6ScaleNodes*s6ScalePods)
	atScale := map[string]float64{}
	for op := range addMaps(perAudit, slope) {
		atScale[op] = Extend(perAudit[op], slope[op], v0, v)
	}
	scaleHour := addMaps(scaleMap(atScale, AuditsPerHour(s6Audit)), between)
	c = fmt.Sprintf("%s, idle, %d nodes x %d pods", name, s6ScaleNodes, s6ScalePods)
	rows = append(rows, atMost(c, "cloud reads per node per hour", "reads", s6IdleReadsPerHour, sumMap(scaleHour)))
	byClass, unmetered := ClassUse(name, scaleHour)
	fleetIdle := scaleMap(byClass, s6ScaleNodes/3600.0)
	var bucketRows []Row
	for _, class := range readClasses(name) {
		bucketRows = append(bucketRows, atMost(c, class+" bucket", "% of refill", s6IdlePercent, PercentOfRefill(fleetIdle[class], m.limits[class])))
		details = append(details, fmt.Sprintf("%s, %s bucket: %s%% of its refill (%s a second) is %s tokens per node per hour over %d nodes",
			c, class, Num(s6IdlePercent), Num(RefillPerSecond(m.limits[class])),
			Num(s6IdlePercent/100*RefillPerSecond(m.limits[class])*3600/s6ScaleNodes), s6ScaleNodes))
	}
	rows = append(rows, busiest(bucketRows, fmt.Sprintf("idle, %d nodes x %d pods: busiest read bucket", s6ScaleNodes, s6ScalePods))...)
	details = append(details, fmt.Sprintf("%s: per audit at %s VMs in the account, from %s measured at %s and the growth per VM of the startup "+
		"cases (%s): %s; reads no published bucket meters, per node per hour: %s", c, Num(v), CountsLine(roundMap(perAudit)), Num(v0),
		CountsLine(roundMap(scaleMap(slope, 1000))), CountsLine(roundMap(atScale)), CountsLine(roundMap(unmetered))))
	if len(slope) > 0 {
		details[len(details)-1] += " (growth shown per 1,000 VMs)"
	}
	if m.cluster != nil {
		crows, cdetails := s6ClusterRows(cfg, m, m.cluster, scaleHour)
		rows, details = append(rows, crows...), append(details, cdetails...)
	}

	// Churn.
	pods := float64(max(m.churnPods, 1))
	for _, half := range []struct {
		what  string
		calls map[string]int64
		reads float64
		vmOp  string
	}{{"pod created", m.creates, s6CreateReads, cloud.OpCreate}, {"pod deleted", m.deletes, s6DeleteReads, cloud.OpDelete}} {
		per := scaleMap(toFloat(half.calls), 1/pods)
		c := fmt.Sprintf("%s, churn, per %s", name, half.what)
		writes := sumKind(per, kindWrite)
		rows = append(rows,
			atMost(c, "cloud reads", "reads", half.reads, sumKind(per, kindRead)),
			atMost(c, "VM writes", "writes", 1, per[half.vmOp]),
			measured(c, "other writes (NICs, volumes)", "writes", writes-per[half.vmOp]),
			measured(c, "long-running-operation polls", "polls", sumKind(per, kindPoll)),
			atMost(c, "listings", "calls", 0, listings(per)))
		details = append(details, fmt.Sprintf("%s: %d pods; calls by op in all: %s", c, m.churnPods, CountsLine(opCalls(half.calls))))
		// At the churn the write buckets allow, with the idle fleet of
		// 1,000 nodes beside it.
		perClass, _ := ClassUse(name, per)
		rate, binding := WriteBoundRate(perClass, writeClasses(name), m.limits)
		if binding == "" {
			continue
		}
		c = fmt.Sprintf("%s, %ss at the write limit, %d nodes idle beside", name, strings.TrimPrefix(half.what, "pod "), s6ScaleNodes)
		c = strings.Replace(c, "createds", "creates", 1)
		c = strings.Replace(c, "deleteds", "deletes", 1)
		bucketRows = nil
		for _, class := range readClasses(name) {
			use := rate*perClass[class] + fleetIdle[class]
			bucketRows = append(bucketRows, atMost(c, class+" bucket", "% of refill", 100, PercentOfRefill(use, m.limits[class])))
		}
		rows = append(rows, busiest(bucketRows, strings.TrimPrefix(c, name+", ")+": busiest read bucket")...)
		details = append(details, fmt.Sprintf("%s: the write buckets allow %s pods a second (bound by %s, %s tokens per pod, refill %s a second)",
			c, Num(rate), binding, Num(perClass[binding]), Num(RefillPerSecond(m.limits[binding]))))
	}
	rows = append(rows, atMost(name+", idle and churn", "throttling replies (429) to caa", "replies", 0,
		float64(m.idleThrottled+m.churnThrottled)),
		Row{Case: fmt.Sprintf("%s, all %d nodes started at once", name, cfg.nodes), Metric: fmt.Sprintf("nodes ready within %s", cfg.startLimit),
			Unit: "nodes", Runs: []float64{float64(m.fleetReady)}, HasLimit: true, Limit: n},
		measured(fmt.Sprintf("%s, all %d nodes started at once", name, cfg.nodes), "throttling replies (429) to caa", "replies",
			float64(m.fleetStartThrottled)))
	details = append(details, fmt.Sprintf("%s: the whole fleet started at once on a rested account: %d of %d nodes ready within %s (the last "+
		"of them %s after the start; the rest were then let through on a rested budget, unmeasured); throttling replies during the rolling "+
		"restart: %d", name, m.fleetReady, cfg.nodes, cfg.startLimit, m.fleetStart.Round(time.Millisecond), m.restartThrottled))

	// Rolling restart.
	c = fmt.Sprintf("%s, rolling restart of %d nodes", name, cfg.nodes)
	var calls, reads, writes, dry []float64
	byOp := map[string][]float64{}
	for _, r := range m.restarts {
		calls = append(calls, float64(r["total"]))
		reads = append(reads, float64(sumKind(r, kindRead)))
		writes = append(writes, float64(sumKind(r, kindWrite)))
		dry = append(dry, float64(sumKind(r, kindDryRun)))
		for op, v := range opCalls(r) {
			byOp[op] = append(byOp[op], float64(v))
		}
	}
	rows = append(rows,
		measured(c, "cloud calls per node restart", "calls", calls...),
		measured(c, "cloud reads per node restart", "reads", reads...),
		atMost(c, "cloud writes per node restart", "writes", 0, writes...),
		measured(c, "dry-run writes per node restart (preflight)", "calls", dry...),
		measured(c, "response bytes per node restart", "KiB", kibs(m.restartBytes)...))
	details = append(details, fmt.Sprintf("%s: calls by op per restart (median): %s", c, CountsLine(medians(byOp))))
	return rows, details
}

// readClasses are the account-wide bucket classes a cloud's reads draw.
func readClasses(cloudName string) []string {
	var out []string
	for op, classes := range opClasses[cloudName] {
		if kindOf(op) == kindRead {
			out = append(out, classes...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func sumMap(m map[string]float64) float64 {
	n := 0.0
	for _, v := range m {
		n += v
	}
	return n
}

// roundMap keeps three significant digits, for printing.
func roundMap(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		if v == 0 {
			continue
		}
		p := math.Pow(10, 2-math.Floor(math.Log10(math.Abs(v))))
		out[k] = math.Round(v*p) / p
	}
	return out
}

func kibs(bytes []float64) []float64 {
	out := make([]float64, len(bytes))
	for i, b := range bytes {
		out[i] = b / 1024
	}
	return out
}

func joinInts(vs []int) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, ", ")
}

// fits says how many idle nodes' caa this machine would hold, by CPU (two
// cores, at a node's measured share of one) and by memory (its total, at a
// node's resident set in KiB).
func fits(cpuPerNode, rssKiBPerNode float64) string {
	out := "at those rates"
	if cpuPerNode > 0 {
		out += fmt.Sprintf(" 2 cores would hold %s idle nodes", Num(math.Floor(2/cpuPerNode)))
	}
	if total := memTotalKiB(); total > 0 && rssKiBPerNode > 0 {
		out += fmt.Sprintf(", and this machine's %s GiB of memory %s", Num(float64(total)/(1<<20)), Num(math.Floor(float64(total)/rssKiBPerNode)))
	}
	return out
}

// memTotalKiB is the machine's MemTotal (0 if unknown).
func memTotalKiB() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			var kb int64
			if _, err := fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), &kb); err == nil {
				return kb
			}
		}
	}
	return 0
}

// opCalls keeps the calls by operation: no derived counter.
func opCalls(m map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for op, v := range m {
		if kindOf(op) != kindMeta {
			out[op] = v
		}
	}
	return out
}

// busiest marks, of rows of one figure per bucket class, the one with the
// highest median as the pivot's figure, its class in the cell, and hides
// the others from the pivot (results.md keeps them all).
func busiest(rows []Row, figure string) []Row {
	top := -1
	for i, r := range rows {
		if top < 0 || Median(r.Runs) > Median(rows[top].Runs) {
			top = i
		}
	}
	for i := range rows {
		if i == top {
			rows[i].Figure = figure
			rows[i].Cell = "(" + strings.TrimSuffix(rows[i].Metric, " bucket") + ")"
			continue
		}
		rows[i].Hide = true
	}
	return rows
}
