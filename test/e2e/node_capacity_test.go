package e2e

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/caa-project/caa/pkg/nodecap"
)

// TestNodeAdvertisesPeerPodCapacity: on the real apiserver, the Node shows
// kata.peerpods.io/vm (what upstream's peer-pods webhook asks every peer pod
// for) in status.capacity and status.allocatable once caa runs: upstream's
// default 10 without the flag; a capacity zeroed behind caa's back (a kubelet
// re-registration) is put back while caa runs; a stop removes nothing; a
// restart with another --max-pod-vms advertises the new number; -1
// advertises nothing and leaves what is there.
func TestNodeAdvertisesPeerPodCapacity(t *testing.T) {
	t.Parallel()
	ctx, e := newHVEnv(t, 4*time.Minute)
	nodes := e.c.Client().CoreV1().Nodes()
	capacity := func() (capacity, allocatable int64, ok bool) {
		n, err := nodes.Get(ctx, e.node, metav1.GetOptions{})
		require.NoError(t, err)
		c, okc := n.Status.Capacity[nodecap.Resource]
		a, oka := n.Status.Allocatable[nodecap.Resource]
		return c.Value(), a.Value(), okc && oka
	}
	advertises := func(want int64) func() bool {
		return func() bool { c, a, ok := capacity(); return ok && c == want && a == want }
	}
	_, _, ok := capacity()
	require.False(t, ok, "a new Node has no peer-pod capacity")

	d := e.startReady(t)
	require.Eventually(t, advertises(nodecap.DefaultMax), 30*time.Second, 50*time.Millisecond, "upstream's default, 10")

	// Zeroed by someone else (as a kubelet re-registering a recreated Node
	// does): caa puts it back within a resync (2s here).
	zero, err := json.Marshal(map[string]any{"status": map[string]any{
		"capacity": map[string]string{string(nodecap.Resource): "0"}, "allocatable": map[string]string{string(nodecap.Resource): "0"}}})
	require.NoError(t, err)
	_, err = nodes.Patch(ctx, e.node, types.MergePatchType, zero, metav1.PatchOptions{}, "status")
	require.NoError(t, err)
	require.Eventually(t, advertises(nodecap.DefaultMax), 30*time.Second, 50*time.Millisecond, "caa restores the capacity")

	d.stop(t)
	assert.True(t, advertises(nodecap.DefaultMax)(), "a stopping caa leaves the capacity (a hand-over's new caa needs it)")

	d = e.startReady(t, "--max-pod-vms", "7")
	require.Eventually(t, advertises(7), 30*time.Second, 50*time.Millisecond, "the restart's own number")
	d.stop(t)

	d = e.startReady(t, "--max-pod-vms", "-1")
	_, err = nodes.Patch(ctx, e.node, types.MergePatchType, zero, metav1.PatchOptions{}, "status")
	require.NoError(t, err)
	// Two resyncs: caa with -1 leaves the Node's status alone.
	time.Sleep(5 * time.Second)
	assert.True(t, advertises(0)(), "--max-pod-vms=-1 writes nothing")
	d.stop(t)
	assert.NotContains(t, d.logs.String(), "cannot advertise")
}
