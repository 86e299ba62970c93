package sandbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

// The annotations kata's shim sends with CreateVM that caa reads (the
// CRI's sandbox name and namespace; kata's hypervisor settings are read by
// provider.SpecConfig.Select). Checked against kata-containers'
// virtcontainers/remote.go, which fills them from the sandbox's
// configuration (commit 7c6ba40c).
const (
	AnnotationSandboxName      = "io.kubernetes.cri.sandbox-name"
	AnnotationSandboxNamespace = "io.kubernetes.cri.sandbox-namespace"
	AnnotationInitData         = "io.katacontainers.config.hypervisor.cc_init_data"
)

// MaxInitData caps the initdata a sandbox may carry to its VM (it goes in
// the user data, which clouds cap at 16-64 KiB).
const MaxInitData = 16 << 10

// The pod network's VXLAN: one id per sandbox of the node, on UDP port
// VXLANPort (upstream's). Upstream counts ids up from VXLANIDBase; caa draws
// each at random from VXLANIDBase to VXLANIDMax (16.2 million), so a
// sandbox's id says nothing about its neighbours' (freeVXLAN). The range
// keeps upstream's floor: the user data's tunnel index (id - VXLANIDBase)
// stays what upstream's readers expect, and the small ids other VXLAN users
// of the port take (Calico's 4096) are never drawn.
const (
	VXLANIDBase = 555000
	VXLANIDMax  = 1<<24 - 1
	VXLANPort   = 4789
)

// ForwarderPort is where the pod VM's forwarder serves the agent (the
// peer-pods image's default).
const ForwarderPort = 15150

// Error kinds; the hypervisor service maps each to a ttrpc status code.
var (
	// ErrInvalid: the request cannot be served as it is (bad sandbox id,
	// missing annotation, a spec outside the node's allow-lists). Nothing
	// was recorded or created.
	ErrInvalid = errors.New("invalid request")
	// ErrUnknownSandbox: no sandbox with that id is recorded on this node.
	ErrUnknownSandbox = errors.New("unknown sandbox")
	// ErrNotStartable: the sandbox is recorded but cannot get a VM (its VM
	// was lost, it failed, it is being deleted, its pod is gone).
	ErrNotStartable = errors.New("sandbox cannot be started")
	// ErrStopping: caa is shutting down or handing over; nothing new starts.
	ErrStopping = errors.New("caa is stopping: no new work starts")
)

// Pods is the node's pod cache (reconcile.PodSource).
type Pods interface {
	Pods() []*reconcile.Pod
	Pod(uid string) *reconcile.Pod
	Synced() bool
}

// Config is what a Manager works with.
type Config struct {
	Ledger   *ledger.Ledger
	Provider provider.Provider
	Pods     Pods
	Side     PodSide
	Events   reconcile.EventSink
	Spec     provider.SpecConfig
	// RuntimeClasses are the classes caa serves (--runtime-class), for the
	// refusal of a pod of another class (the pod cache's NotPeer decides).
	RuntimeClasses []string
	// Cluster and Node go into every VM's tags.
	Cluster, Node string
	// NodeIP is the node's end of every tunnel (the worker IP the pod VM
	// sends VXLAN to).
	NodeIP net.IP
	// SocketDir holds one directory per sandbox with its agent socket
	// (default /run/peerpod/pods, where upstream's adaptor puts them).
	SocketDir string
	// DefaultInitData is the initdata of pods that name none (the TOML
	// document or its gzip+base64 form; --initdata-file), as upstream's
	// global initdata.
	DefaultInitData string
	// PullSecrets, when set, gives each VM its pod's image-pull
	// credentials (/run/peerpod/auth.json).
	PullSecrets PullSecrets
	// Writes and Reads meter cloud calls (nil: unmetered).
	Writes, Reads *rate.Limiter
	// CallTimeout bounds each cloud call (default 5 min).
	CallTimeout time.Duration
	// StartTimeout bounds a StartVM (default 5 min; kata's shim waits
	// remote_hypervisor_timeout, 600 s by default, at least 60 s).
	StartTimeout time.Duration
	// TunnelOps bounds the tunnel operations that run at once (0:
	// DefaultTunnelOps): a sandbox's tunnel setup and teardown and the
	// reading of its pod network for the VM's user data, the netlink and
	// flock calls of package tunnel. Each such call waiting in the kernel
	// holds an OS thread, and the kernel runs them one after another
	// (rtnl_lock, the NOTRACK table's flock), so a node's burst of 100
	// sandboxes made 100 threads, which the Go runtime keeps for the
	// process's life, to finish no sooner.
	TunnelOps int
	// PodWait is how long CreateVM waits for the sandbox's pod to reach the
	// pod cache (default 10 s).
	PodWait time.Duration
	// Poll is the period of the waits for a VM to run and for the pod
	// cache (default 2 s and 100 ms).
	Poll time.Duration
	// ConfirmMissing is how long a sandbox's VM must stay not found before
	// the sandbox is declared Lost (default 30 s); a VM the cloud shows as
	// terminated, stopped or failed is lost at once.
	ConfirmMissing time.Duration
	// OrphanGrace is how long a VM must be seen as an orphan, in listings
	// at least that far apart, before it is deleted (default 5 min).
	OrphanGrace time.Duration
	// Audit, when set, may stand in for the periodic sync's listing of the
	// node's VMs (the cluster caa's view on the Node, as the informer
	// mode's audits use it): past the first sync, a view that vouches for
	// every VM spares the listing. nil: every sync lists the cloud.
	Audit reconcile.AuditSource
	// Stop, when done, means no new work (invariant I4).
	Stop context.Context
	// StopWrites, when done, means no cloud write starts (a create or a
	// delete waiting for its turn fails with ErrStopping), while the calls
	// already received otherwise go on until Stop: caa stopping for a
	// hand-over or SIGTERM answers kata's calls in flight but starts
	// nothing in the cloud. Nil: Stop alone.
	StopWrites context.Context
	Log        *slog.Logger
	Now        func() time.Time
}

// Manager serves the sandboxes of one node. It is safe for concurrent use.
type Manager struct {
	cfg Config

	mu      sync.Mutex
	live    map[string]*live
	missing map[string]time.Time // sandbox id -> VM first seen missing
	// tearing holds, per pod network namespace, the tunnel teardown a
	// retired sandbox runs after StopVM answered; closed once done. A
	// tunnel set up in that namespace waits for it.
	tearing map[string]chan struct{}
	orphans *reconcile.OrphanTracker
	// exec deletes the VMs of informer-mode records whose pods are gone.
	exec *reconcile.Executor
	bg   sync.WaitGroup
	// steady: a sync has listed the cloud itself (the startup sync); later
	// syncs may use cfg.Audit.
	steady atomic.Bool
	// tunnelOps holds a token per tunnel operation under way (TunnelOps).
	tunnelOps chan struct{}
	// drawVXLAN draws a VXLAN id in VXLANIDBase..VXLANIDMax (tests replace it).
	drawVXLAN func() (int, error)
}

// DefaultTunnelOps is Config.TunnelOps's default. The kernel serialises
// most of a tunnel operation (rtnl_lock, the NOTRACK flock), so a few at
// once keep it busy: S10's 100 StartVM at once and S11's 1,000 cycles on
// 100 slots take no longer with 4 than unbounded (docs/bench/results.md),
// while caa's threads stay near GOMAXPROCS plus 4.
const DefaultTunnelOps = 4

// live is what a sandbox has in memory only: its relay, the secrets it
// carries to its VM (never in the ledger, I7), its StartVM in flight.
type live struct {
	id        string
	busy      chan struct{} // held by a StartVM or StopVM of this sandbox
	relay     Relay
	initData  string
	userData  []byte             // between the intent and the create only
	reachable bool               // the relay reached the forwarder
	deleting  bool               // a background delete runs
	cancel    context.CancelFunc // the StartVM in flight
}

// New returns a manager; call Adopt before serving.
func New(cfg Config) *Manager {
	if cfg.SocketDir == "" {
		cfg.SocketDir = "/run/peerpod/pods"
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 5 * time.Minute
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 5 * time.Minute
	}
	if cfg.PodWait <= 0 {
		cfg.PodWait = 10 * time.Second
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 2 * time.Second
	}
	if cfg.ConfirmMissing <= 0 {
		cfg.ConfirmMissing = 30 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.OrphanGrace <= 0 {
		cfg.OrphanGrace = orphanGrace
	}
	if cfg.TunnelOps <= 0 {
		cfg.TunnelOps = DefaultTunnelOps
	}
	exec := &reconcile.Executor{
		Ledger: cfg.Ledger, Provider: cfg.Provider, Writes: cfg.Writes, Reads: cfg.Reads,
		Cluster: cfg.Cluster, Node: cfg.Node, CallTimeout: cfg.CallTimeout, Stop: cfg.Stop, Log: cfg.Log, Now: cfg.Now,
		Events: cfg.Events,
	}
	return &Manager{cfg: cfg, live: map[string]*live{}, missing: map[string]time.Time{}, tearing: map[string]chan struct{}{},
		orphans: reconcile.NewOrphanTracker(cfg.OrphanGrace), exec: exec, tunnelOps: make(chan struct{}, cfg.TunnelOps),
		drawVXLAN: drawVXLAN}
}

// tunnelOp runs fn, a tunnel operation (TunnelOps), once fewer than
// TunnelOps others run; ctx bounds the wait for that turn. A waiting caller
// is a parked goroutine, not a thread blocked in the kernel.
func (m *Manager) tunnelOp(ctx context.Context, fn func() error) error {
	select {
	case m.tunnelOps <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("%w (%d at once): %w", errNoTurn, cap(m.tunnelOps), ctx.Err())
	}
	defer func() { <-m.tunnelOps }()
	return fn()
}

// errNoTurn: a tunnel operation's caller gave up waiting for its turn; the
// operation did not run.
var errNoTurn = errors.New("gave up waiting for a turn among the node's tunnel operations")

// teardownTunnel is the PodSide's, a tunnel operation whose turn is waited
// for however long it takes: a teardown always runs.
func (m *Manager) teardownTunnel(s ledger.Sandbox) error {
	return m.tunnelOp(context.Background(), func() error { return m.cfg.Side.TeardownTunnel(s.NetNS, s.Tunnel) })
}

// Wait returns once the background deletes have finished or given up
// (they give up at Stop; their Deleting records are resumed by Adopt).
func (m *Manager) Wait() { m.bg.Wait() }

func (m *Manager) stopping() bool { return m.cfg.Stop != nil && m.cfg.Stop.Err() != nil }

func checkID(id string) error {
	if !ledger.ValidSandboxID(id) {
		return fmt.Errorf("%w: sandbox id %q: want 1-128 letters, digits, '.', '_' or '-' (kata sends a 64-hex-digit id)", ErrInvalid, id)
	}
	return nil
}

// SocketPath is where the agent socket of sandbox id is served.
func (m *Manager) SocketPath(id string) string {
	return filepath.Join(m.cfg.SocketDir, id, "agent.ttrpc")
}

// Key is the idempotency key of a sandbox's VM create, per attempt.
func Key(sandboxID string, attempt int) string {
	return "sb-" + sandboxID + "-a" + strconv.Itoa(attempt)
}

// VMName is the readable name of a sandbox's VM and the name its TLS
// server certificate is issued for, a DNS label: podvm-<pod name>-<8 hex
// digits of the sandbox id's SHA-256> (upstream uses the id's first 8).
func VMName(pod, sandboxID string) string {
	sum := sha256.Sum256([]byte(sandboxID))
	return provider.DNSLabel("podvm-", pod, sum[:], 8, 63)
}

// enter takes sandbox id's turn: StartVM and StopVM of one sandbox run one
// at a time (StopVM first cancels a StartVM in flight).
func (m *Manager) enter(ctx context.Context, id string) (*live, error) {
	for {
		m.mu.Lock()
		l := m.live[id]
		if l == nil {
			l = &live{id: id}
			m.live[id] = l
		}
		if l.busy == nil {
			l.busy = make(chan struct{})
			m.mu.Unlock()
			return l, nil
		}
		busy := l.busy
		m.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, fmt.Errorf("sandbox %s is busy with another call: %w", id, ctx.Err())
		}
	}
}

func (m *Manager) leave(l *live) {
	m.mu.Lock()
	close(l.busy)
	l.busy = nil
	l.cancel = nil
	// An entry that holds nothing goes: a StartVM or StopVM of an id the
	// ledger never had must not grow the map (a waiter in enter makes a
	// new one).
	if l.empty() && m.live[l.id] == l {
		delete(m.live, l.id)
	}
	m.mu.Unlock()
}

// empty reports that l holds nothing worth keeping. Caller holds mu.
func (l *live) empty() bool {
	return l.busy == nil && l.relay == nil && l.initData == "" && l.userData == nil && !l.reachable && !l.deleting && l.cancel == nil
}

// update applies fn to the sandbox's fresh record and stores it, again
// from a fresh read when another writer moved it on (compare-and-set).
func (m *Manager) update(id string, fn func(*ledger.Sandbox) error) (ledger.Sandbox, error) {
	for range 5 {
		s, err := m.cfg.Ledger.GetSandbox(id)
		if err != nil {
			return s, err
		}
		if err := fn(&s); err != nil {
			return s, err
		}
		stored, err := m.cfg.Ledger.PutSandbox(s)
		if errors.Is(err, ledger.ErrConflict) {
			continue
		}
		return stored, err
	}
	return ledger.Sandbox{}, fmt.Errorf("update sandbox %s: %w: it kept changing under this write", id, ledger.ErrConflict)
}

func (m *Manager) event(s ledger.Sandbox, warning bool, reason, msg string) {
	if m.cfg.Events == nil {
		return
	}
	pod := m.cfg.Pods.Pod(s.PodUID)
	if pod == nil {
		pod = &reconcile.Pod{UID: s.PodUID, Namespace: s.Namespace, Name: s.Name}
	}
	m.cfg.Events.Event(pod, warning, reason, msg)
}

// take waits for a token of budget; nothing starts once Stop is done, and
// no write once StopWrites is.
func (m *Manager) take(ctx context.Context, budget *rate.Limiter) error {
	write := budget != nil && budget == m.cfg.Writes
	stopped := func() bool { return m.stopping() || (write && m.writesStopped()) }
	if stopped() {
		return ErrStopping
	}
	if budget != nil {
		wctx := ctx
		if write && m.cfg.StopWrites != nil {
			var cancel context.CancelFunc
			wctx, cancel = context.WithCancel(ctx)
			defer context.AfterFunc(m.cfg.StopWrites, cancel)()
			defer cancel()
		}
		if err := budget.Wait(wctx); err != nil {
			if stopped() {
				return ErrStopping
			}
			return fmt.Errorf("wait for the cloud call budget: %w", err)
		}
	}
	if stopped() {
		return ErrStopping
	}
	return nil
}

func (m *Manager) writesStopped() bool {
	return m.cfg.StopWrites != nil && m.cfg.StopWrites.Err() != nil
}

func (m *Manager) selector() provider.Selector {
	return provider.Selector{Cluster: m.cfg.Cluster, Node: m.cfg.Node}
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
