// Package adaptorvm finds the pod VMs that upstream's cloud-api-adaptor
// made on this node before caa replaced it, and decides, VM by VM, which
// of them no sandbox can use any more: the migration of a node from the
// adaptor to caa (docs/design.md, "Migrating a node from the adaptor").
//
// The adaptor tags its VMs with nothing caa can trust (no cluster, node or
// pod UID), so a VM is tied to this node only by the adaptor's own record
// of the sandbox on this node's disk, and judged dead only by the
// apiserver. Everything here is a decision on plain values (Decide) plus
// the reads that gather them (Scan); deleting is the caller's, and opt-in.
package adaptorvm

import "strings"

// The adaptor's instance names, as its providers build them for AWS,
// Azure and IBM Cloud VPC: "podvm-", the pod's name, "-", the first eight
// characters of the sandbox id, each lowered and with every character
// other than [a-z0-9-] made '-'; the pod's name cut so the whole fits 63.
const (
	// NamePrefix starts every adaptor VM's name.
	NamePrefix = "podvm-"
	// maxName is the longest name the adaptor makes on these clouds.
	maxName = 63
	// sandboxChars is how much of the sandbox id the name keeps.
	sandboxChars = 8
)

// clean lowers s and turns every character outside [a-z0-9-] into '-',
// one '-' per character, as the adaptor does.
func clean(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return b.String()
}

// Name is the name the adaptor gives the VM of pod podName's sandbox
// sandboxID.
func Name(podName, sandboxID string) string {
	pod, sid := clean(podName), clean(sandboxID)
	// "podvm" + two '-' + eight characters of the sandbox leave 48.
	if room := maxName - len("podvm") - 2 - sandboxChars; len(pod) > room {
		pod = pod[:room]
	}
	if len(sid) > sandboxChars {
		sid = sid[:sandboxChars]
	}
	return NamePrefix + pod + "-" + sid
}

// Parse splits an adaptor VM's name into the pod part (perhaps cut) and
// the sandbox id's first eight characters. ok is false for any name the
// adaptor cannot have made.
func Parse(name string) (pod, sandbox string, ok bool) {
	rest, found := strings.CutPrefix(name, NamePrefix)
	if !found || len(name) > maxName || len(rest) < sandboxChars+2 {
		return "", "", false
	}
	cut := len(rest) - sandboxChars
	if rest[cut-1] != '-' {
		return "", "", false
	}
	pod, sandbox = rest[:cut-1], rest[cut:]
	if pod == "" || clean(pod) != pod || clean(sandbox) != sandbox {
		return "", "", false
	}
	return pod, sandbox, true
}
