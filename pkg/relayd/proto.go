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
}

// Response answers a Request. Error is empty on success.
type Response struct {
	Error string `json:"error,omitempty"`
	// Boot identifies this run of the daemon: a new value means it
	// restarted and lost what it served.
	Boot string `json:"boot"`
	// Kept is true when a Serve found the same sandbox served with the
	// same arguments and kept its listener and connections.
	Kept    bool    `json:"kept,omitempty"`
	Entries []Entry `json:"entries,omitempty"`
}
