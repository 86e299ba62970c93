package health

import "time"

// Hand-over roles and outcomes, as /status and the metrics name them.
const (
	RoleTookOver   = "took_over"   // this caa took the ledger from the one beside it
	RoleHandedOver = "handed_over" // this caa gave its ledger to a new one

	HandoverDone       = "done"        // the new caa turned ready; the old one is inert
	HandoverHandedBack = "handed_back" // the new caa failed; the old one resumed
	HandoverAborted    = "aborted"     // this (new) caa gave the ledger back
	HandoverUnderway   = "underway"    // not finished yet (status only)
)

// Handover is the last ledger hand-over this process took part in.
type Handover struct {
	Role string `json:"role"`
	// Peer is the other caa: the one handed over to, or taken over from.
	Peer      string    `json:"peer"`
	Outcome   string    `json:"outcome"`
	Reason    string    `json:"reason,omitempty"`
	StartedAt time.Time `json:"startedAt"`
	// Took runs from the request to the new caa's readiness (or to the
	// handback); Gap from the old caa stopping work to a caa being ready
	// to act again. Both are zero while the hand-over is under way.
	Took Duration `json:"took,omitempty"`
	Gap  Duration `json:"gap,omitempty"`
}

// SetHandover records the hand-over's progress for /status and, once it
// has an outcome, for the metrics.
func (s *Status) SetHandover(h Handover) {
	s.mu.Lock()
	s.handover = &h
	s.mu.Unlock()
	m := s.cfg.Metrics
	if m == nil || h.Outcome == HandoverUnderway {
		return
	}
	m.handovers.WithLabelValues(h.Role, h.Outcome).Inc()
	if h.Took > 0 {
		m.handoverTook.Set(time.Duration(h.Took).Seconds())
	}
	if h.Gap > 0 {
		m.handoverGap.Set(time.Duration(h.Gap).Seconds())
	}
}
