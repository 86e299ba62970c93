package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// S10 is a burst of sandboxes on one node: a Deployment scaled up puts tens
// of kata sandboxes on a node at once, each StartVM waiting for its VM. The
// node's caa is the real binary in the remote hypervisor mode (the rig of
// S8), the cloud the fake EC2 with EC2's published request limits
// (ec2fake.PublishedLimits: RunInstances 50 at once, 5 a second back) and
// s10Latency on every call; the fake pod VMs are real network namespaces.
const (
	s10Latency = s8Latency
	// caa's create budget (the daemon's defaults, passed explicitly so the
	// bound below names what it is made of).
	s10WriteRate, s10WriteBurst = 5.0, 10
	s10ReadRate, s10ReadBurst   = 5.0, 20
	// s10CallsPerStart are the cloud calls one StartVM makes in a row on
	// EC2: RunInstances and the read that finds the VM running (a fresh
	// key is not looked up first: Spec.MaybeSent).
	s10CallsPerStart = 2
	// s10StopLimit is how long kata's runtime-rs gives StopVM (about a
	// second, hypervisor/src/remote/inner.rs; it only logs a late answer);
	// every StopVM of the burst should answer within.
	s10StopLimit = time.Second
)

// s10Case is one way the burst meets the account.
type s10Case struct {
	name string
	// spent: the account's RunInstances bucket is empty when the burst
	// starts (other nodes of the cluster spent it), so EC2 refuses what
	// caa's own budget lets through until its bucket refills.
	spent bool
}

func (b *bench) s10(ctx context.Context) (sc Scenario, err error) {
	n := b.s10N
	cases := []s10Case{{name: fmt.Sprintf("%d at once", n)},
		{name: fmt.Sprintf("%d at once, account's RunInstances bucket spent by other nodes", n), spent: true}}
	sc = Scenario{ID: "S10", Title: "remote hypervisor: a burst of sandboxes on one node",
		Setup: fmt.Sprintf("The rig of S8 (the real caa binary in the remote hypervisor mode in a node's network namespace, the fake EC2 behind its EC2 provider, "+
			"a fake pod VM per instance in a namespace of its own, real tunnels and mutual-TLS relays), with %s injected into every cloud call and the fake "+
			"EC2's published request limits on (RunInstances: a bucket of 50 requests refilling 5 a second, and 1,000 instances refilling 2 a second; "+
			"DescribeInstances 100, 20 a second; TerminateInstances 50, 5 a second). caa runs with its default cloud budgets, stated: "+
			"`--create-rate %g --create-burst %d --read-rate %g --read-burst %d`. A run: the fake shim sends CreateVM for %d pods, then all %d StartVM calls at "+
			"once (one connection each, as kata's Go shim), timed from the common start to each answer; then, after the write bucket has had %s to refill, "+
			"all %d StopVM calls at once, timed to each answer and to the moment the cloud shows every VM terminated. Cloud calls are counted at the fake across "+
			"each half; throttling replies (EC2's 503 RequestLimitExceeded, the 429 of the other clouds) by the fake's budget. Case 2 empties the account's "+
			"RunInstances request bucket just before the burst, as other nodes creating at the same time would. %d run(s) per case; buckets full before each.",
			s10Latency, s10WriteRate, s10WriteBurst, s10ReadRate, s10ReadBurst, n, n, restTime(s10WriteRate, s10WriteBurst), n, b.count)}
	if b.notRoot(&sc, "S10") {
		return sc, nil
	}
	h := &nsHarness{}
	defer h.cleanup()
	defer recoverHarness(&err)
	clock := &restClock{}
	budget := ec2fake.NewBudget(clock.now)
	r, err := b.newKataRig(ctx, h, "s10", n, budget, false)
	defer r.close()
	if err != nil {
		return sc, err
	}
	if err := r.start(ctx, "--create-rate", fmt.Sprint(s10WriteRate), "--create-burst", fmt.Sprint(s10WriteBurst),
		"--read-rate", fmt.Sprint(s10ReadRate), "--read-burst", fmt.Sprint(s10ReadBurst)); err != nil {
		return sc, err
	}
	hs := time.Duration(0)
	run := 0
	for _, c := range cases {
		var res []s10Result
		for range b.count {
			run++
			clock.rest()
			// caa's own buckets refill too.
			if err := sleepCtx(ctx, restTime(s10WriteRate, s10WriteBurst)); err != nil {
				return sc, err
			}
			x, err := b.s10Run(ctx, r, budget, c, run, &hs)
			if err != nil {
				return sc, fmt.Errorf("%s, run %d: %w", c.name, run, err)
			}
			res = append(res, x)
		}
		sc.Rows = append(sc.Rows, s10Rows(c, n, hs, res)...)
		var details []string
		for i, x := range res {
			details = append(details, fmt.Sprintf("run %d: calls while starting %s; while stopping %s; StartVM errors: %s",
				i+1, CountsLine(x.startCalls), CountsLine(x.stopCalls), x.errText()))
		}
		lo, med, hi := Stats(r.bootTimes())
		details = append(details, fmt.Sprintf("the fake VMs' boots (one after another in the fleet): median %s ms, %s to %s", Num(med), Num(lo), Num(hi)))
		sc.Details = append(sc.Details, c.name+": "+strings.Join(details, ". "))
	}
	sc.Details = append(sc.Details, fmt.Sprintf("Failed fake VM boots: %d. Every StartVM's sandbox is checked to have exactly one instance "+
		"tagged with its id (any state) once the burst has answered.", len(r.fleet.Failed())))
	return sc, nil
}

// restTime is how long a bucket of rate and burst takes to fill from empty.
func restTime(rate float64, burst int) time.Duration {
	return time.Duration(float64(burst) / rate * float64(time.Second))
}

// s10Result is one run of one case.
type s10Result struct {
	starts                []time.Duration // each StartVM's answer, from the common start
	startErrs             []error
	throttled, surfaced   int64
	noOneVM               int
	startCalls, stopCalls map[string]int64
	stopAnswered, stopped time.Duration
	stopErrs              int
}

func (x s10Result) errText() string {
	seen := map[string]int{}
	for _, err := range x.startErrs {
		if err != nil {
			seen[firstLine(err.Error())]++
		}
	}
	if len(seen) == 0 {
		return "none"
	}
	var out []string
	for k, v := range seen {
		out = append(out, fmt.Sprintf("%dx %q", v, k))
	}
	slices.Sort(out)
	if len(out) > 3 {
		out = append(out[:3], fmt.Sprintf("and %d other kinds", len(out)-3))
	}
	return strings.Join(out, "; ")
}

// throttleText is what a throttling error kata sees says.
func throttleText(err error) bool {
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "throttl") || strings.Contains(s, "requestlimitexceeded") || strings.Contains(s, "429")
}

// s10Run is one burst of StartVM and one of StopVM.
func (b *bench) s10Run(ctx context.Context, r *kataRig, budget *cloud.Budget, c s10Case, run int, hs *time.Duration) (s10Result, error) {
	n := len(r.pods)
	ids := make([]string, n)
	socks := make([]string, n)
	for i := range n {
		ids[i] = sandboxID(run, i)
		sock, err := r.createVM(ctx, ids[i], i)
		if err != nil {
			return s10Result{}, err
		}
		socks[i] = sock
	}
	r.f.core.SetFaults(cloud.Faults{Latency: s10Latency})
	defer r.f.core.SetFaults(cloud.Faults{})
	r.f.resetCounters()
	budget.ResetCounts()
	if c.spent {
		budget.Drain(ec2fake.ClassRun)
	}
	var x s10Result
	start, done, errs := each(n, func(i int) error { return r.startVM(ctx, ids[i]) })
	for i := range n {
		x.starts = append(x.starts, done[i].Sub(start))
	}
	x.startErrs = errs
	for _, err := range errs {
		if err != nil && throttleText(err) {
			x.surfaced++
		}
	}
	x.startCalls = callsByOp(r.f.counters())
	x.throttled = budget.Throttled()
	for _, id := range ids {
		if r.vmsOf(ids)[id] != 1 {
			x.noOneVM++
		}
	}
	if *hs == 0 {
		for i, err := range errs {
			if err == nil {
				d, err := relayedCallTime(ctx, socks[i], 5)
				if err != nil {
					return x, err
				}
				*hs = d
				break
			}
		}
	}
	if err := sleepCtx(ctx, restTime(s10WriteRate, s10WriteBurst)); err != nil {
		return x, err
	}
	r.f.resetCounters()
	var mu sync.Mutex
	start, done, errs = each(n, func(i int) error {
		err := r.stopVM(ctx, ids[i])
		if err != nil {
			mu.Lock()
			defer mu.Unlock()
			b.logf("S10: StopVM %s: %v", ids[i][:12], err)
		}
		return err
	})
	for i := range n {
		x.stopAnswered = max(x.stopAnswered, done[i].Sub(start))
		if errs[i] != nil {
			x.stopErrs++
		}
	}
	gone, err := r.waitVMsGone(ctx, ids, 5*time.Minute)
	if err != nil {
		return x, err
	}
	x.stopped = gone.Sub(start)
	x.stopCalls = callsByOp(r.f.counters())
	return x, nil
}

// s10Rows are a case's rows over its runs.
func s10Rows(c s10Case, n int, hs time.Duration, res []s10Result) []Row {
	at := func(metric, unit string) Row { return Row{Case: c.name, Metric: metric, Unit: unit} }
	none := func(metric, unit string) Row {
		return Row{Case: c.name, Metric: metric, Unit: unit, HasLimit: true, AtMost: true, EveryRun: true}
	}
	schedule := CreateSchedule(n, s10WriteRate, s10WriteBurst)
	note := fmt.Sprintf("caa's create budget lets %d creates through in %s (a bucket of %d, then %g a second: (%d - %d) / %g)",
		n, round(schedule), s10WriteBurst, s10WriteRate, n, s10WriteBurst, s10WriteRate)
	if reads := CreateSchedule(n, s10ReadRate, s10ReadBurst); reads > schedule {
		schedule = reads
		note = fmt.Sprintf("caa's read budget lets the %d reads that find the VMs running through in %s", n, round(reads))
	}
	if c.spent {
		if ec2 := CreateSchedule(n, 5, 0); ec2 > schedule {
			schedule = ec2
			note = fmt.Sprintf("the account's RunInstances bucket, empty at the start, gives back 5 requests a second: %d creates take %s", n, round(ec2))
		}
	}
	bound := schedule + s10CallsPerStart*s10Latency + hs
	all := Row{Case: c.name, Metric: "every StartVM answered", Unit: "ms", MaxRatio: 1.25, Bound: ms(bound),
		BoundNote: fmt.Sprintf("%s; + the last sandbox's %d cloud calls in a row (RunInstances, the read that finds it running: %d x %s) "+
			"+ one relayed agent call over a new mutual-TLS connection (%s, the median of fresh health checks through a served socket). Left out: caa's own work "+
			"(the pod's and service account's reads from the apiserver, durable intents, certificate, tunnel, relay) and the fake VMs' boot (the fleet, "+
			"on a %s tick, boots them one after another: a network namespace, a veth pair and a TLS listener each)",
			note, s10CallsPerStart, s10CallsPerStart, s10Latency, round(hs), s8FleetTick)}
	first, median := at("first StartVM answered", "ms"), at("median StartVM answered", "ms")
	creates, reads := at("RunInstances calls per sandbox (refused ones included)", "calls"), at("cloud reads per sandbox started", "calls")
	throttled := at("throttling replies seen (EC2's 503 RequestLimitExceeded)", "replies")
	surfaced, failed, dup := none("throttling errors surfaced to kata", "StartVMs"), none("StartVM failures", "StartVMs"),
		none("sandboxes without exactly one VM", "sandboxes")
	stopAns := none("every StopVM answered", "ms")
	stopAns.Limit = ms(s10StopLimit)
	deleteSchedule := CreateSchedule(n, s10WriteRate, s10WriteBurst)
	stopped := Row{Case: c.name, Metric: "every VM terminated after StopVM", Unit: "ms", MaxRatio: 1.25, Bound: ms(deleteSchedule + s10Latency),
		BoundNote: fmt.Sprintf("caa's write budget lets %d deletes through in %s (full bucket: the bench waits for it to refill) + one TerminateInstances (%s)",
			n, round(deleteSchedule), s10Latency)}
	delCalls, delReads := none("VM deletes per sandbox stopped", "calls"), at("cloud reads per sandbox stopped", "calls")
	delCalls.Limit = 1
	for _, x := range res {
		lo, med, hi := Stats(durs(x.starts))
		all.Runs, first.Runs, median.Runs = append(all.Runs, hi), append(first.Runs, lo), append(median.Runs, med)
		creates.Runs = append(creates.Runs, float64(x.startCalls[cloud.OpCreate])/float64(n))
		reads.Runs = append(reads.Runs, float64(reads3(x.startCalls))/float64(n))
		throttled.Runs = append(throttled.Runs, float64(x.throttled))
		surfaced.Runs = append(surfaced.Runs, float64(x.surfaced))
		nf := 0
		for _, err := range x.startErrs {
			if err != nil {
				nf++
			}
		}
		failed.Runs = append(failed.Runs, float64(nf))
		dup.Runs = append(dup.Runs, float64(x.noOneVM))
		stopAns.Runs = append(stopAns.Runs, ms(x.stopAnswered))
		stopped.Runs = append(stopped.Runs, ms(x.stopped))
		delCalls.Runs = append(delCalls.Runs, float64(x.stopCalls[cloud.OpDelete])/float64(n))
		delReads.Runs = append(delReads.Runs, float64(reads3(x.stopCalls))/float64(n))
	}
	return []Row{all, first, median, creates, reads, throttled, surfaced, failed, dup, stopAns, stopped, delCalls, delReads}
}

// reads3 sums the read counters of EC2's fake: reads by id, listings and
// client-token lookups.
func reads3(calls map[string]int64) int64 {
	return calls[cloud.OpGet] + calls[cloud.OpList] + calls[ec2fake.OpLookup]
}

func durs(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = ms(d)
	}
	return out
}
