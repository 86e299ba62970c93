package holder

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTransitions walks every move a caa makes, named by the situation that
// causes it. A stopped (SIGSTOP) peer shows only as silence or a held lock.
func TestTransitions(t *testing.T) {
	for _, tc := range []struct {
		name string
		from State
		ev   Event
		want Step
	}{
		{"the holder hands over", Acquiring, Granted, Step{To: TakingOver}},
		{"the holder is busy or cooling this pod down", Acquiring, Refused, Step{To: Acquiring}},
		{"the holder is SIGSTOPped before the release: the ask times out, the lock decides", Acquiring, AskTimeout, Step{To: Acquiring}},
		{"nobody on the socket", Acquiring, NoHolder, Step{To: Acquiring}},
		{"a SIGSTOPped holder keeps the lock: wait, never break it", Acquiring, LockHeld, Step{To: Acquiring}},
		{"the lock is free: hold and serve", Acquiring, LockFree, Step{To: Holding, Serve: true}},

		{"converged and said ready: wait for retired", TakingOver, Converged, Step{To: TakingOver}},
		{"the old caa retired: serve the socket", TakingOver, Retired, Step{To: Holding, Serve: true}},
		{"the old caa is SIGSTOPped after the release: reconcile, leave its socket alone", TakingOver, HolderSilent, Step{To: TakingOver}},
		{"the old caa ended (killed while frozen): serve", TakingOver, HolderGone, Step{To: Holding, Serve: true}},
		{"the old caa took the ledger back", TakingOver, Aborted, Step{To: Inert}},

		{"a live asker passed the gate", Holding, Request, Step{To: Releasing}},
		{"a request queued while this caa was SIGSTOPped, its asker gone: nothing stops", Holding, AskerGone, Step{To: Holding}},
		{"released", Releasing, Released, Step{To: AwaitingReady}},
		{"the asker hung up before the release: reclaim, no cooldown", Releasing, ReleaseFailed, Step{To: Reclaiming}},

		{"the successor is ready", AwaitingReady, SuccessorReady, Step{To: Inert}},
		{"the successor crashed", AwaitingReady, SuccessorGone, Step{To: Reclaiming, Cooldown: true}},
		{"the successor is SIGSTOPped after taking the ledger: abort, reclaim, cool down", AwaitingReady, ReadyTimeout,
			Step{To: Reclaiming, Cooldown: true, Abort: true}},

		{"the SIGSTOPped successor still holds the lock: wait live, not ready", Reclaiming, LockHeld, Step{To: Reclaiming}},
		{"its process ended: the lock is free, hold again", Reclaiming, LockFree, Step{To: Holding, Serve: true}},

		{"SIGTERM while holding", Holding, Sigterm, Step{To: Stopped}},
		{"SIGTERM while reclaiming", Reclaiming, Sigterm, Step{To: Stopped}},
		{"SIGTERM while inert", Inert, Sigterm, Step{To: Stopped}},
		{"inert, and the caa it went to is gone: take it back through the lock", Inert, LockAbandoned, Step{To: Reclaiming}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Next(tc.from, tc.ev)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestOnlyHoldingStatesWrite: every move that lands in a writing state
// comes from a lock that was free or a ledger handed over, never from a
// timeout alone.
func TestOnlyHoldingStatesWrite(t *testing.T) {
	for s := Acquiring; s <= Stopped; s++ {
		for e := Granted; e <= Sigterm; e++ {
			st, err := Next(s, e)
			if err != nil {
				assert.Equal(t, s, st.To, "an impossible event leaves the state alone")
				continue
			}
			if st.To.Writes() && !s.Writes() {
				assert.Contains(t, []Event{Granted, LockFree}, e, "%s --%s--> %s", s, e, st.To)
			}
			if e == ReadyTimeout || e == AskTimeout || e == HolderSilent {
				assert.NotEqual(t, Holding, st.To, "%s --%s--> %s: a timeout never takes a ledger", s, e, st.To)
			}
		}
	}
}

func TestImpossibleEventsAreErrors(t *testing.T) {
	for _, tc := range []struct {
		from State
		ev   Event
	}{
		{Inert, Request}, {Holding, LockAbandoned}, {Holding, Granted}, {Reclaiming, SuccessorReady}, {Stopped, LockFree}, {AwaitingReady, Request},
	} {
		st, err := Next(tc.from, tc.ev)
		assert.Error(t, err, "%s in %s", tc.ev, tc.from)
		assert.Equal(t, tc.from, st.To)
	}
}
