// Package health tells the kubelet and the operator how caa is doing:
// /healthz (is the reconcile loop alive), /readyz (has the startup pass
// converged, invariant I5), /metrics (Prometheus) and a status snapshot.
//
// The reconciler writes, the endpoints read. The reconciler calls
// [Status.Beat] from its loop (and from inside long passes, so a slow
// startup pass under throttling is not mistaken for a hung loop),
// [Status.PassDone] after every full pass over the desired set (with
// [Pass.Blocked] set when the pass hit something no pod can get past, such
// as rejected credentials), and [Status.SetBlocked] for reasons found
// outside a pass: the daemon sets it while it waits for the Kubernetes API
// or the ledger's lock at start, and clears it once its loop runs. Cloud calls are counted by
// [Metrics.ObserveCloudCall], or by wrapping the provider with
// [InstrumentProvider]. This package never imports pkg/reconcile: it sees
// passes only through [Pass], so it stays below the reconciler.
//
// # Readiness
//
// /readyz answers 200 once a pass has converged: it ended without error and
// reported no pending pod, so every desired pod has a Running VM recorded or
// a terminal per-pod failure. Failed pods are listed but never block: a bad
// spec is the pod's to fix, and holding the node unready for it would stall
// a rolling update of caa across the cluster.
//
// Convergence latches. After the startup pass, later passes that report
// pending pods (new pods whose VMs are being created) keep /readyz at 200:
// readiness says "this caa has taken over the node", and a pod scheduled
// later must not flap the daemon's readiness and, through it, the
// DaemonSet rollout. A daemon-level blocking reason is different: it means
// no pod can make progress, so it turns /readyz to 503 at any time, and
// clearing it restores 200 without another startup pass. A reason from a
// pass lasts until the next pass; one from SetBlocked until its caller
// clears it.
//
// # Liveness
//
// /healthz answers 200 while the last heartbeat is younger than
// [Config.Stale]. Before the first heartbeat it answers 200 only within
// [Config.StartGrace] of the Status being made, so a daemon wedged before
// its loop ever ran is restarted too.
//
// # Metrics
//
// Every metric is registered on the caller's registry (there is no global
// state) and named caa_*. Labels take only small, fixed sets of values
// (phase, action kind, cloud operation and result); pod names never become
// labels, and a label that sees more distinct values than expected folds
// the rest into "other" so a caller's mistake cannot grow the series count
// without bound.
package health
