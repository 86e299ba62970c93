package health

import "time"

// AdaptorVMs is the last scan of the VMs upstream's cloud-api-adaptor left
// (pkg/adaptorvm): what caa found, and what it does with each and why.
type AdaptorVMs struct {
	At time.Time `json:"at"`
	// Mode is --adaptor-vms: report (delete nothing) or collect.
	Mode string `json:"mode"`
	// Sandboxes is how many sandbox records of the adaptor this node has.
	Sandboxes int         `json:"sandboxes"`
	VMs       []AdaptorVM `json:"vms"`
	Problems  []string    `json:"problems,omitempty"`
	Error     string      `json:"error,omitempty"`
	// Skipped says why the cloud was not listed, when it was not.
	Skipped string `json:"skipped,omitempty"`
}

// AdaptorVM is one of the adaptor's VMs.
type AdaptorVM struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	State string `json:"state"`
	// Tie is what on this node ties it to a sandbox: tied, untied,
	// mismatch or ambiguous; Sandbox and Pod are that record's.
	Tie     string `json:"tie"`
	Sandbox string `json:"sandbox,omitempty"`
	Pod     string `json:"pod,omitempty"`
	// Action: deleted, would-delete, wait, keep, report, gone or
	// delete-failed.
	Action string `json:"action"`
	Why    string `json:"why"`
}

// SetAdaptorVMs records the last scan of the adaptor's VMs for /status.
func (s *Status) SetAdaptorVMs(a AdaptorVMs) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.adaptor = &a
}
