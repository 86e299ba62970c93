package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/relayd"
)

// RelaydSide is a PodSide whose agent relays run in the relay daemon (`caa
// relay`, package relayd) instead of in caa, so that caa's restarts,
// upgrades and crashes leave the kata shims' agent connections open. The
// user data and the tunnel come from PodSide. caa's shutdown detaches from
// the daemon's relays (Manager.Close); only StopVM, a lost VM or a
// superseded sandbox stops one.
type RelaydSide struct {
	PodSide
	Client *relayd.Client
	Log    *slog.Logger
	// Fresh is how recent the VM's last bytes on a kept relay's open shim
	// connection must be for a restarted caa to count the sandbox reachable
	// without a probe (default FreshWindow). 0 takes the default; negative
	// always probes.
	Fresh time.Duration

	ops        sync.Mutex // one of StartRelay, Close, keepOnce at a time
	mu         sync.Mutex
	registered map[string]relayd.Request // what this caa asked the daemon to serve
	stops      map[string]bool           // stops the daemon did not take yet
	boot       string                    // the daemon's run last seen
	strangers  map[string]bool           // sandboxes the daemon serves that the ledger never had, warned about
	rounds     atomic.Int64              // Keep's rounds done (tests wait on it)
	probes     chan struct{}             // bounds the reach probes in flight
}

// maxProbes bounds the first probes of kept relays (a mutual-TLS
// handshake and a health check each) in flight at once: a restarted caa's
// startup sync probes every sandbox the daemon kept serving, and a burst of
// handshakes takes the CPU the node's shims and the relay need to answer
// kata's health checks promptly. A new relay (StartVM, a VM that may still
// be booting) is not bounded: its wait is mostly the VM's boot.
const maxProbes = 4

// keptProbe bounds that first probe; a kept relay whose VM does not answer
// in time waits unbounded, as a new one does, without holding a turn.
const keptProbe = 5 * time.Second

// FreshWindow is RelaydSide.Fresh's default: two of kata's 5 s health
// check periods. A shim that checks its agent hears from the VM every 5 s,
// so a live sandbox stays within it even with one check answered late; a VM
// that went silent (killed without a reset, frozen, cut off) is probed
// again at most 10 s after its last word, and one whose connection ended is
// probed at once (the daemon keeps no evidence of closed connections).
const FreshWindow = 10 * time.Second

func (p *RelaydSide) fresh() time.Duration {
	if p.Fresh == 0 {
		return FreshWindow
	}
	return p.Fresh
}

var _ PodSide = (*RelaydSide)(nil)

// Detacher is a Relay that outlives caa: caa's shutdown calls Detach, which
// leaves it serving, instead of Close.
type Detacher interface{ Detach() }

func (p *RelaydSide) log() *slog.Logger {
	if p.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Log
}

// sandboxOf is the sandbox id in an agent socket path: Manager.SocketPath
// puts each sandbox's socket in a directory named by its id.
func sandboxOf(socketPath string) string { return filepath.Base(filepath.Dir(socketPath)) }

// StartRelay asks the daemon to serve the socket; the same sandbox served
// with the same arguments keeps its shim connections (caa's restart).
func (p *RelaydSide) StartRelay(ctx context.Context, socketPath, addr, serverName string) (Relay, error) {
	req := relayd.Request{Op: relayd.OpServe, Sandbox: sandboxOf(socketPath), Socket: socketPath, Addr: addr, ServerName: serverName}
	p.ops.Lock()
	defer p.ops.Unlock()
	resp, err := p.Client.Do(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("relay daemon at %s (--relay-socket): %w", p.Client.Socket, err)
	}
	p.mu.Lock()
	if p.registered == nil {
		p.registered, p.stops = map[string]relayd.Request{}, map[string]bool{}
	}
	p.registered[req.Sandbox] = req
	delete(p.stops, req.Sandbox)
	p.boot = resp.Boot
	p.mu.Unlock()
	p.log().Info("agent socket served by the relay daemon", "sandbox", req.Sandbox, "kept", resp.Kept, "vmHeardAgo", resp.HeardAgo)
	dr := &daemonRelay{side: p, id: req.Sandbox, kept: resp.Kept}
	if resp.Kept && resp.HeardAgo > 0 {
		dr.heard = time.Now().Add(-resp.HeardAgo)
	}
	return dr, nil
}

type daemonRelay struct {
	side *RelaydSide
	id   string
	kept bool // the daemon kept serving it (a restarted caa's registration)

	mu    sync.Mutex
	heard time.Time // when the VM last spoke on an open shim connection, as the daemon saw at Serve; zero: unknown
}

// recent takes the Serve answer's evidence, once: true if the VM spoke on
// the shim's open connection within the Fresh window before now.
func (r *daemonRelay) recent() (time.Duration, bool) {
	r.mu.Lock()
	heard := r.heard
	r.heard = time.Time{}
	r.mu.Unlock()
	if heard.IsZero() {
		return 0, false
	}
	age := time.Since(heard)
	return age, age <= r.side.fresh()
}

func (r *daemonRelay) WaitReachable(ctx context.Context) error {
	p := r.side
	if r.kept {
		// The shim's own traffic proves the VM reachable over mutual TLS
		// (and its agent answering) more cheaply than a handshake of our
		// own, which takes the CPU the shims' checks need.
		if age, ok := r.recent(); ok {
			p.log().Debug("agent reachable: its VM spoke on the shim's connection lately; not probed", "sandbox", r.id, "ago", age)
			return nil
		}
		p.mu.Lock()
		if p.probes == nil {
			p.probes = make(chan struct{}, maxProbes)
		}
		probes := p.probes
		p.mu.Unlock()
		select {
		case probes <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("wait for a probe turn: %w", ctx.Err())
		}
		pctx, cancel := context.WithTimeout(ctx, keptProbe)
		err := p.Client.Reach(pctx, r.id)
		cancel()
		<-probes
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	return p.Client.Reach(ctx, r.id)
}

// Close stops the daemon's relay of the sandbox. A daemon that does not
// answer gets the stop again from Keep, and from the next caa's Reconcile.
func (r *daemonRelay) Close() error {
	p := r.side
	p.ops.Lock()
	defer p.ops.Unlock()
	p.mu.Lock()
	delete(p.registered, r.id)
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Client.Stop(ctx, r.id); err != nil {
		p.mu.Lock()
		p.stops[r.id] = true
		p.mu.Unlock()
		return fmt.Errorf("stop the agent socket of sandbox %s: %w", r.id, err)
	}
	return nil
}

// Detach forgets the relay and leaves the daemon serving it.
func (r *daemonRelay) Detach() {
	r.side.mu.Lock()
	delete(r.side.registered, r.id)
	r.side.mu.Unlock()
}

// Reconcile stops the daemon's relays of sandboxes this node no longer
// has, on positive evidence only: the ledger shows the sandbox Lost, Failed
// or Deleting, or its record is gone and its history tells it was here (a
// finished StopVM; caa may have died before it stopped the relay). A
// sandbox the ledger does not know at all (another ledger, a wrong
// --ledger) keeps its socket, with a warning: stopping it would fail a pod
// that may be running. The relays of the other sandboxes stay: Sync
// registers the running ones again with the same arguments, which keeps
// their connections.
func (p *RelaydSide) Reconcile(ctx context.Context, led *ledger.Ledger) (stopped []string, err error) {
	entries, _, err := p.Client.List(ctx)
	if err != nil {
		return nil, err
	}
	listed := make(map[string]bool, len(entries))
	for _, e := range entries {
		listed[e.Sandbox] = true
	}
	p.mu.Lock()
	for id := range p.strangers { // forget those the daemon no longer serves
		if !listed[id] {
			delete(p.strangers, id)
		}
	}
	p.mu.Unlock()
	for _, e := range entries {
		s, err := led.GetSandbox(e.Sandbox)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			hist, err := led.SandboxHistory(e.Sandbox)
			if errors.Is(err, ledger.ErrNotFound) {
				hist, err = nil, nil
			}
			if err != nil {
				return stopped, fmt.Errorf("read the history of sandbox %s: %w", e.Sandbox, err)
			}
			if len(hist) == 0 {
				p.warnStranger(e)
				continue
			}
		case err != nil:
			return stopped, fmt.Errorf("read sandbox %s: %w", e.Sandbox, err)
		case s.Phase == ledger.SandboxLost || s.Phase == ledger.SandboxFailed || s.Phase == ledger.SandboxDeleting:
		default:
			continue
		}
		if err := p.Client.Stop(ctx, e.Sandbox); err != nil {
			return stopped, err
		}
		stopped = append(stopped, e.Sandbox)
		p.log().Info("relay daemon's agent socket stopped: its sandbox is gone", "sandbox", e.Sandbox, "socket", e.Socket)
	}
	return stopped, nil
}

// warnStranger warns once per sandbox (while the daemon keeps serving it)
// about a socket the ledger never had: Keep reconciles every few seconds.
func (p *RelaydSide) warnStranger(e relayd.Entry) {
	p.mu.Lock()
	if p.strangers == nil {
		p.strangers = map[string]bool{}
	}
	seen := p.strangers[e.Sandbox]
	p.strangers[e.Sandbox] = true
	p.mu.Unlock()
	if !seen {
		p.log().Warn("the relay daemon serves a sandbox this ledger never had; left serving (stop it with the daemon if it is stale); not repeated",
			"sandbox", e.Sandbox, "socket", e.Socket)
	}
}

// Keep watches the daemon every period until ctx is done, the first time
// at once. Each round runs Reconcile against led (so a relay of a sandbox
// that ended without this caa holding its relay, one StartVM registered
// before a restart and StopVM ended after it, is stopped within a period)
// and then, when the daemon restarted (a new boot id) or lost a relay,
// serves again what this caa registered (the sockets come back; the shims'
// connections of the daemon's restart are lost), and sends again the stops
// it missed.
func (p *RelaydSide) Keep(ctx context.Context, period time.Duration, led *ledger.Ledger) {
	down := false
	for {
		stopped, err := p.Reconcile(ctx, led)
		switch {
		case err != nil && !down:
			p.log().Warn("relay daemon unreachable or its sockets not reconciled; agent sockets it serves stay served", "err", err)
			down = true
		case err == nil && down:
			p.log().Info("relay daemon reachable again")
			down = false
		}
		if len(stopped) > 0 {
			p.log().Info("relay daemon's sockets of ended sandboxes stopped", "sandboxes", stopped)
		}
		if err == nil {
			p.keepOnce(ctx)
		}
		p.rounds.Add(1)
		if sleep(ctx, period) != nil {
			return
		}
	}
}

func (p *RelaydSide) keepOnce(ctx context.Context) {
	p.ops.Lock()
	defer p.ops.Unlock()
	entries, boot, err := p.Client.List(ctx)
	if err != nil {
		return // Keep reports it
	}
	have := map[string]relayd.Entry{}
	for _, e := range entries {
		have[e.Sandbox] = e
	}
	p.mu.Lock()
	if p.boot != "" && boot != p.boot {
		p.log().Warn("the relay daemon restarted: serving every agent socket again (shim connections it had are gone)", "was", p.boot, "now", boot)
	}
	p.boot = boot
	var again []relayd.Request
	for id, req := range p.registered {
		e, ok := have[id]
		if !ok || e.Socket != req.Socket || e.Addr != req.Addr || e.ServerName != req.ServerName {
			again = append(again, req)
		}
	}
	var stops []string
	for id := range p.stops {
		stops = append(stops, id)
	}
	p.mu.Unlock()
	for _, req := range again {
		if _, err := p.Client.Do(ctx, req); err != nil {
			p.log().Warn("serving an agent socket again failed", "sandbox", req.Sandbox, "err", err)
		}
	}
	for _, id := range stops {
		if err := p.Client.Stop(ctx, id); err == nil {
			p.mu.Lock()
			delete(p.stops, id)
			p.mu.Unlock()
		}
	}
}
