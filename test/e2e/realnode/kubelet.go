package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// KubeletOptions configure a kubelet of the node.
type KubeletOptions struct {
	// Cluster is the apiserver the kubelet registers with; it must have
	// been started with cluster.Options.RealKubelets.
	Cluster *cluster.Cluster
	// Name is the node's name; the kubelet's identity is system:node:<Name>.
	Name string
	// NodeIP is the node's address (--node-ip): status.hostIP of its pods,
	// and where the apiserver reaches the kubelet.
	NodeIP string
	// Logf receives progress lines; nil: the node's.
	Logf func(format string, args ...any)
}

// Kubelet is a real kubelet of the node, registered with the apiserver.
type Kubelet struct {
	Name string
	// RootDir is its --root-dir, where its kubeconfig and client
	// certificate also are (RootDir/kubeconfig, RootDir/pki): the layout of
	// /var/lib/kubelet that caa's kata manifests mount.
	RootDir    string
	Kubeconfig string
	// CgroupRoot is the cgroup (in every v1 hierarchy) its pods live under.
	CgroupRoot string

	proc *proc
}

// kubeletPort is the kubelet's API port: the node has a namespace of its
// own, so the well-known port is free there. (In this process's namespace
// pick a free one.)
const kubeletPort = 10250

// StartKubelet starts a kubelet on the node, in its network namespace, with
// containerd's CRI, and waits until its Node is Ready. It configures what
// this machine needs: cgroup v1 (failCgroupV1: false, as Kubernetes 1.35+
// refuses v1 otherwise), the cgroupfs driver (no systemd), pods under a
// cgroup of their own, no swap check, and no eviction or image garbage
// collection by disk use (a shared CI disk must not evict caa). The
// apiserver's calls are authenticated by the client CA (x509) and
// authorised by the apiserver (Webhook), as on a kubeadm node.
func (n *Node) StartKubelet(ctx context.Context, o KubeletOptions) (*Kubelet, error) {
	logf := o.Logf
	if logf == nil {
		logf = n.logf
	}
	kubeconfig, err := o.Cluster.NodeKubeconfig(o.Name)
	if err != nil {
		return nil, err
	}
	k := &Kubelet{Name: o.Name, RootDir: filepath.Dir(kubeconfig), Kubeconfig: kubeconfig,
		CgroupRoot: "/caa-e2e-" + filepath.Base(n.Dir)}
	if err := relativeCertPaths(kubeconfig); err != nil {
		return nil, err
	}
	if err := makeCgroupRoot(k.CgroupRoot); err != nil {
		return nil, err
	}
	// Pods mount the pods' network namespaces with HostToContainer
	// propagation (caa's kata manifests do).
	if err := ensureShared("/run/netns"); err != nil {
		return nil, err
	}
	address := o.NodeIP
	if n.NetNS == "" {
		// In this process's namespace a kubelet of another test may hold
		// 10250; the node's own namespace has it free.
		return nil, fmt.Errorf("kubelet %s: the node needs a network namespace of its own (Options.NetNS)", o.Name)
	}
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %q
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://%s
address: %q
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %q
authorization:
  mode: Webhook
failSwapOn: false
podLogsDirectory: %q
volumePluginDir: %q
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "0%%"
  nodefs.inodesFree: "0%%"
  imagefs.available: "0%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
fileCheckFrequency: 1h
staticPodPath: ""
resolvConf: /etc/resolv.conf
localStorageCapacityIsolation: false
`, k.CgroupRoot, n.Socket, address, kubeletPort, o.Cluster.ClientCAFile(),
		filepath.Join(k.RootDir, "logs"), filepath.Join(k.RootDir, "volume-plugins"))
	configPath := filepath.Join(k.RootDir, "config.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return nil, fmt.Errorf("kubelet config: %w", err)
	}
	args := []string{
		"--config=" + configPath,
		"--kubeconfig=" + kubeconfig,
		"--root-dir=" + k.RootDir,
		"--cert-dir=" + filepath.Join(k.RootDir, "pki"),
		"--hostname-override=" + o.Name,
		"--node-ip=" + o.NodeIP,
		"--v=2",
	}
	k.proc, err = startProc("kubelet", n.Bins.Kubelet, args, nil, n.NetNS, filepath.Join(n.Dir, "kubelet-"+o.Name+".log"))
	if err != nil {
		return nil, err
	}
	n.kubelets = append(n.kubelets, k)
	if err := k.waitReady(ctx, o.Cluster); err != nil {
		return nil, err
	}
	logf("realnode: kubelet %s registered and Ready (cgroup root %s)", o.Name, k.CgroupRoot)
	return k, nil
}

// waitReady waits until the kubelet's Node is Ready.
func (k *Kubelet) waitReady(ctx context.Context, c *cluster.Cluster) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	last := "not registered"
	for {
		if err := k.proc.Exited(); err != nil {
			return fmt.Errorf("%w; last lines of %s:\n%s", err, k.proc.LogPath(), k.proc.Tail(40))
		}
		node, err := c.Client().CoreV1().Nodes().Get(ctx, k.Name, metav1.GetOptions{})
		if err == nil {
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					if cond.Status == corev1.ConditionTrue && cond.Reason == "KubeletReady" {
						return nil
					}
					last = fmt.Sprintf("Ready=%s %s: %s", cond.Status, cond.Reason, cond.Message)
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubelet %s's node not Ready: %w (last: %s); last lines of %s:\n%s", k.Name, ctx.Err(), last, k.proc.LogPath(), k.proc.Tail(40))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// stop ends the kubelet; its pods keep running in containerd, as when a
// real kubelet restarts (Node.Close removes them and the cgroup root).
func (k *Kubelet) stop() {
	k.proc.Stop(15 * time.Second)
}

// Log is the tail of the kubelet's log.
func (k *Kubelet) Log(lines int) string { return k.proc.Tail(lines) }

// v1Hierarchies are the cgroup v1 controllers the kubelet and runc use.
var v1Hierarchies = []string{"cpu", "cpuacct", "cpuset", "memory", "pids", "blkio", "devices", "freezer", "systemd"}

// makeCgroupRoot creates root in every cgroup v1 hierarchy mounted (the
// kubelet refuses a cgroup root that does not exist), and for cpuset gives
// it its parent's cpus and mems, which a new v1 cpuset lacks.
func makeCgroupRoot(root string) error {
	for _, h := range v1Hierarchies {
		base := filepath.Join("/sys/fs/cgroup", h)
		if _, err := os.Stat(base); err != nil {
			continue
		}
		dir := filepath.Join(base, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if h == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(base, f))
				if err != nil {
					return fmt.Errorf("cgroup %s: %w", base, err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), []byte(strings.TrimSpace(string(b))), 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %w", dir, err)
				}
			}
		}
	}
	return nil
}

// removeCgroupRoot removes root and what is under it, deepest first, in
// every hierarchy (the hybrid unified one too, where runc mirrors it); a
// cgroup still holding a process stays.
func removeCgroupRoot(root string) {
	for _, h := range append(slices.Clone(v1Hierarchies), "unified") {
		dir := filepath.Join("/sys/fs/cgroup", h, root)
		var dirs []string
		_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}

// relativeCertPaths rewrites the kubeconfig's client certificate and key
// paths relative to its own directory (pki/kubelet-client-current.pem), so
// that it reads the same in a container that mounts the kubelet's root dir
// at /var/lib/kubelet, as on a real node, where the kubeconfig names
// /var/lib/kubelet/pki/kubelet-client-current.pem.
func relativeCertPaths(path string) error {
	kc, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return fmt.Errorf("kubelet kubeconfig: %w", err)
	}
	dir := filepath.Dir(path)
	for _, a := range kc.AuthInfos {
		for _, p := range []*string{&a.ClientCertificate, &a.ClientKey} {
			if filepath.IsAbs(*p) {
				if *p, err = filepath.Rel(dir, *p); err != nil {
					return fmt.Errorf("kubelet kubeconfig: %w", err)
				}
			}
		}
	}
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("kubelet kubeconfig: %w", err)
	}
	return nil
}
