package sandbox

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/caa-project/caa/pkg/provider"
)

// NetNSDirs are the directories a pod's network namespace is bound in by
// the container runtimes kata runs under: containerd's CRI plugin names
// its pod namespaces /var/run/netns/cni-<uuid> (the CNI library's
// testutils.NewNS, which kata's own katautils.SetupNetworkNamespace also
// uses when the runtime names none), CRI-O pins them under its
// namespaces_dir, /var/run by default, in netns/; /run/netns is the same
// directory where /var/run links to /run. A CreateVM naming any other
// place is refused: caa would open it to read the pod network and build
// the tunnel there.
var NetNSDirs = [...]string{"/var/run/netns", "/run/netns"}

// MaxNetNSPath bounds CreateVM's networkNamespacePath (Linux's PATH_MAX).
const MaxNetNSPath = 4096

// MaxAnnotation bounds each annotation caa reads from a CreateVM, but the
// initdata (MaxInitData): names, types, images and sizes are far shorter,
// and a value is quoted in errors and logs.
const MaxAnnotation = 4096

// readAnnotations are the annotations CreateVM reads besides the initdata.
var readAnnotations = [...]string{
	AnnotationSandboxName, AnnotationSandboxNamespace,
	provider.AnnotationMachineType, provider.AnnotationImage, provider.AnnotationVCPUs, provider.AnnotationMemory,
	provider.AnnotationGPUs, provider.AnnotationGPUModel, provider.AnnotationTEE,
}

// checkAnnotations bounds every annotation CreateVM reads, naming the one
// that is too long and its size (never its value).
func checkAnnotations(id string, annotations map[string]string) error {
	for _, k := range readAnnotations {
		if v := annotations[k]; len(v) > MaxAnnotation {
			return fmt.Errorf("%w: sandbox %s: annotation %s is %d bytes, the limit is %d", ErrInvalid, id, k, len(v), MaxAnnotation)
		}
	}
	if v := annotations[AnnotationInitData]; len(v) > MaxInitData {
		return fmt.Errorf("%w: sandbox %s: annotation %s is %d bytes, the limit is %d (it travels in the VM's user data)",
			ErrInvalid, id, AnnotationInitData, len(v), MaxInitData)
	}
	return nil
}

// CheckNetNS checks CreateVM's networkNamespacePath and returns it cleaned:
// an absolute path of at most MaxNetNSPath bytes naming an entry directly
// in one of NetNSDirs. The error names the field and what is allowed; it
// quotes the path only when it is short.
func CheckNetNS(p string) (string, error) {
	const field = "networkNamespacePath"
	switch {
	case p == "":
		return "", fmt.Errorf("%w: %s is empty: caa reads the pod network and builds the pod's tunnel in the pod's network "+
			"namespace (kata sends it unless its disable_new_netns is set, which peer pods cannot use)", ErrInvalid, field)
	case len(p) > MaxNetNSPath:
		return "", fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrInvalid, field, len(p), MaxNetNSPath)
	case strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "", fmt.Errorf("%w: %s %q holds control characters", ErrInvalid, field, p)
	case !filepath.IsAbs(p):
		return "", fmt.Errorf("%w: %s %q is not an absolute path; want one in %s", ErrInvalid, field, p, strings.Join(NetNSDirs[:], " or "))
	}
	clean := filepath.Clean(p)
	dir, base := filepath.Split(clean)
	if !slices.Contains(NetNSDirs[:], filepath.Clean(dir)) || base == "" {
		return "", fmt.Errorf("%w: %s %q is not a network namespace of the container runtime: want a file directly in %s",
			ErrInvalid, field, p, strings.Join(NetNSDirs[:], " or "))
	}
	return clean, nil
}
