package daemon

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

	"github.com/caa-project/caa/pkg/adaptorvm"
	"github.com/caa-project/caa/pkg/cluster"
	"github.com/caa-project/caa/pkg/handover"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/holder"
	"github.com/caa-project/caa/pkg/hypervisor"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/ledger/ledgerapi"
	"github.com/caa-project/caa/pkg/nodecap"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

// nodeDaemon is the part of the daemon that holds (or waits for, or has
// handed away) the node's ledger: the effects of the states and moves that
// pkg/holder decides (holder.Next). Only hold writes to the ledger or the
// cloud; every other state makes no write of either (invariant I4 and the
// hand-over's "never two writers").
//
// The old caa stays Ready from the request until the new one is ready
// (and after a handback): with maxSurge the DaemonSet controller deletes
// an old pod that is not available at once, which would leave a node
// whose new caa then fails with no caa at all. /status shows the
// hand-over under way meanwhile. Only once retired does it answer 503.
type nodeDaemon struct {
	f          *Options
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
	preflight  string    // fingerprint of the passed preflight, recorded at open
	serve      func(name string, fn func() error)
	// early is the startup listing taken before the ledger was opened;
	// the first hold uses it only on a ledger opened from a free lock.
	early *reconcile.Prefetch
	// adaptor collects the VMs upstream's adaptor left (adaptorvms.go).
	adaptor *adaptorvm.Collector
	// metrics counts kata's calls in the remote hypervisor mode.
	metrics *health.Metrics

	readyOnce sync.Once

	// gate admits the hand-over requests that reach hold; it refuses a
	// pod whose hand-over failed for --handover-failed-cooldown.
	gate holder.Gate
	// proveSelf: this caa runs in a DaemonSet's pod and sends its service
	// account token when it asks for the ledger.
	proveSelf bool
	// verify checks an asker and returns its verified identity, the
	// cooldown's key; nil refuses every asker (fail closed).
	verify func(ctx context.Context, r *handover.Request) (string, error)
	surge  bool // the DaemonSet's strategy runs two caa pods on a node
	// hv is kata's hypervisor socket, held for the process's life (the
	// remote hypervisor mode): bound at the first session, or passed by
	// the caa that handed the ledger over; passed on at a release.
	hv *hypervisor.Socket

	mu        sync.Mutex
	state     holder.State
	requests  chan *handover.Request // set while hold takes requests
	listener  *handover.Listener
	listening bool // a listen loop is under way
}

// step applies holder.Next to the current state and returns the step.
func (n *nodeDaemon) step(e holder.Event) holder.Step {
	n.mu.Lock()
	from := n.state
	st, err := holder.Next(from, e)
	n.state = st.To
	n.mu.Unlock()
	if err != nil {
		n.log.Error("unexpected hand-over event", "err", err)
	} else if from != st.To {
		n.log.Debug("hand-over state", "from", from.String(), "event", e.String(), "to", st.To.String())
	}
	return st
}

// readyWait is how long a new caa waits for the old one to answer its
// ready before it turns ready anyway (the old caa is frozen).
const readyWait = 10 * time.Second

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
	defer n.closeHypervisorSocket()
	if err := n.knowMyPod(stopCtx); err != nil {
		return shutdownErr(ctx, err)
	}
	led, ho, err := n.acquire(stopCtx)
	if err != nil {
		return shutdownErr(ctx, err)
	}
	for {
		out := n.hold(ctx, stopCtx, led, ho)
		ho = nil
		switch {
		case out.end == endStopped:
			return nil
		case out.end == endReturned:
			if !n.inert(stopCtx, "not serving: the hand-over was aborted and the ledger went back to the caa already running ("+
				out.reason+"); this pod stays inert until it is deleted or restarted, or that caa ends") {
				return nil
			}
		case n.afterRelease(stopCtx, out):
			if !n.inert(stopCtx, fmt.Sprintf("handed over to %s at %s: this caa is inert until it is stopped, or that caa ends",
				out.req.From, out.asked.UTC().Format(time.RFC3339))) {
				return nil
			}
		}
		if led, err = n.reclaim(stopCtx); err != nil {
			return shutdownErr(ctx, err)
		}
	}
}

// earlyListingMaxAge bounds how old a listing taken before the ledger was
// opened may be and still serve the first pass.
const earlyListingMaxAge = 10 * time.Second

// reclaim takes the ledger back after a failed hand-over. While another
// process holds the lock (a new caa that hangs: SIGSTOP, a deadlock), it
// waits live (its own heartbeat) and not ready, saying who holds the lock
// and whether that holder's lease still runs; it never breaks the lock:
// the lock frees when that process ends.
func (n *nodeDaemon) reclaim(ctx context.Context) (*ledger.Ledger, error) {
	led, err := holder.Wait(ctx, holder.LockWait{
		LeasePath: holder.LeasePath(n.f.ledgerPath),
		Locked:    func(err error) bool { return errors.Is(err, ledger.ErrLocked) },
		Beat:      n.status.Beat,
		Say: func(reason string) {
			n.status.SetBlocked(reason)
			n.log.Warn("cannot take the ledger back yet; waiting for its lock", "reason", reason)
		},
		Prefix: "not reconciling: taking the ledger back after a failed hand-over",
	}, func(ctx context.Context) (*ledger.Ledger, error) { return n.open(ctx, ledger.DefaultOpenTimeout) })
	if err == nil {
		n.step(holder.LockFree)
	}
	return led, err
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
			me := n.me
			if n.proveSelf {
				tok, terr := bearerToken(n.f.kubeconfig)
				if terr != nil {
					n.log.Warn("cannot read this caa's service account token; the holder will refuse the hand-over", "err", terr)
				}
				me.Token = tok
			}
			actx, cancel := context.WithTimeout(ctx, 2*n.f.shutdownGrace+time.Minute)
			ho, err := handover.Ask(actx, sock, me)
			cancel()
			switch {
			case err == nil:
				n.early = nil // listed before the old caa's last writes
				n.step(holder.Granted)
				n.log.Info("the running caa released the ledger", "from", ho.From.String(), "waited", time.Since(asked).Round(time.Millisecond))
				n.status.SetHandover(health.Handover{Role: health.RoleTookOver, Peer: ho.From.String(),
					Outcome: health.HandoverUnderway, StartedAt: asked})
				n.status.SetBlocked("taking over from " + ho.From.String() + ": opening the ledger")
				n.asked = asked
				n.takeSockets(ho.Sockets)
				led, err := n.open(ctx, 30*time.Second)
				if err != nil {
					ho.Close() // the old caa takes the ledger back
					return nil, nil, err
				}
				return led, ho, nil
			case ctx.Err() != nil:
				return nil, nil, ctx.Err()
			case errors.Is(err, handover.ErrRefused):
				n.step(holder.Refused)
				n.log.Info("the running caa cannot hand over yet; asking again", "err", err, "retryIn", backoff)
				if err := wait("starting: waiting to take the ledger over: " + err.Error()); err != nil {
					return nil, nil, err
				}
				continue
			}
			// Nobody answers by the protocol (gone, or frozen: the ask
			// timed out): the file lock decides.
			if errors.Is(err, context.DeadlineExceeded) {
				n.early = nil // a frozen holder may have written since
				n.step(holder.AskTimeout)
			} else {
				n.step(holder.NoHolder)
			}
		}
		n.status.SetBlocked("starting: opening the ledger " + n.f.ledgerPath)
		led, err := n.open(ctx, ledger.DefaultOpenTimeout)
		if err == nil {
			n.step(holder.LockFree)
			return led, nil, nil
		}
		if !errors.Is(err, ledger.ErrLocked) || ctx.Err() != nil {
			return nil, nil, err
		}
		n.step(holder.LockHeld)
		n.early = nil // another process may write until it lets go
		why := holder.DescribeLockHolder(holder.LeasePath(n.f.ledgerPath), time.Now())
		if !n.f.handover && n.surge {
			// The deadlock of issue 17 item 5: the old pod keeps the lock
			// until this one is ready, which needs the lock.
			why += "; " + holder.Limits{Surge: true}.Check().Error()
		}
		n.log.Warn("the ledger is locked by a process that does not hand it over; waiting for it", "holder", why, "err", err)
		if err := wait("starting: waiting for the ledger lock: " + why); err != nil {
			return nil, nil, err
		}
	}
}

// open opens the ledger for writing and checks it against the Node's
// record of its ledger (invariant I8).
func (n *nodeDaemon) open(ctx context.Context, timeout time.Duration) (*ledger.Ledger, error) {
	f := n.f
	{
		_, statErr := os.Stat(f.ledgerPath)
		existed := statErr == nil
		if err := reconcile.CompareNodeLedger(f.node, n.nodeLedger, f.ledgerPath, existed, ""); err != nil {
			return nil, err
		}
		led, err := ledger.Open(ledger.Options{Path: f.ledgerPath, Node: f.node, Cluster: n.clusterID, Logger: n.log, Timeout: timeout,
			Preflight: n.preflight})
		if err != nil {
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
	// The lease tells a caa waiting on the lock who holds it and whether
	// it still makes progress: renewed only while /healthz would pass.
	sessServe("ledger lease", func() error {
		holder.Renew(sessCtx, holder.LeasePath(f.ledgerPath), n.me.String(), n.me.PID, holder.LeaseTTL,
			func() bool { live, _ := n.status.Live(); return live })
		return nil
	})

	// The Node's kata.peerpods.io/vm capacity, in both modes: upstream's
	// webhook asks it of every peer pod, whoever creates the VMs. Kept
	// while this caa holds the ledger; never removed on the way out.
	sessServe("node capacity", func() error {
		nodecap.Advertiser{Client: n.client, Node: f.node, Max: f.maxPodVMs, Log: log}.Run(sessCtx, f.resync)
		return nil
	})

	exec := &reconcile.Executor{
		Ledger: led, Provider: n.prov, Events: n.events, Cluster: n.clusterID, Node: f.node,
		Writes: rate.NewLimiter(rate.Limit(f.createRate), f.createBurst), Log: log,
		Reads:       rate.NewLimiter(rate.Limit(f.readRate), f.readBurst),
		CallTimeout: f.cloudTimeout, Stop: sessCtx,
	}
	sessServe("adaptor VMs", func() error { n.runAdaptorVMs(sessCtx, exec.Writes); return nil })
	if n.userData != nil {
		exec.UserData = func(*reconcile.Pod) ([]byte, error) { return n.userData, nil }
	}
	rec := &reconcile.Reconciler{
		Exec: exec, Config: reconcile.Config{Spec: n.specCfg, ConfirmMissing: f.confirmMissing, Provider: n.prov.Name()},
		Concurrency: f.concurrency, OrphanGrace: f.gcGrace, BootTimeout: f.bootTimeout,
		Progress: func() { n.status.Beat(time.Now()) },
	}
	if n.early != nil && ho == nil && time.Since(n.early.Started()) < earlyListingMaxAge {
		rec.UsePrefetch(n.early)
	}
	n.early = nil
	if f.clusterView {
		// Audits past startup use the cluster caa's view when it is fresh.
		rec.SetAuditSource(&cluster.NodeAudit{Client: n.client, Log: log})
	}
	converged := make(chan struct{})
	var convergedOnce sync.Once
	lastBlocked := ""
	loop := &reconcile.Loop{
		Reconciler: rec, Pods: n.pods, Resync: f.resync, Audit: f.audit, Calls: callCtx,
		Beat: func() { n.status.Beat(time.Now()) }, MaxPass: 3 * f.cloudTimeout,
		Report: func(res reconcile.PassResult, ok bool) {
			hp := toHealthPass(res, f.confidential)
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
			n.runSandboxes(sessCtx, ctx, led, exec.Writes, exec.Reads, func() { convergedOnce.Do(func() { close(converged) }) })
			return
		}
		loop.Run(sessCtx)
	}()
	acting := time.Now() // the node has a reconciler again from here

	// stopWork stops new work, lets calls in flight finish within the
	// grace (then abandons them: their intents are durable), stops the
	// session's servers and closes the ledger.
	stopWork := func() {
		// The loop's heartbeat ends here; the wait for calls in flight
		// (up to the grace) must not cost the process its liveness.
		defer n.keepAlive(stopCtx)()
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
	var retired, gone <-chan struct{}
	var silence <-chan time.Time
	var ready <-chan struct{} = converged
	public := false // as the new caa: ready where the cluster sees it
	var readyAt time.Time
	if ho == nil {
		n.status.SetBlocked("")
		n.listen(stopCtx)
		n.takeRequests(requests)
	} else {
		aborted = ho.Aborted()
		n.status.SetBlocked("taking over from " + ho.From.String() + ": running the startup pass")
		n.refuse("this caa is still taking the ledger over")
	}
	// takenOver ends the conversation with the old caa: this caa holds
	// the ledger for good and answers the next update's requests.
	takenOver := func(how string) {
		if !public {
			n.goPublic(ho, acting, readyAt)
			public = true
		}
		log.Info("the old caa "+how+"; this caa serves the hand-over socket", "from", ho.From.String())
		ho, aborted, retired, gone, silence = nil, nil, nil, nil, nil
		n.listen(stopCtx)
		n.takeRequests(requests)
	}
	// onAbort answers the old caa's abort: before this caa turned ready
	// where the cluster sees it, the abort wins and the ledger goes back;
	// after, this caa answers kept and keeps it.
	onAbort := func(reason string) (holdOutcome, bool) {
		if public {
			log.Warn("the old caa sent an abort after this caa turned ready: keeping the ledger", "reason", reason)
			ho.Keep()
			n.step(holder.HolderGone)
			takenOver("was answered kept")
			return holdOutcome{}, false
		}
		n.step(holder.Aborted)
		n.refuse("this caa gave the ledger back")
		log.Warn("the old caa took the ledger back: stopping work and closing the ledger", "reason", reason)
		stopWork()
		// Say so before the old caa hears it: once it resumes, this
		// caa's status must already read aborted.
		n.status.SetHandover(health.Handover{Role: health.RoleTookOver, Peer: ho.From.String(), Outcome: health.HandoverAborted,
			Reason: reason, StartedAt: n.asked, Took: health.Duration(time.Since(n.asked))})
		n.events.NodeEvent(f.node, true, "CaaHandoverAborted", fmt.Sprintf("caa %s gave the ledger back to %s: %s", n.me, ho.From, reason))
		ho.Returned()
		return holdOutcome{end: endReturned, reason: reason}, true
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
			n.step(holder.Converged)
			readyAt = time.Now()
			if err := ho.SayReady(acting); err != nil {
				takenOver("went away before it heard this caa was ready")
				continue
			}
			retired, gone = ho.Retired(), ho.Gone()
			silence = time.After(readyWait)

		case <-retired:
			n.step(holder.Retired)
			takenOver("retired")

		case <-gone:
			// An abort also ends the conversation: it goes first.
			select {
			case reason := <-aborted:
				if out, done := onAbort(reason); done {
					return out
				}
				continue
			default:
			}
			n.step(holder.HolderGone)
			takenOver("went away after this caa said ready")

		case <-silence:
			// The old caa does not answer (frozen after its release):
			// this caa turns ready, since it holds the ledger and
			// reconciles, but leaves the old socket alone until the old
			// caa retires or its process ends; an abort it sends when it
			// thaws is answered "kept".
			silence = nil
			n.step(holder.HolderSilent)
			log.Warn("the old caa has not answered this caa's ready; reconciling, and waiting for it to retire or end",
				"from", ho.From.String(), "waited", readyWait)
			n.goPublic(ho, acting, readyAt)
			public = true

		case reason := <-aborted:
			if out, done := onAbort(reason); done {
				return out
			}

		case req := <-requests:
			if !req.Alive() {
				// Queued while this caa could not answer (frozen); the asker
				// gave up. Nothing stops for it, and it costs it no cooldown.
				n.step(holder.AskerGone)
				log.Info("hand-over request dropped: its asker hung up", "from", req.From.String())
				req.Refuse("the asker hung up")
				continue
			}
			n.step(holder.Request)
			asked := time.Now()
			n.refuse("this caa is handing the ledger over to " + req.From.String())
			log.Info("hand-over requested: stopping work and releasing the ledger", "to", req.From.String())
			n.status.SetHandover(health.Handover{Role: health.RoleHandedOver, Peer: req.From.String(), Outcome: health.HandoverUnderway, StartedAt: asked})
			n.events.NodeEvent(f.node, false, "CaaHandingOver", fmt.Sprintf("caa %s is handing the ledger over to %s", n.me, req.From))
			epoch := led.Meta().OpenEpoch
			stopWork()
			stopped := time.Now()
			err := req.Release(n.me, epoch, stopped, n.passSockets()...)
			if err == nil {
				n.step(holder.Released)
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
	back := func(st holder.Step, reason string) bool {
		n.log.Warn("taking the ledger back: the hand-over failed", "to", peer, "reason", reason)
		n.status.SetHandover(health.Handover{Role: health.RoleHandedOver, Peer: peer, Outcome: health.HandoverHandedBack,
			Reason: reason, StartedAt: out.asked, Took: health.Duration(time.Since(out.asked))})
		n.events.NodeEvent(n.f.node, true, "CaaHandedBack", fmt.Sprintf("caa %s took the ledger back from %s: %s", n.me, peer, reason))
		if st.Cooldown {
			n.gate.Failed(out.req.Verified, reason, time.Now())
		}
		return false
	}
	if out.releaseErr != nil {
		// The asker hung up between its request and the release: its
		// loss, not its failure; no cooldown.
		return back(n.step(holder.ReleaseFailed), out.releaseErr.Error())
	}
	wctx, cancel := context.WithTimeout(ctx, n.f.handoverReady)
	acting, err := out.req.WaitReady(wctx)
	cancel()
	retire := func() bool {
		n.step(holder.SuccessorReady)
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
	}
	switch {
	case err == nil:
		return retire()
	case ctx.Err() != nil:
		return true // stopping: the new caa keeps the ledger
	case errors.Is(err, handover.ErrSuccessorGone):
		return back(n.step(holder.SuccessorGone), "the new caa went away before it turned ready")
	}
	st := n.step(holder.ReadyTimeout)
	reason := fmt.Sprintf("the new caa was not ready within %s (--handover-ready-timeout)", n.f.handoverReady)
	actx, cancel := context.WithTimeout(ctx, n.f.shutdownGrace+holder.AbortWait)
	err = out.req.Abort(actx, reason)
	cancel()
	switch {
	case errors.Is(err, handover.ErrKept):
		// It turned ready while this caa could not see it (frozen past
		// its timeout): it keeps the ledger.
		n.mu.Lock()
		n.state = holder.AwaitingReady
		n.mu.Unlock()
		n.log.Warn("the new caa answered the abort with kept: it was ready already", "to", peer)
		return retire()
	case err != nil:
		n.log.Warn("the new caa did not confirm it gave the ledger back; the file lock decides", "err", err)
	}
	return back(st, reason)
}

// defaultInertLook is how often an inert caa looks whether the ledger's lock is
// still held; it takes the ledger back after two looks that found it free.
// A hand-over between two other caas frees the lock for milliseconds,
// never for a whole look's interval.
const defaultInertLook = 5 * time.Second

// inert keeps the process up, live and not ready, with reason, and writes
// nothing anywhere, until ctx ends (false) or the ledger's lock stays free
// across two looks (true): the caa that has the ledger ended (crashed, or
// deleted with nobody after it), and this one must take it back rather
// than leave the node with no reconciler until someone restarts it.
// Taking it back goes through the file lock (reclaim), so a successor
// restarted meanwhile and this caa can never both hold it.
func (n *nodeDaemon) inert(ctx context.Context, reason string) bool {
	n.refuse(reason)
	n.status.SetBlocked(reason)
	defer n.keepAlive(ctx)()
	t := time.NewTicker(max(n.f.inertLook, 100*time.Millisecond))
	defer t.Stop()
	free := 0
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		if !ledger.Free(n.f.ledgerPath) {
			free = 0
			continue
		}
		if free++; free < 2 {
			continue
		}
		n.step(holder.LockAbandoned)
		msg := "the ledger's lock is free: the caa that had it is gone; taking the ledger back"
		n.log.Warn(msg, "inertReason", reason)
		n.events.NodeEvent(n.f.node, true, "CaaLedgerAbandoned", fmt.Sprintf("caa %s: %s", n.me, msg))
		return true
	}
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
