// Package relayd is the agent relay daemon, `caa relay`: a small process
// that owns the sandboxes' agent sockets and the kata shims' connections to
// them, so that caa itself can be upgraded, restarted or killed while the
// shims' connections (and their health checks and long calls) carry on.
//
// caa tells it what to serve over a control socket (a unix socket, mode
// 0600, beside the ledger): Serve a sandbox's agent socket relayed to its
// VM's forwarder, Stop it, List what is served, and wait until a sandbox's
// forwarder is reachable. The protocol is one JSON request and one JSON
// answer per connection (see Request and Response); a client that hangs up
// cancels its request.
//
// The daemon's state is in memory only: caa's ledger is the record of what
// should be served, and caa registers every live sandbox again when it
// starts and whenever it sees the daemon restarted (a new Boot in List).
// A restart of the daemon itself closes the shims' connections of that
// moment (the sockets come back once caa registers them again): upgrade it
// rarely, node by node (its DaemonSet uses updateStrategy OnDelete).
//
// TLS: the daemon never holds the agent CA's key. It reads caa's client
// certificates and the CA certificates from ClientFile in the agent CA's
// directory, which caa writes at start, and reads it again when it changes.
//
// Run is `caa relay` itself (run.go): its settings (Options, AddFlags) and
// the wait for caa's client file before the control socket is served.
package relayd
