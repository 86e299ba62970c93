package daemon

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/handover"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/holder"
	"github.com/spf13/pflag"
)

// This file is the hand-over socket's side of nodeDaemon: its flags, who
// may ask (the gate and the identity check), and binding the socket.

// addHandoverFlags registers the hand-over's tuning flags of `caa run`.
func (f *Options) addHandoverFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&f.handoverReady, "handover-ready-timeout", cli.EnvDuration("CAA_HANDOVER_READY_TIMEOUT", holder.DefaultReadyTimeout),
		"how long a new caa may take to turn ready after this one handed it the ledger; past it, this one takes the ledger back; "+
			"must exceed --boot-timeout (env CAA_HANDOVER_READY_TIMEOUT)")
	fs.BoolVar(&f.handoverCheckProcess, "handover-check-process", cli.EnvOr("CAA_HANDOVER_CHECK_PROCESS", "false") == "true",
		"also check that the asking process (SO_PEERCRED -> pid -> cgroup) is the main process of the pod it names; "+
			"needs hostPID in the DaemonSet; the asker's pod is checked against the apiserver whenever POD_NAMESPACE and POD_UID "+
			"(downward API) are set (env CAA_HANDOVER_CHECK_PROCESS)")
	fs.BoolVar(&f.handoverUnverified, "handover-allow-unverified", cli.EnvOr("CAA_HANDOVER_ALLOW_UNVERIFIED", "false") == "true",
		"outside a DaemonSet's pod (no POD_NAMESPACE), hand the ledger to any local process that asks, taking its word for its "+
			"name: for tests and by-hand runs only. Without it such a caa refuses every hand-over request, since nothing can verify "+
			"the asker (env CAA_HANDOVER_ALLOW_UNVERIFIED)")
	fs.DurationVar(&f.handoverCool, "handover-failed-cooldown", cli.EnvDuration("CAA_HANDOVER_FAILED_COOLDOWN", holder.DefaultFailedCooldown),
		"how long a pod whose hand-over failed is refused another; keep it above the startup probe's window plus 5m "+
			"(env CAA_HANDOVER_FAILED_COOLDOWN)")
	fs.DurationVar(&f.inertLook, "handover-inert-check", cli.EnvDuration("CAA_HANDOVER_INERT_CHECK", defaultInertLook),
		"how often a caa that handed the ledger over looks whether the caa it went to still holds the ledger's lock; after two "+
			"looks that find it free it takes the ledger back (env CAA_HANDOVER_INERT_CHECK)")
}

// limits are the daemon's time limits that play in a rollout, for the
// refusal at start of settings that cannot work together.
func (f *Options) limits() holder.Limits {
	var sandboxReady time.Duration
	if f.hv.socket != "" {
		sandboxReady = f.hv.readyBound
	}
	return holder.Limits{SandboxReady: sandboxReady,
		Handover: f.handover, ShutdownGrace: f.shutdownGrace, BootTimeout: f.bootTimeout,
		ReadyTimeout: f.handoverReady, FailedCooldown: f.handoverCool, Stale: 3 * f.resync,
	}
}

// knowMyPod reads this caa's pod and DaemonSet when it runs in one (the
// downward API's POD_NAMESPACE is set): the hand-over then goes only to a
// pod of the same DaemonSet on this node and of its current revision that
// proves it is that pod (its process, or its service account token), and
// the asker names itself by namespace, UID and token. Where nothing can
// verify an asker (no pod, no DaemonSet) every request is refused, unless
// --handover-allow-unverified says to take askers at their word.
func (n *nodeDaemon) knowMyPod(ctx context.Context) error {
	defer n.keepAlive(ctx)()
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" || n.f.podName == "" {
		n.unverifiedAskers("POD_NAMESPACE is not set")
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
		n.unverifiedAskers("this caa's pod " + n.f.podName + " has no DaemonSet")
		return nil
	}
	n.surge = holder.Surge(ds)
	n.proveSelf = true
	v := &holder.Verifier{Client: n.client, Node: n.f.node, Self: self, DaemonSet: ds, CheckProcess: n.f.handoverCheckProcess}
	n.setVerify(func(ctx context.Context, r *handover.Request) (string, error) { return v.Verify(ctx, r.From, r.Cred) })
	return nil
}

// setVerify sets how hand-over askers are checked; requests may be handled
// meanwhile.
func (n *nodeDaemon) setVerify(v func(context.Context, *handover.Request) (string, error)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.verify = v
}

// unverifiedAskers sets how askers are treated where none can be
// verified: refused (nil verify), or, with --handover-allow-unverified,
// taken at their word, the cooldown keyed on the name they give.
func (n *nodeDaemon) unverifiedAskers(why string) {
	if !n.f.handoverUnverified {
		n.log.Warn(why+": nothing can verify a hand-over asker, so every request is refused (a second caa on this ledger waits "+
			"for the ledger's lock); run caa in its DaemonSet, or set --handover-allow-unverified for tests and by-hand runs", "pod", n.f.podName)
		return
	}
	n.log.Warn(why+": --handover-allow-unverified: hand-over askers are taken at their word", "pod", n.f.podName)
	n.setVerify(func(_ context.Context, r *handover.Request) (string, error) {
		if r.From.UID != "" {
			return r.From.UID, nil
		}
		return r.From.Pod, nil
	})
}

// bearerToken is this caa's apiserver token (in a pod: its service account
// token, bound to the pod), read afresh (the kubelet rotates it): what it
// shows a holder to prove its pod. Empty when caa authenticates otherwise.
func bearerToken(kubeconfig string) (string, error) {
	cfg, err := cli.RestConfig(kubeconfig)
	if err != nil {
		return "", fmt.Errorf("kubernetes client config: %w", err)
	}
	if cfg.BearerTokenFile != "" {
		b, err := os.ReadFile(cfg.BearerTokenFile)
		if err != nil {
			return "", fmt.Errorf("service account token: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return cfg.BearerToken, nil
}

// refuseUnverified is the refusal where no verifier is set.
const refuseUnverified = "refused: this caa cannot verify who asks (it runs outside a DaemonSet's pod) and takes no asker at its word " +
	"(--handover-allow-unverified is off)"

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
// The cooldown of a failed hand-over is looked up by the identity the
// verifier vouched for, never by the name the asker gives: a process
// naming the real new pod neither gets the ledger nor costs that pod one.
func (n *nodeDaemon) handle(r *handover.Request) {
	ok, reason := n.gate.Admit("", time.Now()) // closed: refused before any check
	n.mu.Lock()
	verify := n.verify
	n.mu.Unlock()
	if ok {
		if verify == nil {
			ok, reason = false, refuseUnverified
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			id, err := verify(ctx, r)
			cancel()
			switch {
			case err != nil:
				ok, reason = false, err.Error()
			case id == "":
				ok, reason = false, refuseUnverified
			default:
				r.Verified = id
				ok, reason = n.gate.Admit(id, time.Now())
			}
		}
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
