// Package realnode runs a real node for caa's end-to-end tests: containerd
// 2.x with its CRI plugin, runc as the default runtime handler and any
// handler a test adds (kata's remote hypervisor shim), a CNI bridge network,
// a locally built pause image, crictl to drive it, and (kubelet.go) a real
// kubelet registered with the test apiserver. The programs are built from
// pinned modules and cached (cluster.EnsureNodeBinaries). It needs root.
package realnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// Options configure a node.
type Options struct {
	// Runtimes are the runtime handlers besides runc (the default one).
	Runtimes []Runtime
	// NetNS is the path of the network namespace containerd (and so its
	// shims and the pods' bridge) runs in; empty: this process's.
	NetNS string
	// Subnet is the pods' network; empty: a random /24 of 10.200.0.0/13.
	Subnet netip.Prefix
	// PathDirs go before PATH in containerd's environment (the shims and
	// the programs they run find each other there).
	PathDirs []string
	// Env is added to containerd's environment (its shims inherit it).
	Env []string
	// Logf receives progress lines; nil drops them.
	Logf func(format string, args ...any)
}

// Node is a running containerd with its CRI plugin.
type Node struct {
	// Dir holds everything of the node: containerd's root and state, the
	// CNI files, logs.
	Dir string
	// Socket is containerd's socket: the CRI endpoint and ctr's address.
	Socket string
	// Bins are the node's programs.
	Bins cluster.NodeBinaries
	// Network is the pods' CNI network.
	Bridge string
	Subnet netip.Prefix
	NetNS  string

	logf       func(string, ...any)
	containerd *proc
	crictlConf string
	kubelets   []*Kubelet
}

// startTimeout bounds containerd's start; it serves in a second or two.
const startTimeout = 2 * time.Minute

// Start starts a node for t and ends it in t.Cleanup, printing the tail of
// containerd's log if t failed. It needs root: it fails t otherwise.
func Start(t testing.TB, opts Options) *Node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("a real node needs root (containerd, runc, network namespaces); CI runs as root: sudo go test %s", t.Name())
	}
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	n, err := Launch(ctx, opts)
	if err != nil {
		t.Fatalf("start the real node: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("real node logs:\n%s", n.LogTails(60))
		}
		if err := n.Close(); err != nil {
			t.Errorf("stop the real node: %v", err)
		}
	})
	return n
}

// Launch builds or finds the node's programs and starts containerd with
// opts; on error nothing is left running. Close ends it.
func Launch(ctx context.Context, opts Options) (n *Node, err error) {
	bins, err := cluster.EnsureNodeBinaries(ctx)
	if err != nil {
		return nil, err
	}
	// Short: containerd's sockets live here, and a unix socket's path
	// has a 108-byte limit.
	dir, err := os.MkdirTemp("", "rn-")
	if err != nil {
		return nil, fmt.Errorf("node dir: %w", err)
	}
	n = &Node{Dir: dir, Socket: filepath.Join(dir, "containerd.sock"), Bins: bins, NetNS: opts.NetNS, logf: opts.Logf}
	if n.logf == nil {
		n.logf = func(string, ...any) {}
	}
	defer func() {
		if err != nil {
			if closeErr := n.Close(); closeErr != nil {
				err = errors.Join(err, closeErr)
			}
			n = nil
		}
	}()
	network, err := newCNINetwork(opts.Subnet)
	if err != nil {
		return n, err
	}
	n.Bridge, n.Subnet = network.Bridge, network.Subnet
	if err := network.write(bins, filepath.Join(dir, "cni", "bin"), filepath.Join(dir, "cni", "conf"), filepath.Join(dir, "cni", "ipam")); err != nil {
		return n, err
	}
	cfg := containerdConfig{
		dir: dir, socket: n.Socket, runc: bins.Runc, shimRunc: bins.ShimRuncV2,
		cniBin: filepath.Join(dir, "cni", "bin"), cniConf: filepath.Join(dir, "cni", "conf"),
		runtimes: opts.Runtimes, sandboxImage: PauseImage, restrictOOMScoreAdj: true,
	}
	config := filepath.Join(dir, "containerd.toml")
	if err := cfg.write(config); err != nil {
		return n, err
	}
	n.crictlConf = filepath.Join(dir, "crictl.yaml")
	crictlConf := fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 60\n", n.Socket, n.Socket)
	if err := os.WriteFile(n.crictlConf, []byte(crictlConf), 0o644); err != nil {
		return n, fmt.Errorf("crictl config: %w", err)
	}

	path := strings.Join(append(append([]string{}, opts.PathDirs...), filepath.Dir(bins.Runc), os.Getenv("PATH")), string(os.PathListSeparator))
	env := append([]string{"PATH=" + path}, opts.Env...)
	n.containerd, err = startProc("containerd", bins.Containerd, []string{"--config", config, "--log-level", "info"}, env, opts.NetNS, filepath.Join(dir, "containerd.log"))
	if err != nil {
		return n, err
	}
	if err := n.waitCRI(ctx); err != nil {
		return n, err
	}
	pause, err := pauseArchive(ctx, dir)
	if err != nil {
		return n, err
	}
	if err := n.ImportImage(ctx, pause); err != nil {
		return n, err
	}
	n.logf("realnode: containerd serving CRI at %s (pods on %s, bridge %s)", n.Socket, n.Subnet, n.Bridge)
	return n, nil
}

// waitCRI polls `crictl info` until the runtime and the network are ready.
func (n *Node) waitCRI(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	var last error
	for {
		if err := n.containerd.Exited(); err != nil {
			return fmt.Errorf("%w; last lines of %s:\n%s", err, n.containerd.LogPath(), n.containerd.Tail(30))
		}
		// crictl's connection waits out its whole timeout for a socket
		// that is not there yet: ask only once containerd serves it, and
		// each time briefly.
		if _, err := os.Stat(n.Socket); err != nil {
			last = err
		} else {
			callCtx, cancelCall := context.WithTimeout(ctx, 10*time.Second)
			out, err := n.Crictl(callCtx, "info")
			cancelCall()
			if err == nil {
				if err = criReady(out); err == nil {
					return nil
				}
			}
			if ctx.Err() == nil {
				last = err
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containerd's CRI not ready: %w (last: %w); last lines of %s:\n%s", ctx.Err(), last, n.containerd.LogPath(), n.containerd.Tail(30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// criReady checks `crictl info`'s conditions RuntimeReady and NetworkReady.
func criReady(info string) error {
	var v struct {
		Status struct {
			Conditions []struct {
				Type    string `json:"type"`
				Status  bool   `json:"status"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(info), &v); err != nil {
		return fmt.Errorf("crictl info: %w", err)
	}
	ready := map[string]bool{}
	for _, c := range v.Status.Conditions {
		// Others, such as ContainerdHasNoDeprecationWarnings (false on
		// cgroup v1), are advice.
		if c.Type != "RuntimeReady" && c.Type != "NetworkReady" {
			continue
		}
		if !c.Status {
			return fmt.Errorf("CRI condition %s false: %s %s", c.Type, c.Reason, c.Message)
		}
		ready[c.Type] = true
	}
	for _, want := range []string{"RuntimeReady", "NetworkReady"} {
		if !ready[want] {
			return fmt.Errorf("CRI reports no %s condition", want)
		}
	}
	return nil
}

// Crictl runs crictl against the node and returns its standard output; an
// error carries its standard error.
func (n *Node) Crictl(ctx context.Context, args ...string) (string, error) {
	return run(ctx, n.Bins.Crictl, append([]string{"--config", n.crictlConf}, args...)...)
}

// Ctr runs ctr against the node's containerd, in the CRI's namespace k8s.io.
func (n *Node) Ctr(ctx context.Context, args ...string) (string, error) {
	return run(ctx, n.Bins.Ctr, append([]string{"--address", n.Socket, "--namespace", "k8s.io"}, args...)...)
}

// ImportImage imports an image archive (docker save or OCI layout tarball)
// for the CRI: `ctr -n k8s.io images import`, which also unpacks it.
func (n *Node) ImportImage(ctx context.Context, archive string) error {
	if _, err := n.Ctr(ctx, "images", "import", archive); err != nil {
		return fmt.Errorf("import %s: %w", archive, err)
	}
	return nil
}

func run(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// LogTails returns the last lines of containerd's log (and the kubelets').
func (n *Node) LogTails(lines int) string {
	var b strings.Builder
	if n.containerd != nil {
		fmt.Fprintf(&b, "--- containerd (%s)\n%s\n", n.containerd.LogPath(), n.containerd.Tail(lines))
	}
	for _, k := range n.kubelets {
		fmt.Fprintf(&b, "--- kubelet (%s)\n%s\n", k.proc.LogPath(), k.proc.Tail(lines))
	}
	return b.String()
}

// Close removes every pod (so the shims end and the netns, mounts and
// bridge ports go), stops the kubelets and containerd, ends any shim left,
// and removes the node's directory. It is safe to call twice.
func (n *Node) Close() error {
	if n.Dir == "" {
		return nil
	}
	var errs []error
	var cgroups, roots []string
	for _, k := range n.kubelets {
		k.stop()
		cgroups = append(cgroups, k.CgroupRoot)
		roots = append(roots, k.RootDir)
	}
	n.kubelets = nil
	if n.containerd != nil && n.containerd.Exited() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if out, err := n.Crictl(ctx, "rmp", "--all", "--force"); err != nil {
			errs = append(errs, fmt.Errorf("remove the node's pods: %w (%s)", err, out))
		}
		cancel()
		n.containerd.Stop(15 * time.Second)
	}
	// Shims are started with containerd's socket in their arguments and
	// outlive it by design.
	if pids := killReferencing(n.Socket); len(pids) > 0 {
		n.logf("realnode: killed %d process(es) left by containerd: %v", len(pids), pids)
	}
	for _, root := range cgroups {
		removeCgroupRoot(root)
	}
	unmountUnder(n.Dir)
	// The kubelets' volumes (emptyDir in memory, projected tokens).
	for _, root := range roots {
		unmountUnder(root)
	}
	if err := os.RemoveAll(n.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove node dir: %w", err))
	}
	if n.Bridge != "" {
		if err := deleteLink(n.NetNS, n.Bridge); err != nil {
			errs = append(errs, err)
		}
	}
	n.Dir = ""
	return errors.Join(errs...)
}
