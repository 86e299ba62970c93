package daemon

import (
	"context"
	"fmt"
	"log/slog"

	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/time/rate"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/cluster"
	"github.com/caa-project/caa/pkg/handover"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/hypervisor"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
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
	// readyBound bounds how long, after a start, a running sandbox whose
	// agent does not answer holds readiness back.
	readyBound time.Duration
	clientTTL  time.Duration
	// replaceLost lets a new agent CA be made although the ledger has
	// sandboxes that trusted the lost one.
	replaceLost bool
	// initData is --initdata-file's document, read by check.
	initDataFile string
	initData     string
	pullSecrets  bool
	// pullKubeconfig is the node's kubelet kubeconfig the pull secrets are
	// read with (pullsecrets.go); pullAsNode reads with it, made by check.
	pullKubeconfig string
	pullAsNode     sandbox.PullSecrets
}

func (h *hypervisorFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&h.socket, "hypervisor-socket", os.Getenv("CAA_HYPERVISOR_SOCKET"),
		"serve kata's remote hypervisor API on this unix socket (kata's remote_hypervisor_socket, e.g. "+hypervisor.DefaultSocket+
			"); only kata's StartVM then creates VMs. Empty: the informer mode, a VM per peer pod (env CAA_HYPERVISOR_SOCKET)")
	fs.StringVar(&h.agentDir, "agent-socket-dir", cli.EnvOr("CAA_AGENT_SOCKET_DIR", "/run/peerpod/pods"),
		"directory of the sandboxes' agent sockets, one subdirectory per sandbox (env CAA_AGENT_SOCKET_DIR)")
	fs.StringVar(&h.caDir, "agent-ca-dir", os.Getenv("CAA_AGENT_CA_DIR"),
		"directory of the agent CA's key file (0600), never the ledger (env CAA_AGENT_CA_DIR; default: the ledger's directory)")
	fs.StringVar(&h.nodeIP, "node-ip", os.Getenv("NODE_IP"),
		"this node's IP, the node's end of every pod network tunnel (env NODE_IP, from the downward API status.hostIP)")
	fs.StringVar(&h.relay, "relay-socket", os.Getenv("CAA_RELAY_SOCKET"),
		"the relay daemon's control socket (`caa relay`, e.g. "+relayd.DefaultSocket+"): the agent sockets are served there and outlive caa's "+
			"restarts and upgrades. Empty: caa relays them itself, and its restart cuts every shim's connection (env CAA_RELAY_SOCKET)")
	fs.StringVar(&h.initDataFile, "initdata-file", os.Getenv("CAA_INITDATA_FILE"),
		"initdata for the pod VMs of pods that name none in "+sandbox.AnnotationInitData+
			": a file holding the TOML document, or it gzipped then base64-encoded as in the annotation (env CAA_INITDATA_FILE)")
	fs.BoolVar(&h.pullSecrets, "pull-secrets", cli.EnvOr("CAA_PULL_SECRETS", "true") == "true",
		"give each pod VM its pod's image-pull credentials (its imagePullSecrets) as /run/peerpod/auth.json, read with "+
			"--pull-secrets-kubeconfig's identity (env CAA_PULL_SECRETS)")
	fs.StringVar(&h.pullKubeconfig, "pull-secrets-kubeconfig", os.Getenv("CAA_PULL_SECRETS_KUBECONFIG"),
		"the node's kubelet kubeconfig (e.g. /var/lib/kubelet/kubeconfig, mounted read-only with the certificates it names): the pull "+
			"secrets are read as the node, which the Node authorizer allows only for pods bound to it. Empty: caa's own credentials, which "+
			"deploy/ grants no secret (env CAA_PULL_SECRETS_KUBECONFIG)")
	fs.DurationVar(&h.startLimit, "start-vm-timeout", cli.EnvDuration("CAA_START_VM_TIMEOUT", 5*time.Minute),
		"how long a StartVM may take before it fails with the reason; keep it below kata's remote_hypervisor_timeout (600 s) (env CAA_START_VM_TIMEOUT)")
	fs.DurationVar(&h.readyBound, "sandbox-ready-timeout", cli.EnvDuration("CAA_SANDBOX_READY_TIMEOUT", defaultSandboxReady),
		"after a start, how long a running sandbox whose agent does not answer (a hung guest, an expired VM certificate, a lost agent CA) "+
			"holds readiness back; past it the sandbox is reported silent (log, Warning event AgentSilent on its pod, caa_sandboxes_silent, "+
			"caa status) and caa turns ready without it. Keep it well below --handover-ready-timeout (env CAA_SANDBOX_READY_TIMEOUT)")
	fs.DurationVar(&h.clientTTL, "agent-client-cert-ttl", cli.EnvDuration("CAA_AGENT_CLIENT_CERT_TTL", pki.DefaultClientTTL),
		"life of caa's client certificates for the pod VMs' agents (and of the copy in "+relayd.ClientFile+"); caa renews them at half "+
			"their life while it runs (env CAA_AGENT_CLIENT_CERT_TTL)")
	fs.BoolVar(&h.replaceLost, "agent-ca-replace-lost", cli.EnvOr("CAA_AGENT_CA_REPLACE_LOST", "false") == "true",
		"create a new agent CA although "+pki.CurrentFile+" is missing while the ledger has sandboxes whose VMs trust it: only when the file "+
			"is lost for good (no backup); those VMs' agents stay unreachable and their sandboxes are reported silent (env CAA_AGENT_CA_REPLACE_LOST)")
}

// defaultSandboxReady is --sandbox-ready-timeout's default: time for a
// restarted caa to reach every agent that answered before (seconds each,
// or a VM still booting), and well inside the 12 minutes a surge rollout
// gives the new caa (--handover-ready-timeout) before it aborts it.
const defaultSandboxReady = 4 * time.Minute

func (h *hypervisorFlags) check() error {
	if h.socket == "" {
		return nil
	}
	if net.ParseIP(h.nodeIP) == nil {
		return fmt.Errorf("--node-ip %q: the remote hypervisor mode needs this node's IP (NODE_IP from status.hostIP)", h.nodeIP)
	}
	if h.relay != "" && !filepath.IsAbs(h.relay) {
		return fmt.Errorf("--relay-socket %q: want the relay daemon's control socket's absolute path, e.g. %s", h.relay, relayd.DefaultSocket)
	}
	if h.startLimit <= 0 {
		return fmt.Errorf("--start-vm-timeout must be positive")
	}
	if h.readyBound <= 0 {
		return fmt.Errorf("--sandbox-ready-timeout %s: must be positive (the default is %s)", h.readyBound, defaultSandboxReady)
	}
	if err := h.checkPullSecrets(); err != nil {
		return err
	}
	if h.clientTTL < pki.MinClientTTL {
		return fmt.Errorf("--agent-client-cert-ttl %s: must be at least %s; the default is %s", h.clientTTL, pki.MinClientTTL, pki.DefaultClientTTL)
	}
	if h.initDataFile != "" {
		b, err := os.ReadFile(h.initDataFile)
		if err != nil {
			return fmt.Errorf("--initdata-file: %w", err)
		}
		doc, err := sandbox.NormalizeInitData(string(b), "--initdata-file "+h.initDataFile)
		if err != nil {
			return err
		}
		if strings.TrimSpace(doc) == "" {
			return fmt.Errorf("--initdata-file %s is empty: give it the initdata TOML document, or drop the flag", h.initDataFile)
		}
		h.initData = doc
	}
	return nil
}

// trustingSandboxes counts the ledger's sandboxes whose VMs were (or are
// being) given a server certificate and the client CA from the agent CA,
// and that caa still has to reach: Created (the certificate may be in a
// create on its way), Creating, Running.
func trustingSandboxes(led *ledger.Ledger) (int, error) {
	ss, err := led.ListSandboxes()
	if err != nil {
		return 0, fmt.Errorf("count the sandboxes that trust the agent CA: %w", err)
	}
	n := 0
	for _, s := range ss {
		switch s.Phase {
		case ledger.SandboxCreated, ledger.SandboxCreating, ledger.SandboxRunning:
			n++
		}
	}
	return n, nil
}

// loadAgentCA loads the agent CA from dir, refusing to make a new one
// while the ledger has sandboxes that trust the one there (unless the
// operator said --agent-ca-replace-lost).
func loadAgentCA(led *ledger.Ledger, dir string, h *hypervisorFlags) (*pki.CA, error) {
	inUse, err := trustingSandboxes(led)
	if err != nil {
		return nil, err
	}
	return pki.Load(dir, pki.Options{InUse: inUse, AllowNew: h.replaceLost, ClientTTL: h.clientTTL})
}

// startRelayClientFile writes the relay daemon's client file beside its
// control socket relaySocket (the directory `caa relay` reads it from, and
// the only one of caa's it mounts) and keeps it there, checking for a
// renewal every period, until ctx ends. The first write and every renewal
// go to that one directory: never the agent CA's, which the relay daemon
// does not see (a renewal written there left the daemon with certificates
// that expired after --agent-client-cert-ttl).
func startRelayClientFile(ctx context.Context, log *slog.Logger, ca *pki.CA, relaySocket string, every time.Duration) error {
	dir := filepath.Dir(relaySocket)
	if err := relayd.WriteClientFile(dir, ca); err != nil {
		return err
	}
	go keepClientFile(ctx, log, ca, dir, every)
	return nil
}

// keepClientFile renews caa's client certificates at half their life
// (RenewClients; caa's own relays also renew on their next handshake) and
// writes the relay daemon's copy again whenever they changed, until ctx
// ends. The relay daemon reads the file again when it changes.
func keepClientFile(ctx context.Context, log *slog.Logger, ca *pki.CA, dir string, every time.Duration) {
	written := ca.Generation()
	for sleepCtx(ctx, every) == nil {
		if _, err := ca.RenewClients(); err != nil {
			log.Error("cannot renew caa's client certificates; the current ones stay in use", "err", err)
		}
		if g := ca.Generation(); g != written {
			if err := relayd.WriteClientFile(dir, ca); err != nil {
				log.Error("cannot write the relay daemon's client file; it keeps the previous certificates", "dir", dir, "err", err)
				continue
			}
			written = g
			log.Info("caa's client certificates renewed; the relay daemon's file written again", "file", filepath.Join(dir, relayd.ClientFile))
		}
	}
}

// runSandboxes is the hold's work in the remote hypervisor mode: serve
// every recorded sandbox again (no cloud write), turn ready once each
// running sandbox's agent answers, then serve kata's calls and sync every
// audit interval, until ctx is done. Nothing is deleted on the way out.
//
// quit ends at SIGTERM: from then on no cloud write starts, even for the
// calls still answered. A hand-over's stop (ctx alone) lets the calls in
// flight finish as the reconciler's do, writes included, before the release.
func (n *nodeDaemon) runSandboxes(ctx, quit context.Context, led *ledger.Ledger, writes, reads *rate.Limiter, ready func()) {
	f, log := n.f, n.log.With("mode", "hypervisor")
	caDir := f.hv.caDir
	if caDir == "" {
		caDir = filepath.Dir(f.ledgerPath)
	}
	ca, err := loadAgentCA(led, caDir, &f.hv)
	if err != nil {
		n.status.SetBlocked("agent CA: " + err.Error())
		log.Error("agent CA unusable: caa does not start", "dir", caDir, "err", err)
		return
	}
	// A VM cannot renew its server certificate: it lasts until the CA
	// expires (pki.ServerLifetime is cut there).
	var side sandbox.PodSide = &sandbox.PodVMSide{CA: ca, CertTTL: pki.ServerLifetime, Log: log}
	var daemon *sandbox.RelaydSide
	if f.hv.relay != "" {
		// The relay daemon authenticates to the VMs with this run's client
		// certificate: write it before any sandbox is registered there.
		// Beside the daemon's control socket, in the directory the daemon
		// is given: not the CA's, whose key it must not reach.
		if err := startRelayClientFile(ctx, log, ca, f.hv.relay, min(ca.ClientTTL()/8, time.Hour)); err != nil {
			n.status.SetBlocked("relay daemon's client file: " + err.Error())
			log.Error("cannot write the relay daemon's client file", "dir", filepath.Dir(f.hv.relay), "err", err)
			return
		}
		daemon = &sandbox.RelaydSide{PodSide: side, Client: &relayd.Client{Socket: f.hv.relay}, Log: log}
		side = daemon
		log.Info("agent sockets served by the relay daemon", "socket", f.hv.relay)
	}
	var pullSecrets sandbox.PullSecrets
	if f.hv.pullSecrets {
		pullSecrets = f.hv.pullSecretsSource(n.client)
	}
	var audit reconcile.AuditSource
	if f.clusterView { // the periodic sync uses the cluster caa's view when fresh, as the informer mode's audits do
		audit = &cluster.NodeAudit{Client: n.client, Log: log}
	}
	// The sandboxes stop taking calls once kata's calls in flight are
	// drained (below), not at ctx's end, so that a call the socket took
	// just before the stop is answered; but no cloud write starts after
	// SIGTERM (StopWrites: quit): a StartVM still waiting for the create
	// budget then fails with Unavailable, and a delete waits for the
	// next caa (its Deleting record is durable).
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	m := sandbox.New(sandbox.Config{
		Ledger: led, Provider: n.prov, Pods: n.pods, Events: n.events, Spec: n.specCfg, RuntimeClasses: f.runtimeClasses,
		Side: side, DefaultInitData: f.hv.initData, PullSecrets: pullSecrets,
		Cluster: n.clusterID, Node: f.node, NodeIP: net.ParseIP(f.hv.nodeIP), SocketDir: f.hv.agentDir,
		Writes: writes, Reads: reads, CallTimeout: f.cloudTimeout, StartTimeout: f.hv.startLimit,
		ConfirmMissing: f.confirmMissing, OrphanGrace: f.gcGrace, Stop: work, StopWrites: quit, Log: log, Audit: audit,
	})
	defer func() { stopWork(); m.Close(); m.Wait() }()
	watch := &agentWatch{bound: f.hv.readyBound, confidential: f.confidential, led: led, silent: func(id, why string, d time.Duration) { n.agentSilent(led, log, id, why, d) }}
	report := func(at time.Time, rep sandbox.Report, err error) bool {
		p := watch.pass(at, time.Now(), rep, err)
		n.status.PassDone(p)
		if err != nil {
			log.Warn("sandbox sync failed", "err", err)
		}
		return p.Converged()
	}
	wait := min(f.bootTimeout, f.hv.readyBound)
	// Startup: every running sandbox served again before /readyz says 200,
	// or reported silent once --sandbox-ready-timeout has passed. kata's
	// calls are served from the first sync on (a new pod need not wait for
	// an old sandbox's agent).
	at := time.Now()
	rep, err := m.Sync(ctx, wait)
	logSync(log, rep, err)
	if daemon != nil {
		// Stops the daemon's sockets of sandboxes that ended while no caa
		// ran, then keeps the daemon serving what this caa registered.
		go daemon.Keep(ctx, 5*time.Second, led)
	}
	if ctx.Err() != nil {
		return // stopped (an abort, SIGTERM) during the first sync: serve nothing
	}
	sock, serr := n.hypervisorSocket()
	if serr != nil {
		n.status.SetBlocked(serr.Error())
		log.Error("cannot serve kata's remote hypervisor socket", "err", serr)
		return
	}
	log.Info("serving kata's remote hypervisor API", "socket", f.hv.socket)
	served := make(chan struct{})
	go func() {
		defer close(served)
		defer stopWork()
		// Stopping (SIGTERM, a hand-over) lets the calls in flight finish
		// within the grace; calls arriving meanwhile wait in the socket's
		// backlog for the next holder (hypervisor.Socket).
		if err := sock.Serve(ctx, &hypervisor.Service{Sandboxes: m, CaaVersion: f.version, Log: log, Calls: n.metrics}, f.shutdownGrace); err != nil {
			log.Error("remote hypervisor service stopped", "err", err)
		}
	}()
	defer func() { <-served }()
	sync := func(ctx context.Context) (sandbox.Report, error) {
		rep, err := m.Sync(ctx, wait)
		logSync(log, rep, err)
		return rep, err
	}
	if !untilReady(ctx, at, rep, err, sync, report, 5*time.Second) {
		return
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
	m.Run(ctx, sandboxSyncPeriod(f.audit), func(rep sandbox.Report, err error) { report(time.Now(), rep, err) })
}

// untilReady reports the first sync (at, rep, err) and syncs again every
// retry until a report says ready (true) or ctx ends (false).
func untilReady(ctx context.Context, at time.Time, rep sandbox.Report, err error, sync func(context.Context) (sandbox.Report, error),
	report func(time.Time, sandbox.Report, error) bool, retry time.Duration) bool {
	for !report(at, rep, err) {
		if sleepCtx(ctx, retry) != nil {
			return false
		}
		at = time.Now()
		rep, err = sync(ctx)
	}
	return true
}

// agentWatch turns sync reports into passes. A running sandbox whose agent
// has not answered for longer than bound (counted from the first sync
// that found it silent) moves from Pending, which holds readiness, to
// Silent, which is reported once (silent) and listed, never blocking: a
// hung guest, a VM certificate past its life or a lost agent CA must not
// keep caa unready until a rollout aborts it. Not safe for concurrent use
// (one sync at a time).
type agentWatch struct {
	bound  time.Duration
	silent func(id, why string, d time.Duration)
	// confidential is --confidential, for the VMs' entries.
	confidential bool
	// led, when set, is counted by phase into each pass (caa_sandboxes).
	led *ledger.Ledger

	since map[string]time.Time // first sync that found the agent silent
	told  map[string]bool
}

func (w *agentWatch) pass(at, now time.Time, rep sandbox.Report, err error) health.Pass {
	if w.since == nil {
		w.since, w.told = map[string]time.Time{}, map[string]bool{}
	}
	p := health.Pass{At: at, Duration: now.Sub(at), Err: err, CloudWrites: rep.CloudWrites, OrphansDeleted: rep.OrphansDeleted}
	if w.led != nil {
		p.Sandboxes = sandboxesByPhase(w.led)
	}
	if rep.VMs != nil {
		p.VMs = []health.VMNote{}
		for _, vm := range rep.VMs {
			p.VMs = append(p.VMs, health.VMNote{Pod: vm.Pod, ID: vm.ID, Confidential: provider.Mode(w.confidential, vm.TEE)})
		}
	}
	for _, o := range rep.Orphans {
		p.Orphans = append(p.Orphans, health.Orphan{ID: o.ID, Pod: o.Pod, FirstSeen: o.FirstSeen})
	}
	for id := range w.since {
		if _, still := rep.Pending[id]; !still && err == nil {
			delete(w.since, id) // it answers again (or the sandbox is gone)
			delete(w.told, id)
		}
	}
	for id, why := range rep.Pending {
		first, ok := w.since[id]
		if !ok {
			first = at
			w.since[id] = at
		}
		note := health.PodNote{Pod: "sandbox " + id, Reason: "AgentPending", Message: why}
		if silentFor := now.Sub(first); silentFor >= w.bound {
			note.Reason = "AgentSilent"
			note.Message = fmt.Sprintf("no answer for %s (bound %s): %s", silentFor.Round(time.Second), w.bound, why)
			p.Silent = append(p.Silent, note)
			if !w.told[id] {
				w.told[id] = true
				if w.silent != nil {
					w.silent(id, why, silentFor)
				}
			}
			continue
		}
		p.Pending = append(p.Pending, note)
	}
	return p
}

// sandboxesByPhase counts led's sandboxes by phase; nil (the previous
// counts stay) when the ledger cannot be read.
func sandboxesByPhase(led *ledger.Ledger) map[ledger.SandboxPhase]int {
	ss, err := led.ListSandboxes()
	if err != nil {
		return nil
	}
	out := map[ledger.SandboxPhase]int{}
	for _, s := range ss {
		out[s.Phase]++
	}
	return out
}

// agentSilent reports a sandbox whose agent stayed silent past the bound:
// in the log and as a Warning event on its pod.
func (n *nodeDaemon) agentSilent(led *ledger.Ledger, log *slog.Logger, id, why string, d time.Duration) {
	msg := fmt.Sprintf("the agent of sandbox %s has not answered caa for %s (%s); caa no longer waits for it to turn ready. "+
		"Look at the VM's console; a VM whose certificate expired or whose agent CA was lost must be recreated (delete the pod)",
		id, d.Round(time.Second), why)
	s, err := led.GetSandbox(id)
	if err != nil {
		log.Warn("sandbox agent silent", "sandbox", id, "silentFor", d.Round(time.Second), "reason", why, "err", err)
		return
	}
	log.Warn("sandbox agent silent", "sandbox", id, "pod", s.PodRef(), "vm", s.VMID, "silentFor", d.Round(time.Second), "reason", why)
	if n.events != nil {
		n.events.Event(&reconcile.Pod{UID: s.PodUID, Namespace: s.Namespace, Name: s.Name}, true, "AgentSilent", msg)
	}
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

// sleepCtx waits d, or returns ctx's error as soon as ctx is done.
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

// hypervisorSocket is kata's socket for this session: the one this process
// holds already (an earlier session's, or passed by the caa it took over
// from), else bound now.
func (n *nodeDaemon) hypervisorSocket() (*hypervisor.Socket, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hv == nil {
		s, err := hypervisor.ListenSocket(n.f.hv.socket)
		if err != nil {
			return nil, err
		}
		n.hv = s
	}
	return n.hv, nil
}

// takeSockets keeps the hypervisor socket a releasing caa passed, when it
// is the one this caa serves; other sockets are closed.
func (n *nodeDaemon) takeSockets(socks []handover.Socket) {
	for _, s := range socks {
		if s.Name != hvSocketName || n.f.hv.socket == "" {
			_ = s.File.Close()
			continue
		}
		hv, err := hypervisor.FromFile(s.File, n.f.hv.socket)
		if err != nil {
			n.log.Warn("not serving the socket the running caa passed", "err", err)
			continue
		}
		n.mu.Lock()
		if n.hv != nil {
			_ = n.hv.Close()
		}
		n.hv = hv
		n.mu.Unlock()
		n.log.Info("took kata's hypervisor socket over from the running caa: calls made during the hand-over wait in it", "socket", hv.Path())
	}
}

// hvSocketName names the hypervisor socket in a hand-over.
const hvSocketName = "hypervisor"

// passSockets are the sockets a release passes to the new caa: kata's
// hypervisor socket, so that the shims' calls during the hand-over wait
// for the new caa instead of being refused. This caa keeps its own
// descriptor, for a hand-over taken back.
func (n *nodeDaemon) passSockets() []handover.Socket {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hv == nil {
		return nil
	}
	f, err := n.hv.File()
	if err != nil {
		n.log.Warn("cannot pass kata's hypervisor socket to the new caa; it binds its own", "err", err)
		return nil
	}
	return []handover.Socket{{Name: hvSocketName, File: f}}
}

func (n *nodeDaemon) closeHypervisorSocket() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hv != nil {
		_ = n.hv.Close()
		n.hv = nil
	}
}
