package main

import (
	"context"
	"fmt"
	"log/slog"

	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/time/rate"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/hypervisor"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/relayd"
	"github.com/caa-project/caa/pkg/sandbox"
)

// hypervisorFlags are the remote hypervisor mode's settings. The mode is on
// when --hypervisor-socket is set: then only kata's StartVM creates VMs,
// and the pod informer gives UID lookup, deletion evidence and readiness.
// Without it caa runs the informer mode (a VM per peer pod), the default:
// it needs no kata configuration and no privilege, and it is what clusters
// without kata's remote hypervisor (and the demo) use.
type hypervisorFlags struct {
	socket     string
	agentDir   string
	caDir      string
	nodeIP     string
	startLimit time.Duration
	relay      string
}

func (h *hypervisorFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&h.socket, "hypervisor-socket", os.Getenv("CAA_HYPERVISOR_SOCKET"),
		"serve kata's remote hypervisor API on this unix socket (kata's remote_hypervisor_socket, e.g. "+hypervisor.DefaultSocket+
			"); only kata's StartVM then creates VMs. Empty: the informer mode, a VM per peer pod (env CAA_HYPERVISOR_SOCKET)")
	fs.StringVar(&h.agentDir, "agent-socket-dir", envOr("CAA_AGENT_SOCKET_DIR", "/run/peerpod/pods"),
		"directory of the sandboxes' agent sockets, one subdirectory per sandbox (env CAA_AGENT_SOCKET_DIR)")
	fs.StringVar(&h.caDir, "agent-ca-dir", os.Getenv("CAA_AGENT_CA_DIR"),
		"directory of the agent CA's key file (0600), never the ledger (env CAA_AGENT_CA_DIR; default: the ledger's directory)")
	fs.StringVar(&h.nodeIP, "node-ip", os.Getenv("NODE_IP"),
		"this node's IP, the node's end of every pod network tunnel (env NODE_IP, from the downward API status.hostIP)")
	fs.StringVar(&h.relay, "relay-socket", os.Getenv("CAA_RELAY_SOCKET"),
		"the relay daemon's control socket (`caa relay`, e.g. "+defaultRelaySocket+"): the agent sockets are served there and outlive caa's "+
			"restarts and upgrades. Empty: caa relays them itself, and its restart cuts every shim's connection (env CAA_RELAY_SOCKET)")
	fs.DurationVar(&h.startLimit, "start-vm-timeout", envDuration("CAA_START_VM_TIMEOUT", 5*time.Minute),
		"how long a StartVM may take before it fails with the reason; keep it below kata's remote_hypervisor_timeout (600 s) (env CAA_START_VM_TIMEOUT)")
}

func (h *hypervisorFlags) check() error {
	if h.socket == "" {
		return nil
	}
	if net.ParseIP(h.nodeIP) == nil {
		return fmt.Errorf("--node-ip %q: the remote hypervisor mode needs this node's IP (NODE_IP from status.hostIP)", h.nodeIP)
	}
	if h.relay != "" && !filepath.IsAbs(h.relay) {
		return fmt.Errorf("--relay-socket %q: want the relay daemon's control socket's absolute path, e.g. %s", h.relay, defaultRelaySocket)
	}
	if h.startLimit <= 0 {
		return fmt.Errorf("--start-vm-timeout must be positive")
	}
	return nil
}

// runSandboxes is the hold's work in the remote hypervisor mode: serve
// every recorded sandbox again (no cloud write), turn ready once each
// running sandbox's agent answers, then serve kata's calls and sync every
// audit interval, until ctx is done. Nothing is deleted on the way out.
func (n *nodeDaemon) runSandboxes(ctx context.Context, led *ledger.Ledger, writes, reads *rate.Limiter, ready func()) {
	f, log := n.f, n.log.With("mode", "hypervisor")
	caDir := f.hv.caDir
	if caDir == "" {
		caDir = filepath.Dir(f.ledgerPath)
	}
	ca, err := pki.LoadOrCreateCA(caDir)
	if err != nil {
		n.status.SetBlocked("agent CA: " + err.Error())
		log.Error("agent CA unusable", "dir", caDir, "err", err)
		return
	}
	var side sandbox.PodSide = &sandbox.PodVMSide{CA: ca, Log: log}
	var daemon *sandbox.RelaydSide
	if f.hv.relay != "" {
		// The relay daemon authenticates to the VMs with this run's client
		// certificate: write it before any sandbox is registered there.
		if err := relayd.WriteClientFile(caDir, ca); err != nil {
			n.status.SetBlocked("relay daemon's client file: " + err.Error())
			log.Error("cannot write the relay daemon's client file", "dir", caDir, "err", err)
			return
		}
		daemon = &sandbox.RelaydSide{PodSide: side, Client: &relayd.Client{Socket: f.hv.relay}, Log: log}
		side = daemon
		log.Info("agent sockets served by the relay daemon", "socket", f.hv.relay)
	}
	m := sandbox.New(sandbox.Config{
		Ledger: led, Provider: n.prov, Pods: n.pods, Events: n.events, Spec: n.specCfg, RuntimeClasses: f.runtimeClasses,
		Side:    side,
		Cluster: n.clusterID, Node: f.node, NodeIP: net.ParseIP(f.hv.nodeIP), SocketDir: f.hv.agentDir,
		Writes: writes, Reads: reads, CallTimeout: f.cloudTimeout, StartTimeout: f.hv.startLimit,
		ConfirmMissing: f.confirmMissing, OrphanGrace: f.gcGrace, Stop: ctx, Log: log,
	})
	defer func() { m.Close(); m.Wait() }()
	report := func(rep sandbox.Report, err error) bool {
		p := health.Pass{At: time.Now(), Err: err, CloudWrites: rep.CloudWrites, OrphansDeleted: rep.OrphansDeleted}
		for _, o := range rep.Orphans {
			p.Orphans = append(p.Orphans, health.Orphan{ID: o.ID, Pod: o.Pod, FirstSeen: o.FirstSeen})
		}
		for id, why := range rep.Pending {
			p.Pending = append(p.Pending, health.PodNote{Pod: "sandbox " + id, Reason: "AgentPending", Message: why})
		}
		n.status.PassDone(p)
		if err != nil {
			log.Warn("sandbox sync failed", "err", err)
		}
		return err == nil && rep.Ready()
	}
	// Startup: every running sandbox served again before /readyz says 200.
	// kata's calls are served from the first sync on (a new pod need not
	// wait for an old sandbox's agent).
	rep, err := m.Sync(ctx, f.bootTimeout)
	logSync(log, rep, err)
	if daemon != nil {
		// Stops the daemon's sockets of sandboxes that ended while no caa
		// ran, then keeps the daemon serving what this caa registered.
		go daemon.Keep(ctx, 5*time.Second, led)
	}
	ln, lerr := hypervisor.Listen(f.hv.socket)
	if lerr != nil {
		n.status.SetBlocked(lerr.Error())
		log.Error("cannot serve kata's remote hypervisor socket", "err", lerr)
		return
	}
	log.Info("serving kata's remote hypervisor API", "socket", f.hv.socket)
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := hypervisor.Serve(ctx, ln, &hypervisor.Service{Sandboxes: m, CaaVersion: version, Log: log}); err != nil {
			log.Error("remote hypervisor service stopped", "err", err)
		}
	}()
	defer func() { <-served }()
	for !report(rep, err) {
		if sleepCtx(ctx, 5*time.Second) != nil {
			return
		}
		rep, err = m.Sync(ctx, f.bootTimeout)
		logSync(log, rep, err)
	}
	ready()
	go func() { // the history of deleted sandboxes, as pruneHistory does for pods
		for sleepCtx(ctx, time.Hour) == nil {
			if k, err := led.PruneSandboxHistory(time.Now().Add(-f.retention)); err != nil {
				log.Warn("sandbox history pruning failed", "err", err)
			} else if k > 0 {
				log.Info("history of deleted sandboxes pruned", "sandboxes", k)
			}
		}
	}()
	m.Run(ctx, sandboxSyncPeriod(f.audit), func(rep sandbox.Report, err error) { report(rep, err) })
}

// sandboxSyncPeriod is how often the sandboxes are synced with the cloud
// (one listing of the node's VMs each time): the operator's
// --audit-interval, or 30 s when it is 0 (startup only), since in this mode
// the sync is also what finds a VM lost under a live sandbox.
func sandboxSyncPeriod(audit time.Duration) time.Duration {
	if audit <= 0 {
		return 30 * time.Second
	}
	return audit
}

func logSync(log *slog.Logger, rep sandbox.Report, err error) {
	log.Info("sandboxes synced", "served", len(rep.Served), "pending", len(rep.Pending), "lost", len(rep.Lost),
		"retired", rep.Retired, "podRecords", rep.Records, "podRecordsRetired", rep.RecordsRetired,
		"orphansPending", len(rep.Orphans), "orphansDeleted", rep.OrphansDeleted,
		"cloudReads", rep.CloudReads, "cloudWrites", rep.CloudWrites, "err", err)
}

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
