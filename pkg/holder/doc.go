// Package holder decides what a node's caa does with the node's ledger
// across a surge hand-over: which states it passes through, which
// hand-over requests it admits, what it leaves beside the ledger for a
// caa waiting on the file lock (the lease), and which time limits must
// hold between the daemon's settings and the DaemonSet's probes. The
// effects (opening the ledger, running the reconciler, talking on the
// socket) are cmd/caa's; this package holds the decisions, so they are
// table tests.
//
// A caa's life, as the states of Next:
//
//	Acquiring ──granted──> TakingOver ──retired──> Holding
//	    │                      └──aborted──> Inert
//	    └──lock free──> Holding
//	Holding ──request admitted──> Releasing ──released──> AwaitingReady
//	    │                             └──successor gone──> Holding (no cooldown)
//	    └──SIGTERM──> Stopped
//	AwaitingReady ──ready──> Inert
//	    ├──successor gone──> Reclaiming
//	    └──ready timeout──> Reclaiming (after an abort)
//	Reclaiming ──lock free──> Holding
//	    └──lock held──> Reclaiming (live, not ready, with the lease's reason)
//
// Only Holding and TakingOver write the ledger or the cloud.
package holder
