package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/pkg/handover"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/ledger/ledgerapi"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

// nodeDaemon is the part of the daemon that holds (or waits for, or has
// handed away) the node's ledger. Its life:
//
//	acquire ──> hold ──SIGTERM──> stop
//	              │
//	              ├─ a new caa asks ──> release ──ready──> inert until SIGTERM
//	              │                        └──gone / too slow──> reopen ──> hold
//	              └─ (as the new caa) the old one takes the ledger back
//	                                   ──> inert until SIGTERM
//
// Only hold writes to the ledger or the cloud; every other state makes no
// write of either (invariant I4 and the hand-over's "never two writers").
//
// The old caa stays Ready from the request until the new one is ready
// (and after a handback): with maxSurge the DaemonSet controller deletes
// an old pod that is not available at once, which would leave a node
// whose new caa then fails with no caa at all. /status shows the
// hand-over under way meanwhile. Only once retired does it answer 503.
type nodeDaemon struct {
	f          *runFlags
	log        *slog.Logger
	status     *health.Status
	client     kubernetes.Interface
	events     *reconcile.KubeEvents
	pods       *reconcile.PodSource
	prov       provider.Provider
	specCfg    provider.SpecConfig
	userData   []byte
	clusterID  string
	nodeLedger string
	me         handover.Peer
	started    time.Time
	asked      time.Time // when this caa asked for the ledger it took over
	serve      func(name string, fn func() error)

	readyOnce sync.Once

	mu       sync.Mutex
	requests chan *handover.Request // set while hold takes requests
	refusal  string                 // why requests are refused otherwise
	listener *handover.Listener
	// failed holds, by pod name, the hand-overs that failed and until
	// when that pod is refused: a new pod whose container the kubelet
	// restarts must not cost the node another ready timeout each time.
	failed map[string]failedHandover
}

type failedHandover struct {
	reason string
	until  time.Time
}

// failedCooldown is how long a pod whose hand-over failed is refused.
func (n *nodeDaemon) failedCooldown() time.Duration { return 5 * n.f.handoverReady }

// holdEnd says how a hold ended.
type holdEnd int

const (
	endStopped  holdEnd = iota // SIGTERM: the daemon exits
	endReleased                // the ledger went to a new caa
	endReturned                // as the new caa, the ledger went back to the old one
)

type holdOutcome struct {
	end        holdEnd
	req        *handover.Request // endReleased
	asked      time.Time         // endReleased: when the request came
	stopped    time.Time         // endReleased: when work stopped
	releaseErr error             // endReleased: the successor was gone at once
	reason     string            // endReturned
}

// run acquires the ledger, holds it, and follows the hand-overs until ctx
// (SIGTERM) ends.
func (n *nodeDaemon) run(ctx, stopCtx context.Context) error {
	defer n.closeListener()
	led, ho, err := n.acquire(stopCtx)
	if err != nil {
		return shutdownErr(ctx, err)
	}
	for {
		out := n.hold(ctx, stopCtx, led, ho)
		ho = nil
		switch out.end {
		case endStopped:
			return nil
		case endReturned:
			n.inert(stopCtx, "not serving: the hand-over was aborted and the ledger went back to the caa already running ("+
				out.reason+"); this pod stays inert until it is deleted or restarted")
			return nil
		}
		if n.afterRelease(stopCtx, out) {
			n.inert(stopCtx, fmt.Sprintf("handed over to %s at %s: this caa is inert until it is stopped",
				out.req.From, out.asked.UTC().Format(time.RFC3339)))
			return nil
		}
		if led, err = n.open(stopCtx, ledger.DefaultOpenTimeout, true); err != nil {
			return shutdownErr(ctx, err)
		}
	}
}

// acquire gets the ledger: from the caa that holds it, by hand-over, or
// by opening the file when nobody holds it. A holder that is busy, or a
// file lock held by a caa that does not speak the hand-over, is waited for.
func (n *nodeDaemon) acquire(ctx context.Context) (*ledger.Ledger, *handover.Handover, error) {
	defer n.keepAlive(ctx)()
	sock := handover.SocketPath(n.f.ledgerPath)
	backoff := 500 * time.Millisecond
	wait := func(reason string) error {
		n.status.SetBlocked(reason)
		t := time.NewTimer(backoff)
		defer t.Stop()
		backoff = min(2*backoff, 10*time.Second)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	for {
		if n.f.handover {
			n.status.SetBlocked("starting: asking the caa that holds the ledger to hand it over")
			asked := time.Now()
			actx, cancel := context.WithTimeout(ctx, 2*n.f.shutdownGrace+time.Minute)
			ho, err := handover.Ask(actx, sock, n.me)
			cancel()
			switch {
			case err == nil:
				n.log.Info("the running caa released the ledger", "from", ho.From.String(), "waited", time.Since(asked).Round(time.Millisecond))
				n.status.SetHandover(health.Handover{Role: health.RoleTookOver, Peer: ho.From.String(),
					Outcome: health.HandoverUnderway, StartedAt: asked})
				n.status.SetBlocked("taking over from " + ho.From.String() + ": opening the ledger")
				n.asked = asked
				led, err := n.open(ctx, 30*time.Second, false)
				if err != nil {
					ho.Close() // the old caa takes the ledger back
					return nil, nil, err
				}
				return led, ho, nil
			case ctx.Err() != nil:
				return nil, nil, ctx.Err()
			case errors.Is(err, handover.ErrRefused):
				n.log.Info("the running caa cannot hand over yet; asking again", "err", err, "retryIn", backoff)
				if err := wait("starting: waiting to take the ledger over: " + err.Error()); err != nil {
					return nil, nil, err
				}
				continue
			}
			// Nobody holds the ledger by the protocol: open it directly.
		}
		led, err := n.open(ctx, ledger.DefaultOpenTimeout, false)
		if err == nil {
			return led, nil, nil
		}
		if !errors.Is(err, ledger.ErrLocked) || ctx.Err() != nil {
			return nil, nil, err
		}
		n.log.Warn("the ledger is locked by a process that does not answer on the hand-over socket; waiting for it", "err", err)
		if err := wait("starting: waiting for the ledger lock: " + err.Error()); err != nil {
			return nil, nil, err
		}
	}
}

// open opens the ledger for writing and checks it against the Node's
// record of its ledger (invariant I8). With retry it waits out a held file
// lock (the hung new caa of a failed hand-over) instead of failing.
func (n *nodeDaemon) open(ctx context.Context, timeout time.Duration, retry bool) (*ledger.Ledger, error) {
	f := n.f
	for {
		if !retry {
			n.status.SetBlocked("starting: opening the ledger " + f.ledgerPath)
		}
		_, statErr := os.Stat(f.ledgerPath)
		existed := statErr == nil
		if err := reconcile.CompareNodeLedger(f.node, n.nodeLedger, f.ledgerPath, existed, ""); err != nil {
			return nil, err
		}
		led, err := ledger.Open(ledger.Options{Path: f.ledgerPath, Node: f.node, Cluster: n.clusterID, Logger: n.log, Timeout: timeout})
		if err != nil {
			if retry && errors.Is(err, ledger.ErrLocked) && ctx.Err() == nil {
				n.log.Warn("cannot take the ledger back yet; retrying", "err", err)
				continue
			}
			return nil, err
		}
		if err := reconcile.CompareNodeLedger(f.node, n.nodeLedger, f.ledgerPath, existed, led.Meta().ID); err != nil {
			_ = led.Close()
			return nil, err
		}
		if n.nodeLedger != led.Meta().ID {
			if err := retryAPI(ctx, n.log, n.status, func(ctx context.Context) error {
				return reconcile.RecordNodeLedger(ctx, n.client, f.node, led.Meta().ID)
			}); err != nil {
				_ = led.Close()
				return nil, err
			}
			n.nodeLedger = led.Meta().ID
		}
		n.log.Info("ledger open", "ledgerID", led.Meta().ID, "cluster", n.clusterID, "epoch", led.Meta().OpenEpoch)
		return led, nil
	}
}

// hold runs the reconciler on led until SIGTERM, a hand-over request, or
// (when ho is set, as the new caa of a hand-over) the old caa taking the
// ledger back. It closes led before it returns.
func (n *nodeDaemon) hold(ctx, stopCtx context.Context, led *ledger.Ledger, ho *handover.Handover) holdOutcome {
	f, log := n.f, n.log
	sessCtx, stopSess := context.WithCancel(stopCtx)
	defer stopSess()
	callCtx, cancelCalls := context.WithCancel(context.WithoutCancel(stopCtx))
	defer cancelCalls()
	var sessWG sync.WaitGroup
	sessServe := func(name string, fn func() error) {
		sessWG.Add(1)
		go func() {
			defer sessWG.Done()
			if err := fn(); err != nil && sessCtx.Err() == nil {
				log.Error(name+" stopped", "err", err)
			}
		}()
	}
	sessServe("ledger socket", func() error {
		return ledgerapi.Serve(sessCtx, ledgerapi.SocketPath(f.ledgerPath), &ledgerapi.Local{L: led, KeepOpen: true}, log)
	})
	sessServe("history pruning", func() error { pruneHistory(sessCtx, led, f.retention, log); return nil })

	exec := &reconcile.Executor{
		Ledger: led, Provider: n.prov, Events: n.events, Cluster: n.clusterID, Node: f.node,
		Writes: rate.NewLimiter(rate.Limit(f.createRate), f.createBurst), Log: log,
		Reads:       rate.NewLimiter(rate.Limit(f.readRate), f.readBurst),
		CallTimeout: f.cloudTimeout, Stop: sessCtx,
	}
	if n.userData != nil {
		exec.UserData = func(*reconcile.Pod) ([]byte, error) { return n.userData, nil }
	}
	rec := &reconcile.Reconciler{
		Exec: exec, Config: reconcile.Config{Spec: n.specCfg, ConfirmMissing: f.confirmMissing, Provider: n.prov.Name()},
		Concurrency: f.concurrency, OrphanGrace: f.gcGrace, BootTimeout: f.bootTimeout,
		Progress: func() { n.status.Beat(time.Now()) },
	}
	converged := make(chan struct{})
	var convergedOnce sync.Once
	lastBlocked := ""
	loop := &reconcile.Loop{
		Reconciler: rec, Pods: n.pods, Resync: f.resync, Audit: f.audit, Calls: callCtx,
		Beat: func() { n.status.Beat(time.Now()) }, MaxPass: 3 * f.cloudTimeout,
		Report: func(res reconcile.PassResult, ok bool) {
			hp := toHealthPass(res)
			n.status.PassDone(hp)
			if ok {
				convergedOnce.Do(func() { close(converged) })
			}
			level := slog.LevelInfo
			if errors.Is(res.Err, reconcile.ErrDaemon) {
				level = slog.LevelError
			}
			log.Log(sessCtx, level, "pass", "duration", res.Duration.Round(time.Millisecond), "actions", res.Actions,
				"cloudWrites", res.CloudWrites, "pending", len(res.Pending), "failed", len(res.Failed),
				"notWatched", len(res.NotWatched), "orphansPending", len(res.Orphans), "err", res.Err)
			// A failure that blocks the whole node (credentials, the
			// ledger) is an event on the Node, once per distinct reason.
			if errors.Is(res.Err, reconcile.ErrDaemon) && hp.Blocked != lastBlocked {
				n.events.NodeEvent(f.node, true, "CaaBlocked", hp.Blocked)
			}
			lastBlocked = hp.Blocked
		},
		PodDone: func(st reconcile.PodStatus, standing reconcile.PodStanding) {
			n.status.PodDone(health.PodNote(st), standing == reconcile.StandingPending, standing == reconcile.StandingFailed)
		},
	}
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		if f.hv.socket != "" { // only kata's StartVM creates VMs (hypervisor.go)
			n.runSandboxes(sessCtx, led, exec.Writes, exec.Reads, func() { convergedOnce.Do(func() { close(converged) }) })
			return
		}
		loop.Run(sessCtx)
	}()
	acting := time.Now() // the node has a reconciler again from here

	// stopWork stops new work, lets calls in flight finish within the
	// grace (then abandons them: their intents are durable), stops the
	// session's servers and closes the ledger.
	stopWork := func() {
		stopSess()
		select {
		case <-loopDone:
		case <-time.After(f.shutdownGrace):
			log.Warn("abandoning cloud calls still in flight after the grace period")
			cancelCalls()
			<-loopDone
		}
		cancelCalls()
		sessWG.Wait()
		if err := led.Close(); err != nil {
			log.Error("ledger close failed", "err", err)
		}
	}

	requests := make(chan *handover.Request)
	var aborted <-chan string
	var ready <-chan struct{} = converged
	if ho == nil {
		n.status.SetBlocked("")
		n.listen(stopCtx)
		n.takeRequests(requests)
	} else {
		aborted = ho.Aborted()
		n.status.SetBlocked("taking over from " + ho.From.String() + ": running the startup pass")
		n.refuse("this caa is still taking the ledger over")
	}
	for {
		select {
		case <-ctx.Done():
			n.refuse("this caa is shutting down")
			log.Info("shutting down: no new work starts; VMs are left as they are", "grace", f.shutdownGrace)
			stopWork()
			if ho != nil {
				ho.Close()
			}
			return holdOutcome{end: endStopped}

		case <-ready:
			ready = nil
			if ho == nil {
				n.readyOnce.Do(func() { log.Info("ready", "timeToReady", time.Since(n.started).Round(time.Millisecond)) })
				continue
			}
			rctx, cancel := context.WithTimeout(stopCtx, 10*time.Second)
			err := ho.Ready(rctx, acting)
			cancel()
			if errors.Is(err, handover.ErrAborted) {
				continue // the abort is waiting on its channel
			}
			readyAt := time.Now()
			h := health.Handover{Role: health.RoleTookOver, Peer: ho.From.String(), Outcome: health.HandoverDone,
				StartedAt: n.asked, Took: health.Duration(readyAt.Sub(n.asked))}
			if !ho.Stopped.IsZero() {
				h.Gap = health.Duration(acting.Sub(ho.Stopped))
			}
			n.status.SetHandover(h)
			log.Info("took the ledger over; the old caa is inert", "from", ho.From.String(),
				"gap", time.Duration(h.Gap).Round(time.Millisecond), "took", time.Duration(h.Took).Round(time.Millisecond))
			n.events.NodeEvent(f.node, false, "CaaTookOver", fmt.Sprintf("caa %s took the ledger over from %s; the node had no reconciler for %s",
				n.me, ho.From, time.Duration(h.Gap).Round(time.Millisecond)))
			ho, aborted = nil, nil
			n.status.SetBlocked("")
			n.readyOnce.Do(func() { log.Info("ready", "timeToReady", time.Since(n.started).Round(time.Millisecond)) })
			n.listen(stopCtx)
			n.takeRequests(requests)

		case reason := <-aborted:
			n.refuse("this caa gave the ledger back")
			log.Warn("the old caa took the ledger back: stopping work and closing the ledger", "reason", reason)
			stopWork()
			// Say so before the old caa hears it: once it resumes, this
			// caa's status must already read aborted.
			n.status.SetHandover(health.Handover{Role: health.RoleTookOver, Peer: ho.From.String(), Outcome: health.HandoverAborted,
				Reason: reason, StartedAt: n.asked, Took: health.Duration(time.Since(n.asked))})
			n.events.NodeEvent(f.node, true, "CaaHandoverAborted", fmt.Sprintf("caa %s gave the ledger back to %s: %s", n.me, ho.From, reason))
			ho.Returned()
			return holdOutcome{end: endReturned, reason: reason}

		case req := <-requests:
			asked := time.Now()
			n.refuse("this caa is handing the ledger over to " + req.From.String())
			log.Info("hand-over requested: stopping work and releasing the ledger", "to", req.From.String())
			n.status.SetHandover(health.Handover{Role: health.RoleHandedOver, Peer: req.From.String(), Outcome: health.HandoverUnderway, StartedAt: asked})
			n.events.NodeEvent(f.node, false, "CaaHandingOver", fmt.Sprintf("caa %s is handing the ledger over to %s", n.me, req.From))
			epoch := led.Meta().OpenEpoch
			stopWork()
			stopped := time.Now()
			err := req.Release(n.me, epoch, stopped)
			if err == nil {
				log.Info("ledger released to the new caa; waiting for it to turn ready", "to", req.From.String(),
					"stopWork", stopped.Sub(asked).Round(time.Millisecond), "readyTimeout", f.handoverReady)
			}
			return holdOutcome{end: endReleased, req: req, asked: asked, stopped: stopped, releaseErr: err}
		}
	}
}

// afterRelease waits for the new caa to turn ready. It reports true when
// it did (this caa is inert from now on, and so is true on SIGTERM), false
// when the ledger must be taken back: the new caa went away, or was not
// ready within --handover-ready-timeout.
func (n *nodeDaemon) afterRelease(ctx context.Context, out holdOutcome) bool {
	defer n.keepAlive(ctx)()
	peer := out.req.From.String()
	back := func(reason string) bool {
		n.log.Warn("taking the ledger back: the hand-over failed", "to", peer, "reason", reason)
		n.status.SetHandover(health.Handover{Role: health.RoleHandedOver, Peer: peer, Outcome: health.HandoverHandedBack,
			Reason: reason, StartedAt: out.asked, Took: health.Duration(time.Since(out.asked))})
		n.events.NodeEvent(n.f.node, true, "CaaHandedBack", fmt.Sprintf("caa %s took the ledger back from %s: %s", n.me, peer, reason))
		if pod := out.req.From.Pod; pod != "" {
			n.mu.Lock()
			if n.failed == nil {
				n.failed = map[string]failedHandover{}
			}
			n.failed[pod] = failedHandover{reason: reason, until: time.Now().Add(n.failedCooldown())}
			n.mu.Unlock()
		}
		return false
	}
	if out.releaseErr != nil {
		return back(out.releaseErr.Error())
	}
	wctx, cancel := context.WithTimeout(ctx, n.f.handoverReady)
	acting, err := out.req.WaitReady(wctx)
	cancel()
	switch {
	case err == nil:
		// The new caa binds the socket next; this one stops answering first.
		n.closeListener()
		out.req.Retire()
		now := time.Now()
		gap := acting.Sub(out.stopped)
		if acting.IsZero() {
			gap = now.Sub(out.stopped) // a successor that does not say: at most this
		}
		n.status.SetHandover(health.Handover{Role: health.RoleHandedOver, Peer: peer, Outcome: health.HandoverDone,
			StartedAt: out.asked, Took: health.Duration(now.Sub(out.asked)), Gap: health.Duration(gap)})
		n.log.Info("handed the ledger over; this caa is inert until it is stopped", "to", peer,
			"took", now.Sub(out.asked).Round(time.Millisecond), "gap", gap.Round(time.Millisecond))
		n.events.NodeEvent(n.f.node, false, "CaaHandedOver", fmt.Sprintf("caa %s handed the ledger over to %s", n.me, peer))
		return true
	case ctx.Err() != nil:
		return true // stopping: the new caa keeps the ledger
	case errors.Is(err, handover.ErrSuccessorGone):
		return back("the new caa went away before it turned ready")
	}
	reason := fmt.Sprintf("the new caa was not ready within %s (--handover-ready-timeout)", n.f.handoverReady)
	actx, cancel := context.WithTimeout(ctx, n.f.shutdownGrace+10*time.Second)
	if err := out.req.Abort(actx, reason); err != nil {
		n.log.Warn("the new caa did not confirm it gave the ledger back; the file lock decides", "err", err)
	}
	cancel()
	return back(reason)
}

// inert keeps the process up, live and not ready, with reason, until ctx
// ends; it writes nothing anywhere.
func (n *nodeDaemon) inert(ctx context.Context, reason string) {
	n.refuse(reason)
	n.status.SetBlocked(reason)
	defer n.keepAlive(ctx)()
	<-ctx.Done()
}

// keepAlive beats the liveness heartbeat while no reconcile loop does;
// the returned func stops it.
func (n *nodeDaemon) keepAlive(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			n.status.Beat(time.Now())
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// listen binds the hand-over socket, once; it retries for a few seconds
// while the old caa's socket still answers.
func (n *nodeDaemon) listen(ctx context.Context) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.listener != nil || !n.f.handover {
		return
	}
	path := handover.SocketPath(n.f.ledgerPath)
	var err error
	for range 20 {
		var ln *handover.Listener
		if ln, err = handover.Listen(path); err == nil {
			n.listener = ln
			n.serve("hand-over socket", func() error { return ln.Serve(ctx, n.handle) })
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
	n.log.Error("cannot serve the hand-over socket; a new caa will wait for the ledger lock instead", "err", err)
}

func (n *nodeDaemon) closeListener() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.listener != nil {
		_ = n.listener.Close()
		n.listener = nil
	}
}

// takeRequests lets hand-over requests through to hold.
func (n *nodeDaemon) takeRequests(ch chan *handover.Request) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.requests, n.refusal = ch, ""
}

// refuse makes every hand-over request get reason as its refusal.
func (n *nodeDaemon) refuse(reason string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.requests, n.refusal = nil, reason
}

// handle passes a request to hold, or refuses it.
func (n *nodeDaemon) handle(r *handover.Request) {
	n.mu.Lock()
	ch, reason := n.requests, n.refusal
	if f, ok := n.failed[r.From.Pod]; ok && ch != nil {
		if time.Now().Before(f.until) {
			ch, reason = nil, fmt.Sprintf("pod %s failed a hand-over (%s); it is refused until %s: roll back, or delete the pod to try a new one at once",
				r.From.Pod, f.reason, f.until.UTC().Format(time.RFC3339))
		} else {
			delete(n.failed, r.From.Pod)
		}
	}
	n.mu.Unlock()
	if ch != nil {
		t := time.NewTimer(2 * time.Second)
		defer t.Stop()
		select {
		case ch <- r:
			return
		case <-t.C:
			reason = "this caa is busy"
		}
	}
	n.log.Info("hand-over request refused", "from", r.From.String(), "reason", reason)
	r.Refuse(reason)
}
