package realnode

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Runtime is a runtime handler of the node's containerd besides runc (the
// default handler), as a RuntimeClass's handler names it.
type Runtime struct {
	// Handler is the CRI handler name, e.g. kata-remote.
	Handler string
	// Type is containerd's runtime_type, e.g. io.containerd.kata.v2; the
	// shim binary is containerd-shim-<kata>-<v2> on PATH unless Path is set.
	Type string
	// Path is the shim binary (runtime_path); empty: found on PATH.
	Path string
	// Options are the shim's options table, e.g. ConfigPath for kata.
	Options map[string]string
	// PodAnnotations are the pod annotations passed to the shim (globs),
	// e.g. io.katacontainers.*.
	PodAnnotations []string
}

// containerdConfig is the node's containerd configuration (version 3, that
// of containerd 2.x): everything under dir, the CRI plugin on, runc the
// default handler, the extra runtimes, the CNI network, and the local
// pause image pinned as the sandbox image.
type containerdConfig struct {
	dir, socket         string
	runc, shimRunc      string
	cniBin, cniConf     string
	runtimes            []Runtime
	sandboxImage        string
	restrictOOMScoreAdj bool
}

func (c containerdConfig) render() string {
	q := strconv.Quote
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("version = 3")
	w("root = %s", q(c.dir+"/root"))
	w("state = %s", q(c.dir+"/state"))
	// Plugins that would reach outside dir or this node.
	w("disabled_plugins = [%s, %s]", q("io.containerd.nri.v1.nri"), q("io.containerd.internal.v1.tracing"))
	w("[grpc]")
	w("  address = %s", q(c.socket))
	w("[ttrpc]")
	w("  address = %s", q(c.socket+".ttrpc"))
	w("[plugins.'io.containerd.internal.v1.opt']")
	w("  path = %s", q(c.dir+"/opt"))
	w("[plugins.'io.containerd.cri.v1.images']")
	w("  snapshotter = 'overlayfs'")
	w("  [plugins.'io.containerd.cri.v1.images'.pinned_images]")
	w("    sandbox = %s", q(c.sandboxImage))
	w("[plugins.'io.containerd.cri.v1.runtime']")
	// This machine's containerd cannot lower its children's oom_score_adj
	// below its own (runc fails on a negative one); a node with the right
	// leaves this false.
	w("  restrict_oom_score_adj = %t", c.restrictOOMScoreAdj)
	w("  enable_cdi = false")
	w("  [plugins.'io.containerd.cri.v1.runtime'.cni]")
	w("    bin_dirs = [%s]", q(c.cniBin))
	w("    conf_dir = %s", q(c.cniConf))
	w("  [plugins.'io.containerd.cri.v1.runtime'.containerd]")
	w("    default_runtime_name = 'runc'")
	w("    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]")
	w("      runtime_type = 'io.containerd.runc.v2'")
	w("      runtime_path = %s", q(c.shimRunc))
	w("      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]")
	w("        BinaryName = %s", q(c.runc))
	w("        SystemdCgroup = false")
	for _, r := range c.runtimes {
		key := "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes." + q(r.Handler)
		w("    [%s]", key)
		w("      runtime_type = %s", q(r.Type))
		if r.Path != "" {
			w("      runtime_path = %s", q(r.Path))
		}
		if len(r.PodAnnotations) > 0 {
			quoted := make([]string, len(r.PodAnnotations))
			for i, a := range r.PodAnnotations {
				quoted[i] = q(a)
			}
			w("      pod_annotations = [%s]", strings.Join(quoted, ", "))
		}
		if len(r.Options) > 0 {
			w("      [%s.options]", key)
			for _, k := range slices.Sorted(maps.Keys(r.Options)) {
				w("        %s = %s", k, q(r.Options[k]))
			}
		}
	}
	return b.String()
}

func (c containerdConfig) write(path string) error {
	if err := os.WriteFile(path, []byte(c.render()), 0o644); err != nil {
		return fmt.Errorf("containerd config: %w", err)
	}
	return nil
}
