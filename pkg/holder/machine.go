package holder

import "fmt"

// State is where a caa stands with respect to the node's ledger.
type State int

const (
	Acquiring     State = iota // asking the holder, or waiting for the file lock
	TakingOver                 // the ledger was handed to this caa; reconciling until the old caa retires
	Holding                    // the ledger is this caa's; reconciling, serving the hand-over socket
	Releasing                  // a request was admitted: stopping work, closing the ledger
	AwaitingReady              // the ledger is the successor's; waiting for it to turn ready
	Reclaiming                 // taking the ledger back: waiting for the file lock, live and not ready
	Inert                      // handed over: no write anywhere until SIGTERM, or until the ledger's lock is abandoned
	Stopped                    // SIGTERM: the process exits
)

func (s State) String() string {
	return [...]string{"acquiring", "taking over", "holding", "releasing", "awaiting ready", "reclaiming", "inert", "stopped"}[s]
}

// Writes reports whether a caa in s may write the ledger or the cloud.
func (s State) Writes() bool { return s == Holding || s == TakingOver }

// Event is what a caa learns: from the socket, the file lock, its own
// loop or a signal. A peer's SIGSTOP is never seen as such; it shows as
// silence (AskTimeout, ReadyTimeout, HolderSilent) or a lock that stays
// held (LockHeld).
type Event int

const (
	Granted        Event = iota // the holder answered "released"
	Refused                     // the holder answered "refused" (busy, cooling down, not a peer)
	AskTimeout                  // the holder accepted the connection but never answered (frozen)
	NoHolder                    // nobody answers on the socket
	LockFree                    // the ledger opened
	LockHeld                    // the file lock is held by another process
	Request                     // a request passed the gate, and its asker is still connected
	AskerGone                   // a request passed the gate, but its asker already hung up
	Released                    // "released" went out to the successor
	ReleaseFailed               // "released" could not be sent: the successor hung up meanwhile
	SuccessorReady              // the successor said "ready"
	SuccessorGone               // the successor's connection dropped before "ready"
	ReadyTimeout                // no "ready" within --handover-ready-timeout (an abort follows)
	Converged                   // as the new caa: the startup pass converged and "ready" went out
	Retired                     // the old caa answered "retired"
	HolderSilent                // the old caa did not answer "ready" (frozen after the release)
	HolderGone                  // the old caa's connection dropped (it exited or was killed)
	Aborted                     // the old caa took the ledger back
	LockAbandoned               // inert: the ledger's lock stayed free across two looks (its holder's process ended)
	Sigterm                     // SIGTERM
)

func (e Event) String() string {
	return [...]string{"granted", "refused", "ask timeout", "no holder", "lock free", "lock held", "request", "asker gone",
		"released", "release failed", "successor ready", "successor gone", "ready timeout", "converged", "retired",
		"holder silent", "holder gone", "aborted", "lock abandoned", "sigterm"}[e]
}

// Step is what a caa does on an event: the state it goes to and the
// effects that come with the move.
type Step struct {
	To State
	// Cooldown: refuse the successor's pod for the failed-hand-over
	// cooldown (its own failure, not a vanished asker's).
	Cooldown bool
	// Abort: tell the successor to give the ledger back before reclaiming.
	Abort bool
	// Serve: bind the hand-over socket (this caa answers the next update).
	Serve bool
}

// Next is the transition table. An event that cannot happen in s is an
// error; the caller logs it and stays where it is.
func Next(s State, e Event) (Step, error) {
	if e == Sigterm {
		return Step{To: Stopped}, nil
	}
	switch s {
	case Acquiring:
		switch e {
		case Granted:
			return Step{To: TakingOver}, nil
		case Refused, AskTimeout, LockHeld:
			return Step{To: Acquiring}, nil
		case NoHolder:
			return Step{To: Acquiring}, nil // the file lock decides next
		case LockFree:
			return Step{To: Holding, Serve: true}, nil
		}
	case TakingOver:
		switch e {
		case Converged, HolderSilent:
			// A silent old caa (frozen after its release) gets no
			// socket taken from under it: this caa reconciles and waits
			// for it to retire or go.
			return Step{To: TakingOver}, nil
		case Retired, HolderGone:
			return Step{To: Holding, Serve: true}, nil
		case Aborted:
			return Step{To: Inert}, nil
		}
	case Holding:
		switch e {
		case Request:
			return Step{To: Releasing}, nil
		case AskerGone:
			return Step{To: Holding}, nil
		}
	case Releasing:
		switch e {
		case Released:
			return Step{To: AwaitingReady}, nil
		case ReleaseFailed:
			return Step{To: Reclaiming}, nil
		}
	case AwaitingReady:
		switch e {
		case SuccessorReady:
			return Step{To: Inert}, nil
		case SuccessorGone:
			return Step{To: Reclaiming, Cooldown: true}, nil
		case ReadyTimeout:
			return Step{To: Reclaiming, Cooldown: true, Abort: true}, nil
		}
	case Reclaiming:
		switch e {
		case LockFree:
			return Step{To: Holding, Serve: true}, nil
		case LockHeld:
			return Step{To: Reclaiming}, nil
		}
	case Inert:
		if e == LockAbandoned {
			// Nobody holds the ledger any more (the caa it went to
			// ended): take it back through the lock like a reclaim; the
			// lock, not this event, decides who holds it.
			return Step{To: Reclaiming}, nil
		}
	case Stopped:
	}
	return Step{To: s}, fmt.Errorf("hand-over: %s cannot happen while %s", e, s)
}
