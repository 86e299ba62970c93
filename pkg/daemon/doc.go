// Package daemon is `caa run` put together: it checks the node daemon's
// settings (Options, AddFlags), then builds and runs the daemon from the
// other packages (Run): the health endpoints, the pod cache, the cloud's
// provider and its preflight, the ledger taken from a free lock or by a
// hand-over from the caa before it, and for as long as it holds the
// ledger, the reconciler or kata's remote hypervisor service.
//
// The hand-over's decisions are package holder's; this package carries
// them out (holder.go: acquire, hold, release and take back;
// holder_socket.go: who may ask). Rebuild is `caa ledger rebuild`, which
// takes the same settings.
package daemon
