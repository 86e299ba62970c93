package handover

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fakeProc(t *testing.T, pid, cgroup, nspid string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, pid)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "status"), []byte("Name:\tcaa\nNSpid:\t"+nspid+"\n"), 0o644))
	return root
}

func TestProcessPod(t *testing.T) {
	const uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	for _, tc := range []struct {
		name, cgroup, nspid string
		init                bool
		err                 string
	}{
		{name: "systemd driver, cgroup v2, seen from another cgroup namespace",
			cgroup: "0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice/cri-containerd-abc.scope\n",
			nspid:  "48213\t1", init: true},
		{name: "cgroupfs driver, cgroup v1",
			cgroup: "12:pids:/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/abc\n11:cpu:/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/abc\n",
			nspid:  "48213\t1", init: true},
		{name: "kubectl exec into the pod: not its container's first process",
			cgroup: "0::/kubepods/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/abc\n", nspid: "50100\t27", init: false},
		{name: "a process of the host, in no pod", cgroup: "0::/system.slice/sshd.service\n", nspid: "48213", err: "no pod's cgroup"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeProc(t, "48213", tc.cgroup, tc.nspid)
			got, init, err := ProcessPod(root, 48213)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, uid, got)
			assert.Equal(t, tc.init, init)
		})
	}
	_, _, err := ProcessPod(t.TempDir(), 0)
	assert.ErrorContains(t, err, "not visible in this caa's pid namespace")
}
