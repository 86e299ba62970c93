package tunnel

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// NetNSDir is where the node keeps named network namespaces, and where the
// deployment mounts them into caa's container (deploy/components/
// kata-remote-hypervisor).
const NetNSDir = "/run/netns"

// legacyNetNSDir is the same directory through the /var/run link that kata
// puts in CreateVM's networkNamespacePath (containerd and CRI-O name pod
// namespaces /var/run/netns/cni-...).
const legacyNetNSDir = "/var/run/netns"

// ResolveNetNS returns the path to open for a pod's network namespace path p.
// A path under /var/run/netns that does not exist as given is read under
// /run/netns: on the node /var/run links to /run, but caa's image (distroless)
// need not have the link, and the deployment mounts the host's /run/netns
// only. A path that exists as given, or is elsewhere, is used as it is.
func ResolveNetNS(p string) string {
	clean := filepath.Clean(p)
	rest, ok := strings.CutPrefix(clean, legacyNetNSDir+"/")
	if !ok || rest == "" {
		return p
	}
	if _, err := os.Lstat(clean); !errors.Is(err, fs.ErrNotExist) {
		return p
	}
	return filepath.Join(NetNSDir, rest)
}
