package realnode

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/caa-project/caa/test/e2e/cluster"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// proc is one long-running program of the node (containerd, the kubelet),
// its output appended to a log file.
type proc = cluster.Process

// startProc starts bin in the network namespace at netns (empty: this
// process's), with env added to this process's environment.
func startProc(name, bin string, args, env []string, netns, logPath string) (*proc, error) {
	var start func(*exec.Cmd) error
	if netns != "" {
		// Born in the namespace: a child inherits its forking thread's.
		start = func(cmd *exec.Cmd) error { return podvmfake.InNetNS(netns, cmd.Start) }
	}
	return cluster.StartProcess(name, bin, args, env, start, logPath)
}

// killReferencing SIGKILLs every process whose command line holds needle
// (the shims a containerd started name its socket) and their descendants
// (the containers), and returns their pids. A shim outlives containerd by
// design; a test's node must not.
func killReferencing(needle string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	var roots []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			// pid (comm) state ppid ...: comm may hold spaces.
			if i := bytes.LastIndexByte(stat, ')'); i > 0 {
				if f := strings.Fields(string(stat[i+1:])); len(f) > 1 {
					if ppid, err := strconv.Atoi(f[1]); err == nil {
						children[ppid] = append(children[ppid], pid)
					}
				}
			}
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(cmdline, []byte(needle)) {
			roots = append(roots, pid)
		}
	}
	var killed []int
	var kill func(pid int)
	kill = func(pid int) {
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil || !errors.Is(err, syscall.ESRCH) {
			killed = append(killed, pid)
		}
		for _, c := range children[pid] {
			kill(c)
		}
	}
	for _, pid := range roots {
		kill(pid)
	}
	return killed
}

// unmountUnder lazily unmounts every mount point under dir, deepest first
// (overlay snapshots, shm and netns bind mounts containerd left behind).
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}

// ensureShared makes dir a shared mount, as a node's mounts are where
// systemd made / shared: containerd refuses a container's mount with
// HostToContainer (rslave) propagation from a private one ("path is
// mounted on / but it is not a shared or slave mount"), and caa's kata
// manifests mount /run/netns so. Where dir lies on a private mount it is
// bind-mounted onto itself first, recursively so that the namespaces
// already mounted there stay in view, as `ip netns add` does for
// /run/netns. The mount stays: other namespaces get mounted on it.
func ensureShared(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("shared mount %s: %w", dir, err)
	}
	point, shared, err := mountOf(dir)
	if err != nil {
		return err
	}
	if shared {
		return nil
	}
	if point != dir {
		if err := syscall.Mount(dir, dir, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s onto itself: %w", dir, err)
		}
	}
	if err := syscall.Mount("", dir, "", syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// mountOf finds the mount point holding path in this process's mount
// namespace and whether it propagates as shared or slave.
func mountOf(path string) (point string, sharedOrSlave bool, err error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false, fmt.Errorf("read mountinfo: %w", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		mp := f[4]
		if mp != "/" && mp != path && !strings.HasPrefix(path, mp+"/") {
			continue
		}
		if len(mp) < len(point) {
			continue
		}
		// Later lines over-mount earlier ones at the same point.
		point, sharedOrSlave = mp, false
		for _, opt := range f[6:] {
			if opt == "-" {
				break
			}
			if strings.HasPrefix(opt, "shared:") || strings.HasPrefix(opt, "master:") {
				sharedOrSlave = true
			}
		}
	}
	return point, sharedOrSlave, nil
}
