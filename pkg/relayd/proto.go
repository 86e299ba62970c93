package relayd

import "time"

// Operations of the control protocol.
const (
	OpServe = "serve"
	OpStop  = "stop"
	OpList  = "list"
	OpReach = "reach"
)

// Request is one control call.
type Request struct {
	Op string `json:"op"`
	// Sandbox is the sandbox id (Serve, Stop, Reach).
	Sandbox string `json:"sandbox,omitempty"`
	// Socket, Addr and ServerName are what Serve serves: the agent socket
	// path, the forwarder (VM_IP:15150) and the name the VM's certificate
	// was issued for.
	Socket     string `json:"socket,omitempty"`
	Addr       string `json:"addr,omitempty"`
	ServerName string `json:"serverName,omitempty"`
	// Wait bounds a Reach (default 30 s).
	Wait time.Duration `json:"wait,omitempty"`
}

// Entry is one served sandbox.
type Entry struct {
	Sandbox    string `json:"sandbox"`
	Socket     string `json:"socket"`
	Addr       string `json:"addr"`
	ServerName string `json:"serverName,omitempty"`
	// Open counts the shim connections relayed now.
	Open int `json:"open"`
	// HeardAgo is how long ago the VM last sent bytes on one of those open
	// connections (kata's health check answers every 5 s), on the daemon's
	// monotonic clock; 0 means no such evidence (no open connection, or
	// nothing came back yet). Nanoseconds in JSON.
	HeardAgo time.Duration `json:"heardAgo,omitempty"`
}

// Response answers a Request. Error is empty on success.
type Response struct {
	Error string `json:"error,omitempty"`
	// Boot identifies this run of the daemon: a new value means it
	// restarted and lost what it served.
	Boot string `json:"boot"`
	// Kept is true when a Serve found the same sandbox served with the
	// same arguments and kept its listener and connections.
	Kept bool `json:"kept,omitempty"`
	// HeardAgo is, for a kept Serve, the relay's Entry.HeardAgo at that
	// moment: a restarted caa takes recent VM traffic as proof of reach
	// instead of probing (0: no evidence, probe).
	HeardAgo time.Duration `json:"heardAgo,omitempty"`
	Entries  []Entry       `json:"entries,omitempty"`
}
