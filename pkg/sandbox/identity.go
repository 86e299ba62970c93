package sandbox

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// PodIdentity is the pod a CreateVM names, read from the annotations kata's
// shim sends. UID is set only when the runtime sends one.
//
// Both shims send the pod under the keys io.kubernetes.cri.sandbox-name and
// io.kubernetes.cri.sandbox-namespace, whatever the container runtime; the
// value depends on where the shim reads it from (read at kata 7c6ba40c):
//
//   - the Go shim under containerd: containerd's sandbox-name, the pod's
//     name (virtcontainers/sandbox.go, setHypervisorConfigAnnotations);
//   - the Go shim under CRI-O: CRI-O's io.kubernetes.cri-o.SandboxName,
//     which is k8s_<pod>_<namespace>_<uid>_<attempt> (same function; the
//     namespace comes from io.kubernetes.cri-o.Namespace);
//   - runtime-rs under either: the plain name (containerd's sandbox-name,
//     else CRI-O's io.kubernetes.cri-o.KubeName; hypervisor/src/remote/
//     inner.rs).
//
// No shim forwards a UID key (containerd's io.kubernetes.cri.sandbox-uid
// stays on the container spec), so the CRI-O name is the only UID caa gets.
type PodIdentity struct {
	Namespace, Name, UID string
}

func (p PodIdentity) String() string {
	if p.UID != "" {
		return p.Namespace + "/" + p.Name + " (UID " + p.UID + ")"
	}
	return p.Namespace + "/" + p.Name
}

// criONamePrefix starts CRI-O's sandbox names. A pod name cannot hold '_'
// (it is a DNS subdomain), so no plain name starts with it.
const criONamePrefix = "k8s_"

var (
	// dnsSubdomain is a pod name (RFC 1123 subdomain, at most 253).
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// dnsLabel is a namespace (RFC 1123 label, at most 63).
	dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	// podUID is a pod's UID as CRI-O names it: the API server's UUID, or
	// a static pod's 32-hex-digit hash (the kubelet's config hash).
	podUID = regexp.MustCompile(`^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$`)
)

// ReadPodIdentity reads the pod from CreateVM's annotations: a plain name
// (containerd, runtime-rs) or CRI-O's k8s_<pod>_<namespace>_<uid>_<attempt>
// (the Go shim under CRI-O). A name that is neither, or a CRI-O name whose
// namespace disagrees with the namespace annotation, is ErrInvalid naming
// the annotation and the value.
func ReadPodIdentity(annotations map[string]string) (PodIdentity, error) {
	name, ns := annotations[AnnotationSandboxName], annotations[AnnotationSandboxNamespace]
	if name == "" {
		return PodIdentity{}, fmt.Errorf("%w: annotation %s is empty: it must name the pod (kata's shim fills it from the "+
			"container runtime's sandbox annotations)", ErrInvalid, AnnotationSandboxName)
	}
	id := PodIdentity{Namespace: ns, Name: name}
	if strings.HasPrefix(name, criONamePrefix) {
		var err error
		if id, err = parseCRIOName(name); err != nil {
			return PodIdentity{}, fmt.Errorf("%w: annotation %s=%q: %w", ErrInvalid, AnnotationSandboxName, name, err)
		}
		if ns != "" && ns != id.Namespace {
			return PodIdentity{}, fmt.Errorf("%w: annotation %s=%q names namespace %q but %s is %q",
				ErrInvalid, AnnotationSandboxName, name, id.Namespace, AnnotationSandboxNamespace, ns)
		}
	}
	if id.Namespace == "" {
		return PodIdentity{}, fmt.Errorf("%w: annotation %s is empty: it must name the pod's namespace", ErrInvalid, AnnotationSandboxNamespace)
	}
	if len(id.Name) > 253 || !dnsSubdomain.MatchString(id.Name) {
		return PodIdentity{}, fmt.Errorf("%w: annotation %s=%q is not a pod name (lower-case letters, digits, '-' and '.'), "+
			"nor CRI-O's k8s_<pod>_<namespace>_<uid>_<attempt>", ErrInvalid, AnnotationSandboxName, name)
	}
	if len(id.Namespace) > 63 || !dnsLabel.MatchString(id.Namespace) {
		return PodIdentity{}, fmt.Errorf("%w: annotation %s=%q is not a namespace name", ErrInvalid, AnnotationSandboxNamespace, id.Namespace)
	}
	return id, nil
}

// parseCRIOName splits CRI-O's sandbox name k8s_<pod>_<namespace>_<uid>_<attempt>
// (CRI-O's makeSandboxContainerName; no part may hold '_').
func parseCRIOName(s string) (PodIdentity, error) {
	parts := strings.Split(s, "_")
	if len(parts) != 5 {
		return PodIdentity{}, fmt.Errorf("CRI-O sandbox names have 5 parts k8s_<pod>_<namespace>_<uid>_<attempt>, this one has %d", len(parts))
	}
	pod, ns, uid, attempt := parts[1], parts[2], parts[3], parts[4]
	if pod == "" || ns == "" {
		return PodIdentity{}, fmt.Errorf("CRI-O sandbox name with an empty pod or namespace")
	}
	if !podUID.MatchString(uid) {
		return PodIdentity{}, fmt.Errorf("CRI-O sandbox name's UID %q is not a pod UID", uid)
	}
	if n, err := strconv.ParseUint(attempt, 10, 32); err != nil || strconv.FormatUint(n, 10) != attempt {
		return PodIdentity{}, fmt.Errorf("CRI-O sandbox name's attempt %q is not a number", attempt)
	}
	return PodIdentity{Namespace: ns, Name: pod, UID: uid}, nil
}
