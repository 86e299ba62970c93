package cluster

import (
	"context"
	"fmt"
	"os"
)

// NodeBinaries are the paths of a real node's programs (test/e2e/realnode):
// containerd with its runc shim and ctr, runc, the CNI plugins the node's
// bridge network needs, crictl and the kubelet.
type NodeBinaries struct {
	Containerd   string
	Ctr          string
	ShimRuncV2   string // containerd-shim-runc-v2
	Runc         string
	CNIBridge    string
	CNIHostLocal string
	CNILoopback  string
	CNIPortmap   string
	Crictl       string
	Kubelet      string
}

// nodeComponent is a program of the node wrapper module (containerd, runc,
// the CNI plugins, crictl: one module, as their dependency versions agree),
// stamped with its release the way its own Makefile does.
func nodeComponent(name, pin, pkg, versionVar string) component {
	return component{
		name:   name,
		module: "node",
		pin:    pin,
		pkg:    pkg,
		ldflags: func(version string) string {
			return "-s -w -X " + versionVar + "=" + version
		},
	}
}

const (
	containerdModule = "github.com/containerd/containerd/v2"
	cniModule        = "github.com/containernetworking/plugins"
)

func cniComponent(name, dir string) component {
	return nodeComponent(name, cniModule, cniModule+"/plugins/"+dir+"/"+name,
		cniModule+"/pkg/utils/buildversion.BuildVersion")
}

// nodeTargets lists the node's programs in build order.
func (b *NodeBinaries) nodeTargets() []target {
	runc := nodeComponent("runc", "github.com/opencontainers/runc", "github.com/opencontainers/runc", "main.version")
	// runc's nsenter is C, and its seccomp filters need libseccomp
	// (libseccomp-dev to build, as runc's own release builds).
	runc.cgo, runc.tags = true, "seccomp"
	return []target{
		{nodeComponent("containerd", containerdModule, containerdModule+"/cmd/containerd", containerdModule+"/version.Version"), &b.Containerd},
		{nodeComponent("ctr", containerdModule, containerdModule+"/cmd/ctr", containerdModule+"/version.Version"), &b.Ctr},
		{nodeComponent("containerd-shim-runc-v2", containerdModule, containerdModule+"/cmd/containerd-shim-runc-v2", containerdModule+"/version.Version"), &b.ShimRuncV2},
		{runc, &b.Runc},
		{cniComponent("bridge", "main"), &b.CNIBridge},
		{cniComponent("host-local", "ipam"), &b.CNIHostLocal},
		{cniComponent("loopback", "main"), &b.CNILoopback},
		{cniComponent("portmap", "meta"), &b.CNIPortmap},
		{nodeComponent("crictl", "sigs.k8s.io/cri-tools", "sigs.k8s.io/cri-tools/cmd/crictl", "sigs.k8s.io/cri-tools/pkg/version.Version"), &b.Crictl},
		{kubeComponent("kubelet"), &b.Kubelet},
	}
}

// EnsureNodeBinaries returns a real node's programs for the versions pinned
// in test/e2e/tools/node and test/e2e/tools/kubernetes (the kubelet is of
// the control plane's release), building whichever is not in the cache yet,
// as EnsureBinaries does. runc needs cgo and libseccomp's headers
// (`apt-get install libseccomp-dev`); a failed build says so.
func EnsureNodeBinaries(ctx context.Context) (NodeBinaries, error) {
	ensureMu.Lock()
	defer ensureMu.Unlock()
	var b NodeBinaries
	tools, err := toolsDir()
	if err != nil {
		return NodeBinaries{}, err
	}
	cache, err := cacheDir()
	if err != nil {
		return NodeBinaries{}, err
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return NodeBinaries{}, fmt.Errorf("create e2e binary cache: %w", err)
	}
	for _, e := range b.nodeTargets() {
		if path, ok := ensured[e.c.name]; ok {
			*e.path = path
			continue
		}
		if *e.path, err = e.c.ensure(ctx, cache, tools); err != nil {
			if e.c.cgo {
				err = fmt.Errorf("%w (%s is built with cgo: it needs a C compiler and libseccomp's headers, apt-get install gcc libseccomp-dev)", err, e.c.name)
			}
			return NodeBinaries{}, err
		}
		ensured[e.c.name] = *e.path
	}
	return b, nil
}
