package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/caa-project/caa/test/e2e/cluster"
	katafake "github.com/caa-project/caa/test/mocks/kata"
)

// S11 is the memory a sandbox costs on its node, in caa and in `caa
// relay`, which serves the agent sockets: each sandbox holds a ledger
// record, a tunnel, a relay (a unix socket, the shim's connection and a
// mutual-TLS connection to its VM) in the relay daemon, and caa's watch
// of it.
const (
	// s11CheckPeriod is kata's agent health check period.
	s11CheckPeriod  = 5 * time.Second
	s11CheckTimeout = time.Second
	// s11AnonLimit is the target per sandbox, in KiB, in each process.
	s11AnonLimit = 200
	// s11Batch sandboxes are started at once while setting up.
	s11Batch = 10
	// s11WarmRounds cycles of every slot, side by side, come before the
	// measured cycles.
	s11WarmRounds = 2
	// s11Readings readings make one sample (see s11Sample).
	s11Readings = 3
)

// procSample is what /proc says of one process (KiB and counts), and for
// caa its goroutines from /metrics.
type procSample struct {
	anon, rss, fds, threads, goroutines float64
	// heapInuse and heapObjects: caa's heap spans in use and its objects,
	// from /metrics, read right after a collection (the spans not swept yet
	// count as in use). heapAlloc is the bytes of its objects a second
	// later, once the sweep is done: the live heap and a second's garbage;
	// heapKept the heap's pages the runtime then holds from the OS
	// (heap_sys minus heap_released): in use, or free and not yet returned.
	heapInuse, heapObjects, heapAlloc, heapKept float64
}

func sampleProc(pid int) (procSample, error) {
	var s procSample
	a, err := procStatusKiB(pid, "RssAnon:")
	if err != nil {
		return s, err
	}
	r, err := procStatusKiB(pid, "VmRSS:")
	if err != nil {
		return s, err
	}
	t, err := procStatusKiB(pid, "Threads:")
	if err != nil {
		return s, err
	}
	fds, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return s, err
	}
	s.anon, s.rss, s.threads, s.fds = float64(a), float64(r), float64(t), float64(len(fds))
	return s, nil
}

// s11Slot is one pod's current sandbox and its shim's agent connection.
type s11Slot struct {
	id     string
	agent  *katafake.Agent
	cancel context.CancelFunc
	done   chan struct{}
}

func (b *bench) s11(ctx context.Context) (sc Scenario, err error) {
	ns := b.s11Ns
	slots := ns[len(ns)-1]
	sc = Scenario{ID: "S11", Title: "remote hypervisor: memory, goroutines and files per sandbox, in caa and caa relay",
		Setup: fmt.Sprintf("The rig of S8 with `caa relay` serving the agent sockets (`--relay-socket`, as in S9); the fake EC2 with no latency and no limits, "+
			"caa's cloud budgets raised out of the way (memory is measured here, not pacing). For each of %s sandboxes running, each with its shim's "+
			"one connection to its agent socket open and an agent health check on it every %s (kata's period), the bench waits one check period and "+
			"one second more and, for caa, until its next garbage collection (the runtime forces one every 2 minutes at the latest), then reads, %d times, each after caa's next collection, keeping the reading with the least, each process's resident memory (RssAnon: heap, stacks; VmRSS: the whole resident set, the binary's mapped "+
			"pages and the ledger's mmap included) and open files from /proc, and caa's goroutines from its /metrics (`go_goroutines`; `caa relay` "+
			"serves no metrics, so its threads are given instead). The cost per sandbox is the difference from 0 sandboxes over the count. Then "+
			"%d StartVM/StopVM cycles reuse the %d slots: each slot in turn closes its shim connection, StopVM, CreateVM and StartVM of a new "+
			"sandbox for the same pod, and opens a new shim connection; the %d slots cycle side by side. Once every stopped sandbox's VM is "+
			"terminated, the same reading is taken again with %d sandboxes running: the growth is the difference from the reading taken after a warm-up "+
			"of %d cycles of every slot, side by side as the measured ones. The setup starts 10 sandboxes at a time; 100 calls side by side reach a "+
			"high-water mark once (threads, stacks, heap pages the runtime keeps a while), which is not a cost per cycle: that rise is reported apart, unjudged. "+
			"The measured cycles run in two halves with a reading between them: a cost per cycle grows over the second half too. caa's Go heap is read apart, a second after that collection: the bytes of "+
			"its objects (what a cost per cycle grows) and the heap pages the runtime keeps from the OS (what a peak leaves as well). "+
			"One run (the cycles are the repetition).",
			joinInts(ns), s11CheckPeriod, s11Readings, b.s11Cycles, slots, slots, slots, s11WarmRounds)}
	if b.notRoot(&sc, "S11") {
		return sc, nil
	}
	h := &nsHarness{}
	defer h.cleanup()
	defer recoverHarness(&err)
	r, err := b.newKataRig(ctx, h, "s11", slots, nil, true)
	defer r.close()
	if err != nil {
		return sc, err
	}
	startArgs := []string{"--create-rate", "1000", "--create-burst", "1000", "--read-rate", "1000", "--read-burst", "1000"}
	var pprofAddr string
	if b.s11Heap != "" {
		port, err := cluster.FreePort()
		if err != nil {
			return sc, err
		}
		pprofAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		startArgs = append(startArgs, "--pprof-addr", pprofAddr)
	}
	if err := r.start(ctx, startArgs...); err != nil {
		return sc, err
	}
	heapProfile := func(name string) error {
		if pprofAddr == "" {
			return nil
		}
		return r.d.saveHeapProfile(ctx, pprofAddr, filepath.Join(b.s11Heap, name))
	}
	cctx, stopChecks := context.WithCancel(ctx)
	defer stopChecks()
	sl := make([]*s11Slot, slots)
	defer func() {
		for _, s := range sl {
			if s != nil {
				s.close()
			}
		}
	}()
	run := 0
	startSlot := func(i int) error {
		id := sandboxID(run, i)
		sock, err := r.createVM(ctx, id, i)
		if err != nil {
			return err
		}
		if err := r.startVM(ctx, id); err != nil {
			return fmt.Errorf("StartVM %s: %w", id[:12], err)
		}
		a, err := katafake.DialAgent(ctx, sock)
		if err != nil {
			return fmt.Errorf("shim connection to %s: %w", sock, err)
		}
		actx, cancel := context.WithCancel(cctx)
		s := &s11Slot{id: id, agent: a, cancel: cancel, done: make(chan struct{})}
		go func() { defer close(s.done); a.HealthCheck(actx, s11CheckPeriod, s11CheckTimeout) }()
		sl[i] = s
		return nil
	}
	samples := map[int][2]procSample{}
	var order []int
	running := 0
	for _, k := range ns {
		for running < k {
			batch := min(s11Batch, k-running)
			if err := firstErr(batch, func(j int) error { return startSlot(running + j) }); err != nil {
				return sc, err
			}
			running += batch
		}
		s, err := b.s11Sample(ctx, r)
		if err != nil {
			return sc, err
		}
		samples[k] = s
		order = append(order, k)
	}
	// The cycles: every slot in turn, the slots side by side.
	perSlot := (b.s11Cycles + slots - 1) / max(slots, 1)
	var mu sync.Mutex
	cycles := 0
	// runCycles runs cycles [c0, c1) of every slot, the slots side by side,
	// and waits until every stopped sandbox's VM is terminated.
	runCycles := func(c0, c1 int) error {
		var stopped []string
		err := firstErr(slots, func(i int) error {
			for c := c0; c < c1; c++ {
				old := sl[i]
				old.close()
				if err := r.stopVM(ctx, old.id); err != nil {
					return fmt.Errorf("StopVM %s: %w", old.id[:12], err)
				}
				id := sandboxID(c+1, i)
				sock, err := r.createVM(ctx, id, i)
				if err != nil {
					return err
				}
				if err := r.startVM(ctx, id); err != nil {
					return fmt.Errorf("cycle %d, StartVM %s: %w", c+1, id[:12], err)
				}
				a, err := katafake.DialAgent(ctx, sock)
				if err != nil {
					return err
				}
				actx, cancel := context.WithCancel(cctx)
				s := &s11Slot{id: id, agent: a, cancel: cancel, done: make(chan struct{})}
				go func() { defer close(s.done); a.HealthCheck(actx, s11CheckPeriod, s11CheckTimeout) }()
				sl[i] = s
				mu.Lock()
				stopped = append(stopped, old.id)
				cycles++
				mu.Unlock()
			}
			return nil
		})
		if err != nil {
			return err
		}
		_, err = r.waitVMsGone(ctx, stopped, 5*time.Minute)
		return err
	}
	// The warm-up: s11WarmRounds cycles of every slot, the slots side by
	// side as in the measured cycles. The setup started 10 sandboxes at a
	// time; 100 calls side by side reach a higher mark once (threads,
	// stacks, heap pages the runtime keeps for a while), which is not a
	// cost per cycle. The growth is read from after the warm-up; the
	// warm-up's own rise is reported beside it.
	if err := runCycles(0, s11WarmRounds); err != nil {
		return sc, err
	}
	warmCycles := cycles
	warm, err := b.s11Sample(ctx, r)
	if err != nil {
		return sc, err
	}
	if err := heapProfile("s11-heap-before.pb.gz"); err != nil {
		return sc, err
	}
	t0 := time.Now()
	// The measured cycles in two halves, read between them: a cost per
	// cycle grows over the second half as over the first.
	half := s11WarmRounds + perSlot/2
	if err := runCycles(s11WarmRounds, half); err != nil {
		return sc, err
	}
	firstHalf := cycles
	mid, err := b.s11Sample(ctx, r)
	if err != nil {
		return sc, err
	}
	if err := runCycles(half, s11WarmRounds+perSlot); err != nil {
		return sc, err
	}
	took := time.Since(t0)
	measured := cycles - warmCycles
	after, err := b.s11Sample(ctx, r)
	if err != nil {
		return sc, err
	}
	if err := heapProfile("s11-heap-after.pb.gz"); err != nil {
		return sc, err
	}
	misses := 0
	for _, s := range sl {
		misses += len(s.agent.Misses())
	}
	sc.Rows = s11Rows(order, samples, slots, measured, warm, after, misses)
	sc.Rows = append(sc.Rows, s11WarmRows(samples[slots], warm, slots, warmCycles)...)
	sc.Rows = append(sc.Rows, s11HalfRows(mid, after, slots, cycles-firstHalf)...)
	sc.Details = append(sc.Details, fmt.Sprintf("The %d measured cycles took %s (%d side by side), after %d cycles of warm-up. Failed fake VM boots: %d.",
		measured, took.Round(time.Second), slots, warmCycles, len(r.fleet.Failed())))
	for _, k := range order {
		s := samples[k]
		sc.Details = append(sc.Details, fmt.Sprintf("%d sandboxes: caa anon %s KiB, rss %s KiB, Go heap in use %s KiB, allocated %s KiB, kept from the OS %s KiB, %s files, %s threads, %s goroutines; caa relay anon %s KiB, rss %s KiB, %s files, %s threads",
			k, Num(s[0].anon), Num(s[0].rss), Num(s[0].heapInuse), Num(s[0].heapAlloc), Num(s[0].heapKept), Num(s[0].fds), Num(s[0].threads), Num(s[0].goroutines), Num(s[1].anon), Num(s[1].rss), Num(s[1].fds), Num(s[1].threads)))
	}
	for _, at := range []struct {
		what string
		s    [2]procSample
	}{{fmt.Sprintf("after the %d cycles of warm-up", warmCycles), warm}, {fmt.Sprintf("after %d measured cycles", firstHalf-warmCycles), mid},
		{fmt.Sprintf("after all %d measured cycles", measured), after}} {
		s := at.s
		sc.Details = append(sc.Details, fmt.Sprintf("%s, %d sandboxes: caa anon %s KiB, rss %s KiB, Go heap in use %s KiB, allocated %s KiB, kept from the OS %s KiB, %s heap objects, %s threads, %s goroutines; caa relay anon %s KiB, rss %s KiB, %s threads",
			at.what, slots, Num(s[0].anon), Num(s[0].rss), Num(s[0].heapInuse), Num(s[0].heapAlloc), Num(s[0].heapKept), Num(s[0].heapObjects), Num(s[0].threads), Num(s[0].goroutines), Num(s[1].anon), Num(s[1].rss), Num(s[1].threads)))
	}
	return sc, nil
}

func (s *s11Slot) close() {
	s.cancel()
	<-s.done
	_ = s.agent.Close()
}

// s11Sample waits for every shim to have checked since now, then reads caa
// and the relay daemon s11Readings times, each time after caa's next
// garbage collection, and keeps the reading with caa's least anonymous
// memory (for the relay, its least of the same moments). Right after a
// burst of calls the runtime still holds free heap pages it returns over
// the next seconds; a single reading moved by up to 2 MiB between runs
// with caa's live heap and objects flat.
func (b *bench) s11Sample(ctx context.Context, r *kataRig) ([2]procSample, error) {
	var out [2]procSample
	if err := sleepCtx(ctx, s11CheckPeriod+time.Second); err != nil {
		return out, err
	}
	for i := range s11Readings {
		c, err := s11ReadCaa(ctx, r)
		if err != nil {
			return out, err
		}
		rl, err := sampleProc(r.relay.Process.Pid)
		if err != nil {
			return out, err
		}
		if i == 0 || c.anon < out[0].anon {
			out[0] = c
		}
		if i == 0 || rl.anon < out[1].anon {
			out[1] = rl
		}
	}
	return out, nil
}

// s11ReadCaa reads caa right after its next garbage collection (the
// runtime forces one every 2 minutes at the latest), so that its heap
// holds what is live, not garbage of the moment.
func s11ReadCaa(ctx context.Context, r *kataRig) (procSample, error) {
	var c procSample
	m0, err := r.d.Metrics(ctx)
	if err != nil {
		return c, err
	}
	var m map[string]float64
	for {
		if m, err = r.d.Metrics(ctx); err != nil {
			return c, err
		}
		if m["go_gc_duration_seconds_count"] > m0["go_gc_duration_seconds_count"] {
			break
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return c, err
		}
	}
	if c, err = sampleProc(r.d.Pid()); err != nil {
		return c, err
	}
	c.goroutines = m["go_goroutines"]
	c.heapInuse, c.heapObjects = m["go_memstats_heap_inuse_bytes"]/1024, m["go_memstats_heap_objects"]
	// The heap's objects once the collection's sweep is done (until then
	// the dead ones count as allocated), and the pages kept then.
	if err := sleepCtx(ctx, time.Second); err != nil {
		return c, err
	}
	if m, err = r.d.Metrics(ctx); err != nil {
		return c, err
	}
	c.heapAlloc = m["go_memstats_heap_alloc_bytes"] / 1024
	c.heapKept = (m["go_memstats_heap_sys_bytes"] - m["go_memstats_heap_released_bytes"]) / 1024
	return c, nil
}

// s11Rows: the readings at each count, the cost per sandbox, the growth.
func s11Rows(order []int, samples map[int][2]procSample, slots, cycles int, warm, after [2]procSample, misses int) []Row {
	var rows []Row
	procs := []string{"caa", "caa relay"}
	for p, name := range procs {
		for _, k := range order {
			s := samples[k][p]
			c := fmt.Sprintf("%s, %d sandboxes", name, k)
			rows = append(rows, Row{Case: c, Metric: "RSS anonymous", Unit: "KiB", Runs: []float64{s.anon}},
				Row{Case: c, Metric: "RSS total", Unit: "KiB", Runs: []float64{s.rss}})
		}
	}
	base, top := samples[order[0]], samples[order[len(order)-1]]
	n := float64(order[len(order)-1] - order[0])
	for p, name := range procs {
		c := fmt.Sprintf("%s, per sandbox (%d to %d)", name, order[0], order[len(order)-1])
		rows = append(rows, Row{Case: c, Metric: "RSS anonymous", Unit: "KiB", Runs: []float64{(top[p].anon - base[p].anon) / n},
			HasLimit: true, AtMost: true, Limit: s11AnonLimit},
			Row{Case: c, Metric: "RSS total", Unit: "KiB", Runs: []float64{(top[p].rss - base[p].rss) / n}},
			Row{Case: c, Metric: "open files", Unit: "files", Runs: []float64{(top[p].fds - base[p].fds) / n}},
			Row{Case: c, Metric: "threads", Unit: "threads", Runs: []float64{(top[p].threads - base[p].threads) / n}})
		if p == 0 {
			rows = append(rows, Row{Case: c, Metric: "goroutines", Unit: "goroutines", Runs: []float64{(top[p].goroutines - base[p].goroutines) / n}})
		}
	}
	for p, name := range procs {
		c := fmt.Sprintf("%s, growth over %d cycles (%d slots), from after the warm-up", name, cycles, slots)
		rows = append(rows, Row{Case: c, Metric: "RSS anonymous", Unit: "KiB", Runs: []float64{after[p].anon - warm[p].anon},
			HasLimit: true, AtMost: true, Limit: s11GrowthKiB},
			Row{Case: c, Metric: "open files", Unit: "files", Runs: []float64{after[p].fds - warm[p].fds}, HasLimit: true, AtMost: true, Limit: s11GrowthCount})
		if p == 0 {
			rows = append(rows, Row{Case: c, Metric: "goroutines", Unit: "goroutines", Runs: []float64{after[p].goroutines - warm[p].goroutines},
				HasLimit: true, AtMost: true, Limit: s11GrowthCount},
				Row{Case: c, Metric: "Go heap in use (go_memstats_heap_inuse_bytes)", Unit: "KiB", Runs: []float64{after[p].heapInuse - warm[p].heapInuse}},
				Row{Case: c, Metric: "Go heap objects", Unit: "objects", Runs: []float64{after[p].heapObjects - warm[p].heapObjects}},
				Row{Case: c, Metric: "Go heap allocated (go_memstats_heap_alloc_bytes)", Unit: "KiB", Runs: []float64{after[p].heapAlloc - warm[p].heapAlloc}},
				Row{Case: c, Metric: "Go heap kept from the OS (heap_sys - heap_released)", Unit: "KiB", Runs: []float64{after[p].heapKept - warm[p].heapKept}},
				Row{Case: c, Metric: "threads", Unit: "threads", Runs: []float64{after[p].threads - warm[p].threads}})
		} else {
			rows = append(rows, Row{Case: c, Metric: "threads", Unit: "threads", Runs: []float64{after[p].threads - warm[p].threads}})
		}
	}
	rows = append(rows, Row{Case: fmt.Sprintf("%d cycles", cycles), Metric: "missed health checks", Unit: "checks", Runs: []float64{float64(misses)},
		HasLimit: true, AtMost: true, EveryRun: true})
	return rows
}

// Growth allowed over the cycles: a leak of one goroutine, file or 2 KiB a
// cycle would show as the cycles' count or more; these leave room for
// what is in flight at the reading (a health check, a relay probe) and the
// garbage collector's timing.
const (
	s11GrowthKiB   = 2048
	s11GrowthCount = 10
)

// firstErr runs fn for every i in [0, n) side by side and returns the
// first error.
func firstErr(n int, fn func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = fn(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// s11WarmRows: what the warm-up's cycles, 100 side by side, left above
// the reading with the sandboxes started 10 at a time. Reported, not
// judged: a high-water mark, which the growth rows then show is not
// exceeded.
func s11WarmRows(top, warm [2]procSample, slots, cycles int) []Row {
	return s11DiffRows("%s, rise over the warm-up ("+strconv.Itoa(cycles)+" cycles, "+strconv.Itoa(slots)+" side by side)", top, warm, false)
}

// s11HalfRows: the growth over the second half of the cycles, which a cost
// per cycle shows and a high-water mark reached in the first half does not.
func s11HalfRows(mid, after [2]procSample, slots, cycles int) []Row {
	return s11DiffRows("%s, growth over the last "+strconv.Itoa(cycles)+" cycles ("+strconv.Itoa(slots)+" slots)", mid, after, true)
}

// s11DiffRows: each process's change from one reading to a later one,
// unjudged; caseFmt takes the process's name. objects adds caa's heap in
// use and its objects.
func s11DiffRows(caseFmt string, from, to [2]procSample, objects bool) []Row {
	var rows []Row
	for p, name := range []string{"caa", "caa relay"} {
		c := fmt.Sprintf(caseFmt, name)
		rows = append(rows, Row{Case: c, Metric: "RSS anonymous", Unit: "KiB", Runs: []float64{to[p].anon - from[p].anon}},
			Row{Case: c, Metric: "threads", Unit: "threads", Runs: []float64{to[p].threads - from[p].threads}})
		if p != 0 {
			continue
		}
		if objects {
			rows = append(rows, Row{Case: c, Metric: "Go heap in use (go_memstats_heap_inuse_bytes)", Unit: "KiB", Runs: []float64{to[p].heapInuse - from[p].heapInuse}},
				Row{Case: c, Metric: "Go heap objects", Unit: "objects", Runs: []float64{to[p].heapObjects - from[p].heapObjects}})
		}
		rows = append(rows, Row{Case: c, Metric: "Go heap allocated (go_memstats_heap_alloc_bytes)", Unit: "KiB", Runs: []float64{to[p].heapAlloc - from[p].heapAlloc}},
			Row{Case: c, Metric: "Go heap kept from the OS (heap_sys - heap_released)", Unit: "KiB", Runs: []float64{to[p].heapKept - from[p].heapKept}})
	}
	return rows
}
