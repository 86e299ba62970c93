package health

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
)

func TestLive(t *testing.T) {
	const stale, grace = 3 * time.Minute, time.Minute
	tests := []struct {
		name      string
		sinceBeat time.Duration // 0: no beat at all
		sinceMade time.Duration
		wantOK    bool
		wantMsg   string
	}{
		{name: "before the first beat, within the grace", sinceMade: 59 * time.Second, wantOK: true, wantMsg: "starting: no heartbeat yet, 59s since start (grace 1m0s)"},
		{name: "before the first beat, at the grace", sinceMade: grace, wantOK: true, wantMsg: "starting"},
		{name: "before the first beat, past the grace", sinceMade: grace + time.Second, wantOK: false, wantMsg: "no heartbeat from the reconcile loop in 1m1s since start (grace 1m0s)"},
		{name: "fresh beat", sinceMade: time.Hour, sinceBeat: 10 * time.Second, wantOK: true, wantMsg: "ok: last heartbeat 10s ago"},
		{name: "beat at the bound", sinceMade: time.Hour, sinceBeat: stale, wantOK: true, wantMsg: "ok: last heartbeat 3m0s ago"},
		{name: "stale beat", sinceMade: time.Hour, sinceBeat: stale + 30*time.Second, wantOK: false, wantMsg: "reconcile loop stalled: last heartbeat 3m30s ago (bound 3m0s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newClock()
			s := NewStatus(Config{Stale: stale, StartGrace: grace, Now: clock.Now})
			now := clock.Add(tt.sinceMade)
			if tt.sinceBeat > 0 {
				s.Beat(now.Add(-tt.sinceBeat))
			}
			ok, msg := s.Live()
			assert.Equal(t, tt.wantOK, ok)
			assert.Contains(t, msg, tt.wantMsg)
		})
	}
}

func TestBeatKeepsTheLatestAndPassesBeat(t *testing.T) {
	clock := newClock()
	s := NewStatus(Config{Stale: time.Minute, Now: clock.Now})
	t0 := clock.Now()
	s.Beat(t0.Add(50 * time.Second))
	s.Beat(t0) // late and out of order: must not move the beat back
	clock.Add(100 * time.Second)
	ok, _ := s.Live()
	assert.True(t, ok, "the later beat counts")

	clock.Add(time.Minute)
	ok, _ = s.Live()
	require.False(t, ok)
	// A pass that ends now is a heartbeat too.
	s.PassDone(Pass{At: clock.Now().Add(-2 * time.Second), Duration: 2 * time.Second})
	ok, msg := s.Live()
	assert.True(t, ok, msg)
	assert.Equal(t, clock.Now(), s.Snapshot().LastBeat)
}

func TestDefaults(t *testing.T) {
	s := NewStatus(Config{})
	assert.Equal(t, DefaultStale, s.cfg.Stale)
	assert.Equal(t, DefaultStale, s.cfg.StartGrace, "the grace defaults to the staleness bound")
	assert.Equal(t, DefaultMaxListed, s.cfg.MaxListed)
	ok, _ := s.Live()
	assert.True(t, ok, "a Status just made is within its grace")
	assert.False(t, s.Readiness().Ready)
}

func TestPassResultAndConverged(t *testing.T) {
	tests := []struct {
		name   string
		pass   Pass
		want   string
		wantOK bool
	}{
		{"nothing pending", Pass{}, ResultConverged, true},
		{"failed pods do not count", Pass{Failed: notes(2)}, ResultConverged, true},
		{"pending", Pass{Pending: notes(1)}, ResultPending, false},
		{"ended early", Pass{Err: errList}, ResultError, false},
		{"ended early with pending", Pass{Err: errList, Pending: notes(3)}, ResultError, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.pass.result())
			assert.Equal(t, tt.wantOK, tt.pass.Converged())
		})
	}
}

func TestSnapshot(t *testing.T) {
	r := newRig(t, Config{})
	snap := r.status.Snapshot()
	assert.False(t, snap.Ready)
	assert.Nil(t, snap.LastPass)
	assert.Equal(t, "the startup pass has not finished", snap.Reason)
	start := r.clock.Now()
	assert.Equal(t, start, snap.StartedAt)

	at := r.clock.Add(30 * time.Second)
	r.status.PassDone(Pass{At: at, Duration: 2 * time.Second, Pending: []PodNote{note("ns/b", "Creating", "creating VM")},
		Failed: []PodNote{note("ns/z", "InvalidSpec", "unknown instance type")}, Actions: map[string]int{"Create": 1, "Fail": 1}, CloudWrites: 1,
		Records: map[ledger.Phase]int{ledger.PhaseCreating: 1, ledger.PhaseFailed: 1}})
	snap = r.status.Snapshot()
	assert.False(t, snap.Ready)
	assert.Equal(t, "the startup pass has not converged: 1 pod pending", snap.Reason)
	require.NotNil(t, snap.LastPass)
	assert.Equal(t, PassSummary{At: at, Duration: Duration(2 * time.Second), Actions: map[string]int{"Create": 1, "Fail": 1}, CloudWrites: 1}, *snap.LastPass)

	r.clock.Add(time.Minute)
	r.status.PassDone(converged(r.clock.Now(), 2))
	readyAt := r.clock.Now()
	r.clock.Add(time.Hour)
	r.status.PassDone(converged(r.clock.Now(), 2))
	snap = r.status.Snapshot()
	assert.True(t, snap.Ready)
	assert.Empty(t, snap.Reason)
	assert.Equal(t, 3, snap.Passes)
	assert.Equal(t, readyAt, snap.ReadyAt, "readiness is stamped once")
	assert.Equal(t, Duration(90*time.Second), snap.TimeToReady)
	assert.Equal(t, map[ledger.Phase]int{ledger.PhaseRunning: 2}, snap.Records)

	// The JSON is what `caa status` will read: durations as text, and it
	// reads back to the same value.
	b, err := json.Marshal(snap)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"timeToReady":"1m30s"`)
	assert.Contains(t, string(b), `"lastPass":{"at":"2026-03-01T13:01:30Z","duration":"1s","actions":{"None":2},"cloudWrites":0,"orphansDeleted":0}`)
	var back Snapshot
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, snap.TimeToReady, back.TimeToReady)
	assert.Equal(t, snap.LastPass.Duration, back.LastPass.Duration)
	assert.Error(t, json.Unmarshal([]byte(`{"timeToReady":"soon"}`), &back))
}

func TestPassDoneCopiesItsInput(t *testing.T) {
	s := NewStatus(Config{Now: newClock().Now})
	pending := []PodNote{note("ns/b", "Creating", ""), note("ns/a", "Creating", "")}
	actions := map[string]int{"Create": 2}
	s.PassDone(Pass{Pending: pending, Actions: actions})
	pending[0].Pod, actions["Create"] = "changed", 99

	snap := s.Snapshot()
	assert.Equal(t, []string{"ns/a", "ns/b"}, []string{snap.Pending[0].Pod, snap.Pending[1].Pod}, "sorted, and not the caller's slice")
	assert.Equal(t, 2, snap.LastPass.Actions["Create"])
	snap.Pending[0].Pod = "mine"
	assert.Equal(t, "ns/a", s.Snapshot().Pending[0].Pod, "a snapshot is a copy")
}

func TestPodNoteString(t *testing.T) {
	assert.Equal(t, "ns/a: Creating: creating VM", note("ns/a", "Creating", "creating VM").String())
	assert.Equal(t, "ns/a: NoRecord", note("ns/a", "NoRecord", "").String())
}

// TestSnapshotListsEachVMsConfidentialType: the VMs of the last pass that
// reported them, and the node's setting.
func TestSnapshotListsEachVMsConfidentialType(t *testing.T) {
	s := NewStatus(Config{Confidential: "on"})
	vms := []VMNote{{Pod: "a/x", ID: "i-1", Confidential: "sev-snp"}}
	s.PassDone(Pass{VMs: vms})
	snap := s.Snapshot()
	assert.Equal(t, "on", snap.Confidential)
	assert.Equal(t, vms, snap.VMs)
	s.PassDone(Pass{}) // a pass that did not read the records keeps the list
	assert.Equal(t, vms, s.Snapshot().VMs)
	s.PassDone(Pass{VMs: []VMNote{}})
	assert.Empty(t, s.Snapshot().VMs)
}
