package handover

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// podInCgroup finds a pod UID in a cgroup path, as the kubelet names pod
// cgroups: ".../pod<uid>/<container>" (cgroupfs driver) or
// "...-pod<uid_with_underscores>.slice/..." (systemd driver).
var podInCgroup = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// ProcessPod says which pod the process pid runs in, read from its cgroup
// under procRoot ("/proc"), and whether it is its container's first
// process (pid 1 in its own pid namespace): a caa container's main
// process is, a `kubectl exec` into it is not. The pid must be visible in
// this process's pid namespace (a pod sees other pods' processes only with
// hostPID).
func ProcessPod(procRoot string, pid int) (podUID string, containerInit bool, err error) {
	if pid <= 0 {
		return "", false, fmt.Errorf("the asking process is not visible in this caa's pid namespace (SO_PEERCRED pid %d)", pid)
	}
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	cg, err := os.ReadFile(filepath.Join(dir, "cgroup"))
	if err != nil {
		return "", false, fmt.Errorf("the asking process %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(cg), "\n") {
		if m := podInCgroup.FindStringSubmatch(line); m != nil {
			podUID = strings.ReplaceAll(m[1], "_", "-")
			break
		}
	}
	if podUID == "" {
		return "", false, fmt.Errorf("the asking process %d runs in no pod's cgroup", pid)
	}
	st, err := os.Open(filepath.Join(dir, "status"))
	if err != nil {
		return "", false, fmt.Errorf("the asking process %d: %w", pid, err)
	}
	defer func() { _ = st.Close() }()
	sc := bufio.NewScanner(st)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			f := strings.Fields(rest)
			containerInit = len(f) > 1 && f[len(f)-1] == "1"
		}
	}
	return podUID, containerInit, sc.Err()
}
