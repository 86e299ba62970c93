package health

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
)

// Defaults for Config's zero fields.
const (
	// DefaultStale is three times the default resync period (1 min): one
	// slow pass does not fail liveness, a loop stuck for three does.
	DefaultStale = 3 * time.Minute
	// DefaultMaxListed bounds the pods /readyz lists per kind, so a node
	// with hundreds of pending pods still answers a probe with a short body.
	DefaultMaxListed = 20
)

// Config tunes a Status. Zero fields take the defaults.
type Config struct {
	// Stale: /healthz fails once the last heartbeat is older than this
	// (default DefaultStale). Set it from the resync period.
	Stale time.Duration
	// StartGrace: before the first heartbeat, /healthz passes only this
	// long after the Status was made (default: Stale).
	StartGrace time.Duration
	// MaxListed bounds each list in the /readyz body (default
	// DefaultMaxListed); the totals are always given.
	MaxListed int
	// Metrics, when set, is kept in step with every pass and readiness
	// change.
	Metrics *Metrics
	// Now is the clock (default time.Now); tests inject one.
	Now func() time.Time
	// Confidential names the node's --confidential setting in the
	// snapshot ("on", "off (--confidential=false)").
	Confidential string
}

// PodNote is one pod in a readiness list: which pod ("namespace/name"),
// and why it is listed (Reason a CamelCase word such as Creating or
// VMMissing or InvalidSpec, Message a sentence). It carries no spec or
// user data (invariant I7). Its fields match reconcile.PodStatus's, so
// the daemon converts one to the other with a plain type conversion.
type PodNote struct {
	UID     string `json:"uid,omitempty"`
	Pod     string `json:"pod"`
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

func (p PodNote) String() string {
	s := p.Pod + ": " + p.Reason
	if p.Message != "" {
		s += ": " + p.Message
	}
	return s
}

// Pass is what the reconciler reports after one full pass over the node's
// pods, records and VMs (the startup pass, or any later one). Only a full
// pass can prove convergence: it is the only view of every pod at once.
type Pass struct {
	// At is when the pass started, Duration how long it took.
	At       time.Time
	Duration time.Duration
	// Err is set when the pass ended early (e.g. the cloud listing failed):
	// such a pass never counts as converged, whatever Pending says.
	Err error
	// Blocked is set when the pass hit a failure that no pod can get past
	// (reconcile.ErrDaemon: credentials rejected, a broken ledger); it
	// holds /readyz at 503 until a pass comes back without it.
	Blocked string
	// Pending: desired pods without a Running VM recorded and without a
	// terminal failure, each with why.
	Pending []PodNote
	// Failed: pods with a terminal per-pod failure (invalid spec). Listed,
	// never blocking.
	Failed []PodNote
	// Actions counts the pass's decisions by kind (reconcile.Kind values).
	Actions map[string]int
	// CloudWrites counts creates and deletes sent to the cloud.
	CloudWrites    int
	OrphansDeleted int
	// Records counts the ledger's records by phase after the pass; nil
	// keeps the previous counts.
	Records map[ledger.Phase]int
	// Sandboxes counts the ledger's kata sandboxes by phase after the
	// sync (remote hypervisor mode); nil keeps the previous counts.
	Sandboxes map[ledger.SandboxPhase]int
	// NotWatched: records whose pod exists with a runtime class caa does
	// not watch. Kept (never deleted for that), listed, never blocking.
	NotWatched []PodNote
	// Orphans: orphan VMs waiting out their grace period before deletion.
	Orphans []Orphan
	// Degraded: pods whose VM runs while the cloud reports it degraded
	// (kept, never replaced). Listed, never blocking.
	Degraded []PodNote
	// Silent: running sandboxes whose agent has not answered within the
	// readiness bound (hypervisor mode). Listed and counted, never
	// blocking: one hung guest must not hold the node's caa unready.
	Silent []PodNote
	// VMs are the VMs the ledger records after the pass, each with its
	// confidential type; nil keeps the previous list.
	VMs []VMNote
}

// VMNote is one recorded VM and its confidential type: the TEE it was
// asked to be ("sev-snp", "tdx"; "sgx" on an older record), "none", or, on a node that opted
// out, "off (--confidential=false)".
type VMNote struct {
	Pod          string `json:"pod"`
	ID           string `json:"id"`
	Confidential string `json:"confidential"`
}

// Orphan is an orphan VM waiting out its grace period.
type Orphan struct {
	ID        string    `json:"id"`
	Pod       string    `json:"pod,omitempty"`
	FirstSeen time.Time `json:"firstSeen"`
}

// Converged reports whether the pass proves the node converged: it ran to
// the end and left no pod pending.
func (p Pass) Converged() bool { return p.Err == nil && len(p.Pending) == 0 }

func (p Pass) result() string {
	switch {
	case p.Err != nil:
		return ResultError
	case len(p.Pending) > 0:
		return ResultPending
	}
	return ResultConverged
}

// Status is caa's health as the reconciler last reported it. All methods
// are safe for concurrent use.
type Status struct {
	cfg Config

	mu        sync.Mutex
	started   time.Time
	lastBeat  time.Time
	passes    int
	last      Pass
	converged bool // latched by the first converged pass
	readyAt   time.Time
	blocked   string        // set by SetBlocked, owned by its caller
	preflight string        // set by SetPreflight, owned by the background preflight
	readyCh   chan struct{} // closed at the first moment of readiness
	records   map[ledger.Phase]int
	vms       []VMNote
	handover  *Handover // the last hand-over, if any
	adaptor   *AdaptorVMs
}

// NewStatus returns a Status whose start (for StartGrace and time to
// ready) is now by cfg's clock.
func NewStatus(cfg Config) *Status {
	if cfg.Stale <= 0 {
		cfg.Stale = DefaultStale
	}
	if cfg.StartGrace <= 0 {
		cfg.StartGrace = cfg.Stale
	}
	if cfg.MaxListed <= 0 {
		cfg.MaxListed = DefaultMaxListed
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Status{cfg: cfg, started: cfg.Now(), readyCh: make(chan struct{})}
	s.cfg.Metrics.setReady(false)
	return s
}

// Beat records that the reconcile loop is alive at now. Call it on every
// turn of the loop, and from inside a long pass: liveness must not depend
// on how long the cloud takes. An older time than the last is ignored.
func (s *Status) Beat(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.beat(now)
}

func (s *Status) beat(now time.Time) {
	if now.After(s.lastBeat) {
		s.lastBeat = now
	}
}

// PassDone records a full pass. It also counts as a heartbeat (at the
// pass's end), and the first converged pass ends the startup.
func (s *Status) PassDone(p Pass) {
	p.Pending = sortedNotes(p.Pending)
	p.Failed = sortedNotes(p.Failed)
	p.Actions = maps.Clone(p.Actions)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !p.At.IsZero() {
		s.beat(p.At.Add(p.Duration))
	}
	s.passes++
	s.last = p
	if p.Records != nil {
		s.records = maps.Clone(p.Records)
	}
	if p.VMs != nil {
		s.vms = slices.Clone(p.VMs)
	}
	if p.Converged() {
		s.converged = true
	}
	m := s.cfg.Metrics
	m.observePass(p)
	m.setPods(len(p.Pending), len(p.Failed))
	m.setWatch(len(p.NotWatched), p.Orphans, s.cfg.Now())
	m.setDegraded(len(p.Degraded))
	m.setSilent(len(p.Silent))
	if p.Records != nil {
		m.setRecords(p.Records)
	}
	if p.Sandboxes != nil {
		m.setSandboxes(p.Sandboxes)
	}
	s.updateReady()
}

// PodDone updates one pod's place in the last pass's Pending and Failed
// lists after work on that pod alone: note goes to Pending (pending) or
// Failed (failed), or leaves both when neither. It never changes
// readiness: only a full pass proves convergence.
func (s *Status) PodDone(note PodNote, pending, failed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	drop := func(notes []PodNote) []PodNote {
		return slices.DeleteFunc(slices.Clone(notes), func(n PodNote) bool { return n.UID == note.UID })
	}
	s.last.Pending, s.last.Failed = drop(s.last.Pending), drop(s.last.Failed)
	switch {
	case pending:
		s.last.Pending = sortedNotes(append(s.last.Pending, note))
	case failed:
		s.last.Failed = sortedNotes(append(s.last.Failed, note))
	}
	s.cfg.Metrics.setPods(len(s.last.Pending), len(s.last.Failed))
}

// SetBlocked sets a daemon-level reason found outside a pass (e.g. "ledger:
// open: ..." before the loop starts) that keeps /readyz at 503, or clears
// it with "". Its caller owns it: no pass clears it. Reasons found by a
// pass go in Pass.Blocked instead, and clear themselves.
func (s *Status) SetBlocked(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.blocked = reason
	s.updateReady()
}

// SetPreflight sets the reason a re-check of the cloud's settings failed
// after the startup went ahead on an earlier pass of the same settings (a
// warm restart), or clears it with "". Like SetBlocked it holds /readyz at
// 503 with the reason; it is a slot of its own so that the startup's
// SetBlocked calls neither hide nor clear it.
func (s *Status) SetPreflight(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.preflight = reason
	s.updateReady()
}

// Preflight results, the label of caa_preflight_runs_total.
const (
	PreflightPassed = "passed"
	PreflightFailed = "failed"
)

// CountPreflight counts one run of the cloud preflight and its result.
func (s *Status) CountPreflight(passed bool) {
	if m := s.cfg.Metrics; m != nil {
		r := PreflightFailed
		if passed {
			r = PreflightPassed
		}
		m.preflights.WithLabelValues(r).Inc()
	}
}

// Readied is closed at the first moment /readyz answers 200.
func (s *Status) Readied() <-chan struct{} { return s.readyCh }

// KeepAlive beats every interval until stop is called or ctx ends. It is
// for the waits before a reconcile loop runs (the apiserver away, the
// preflight's retries): waiting there is by design, and a liveness probe
// that restarted caa for it would only add the kubelet's back-off to the
// wait. stop may be called more than once.
func (s *Status) KeepAlive(ctx context.Context, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s.Beat(s.cfg.Now())
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// updateReady stamps the first moment of readiness; the caller holds mu.
func (s *Status) updateReady() {
	ready := s.ready()
	if ready && s.readyAt.IsZero() {
		s.readyAt = s.cfg.Now()
		s.cfg.Metrics.setTimeToReady(s.readyAt.Sub(s.started))
		close(s.readyCh)
	}
	s.cfg.Metrics.setReady(ready)
}

func (s *Status) ready() bool { return s.converged && s.blockedReason() == "" }

// blockedReason is the daemon-level reason, from SetBlocked, else from
// SetPreflight, else from the last pass; the caller holds mu.
func (s *Status) blockedReason() string {
	switch {
	case s.blocked != "":
		return s.blocked
	case s.preflight != "":
		return s.preflight
	}
	return s.last.Blocked
}

// Live answers /healthz: whether the loop is alive, and a sentence saying
// how long since its last heartbeat.
func (s *Status) Live() (bool, string) {
	now := s.cfg.Now()
	s.mu.Lock()
	last, started := s.lastBeat, s.started
	s.mu.Unlock()
	if last.IsZero() {
		since := now.Sub(started)
		if since <= s.cfg.StartGrace {
			return true, fmt.Sprintf("starting: no heartbeat yet, %s since start (grace %s)", round(since), s.cfg.StartGrace)
		}
		return false, fmt.Sprintf("no heartbeat from the reconcile loop in %s since start (grace %s)", round(since), s.cfg.StartGrace)
	}
	age := now.Sub(last)
	if age <= s.cfg.Stale {
		return true, fmt.Sprintf("ok: last heartbeat %s ago", round(age))
	}
	return false, fmt.Sprintf("reconcile loop stalled: last heartbeat %s ago (bound %s)", round(age), s.cfg.Stale)
}

// Readiness is the /readyz answer; its lists are bounded by
// Config.MaxListed and the totals say how many there are.
type Readiness struct {
	Ready bool `json:"ready"`
	// Reason says why not ready; empty when ready.
	Reason string `json:"reason,omitempty"`
	// Blocked is the daemon-level reason, if any.
	Blocked string `json:"blocked,omitempty"`
	// Converged: the startup pass has converged (latched).
	Converged    bool                 `json:"startupConverged"`
	Records      map[ledger.Phase]int `json:"records,omitempty"`
	Pending      []PodNote            `json:"pending"`
	PendingTotal int                  `json:"pendingTotal"`
	Failed       []PodNote            `json:"failed"`
	FailedTotal  int                  `json:"failedTotal"`
}

// Readiness answers /readyz (invariant I5).
func (s *Status) Readiness() Readiness {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.cfg.MaxListed
	r := Readiness{
		Ready:        s.ready(),
		Reason:       s.notReadyReason(),
		Blocked:      s.blockedReason(),
		Converged:    s.converged,
		Records:      maps.Clone(s.records),
		Pending:      listed(s.last.Pending, n),
		PendingTotal: len(s.last.Pending),
		Failed:       listed(s.last.Failed, n),
		FailedTotal:  len(s.last.Failed),
	}
	return r
}

// notReadyReason says in one line why /readyz is 503; the caller holds mu.
func (s *Status) notReadyReason() string {
	switch {
	case s.blockedReason() != "":
		return s.blockedReason()
	case s.converged:
		return ""
	case s.passes == 0:
		return "the startup pass has not finished"
	case s.last.Err != nil:
		return "the last pass ended early: " + s.last.Err.Error()
	}
	return fmt.Sprintf("the startup pass has not converged: %d %s pending", len(s.last.Pending), plural(len(s.last.Pending), "pod", "pods"))
}

// Snapshot is the status view for `caa status`.
type Snapshot struct {
	Ready       bool      `json:"ready"`
	Reason      string    `json:"reason,omitempty"`
	Blocked     string    `json:"blocked,omitempty"`
	StartedAt   time.Time `json:"startedAt"`
	LastBeat    time.Time `json:"lastBeat,omitzero"`
	ReadyAt     time.Time `json:"readyAt,omitzero"`
	TimeToReady Duration  `json:"timeToReady,omitempty"`
	Passes      int       `json:"passes"`
	// LastPass is nil before the first pass.
	LastPass *PassSummary `json:"lastPass,omitempty"`
	// Records is nil until a pass reports them.
	Records map[ledger.Phase]int `json:"records,omitempty"`
	// Pending and Failed are complete (not bounded like /readyz).
	Pending []PodNote `json:"pending"`
	Failed  []PodNote `json:"failed"`
	// NotWatched are records kept for pods of a runtime class caa does
	// not watch; Orphans the orphan VMs waiting out their grace.
	NotWatched []PodNote `json:"notWatched,omitempty"`
	Orphans    []Orphan  `json:"orphans,omitempty"`
	// Degraded are pods whose VM runs degraded (kept, never replaced).
	Degraded []PodNote `json:"degraded,omitempty"`
	// Silent are sandboxes whose agent stayed silent past the readiness
	// bound (reported, not holding readiness).
	Silent []PodNote `json:"silent,omitempty"`
	// Handover is the last ledger hand-over this caa took part in.
	Handover *Handover `json:"handover,omitempty"`
	// Confidential is the node's --confidential setting: "on", or
	// "off (--confidential=false)".
	Confidential string `json:"confidential,omitempty"`
	// VMs are the recorded VMs with their confidential type.
	VMs []VMNote `json:"vms,omitempty"`
	// AdaptorVMs is the last scan of the VMs the adaptor left; nil when
	// none was made (--adaptor-vms=off, or before the first).
	AdaptorVMs *AdaptorVMs `json:"adaptorVMs,omitempty"`
}

// PassSummary is a pass as the status view shows it.
type PassSummary struct {
	At             time.Time      `json:"at"`
	Duration       Duration       `json:"duration"`
	Error          string         `json:"error,omitempty"`
	Actions        map[string]int `json:"actions"`
	CloudWrites    int            `json:"cloudWrites"`
	OrphansDeleted int            `json:"orphansDeleted"`
}

// Snapshot returns a copy of everything the Status knows.
func (s *Status) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := Snapshot{
		Ready:      s.ready(),
		Reason:     s.notReadyReason(),
		Blocked:    s.blockedReason(),
		StartedAt:  s.started,
		LastBeat:   s.lastBeat,
		ReadyAt:    s.readyAt,
		Passes:     s.passes,
		Records:    maps.Clone(s.records),
		Pending:    listed(s.last.Pending, len(s.last.Pending)),
		Failed:     listed(s.last.Failed, len(s.last.Failed)),
		NotWatched: listed(s.last.NotWatched, len(s.last.NotWatched)),
		Orphans:    slices.Clone(s.last.Orphans),
		Degraded:   listed(s.last.Degraded, len(s.last.Degraded)),
		Silent:     listed(s.last.Silent, len(s.last.Silent)),
		VMs:        slices.Clone(s.vms),

		Confidential: s.cfg.Confidential,
	}
	if s.handover != nil {
		h := *s.handover
		snap.Handover = &h
	}
	if s.adaptor != nil {
		a := *s.adaptor
		a.VMs, a.Problems = slices.Clone(a.VMs), slices.Clone(a.Problems)
		snap.AdaptorVMs = &a
	}
	if !s.readyAt.IsZero() {
		snap.TimeToReady = Duration(s.readyAt.Sub(s.started))
	}
	if s.passes > 0 {
		p := s.last
		snap.LastPass = &PassSummary{
			At: p.At, Duration: Duration(p.Duration), Actions: map[string]int{},
			CloudWrites: p.CloudWrites, OrphansDeleted: p.OrphansDeleted,
		}
		maps.Copy(snap.LastPass.Actions, p.Actions)
		if p.Err != nil {
			snap.LastPass.Error = p.Err.Error()
		}
	}
	return snap
}

// Duration is a time.Duration that reads as "1m30s" in JSON, for people
// and for `caa status` alike.
type Duration time.Duration

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads what MarshalJSON wrote.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// listed copies the first n notes; never nil, so JSON shows [] not null.
func listed(notes []PodNote, n int) []PodNote {
	return append([]PodNote{}, notes[:min(n, len(notes))]...)
}

// sortedNotes copies notes in pod order, so bodies are stable
// from one probe to the next and truncation keeps the same pods.
func sortedNotes(notes []PodNote) []PodNote {
	out := slices.Clone(notes)
	slices.SortFunc(out, func(a, b PodNote) int { return strings.Compare(a.Pod, b.Pod) })
	return out
}

// round keeps messages readable: whole seconds, or milliseconds below one.
func round(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
