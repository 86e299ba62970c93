package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/cluster"
	"github.com/caa-project/caa/pkg/nodecap"
	"github.com/caa-project/caa/pkg/reconcile"
	e2ecluster "github.com/caa-project/caa/test/e2e/cluster"
)

// uninstall runs `caa uninstall` against the fake EC2 at url; it returns
// the output and whether it succeeded.
func uninstall(t *testing.T, c *e2ecluster.Cluster, url string, extra ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	args := append([]string{"uninstall", "--kubeconfig", c.Kubeconfig(), "--wait", "30s"}, ec2Args(url)...)
	cmd := exec.CommandContext(ctx, caaBin, append(args, extra...)...)
	cmd.Env = awsEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// caaOnNodes reports, for each Node, whether it still carries anything
// caa wrote: the peer-pod capacity, the ledger id or the cluster view.
func caaOnNodes(ctx context.Context, t *testing.T, c *e2ecluster.Cluster) map[string][]string {
	t.Helper()
	nodes, err := c.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	out := map[string][]string{}
	for _, n := range nodes.Items {
		var left []string
		if _, ok := n.Status.Capacity[nodecap.Resource]; ok {
			left = append(left, "capacity")
		}
		if _, ok := n.Status.Allocatable[nodecap.Resource]; ok {
			left = append(left, "allocatable")
		}
		for _, a := range []string{reconcile.LedgerAnnotation, cluster.ViewAnnotation} {
			if _, ok := n.Annotations[a]; ok {
				left = append(left, a)
			}
		}
		if len(left) > 0 {
			out[n.Name] = left
		}
	}
	return out
}

// TestUninstallLeavesNothingBehind runs README's uninstall sequence on the
// real apiserver with two node caa and a fake EC2: the peer pods deleted
// while caa runs (caa deletes their VMs), caa removed, then `caa
// uninstall`, which deletes what is left (a VM whose pod was deleted while
// caa was already gone, a VM of a node the cluster no longer has) and
// removes the capacity and caa's annotations from the Nodes. It refuses,
// deleting nothing, while a peer pod or a caa pod exists; --dry-run changes
// nothing; a second run finds nothing to do. At the end: 0 live VMs, no
// capacity or annotation on any Node.
func TestUninstallLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 8*time.Minute)
	nodes := []string{"worker-1", "worker-2"}
	c := startWithNode(ctx, t, nodes[0])
	_, err := c.CreateNode(ctx, nodes[1])
	require.NoError(t, err)
	require.NoError(t, c.EnsureNamespace(ctx, scopeNamespace))
	aws := newAWSCloud(t)
	id := clusterUID(ctx, t, c)
	pods := map[string][]string{}
	for _, node := range nodes {
		for i := range 2 {
			name := fmt.Sprintf("%s-pod-%d", node, i)
			_, err := c.CreatePeerPod(ctx, "team", name, node, nil)
			require.NoError(t, err)
			pods[node] = append(pods[node], name)
		}
	}
	var daemons []*daemon
	var dataDirs []string
	for _, node := range nodes {
		dir := filepath.Join(t.TempDir(), "caa")
		d := startDaemon(t, c, aws, node, filepath.Join(dir, "ledger.db"))
		daemons = append(daemons, d)
		dataDirs = append(dataDirs, dir)
	}
	for _, d := range daemons {
		d.waitReady(t, func() {})
	}
	require.Len(t, liveVMs(aws.core), 4)
	require.Eventually(t, func() bool {
		left := caaOnNodes(ctx, t, c)
		return len(left[nodes[0]]) == 3 && len(left[nodes[1]]) == 3
	}, 30*time.Second, 50*time.Millisecond, "each Node has caa's capacity and ledger id")
	gone := seedVMs(t, aws.core, id, "worker-gone", 1) // a node the cluster no longer has

	// While peer pods exist it refuses, naming them, and deletes nothing.
	out, err := uninstall(t, c, aws.url)
	require.Error(t, err, out)
	assert.Contains(t, out, "4 peer pods")
	assert.Contains(t, out, "team/worker-1-pod-0")
	assert.Len(t, aws.core.Live(), 5, "nothing deleted")

	// 1. The peer pods are deleted while caa runs: caa deletes their VMs.
	// One is left for after caa is gone.
	late := pods[nodes[1]][1]
	for _, node := range nodes {
		for _, p := range pods[node] {
			if p != late {
				require.NoError(t, c.DeletePod(ctx, "team", p))
			}
		}
	}
	require.Eventually(t, func() bool { return len(aws.core.Live()) == 2 }, time.Minute, 100*time.Millisecond,
		"caa deleted the VMs of the deleted pods")

	// The node step refuses while caa holds the node's ledger.
	out, err = nodeUninstall(t, dataDirs[0])
	require.Error(t, err, out)
	assert.Contains(t, out, "held by a running caa")

	// 2. caa is removed (its DaemonSet deleted): a stop deletes nothing.
	for _, d := range daemons {
		d.stop(t)
	}
	require.NoError(t, c.DeletePod(ctx, "team", late))
	require.Len(t, aws.core.Live(), 2, "the late pod's VM and the departed node's")

	// A caa pod still in caa's namespace: refused.
	caaPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: scopeNamespace, Name: "caa-x1",
		Labels: map[string]string{"app.kubernetes.io/name": "caa"}},
		Spec: corev1.PodSpec{NodeName: nodes[0], Containers: []corev1.Container{{Name: "caa", Image: e2ecluster.PauseImage}}}}
	_, err = c.Client().CoreV1().Pods(scopeNamespace).Create(ctx, caaPod, metav1.CreateOptions{})
	require.NoError(t, err)
	out, err = uninstall(t, c, aws.url)
	require.Error(t, err, out)
	assert.Contains(t, out, "caa still runs in namespace caa-system (caa-x1)")
	require.NoError(t, c.DeletePod(ctx, scopeNamespace, "caa-x1"))

	// 3. A dry run says what it would do and does nothing. The departed
	// node's VM is kept unless --departed-nodes says the id is this
	// cluster's and the node left it.
	out, err = uninstall(t, c, aws.url, "--dry-run")
	require.Error(t, err, out)
	assert.Contains(t, out, "would delete 1 VMs, kept 1")
	assert.Contains(t, out, "kept VM "+gone[0]+`: its node "worker-gone" is not a Node of this cluster`)
	assert.Contains(t, out, "--departed-nodes")
	out, err = uninstall(t, c, aws.url, "--dry-run", "--departed-nodes")
	require.NoError(t, err, out)
	assert.Contains(t, out, "would delete 2 VMs")
	assert.Contains(t, out, "would delete VM "+gone[0])
	assert.Len(t, aws.core.Live(), 2)
	assert.Len(t, caaOnNodes(ctx, t, c), 2)

	// 4. The uninstall: nothing bills, nothing is left on the Nodes.
	out, err = uninstall(t, c, aws.url)
	require.Error(t, err, out)
	assert.Contains(t, out, "deleted 1 VMs, kept 1")
	left := aws.core.Live()
	require.Len(t, left, 1, "the departed node's VM waits for --departed-nodes")
	assert.Equal(t, gone[0], left[0].ID)
	out, err = uninstall(t, c, aws.url, "--departed-nodes")
	require.NoError(t, err, out)
	assert.Contains(t, out, "deleted 1 VMs")
	assert.Empty(t, aws.core.Live(), "no VM left to bill")
	assert.Empty(t, caaOnNodes(ctx, t, c), "no capacity or annotation left")

	// Again: nothing to do.
	out, err = uninstall(t, c, aws.url)
	require.NoError(t, err, out)
	assert.Contains(t, out, "deleted 0 VMs, kept 0, cleaned 0 Nodes")

	// 5. On each node (deploy/uninstall's DaemonSet): no host data left.
	for _, dir := range dataDirs {
		out, err := nodeUninstall(t, dir)
		require.NoError(t, err, out)
		assert.Contains(t, out, "removed "+filepath.Join(dir, "ledger.db"))
		left, err := os.ReadDir(dir)
		require.NoError(t, err)
		assert.Empty(t, left, "nothing of caa's left in %s", dir)
	}
}

// nodeUninstall runs `caa uninstall node` on a caa host directory.
func nodeUninstall(t *testing.T, dir string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, caaBin, "uninstall", "node", "--dir", dir).CombinedOutput()
	return string(out), err
}
