package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/caa-project/caa/pkg/handover"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/holder"
)

// This file is the hand-over socket's side of nodeDaemon: its flags, who
// may ask (the gate and the identity check), and binding the socket.

// addHandoverFlags registers the hand-over's tuning flags of `caa run`.
func addHandoverFlags(cmd *cobra.Command, f *runFlags) {
	fs := cmd.Flags()
	fs.DurationVar(&f.handoverReady, "handover-ready-timeout", envDuration("CAA_HANDOVER_READY_TIMEOUT", holder.DefaultReadyTimeout),
		"how long a new caa may take to turn ready after this one handed it the ledger; past it, this one takes the ledger back; "+
			"must exceed --boot-timeout (env CAA_HANDOVER_READY_TIMEOUT)")
	fs.BoolVar(&f.handoverCheckProcess, "handover-check-process", envOr("CAA_HANDOVER_CHECK_PROCESS", "false") == "true",
		"also check that the asking process (SO_PEERCRED -> pid -> cgroup) is the main process of the pod it names; "+
			"needs hostPID in the DaemonSet; the asker's pod is checked against the apiserver whenever POD_NAMESPACE and POD_UID "+
			"(downward API) are set (env CAA_HANDOVER_CHECK_PROCESS)")
	fs.DurationVar(&f.handoverCool, "handover-failed-cooldown", envDuration("CAA_HANDOVER_FAILED_COOLDOWN", holder.DefaultFailedCooldown),
		"how long a pod whose hand-over failed is refused another; keep it above the startup probe's window plus 5m "+
			"(env CAA_HANDOVER_FAILED_COOLDOWN)")
	fs.DurationVar(&f.inertLook, "handover-inert-check", envDuration("CAA_HANDOVER_INERT_CHECK", defaultInertLook),
		"how often a caa that handed the ledger over looks whether the caa it went to still holds the ledger's lock; after two "+
			"looks that find it free it takes the ledger back (env CAA_HANDOVER_INERT_CHECK)")
}

// limits are the daemon's time limits that play in a rollout, for the
// refusal at start of settings that cannot work together.
func (f *runFlags) limits() holder.Limits {
	return holder.Limits{
		Handover: f.handover, ShutdownGrace: f.shutdownGrace, BootTimeout: f.bootTimeout,
		ReadyTimeout: f.handoverReady, FailedCooldown: f.handoverCool, Stale: 3 * f.resync,
	}
}

// knowMyPod reads this caa's pod and DaemonSet when it runs in one (the
// downward API's POD_NAMESPACE is set): the hand-over then goes only to a
// pod of the same DaemonSet on this node and of its current revision, and
// the asker names itself by namespace and UID. Outside a pod nothing is
// checked (the end-to-end tests run caa processes without pods).
func (n *nodeDaemon) knowMyPod(ctx context.Context) error {
	defer n.keepAlive(ctx)()
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" || n.f.podName == "" {
		n.log.Warn("POD_NAMESPACE is not set: hand-over askers are not checked against the apiserver")
		return nil
	}
	n.me.Namespace, n.me.UID = ns, os.Getenv("POD_UID")
	var self *corev1.Pod
	var ds *appsv1.DaemonSet
	err := retryAPI(ctx, n.log, n.status, func(ctx context.Context) error {
		var err error
		self, ds, err = holder.SelfAndDaemonSet(ctx, n.client, ns, n.f.podName)
		if self != nil && ds == nil && err != nil && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			return nil // not a DaemonSet's pod: nothing to check against
		}
		return err
	})
	if err != nil {
		return err
	}
	if ds == nil {
		n.log.Warn("this caa's pod has no DaemonSet: hand-over askers are not checked", "pod", n.f.podName)
		return nil
	}
	n.surge = holder.Surge(ds)
	v := &holder.Verifier{Client: n.client, Node: n.f.node, Self: self, DaemonSet: ds, CheckProcess: n.f.handoverCheckProcess}
	n.verify = func(ctx context.Context, r *handover.Request) error { return v.Verify(ctx, r.From, r.Cred) }
	return nil
}

// askerKey is what the cooldown remembers an asker by: its pod's UID
// when it says it (a deleted and recreated pod is a new pod), else its name.
func askerKey(p handover.Peer) string {
	if p.UID != "" {
		return p.UID
	}
	return p.Pod
}

// listen binds the hand-over socket, once. While another process still
// answers on it (an old caa that is frozen, or has not yet closed it) it
// retries in the background until it binds or ctx ends: a caa that gave up
// would leave the next update waiting on the lock for ever.
func (n *nodeDaemon) listen(ctx context.Context) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.listener != nil || n.listening || !n.f.handover {
		return
	}
	n.listening = true
	n.serve("hand-over socket", func() error {
		path := handover.SocketPath(n.f.ledgerPath)
		backoff, warned := 250*time.Millisecond, false
		for {
			ln, err := handover.Listen(path)
			if err == nil {
				n.mu.Lock()
				n.listener, n.listening = ln, false
				n.mu.Unlock()
				if warned {
					n.log.Info("serving the hand-over socket")
				}
				return ln.Serve(ctx, n.handle)
			}
			if !warned && backoff >= 2*time.Second {
				n.log.Warn("cannot serve the hand-over socket yet; retrying until it is free", "err", err)
				warned = true
			}
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				n.mu.Lock()
				n.listening = false
				n.mu.Unlock()
				return nil
			case <-t.C:
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	})
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
	n.requests = ch
	n.mu.Unlock()
	n.gate.Open()
}

// refuse makes every hand-over request get reason as its refusal.
func (n *nodeDaemon) refuse(reason string) {
	n.mu.Lock()
	n.requests = nil
	n.mu.Unlock()
	n.gate.Close(reason)
}

// handle checks who asks, then passes the request to hold or refuses it.
func (n *nodeDaemon) handle(r *handover.Request) {
	ok, reason := n.gate.Admit(askerKey(r.From), time.Now())
	if ok && n.verify != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		if err := n.verify(ctx, r); err != nil {
			ok, reason = false, err.Error()
		}
		cancel()
	}
	n.mu.Lock()
	ch := n.requests
	n.mu.Unlock()
	if ok && ch != nil {
		t := time.NewTimer(2 * time.Second)
		defer t.Stop()
		select {
		case ch <- r:
			return
		case <-t.C:
			reason = "this caa is busy"
		}
	} else if ok {
		reason = "this caa is busy" // the gate closed meanwhile
	}
	n.log.Info("hand-over request refused", "from", r.From.String(), "reason", reason)
	r.Refuse(reason)
}

// goPublic turns this new caa ready where the cluster sees it, and says
// how the take-over went.
func (n *nodeDaemon) goPublic(ho *handover.Handover, acting, readyAt time.Time) {
	h := health.Handover{Role: health.RoleTookOver, Peer: ho.From.String(), Outcome: health.HandoverDone,
		StartedAt: n.asked, Took: health.Duration(readyAt.Sub(n.asked))}
	if !ho.Stopped.IsZero() {
		h.Gap = health.Duration(acting.Sub(ho.Stopped))
	}
	n.status.SetHandover(h)
	n.log.Info("took the ledger over; the old caa is inert", "from", ho.From.String(),
		"gap", time.Duration(h.Gap).Round(time.Millisecond), "took", time.Duration(h.Took).Round(time.Millisecond))
	n.events.NodeEvent(n.f.node, false, "CaaTookOver", fmt.Sprintf("caa %s took the ledger over from %s; the node had no reconciler for %s",
		n.me, ho.From, time.Duration(h.Gap).Round(time.Millisecond)))
	n.status.SetBlocked("")
	n.readyOnce.Do(func() { n.log.Info("ready", "timeToReady", time.Since(n.started).Round(time.Millisecond)) })
}
