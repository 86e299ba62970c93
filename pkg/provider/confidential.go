package provider

import (
	"fmt"
	"slices"
	"strings"
)

// TEE names the hardware trusted execution environment a confidential VM
// runs in. The empty TEE is an ordinary VM: what --confidential=false asks
// for, and what a VM the cloud does not report as confidential is.
type TEE string

// The TEEs caa asks the clouds for.
const (
	TEENone   TEE = ""
	TEESEVSNP TEE = "sev-snp" // AMD SEV-SNP: EC2 m6a/c6a/r6a, Azure DCasv5/ECasv5
	TEETDX    TEE = "tdx"     // Intel TDX: Azure DCesv5/ECesv5, IBM Cloud *x3dc profiles
	// TEESGX is what IBM Cloud reports for an instance made with
	// confidential_compute_mode "sgx". It is not a confidential VM: SGX
	// guards enclaves inside applications built for them, not the VM, and
	// the pod VM image runs nothing in one. caa never asks for it (ParseTEE
	// refuses it) and never serves a confidential pod from it.
	TEESGX TEE = "sgx"
)

// AnnotationTEE is the pod annotation that names the TEE a pod's VM is to
// be; the instance type must offer it. Without it a pod gets the type's
// first TEE. Every type caa knows offers one TEE at most, so the
// annotation only confirms the type's own.
const AnnotationTEE = "caa.dev/tee"

// SGXNotConfidential is why caa refuses to make an SGX instance, for the
// refusals that meet one.
const SGXNotConfidential = "Intel SGX protects enclaves inside applications built for them, not the VM, " +
	"and the pod VM image runs nothing in an enclave, so an SGX instance is not a confidential VM"

// String names the TEE for people: "none" for an ordinary VM.
func (t TEE) String() string {
	if t == TEENone {
		return "none"
	}
	return string(t)
}

// Long names the TEE's hardware for error text: "AMD SEV-SNP".
func (t TEE) Long() string {
	switch t {
	case TEESEVSNP:
		return "AMD SEV-SNP"
	case TEETDX:
		return "Intel TDX"
	case TEESGX:
		return "Intel SGX"
	case TEENone:
		return "no TEE"
	}
	return string(t)
}

// Mode names the node's confidential setting for log lines and /status
// entries that report a VM: the TEE, or, for an ordinary VM, the flag
// that opted out of confidential ones.
func Mode(confidential bool, t TEE) string {
	if t.Confidential() {
		return t.String()
	}
	if !confidential {
		return "off (--confidential=false)"
	}
	return "none"
}

// Capable reports whether the instance type can run a confidential VM.
func (c SpecConfig) Capable(instanceType string) bool {
	return c.TEEs != nil && len(c.TEEs(instanceType)) > 0
}

// Confidential reports whether the TEE makes a confidential VM: SEV-SNP
// and TDX. SGX does not (see TEESGX), nor an unknown name.
func (t TEE) Confidential() bool { return t == TEESEVSNP || t == TEETDX }

// ConfidentialCapable is implemented by a provider that can make
// confidential VMs. TEEs returns the TEEs the cloud offers on an instance
// type, the default first; none means the type cannot be confidential. It
// reads a table compiled into caa (no cloud call), so sizing can filter
// its candidates with it.
type ConfidentialCapable interface {
	TEEs(instanceType string) []TEE
}

// ChooseTEE picks the TEE for a VM of instanceType: none when confidential
// is off; else want when the type offers it, or the type's default when
// want is empty. A type that cannot be confidential, or a want it does not
// offer, is ErrInvalidSpec naming the type, what it offers and the fix.
func ChooseTEE(p ConfidentialCapable, confidential bool, instanceType string, want TEE) (TEE, error) {
	if !confidential {
		if want.Confidential() {
			return TEENone, fmt.Errorf("%w: annotation %s=%q asks for a confidential VM, but this node runs with --confidential=false",
				ErrInvalidSpec, AnnotationTEE, want)
		}
		return TEENone, nil
	}
	var offered []TEE
	if p != nil {
		offered = p.TEEs(instanceType)
	}
	if len(offered) == 0 {
		return TEENone, fmt.Errorf("%w: instance type %q cannot run a confidential VM; choose a confidential-capable type "+
			"(--instance-type or annotation %s) or run caa with --confidential=false to allow ordinary VMs",
			ErrInvalidSpec, instanceType, AnnotationMachineType)
	}
	if want == TEENone {
		return offered[0], nil
	}
	if !slices.Contains(offered, want) {
		names := make([]string, len(offered))
		for i, t := range offered {
			names[i] = string(t)
		}
		return TEENone, fmt.Errorf("%w: annotation %s=%q: instance type %q offers %s", ErrInvalidSpec, AnnotationTEE, want,
			instanceType, strings.Join(names, ", "))
	}
	return want, nil
}

// ParseTEE reads a TEE name as a pod annotation or flag gives it. "sgx" is
// refused with the reason (SGXNotConfidential) and the fix.
func ParseTEE(s string) (TEE, error) {
	switch t := TEE(strings.ToLower(strings.TrimSpace(s))); t {
	case TEESEVSNP, TEETDX:
		return t, nil
	case TEESGX:
		return TEENone, fmt.Errorf("%w: TEE %q: %s; remove the annotation (IBM Cloud's bx3dc, cx3dc and mx3dc profiles then run Intel TDX) or set it to tdx",
			ErrInvalidSpec, s, SGXNotConfidential)
	case "", "none":
		return TEENone, nil
	}
	return TEENone, fmt.Errorf("%w: TEE %q: want sev-snp or tdx", ErrInvalidSpec, s)
}

// Downgraded reports why a VM cannot serve a pod that asked for TEE want:
// the cloud reports it as another TEE or none. Empty when it can. A VM
// asked to be ordinary may be anything: nothing is lost.
func (v VM) Downgraded(want TEE) string {
	if !want.Confidential() || v.TEE == want {
		return ""
	}
	return fmt.Sprintf("VM %s was asked to be confidential (%s) but the cloud reports it as %s: not confidential as asked", v.ID, want, v.TEE)
}

// tableTEEs adapts SpecConfig.TEEs to ChooseTEE.
type tableTEEs func(string) []TEE

func (f tableTEEs) TEEs(t string) []TEE {
	if f == nil {
		return nil
	}
	return f(t)
}

// SelectTEE is the TEE the VM of a pod is to be, on the instance type
// Select chose: the pod's AnnotationTEE when the type offers it, else the
// type's default; none when confidential is off. A type or TEE the node
// cannot give is ErrInvalidSpec naming the fix.
func (c SpecConfig) SelectTEE(annotations map[string]string, instanceType string) (TEE, error) {
	want, err := ParseTEE(annotations[AnnotationTEE])
	if err != nil {
		return TEENone, fmt.Errorf("annotation %s: %w", AnnotationTEE, err)
	}
	return ChooseTEE(tableTEEs(c.TEEs), c.Confidential, instanceType, want)
}
