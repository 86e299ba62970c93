package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

// Report is what a Sync found and did.
type Report struct {
	// Served are the running sandboxes whose agent answers through caa.
	Served []string
	// Pending are running sandboxes whose agent does not answer yet, with
	// the reason; they hold readiness back.
	Pending map[string]string
	// Lost are sandboxes whose VM is gone (reported on the pod, socket closed).
	Lost []string
	// NotConfidential are sandboxes whose VM the cloud reports as not the
	// confidential VM asked for: never served, their VM deleted.
	NotConfidential []string
	// VMs are the sandboxes that have a VM after the sync (not Deleting
	// or Lost), each with the TEE it was asked to be.
	VMs []reconcile.RecordedVM
	// Retired counts sandboxes this sync turned Deleting (pod gone).
	Retired int
	// CloudReads counts listings and gets.
	CloudReads int
	// FromView: the cluster caa's view stood in for this sync's listing.
	FromView bool
	// CloudWrites counts the deletes Sync itself sent: orphans past their
	// grace, and VMs of informer-mode records whose pods are gone. The
	// deletes of retired sandboxes run in the background and are not
	// counted here.
	CloudWrites int
	// Orphans are the orphan VMs waiting out their grace; OrphansDeleted
	// counts those this sync deleted.
	Orphans        []reconcile.PendingOrphan
	OrphansDeleted int
	// Records counts the informer-mode pod records kept (their pods live);
	// RecordsRetired those whose VM this sync deleted (pod gone).
	Records, RecordsRetired int
}

// Ready reports whether every running sandbox is served.
func (r Report) Ready() bool { return len(r.Pending) == 0 }

// Sync brings every recorded sandbox in line with the cloud and the pods:
// at startup (Adopt) and then periodically. It serves the agent socket of
// each running sandbox whose VM is alive (tunnel and relay set up again if
// a restart took them), declares Lost those whose VM is confirmed gone,
// retires those whose pod is gone (positive evidence, only from a synced
// pod cache), and resumes the deletes a restart cut short. Then it keeps
// the informer mode's pod records (syncRecords) and collects orphans
// (Orphans). One listing of the node's VMs, and a Get only for a VM the
// listing misses. wait bounds the wait for the agents to answer.
func (m *Manager) Sync(ctx context.Context, wait time.Duration) (Report, error) {
	rep := Report{Pending: map[string]string{}}
	m.guardTunnels(ctx)
	all, err := m.cfg.Ledger.ListSandboxes()
	if err != nil {
		return rep, fmt.Errorf("read sandboxes: %w", err)
	}
	synced := m.cfg.Pods.Synced()
	var running []ledger.Sandbox
	for _, s := range all {
		if pod := m.cfg.Pods.Pod(s.PodUID); synced && s.Phase != ledger.SandboxDeleting && (pod == nil || pod.Terminal) {
			if _, err := m.retire(s.ID, "PodGone", "pod "+s.PodRef()+" is gone or finished"); err != nil {
				return rep, err
			}
			rep.Retired++
			continue
		}
		switch s.Phase {
		case ledger.SandboxDeleting:
			if !m.deleting(s.ID) {
				m.closeRelay(s.ID)
				if err := m.teardownTunnel(s); err != nil {
					m.cfg.Log.Warn("tearing the tunnel down failed", "sandbox", s.ID, "err", err)
				}
				m.deleteLater(s.ID, nil)
			}
		case ledger.SandboxRunning:
			running = append(running, s)
		case ledger.SandboxLost:
			rep.Lost = append(rep.Lost, s.ID)
		}
	}
	vms, reads, viewed := m.viewVMs(ctx)
	rep.CloudReads += reads
	if viewed {
		rep.FromView = true
	} else {
		if err := m.take(ctx, m.cfg.Reads); err != nil {
			return rep, err
		}
		callCtx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
		vms, err = m.cfg.Provider.List(callCtx, m.selector())
		cancel()
		rep.CloudReads++
		if err != nil {
			return rep, fmt.Errorf("list this node's VMs: %w", err)
		}
		defer m.steady.Store(true)
	}
	byID := map[string]provider.VM{}
	for _, vm := range vms {
		byID[vm.ID] = vm
	}

	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, s := range running {
		vm, listed := byID[s.VMID]
		if !listed || !vm.State.Alive() {
			gone, why, reads := m.confirmGone(ctx, s, vm, listed)
			rep.CloudReads += reads
			if gone {
				m.lose(s, why)
				rep.Lost = append(rep.Lost, s.ID)
				continue
			}
			if why != "" {
				rep.Pending[s.ID] = why
				continue
			}
		} else {
			m.mu.Lock()
			delete(m.missing, s.ID)
			m.mu.Unlock()
			if vm.Downgraded(provider.TEE(s.Confidential)) != "" {
				// Adopting it after a restart (or serving it on) would
				// serve the pod from a VM without its TEE.
				_ = m.refuseDowngraded(s, vm)
				rep.NotConfidential = append(rep.NotConfidential, s.ID)
				continue
			}
		}
		l := m.liveOf(s.ID)
		if m.reachable(l) {
			rep.Served = append(rep.Served, s.ID)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := m.serveOnce(wctx, s)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				rep.Pending[s.ID] = err.Error()
				return
			}
			rep.Served = append(rep.Served, s.ID)
		}()
	}
	wg.Wait()
	// The informer mode's records, then the orphans: both after the
	// sandboxes are served, so no delete delays an agent.
	if err := m.syncRecords(ctx, vms, synced, &rep); err != nil {
		return rep, err
	}
	if synced && !m.stopping() {
		if err := m.collectOrphans(ctx, vms, &rep); err != nil {
			return rep, err
		}
	}
	if after, err := m.cfg.Ledger.ListSandboxes(); err == nil {
		rep.VMs = []reconcile.RecordedVM{}
		for _, s := range after {
			if s.VMID != "" && (s.Phase == ledger.SandboxRunning || s.Phase == ledger.SandboxCreating) {
				rep.VMs = append(rep.VMs, reconcile.RecordedVM{Pod: s.PodRef(), ID: s.VMID, TEE: provider.TEE(s.Confidential)})
			}
		}
	}
	return rep, nil
}

// guardTunnels brings the node's VXLAN guard in line with the ledger (I13):
// every tunnel a record holds, whatever its phase, and no other. At startup
// this is the restarted caa's rebuild; the kernel kept the guard meanwhile,
// and the rebuild replaces its elements in one transaction. A failure is
// logged: each tunnel's Setup adds its own element anyway.
func (m *Manager) guardTunnels(ctx context.Context) {
	if m.cfg.Side == nil { // a manager that serves no sandbox (a rebuild's check) makes no tunnel
		return
	}
	err := m.tunnelOp(ctx, func() error {
		return m.cfg.Side.GuardTunnels(func() ([]ledger.Tunnel, error) {
			all, err := m.cfg.Ledger.ListSandboxes()
			if err != nil {
				return nil, fmt.Errorf("read sandboxes: %w", err)
			}
			var ts []ledger.Tunnel
			for _, s := range all {
				if s.Tunnel.VXLANID != 0 && s.Tunnel.RemoteIP != "" {
					ts = append(ts, s.Tunnel)
				}
			}
			return ts, nil
		})
	})
	if err != nil {
		m.cfg.Log.Warn("the VXLAN guard could not be brought in line with the recorded tunnels", "err", err)
	}
}

// serveOnce serves a running sandbox again unless a StartVM or StopVM of
// it is under way.
func (m *Manager) serveOnce(ctx context.Context, s ledger.Sandbox) error {
	l, err := m.enter(ctx, s.ID)
	if err != nil {
		return err
	}
	defer m.leave(l)
	if cur, err := m.cfg.Ledger.GetSandbox(s.ID); err != nil || cur.Phase != ledger.SandboxRunning {
		return nil // it moved on meanwhile; the next sync sees it
	}
	// The entry enter returns: one that held nothing may have been dropped
	// (leave) and made anew since Sync looked it up.
	return m.serve(ctx, l, s)
}

func (m *Manager) reachable(l *live) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return l.relay != nil && l.reachable
}

// confirmGone decides about a running sandbox whose VM the listing shows
// dead or not at all. Only positive evidence loses a sandbox (invariant
// I3): the cloud shows the VM terminated, stopped or failed, or it stays
// not found for ConfirmMissing. Otherwise why says what is awaited.
func (m *Manager) confirmGone(ctx context.Context, s ledger.Sandbox, vm provider.VM, listed bool) (gone bool, why string, reads int) {
	if listed && (vm.State.Dead() || vm.State.Gone()) {
		return true, fmt.Sprintf("the cloud shows VM %s %s", s.VMID, vm.State), 0
	}
	if listed {
		return false, "", 0 // in flight (stopping, unknown): look again next time
	}
	if err := m.take(ctx, m.cfg.Reads); err != nil {
		return false, err.Error(), 0
	}
	callCtx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
	got, err := m.cfg.Provider.Get(callCtx, s.VMID)
	cancel()
	switch {
	case err == nil && (got.State.Dead() || got.State.Gone()):
		return true, fmt.Sprintf("the cloud shows VM %s %s", s.VMID, got.State), 1
	case err == nil:
		return false, "", 1 // the listing lagged
	case !errors.Is(err, provider.ErrNotFound):
		return false, "", 1
	}
	now := m.cfg.Now()
	m.mu.Lock()
	first, seen := m.missing[s.ID]
	if !seen {
		m.missing[s.ID], first = now, now
	}
	m.mu.Unlock()
	if now.Sub(first) >= m.cfg.ConfirmMissing {
		return true, fmt.Sprintf("VM %s not found in the cloud since %s", s.VMID, first.UTC().Format(time.RFC3339)), 1
	}
	return false, fmt.Sprintf("VM %s not found since %s; confirming before the sandbox is declared lost", s.VMID, first.UTC().Format(time.RFC3339)), 1
}

// lose marks a running sandbox Lost: its VM is gone and is not recreated
// for it. The agent socket closes, so kata fails the sandbox and the
// kubelet starts a new one.
func (m *Manager) lose(s ledger.Sandbox, why string) {
	stored, err := m.update(s.ID, func(r *ledger.Sandbox) error {
		if r.Phase != ledger.SandboxRunning {
			return errSkip
		}
		r.Phase, r.Reason, r.Message = ledger.SandboxLost, "VMLost", why
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			m.cfg.Log.Error("recording a lost sandbox failed", "sandbox", s.ID, "err", err)
		}
		return
	}
	m.closeRelay(s.ID)
	m.removeSocketDir(s.ID)
	if err := m.teardownTunnel(s); err != nil {
		m.cfg.Log.Warn("tearing the tunnel down failed", "sandbox", s.ID, "err", err)
	}
	m.event(stored, true, EventVMLost, fmt.Sprintf("the VM of sandbox %s is gone (%s); its agent socket is closed and kata will start a new sandbox", short(s.ID), why))
	m.cfg.Log.Warn("sandbox lost its VM; agent socket closed", "sandbox", s.ID, "pod", s.PodRef(), "vm", s.VMID, "why", why)
}

// EventVMLost is raised on a pod whose sandbox lost its VM.
const EventVMLost = "SandboxVMLost"

// deleting reports whether a background delete of id is under way.
func (m *Manager) deleting(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.live[id]
	return l != nil && l.deleting
}

// Run syncs every period until ctx is done; each result goes to report.
func (m *Manager) Run(ctx context.Context, period time.Duration, report func(Report, error)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rep, err := m.Sync(ctx, period)
		if report != nil {
			report(rep, err)
		}
	}
}

// Close stops serving every agent socket that caa serves itself (shutdown
// or hand-over), and leaves the relay daemon's serving: the sandboxes and
// their VMs stay as they are (invariant I4).
func (m *Manager) Close() {
	m.mu.Lock()
	ids := make([]string, 0, len(m.live))
	for id := range m.live {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	for _, id := range ids {
		m.releaseRelay(id)
	}
}

// releaseRelay is closeRelay for caa's shutdown: a relay that outlives caa
// (the relay daemon's, a Detacher) is left serving, so the shim's agent
// connection survives caa's restart; an in-process relay is closed.
func (m *Manager) releaseRelay(id string) {
	m.mu.Lock()
	l := m.live[id]
	var r Relay
	if l != nil {
		r, l.relay, l.reachable = l.relay, nil, false
	}
	m.mu.Unlock()
	if d, ok := r.(Detacher); ok {
		d.Detach()
		return
	}
	if r != nil {
		if err := r.Close(); err != nil {
			m.cfg.Log.Warn("closing an agent relay failed", "sandbox", id, "err", err)
		}
	}
}
