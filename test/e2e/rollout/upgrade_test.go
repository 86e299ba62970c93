package rollout

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/test/e2e/nodeagent"
)

// TestUpgradeFromACaaWithoutTheHandover is the upgrade README.md's
// Upgrading section prescribes for a caa release that predates the
// hand-over, which holds the ledger's file lock and neither serves nor asks
// on the hand-over socket; caa v1 run with CAA_HANDOVER=false behaves the
// same. A surge to v2 stalls: v2 waits for the lock, v1 keeps the node, the
// controller keeps both. The same release applied with
// deploy/components/no-surge replaces v1 by v2, which opens the ledger
// itself; no VM is lost.
func TestUpgradeFromACaaWithoutTheHandover(t *testing.T) {
	t.Parallel() // its own control plane, kwok nodes, fake EC2 and report files
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const podsPerNode = 10
	e := start(ctx, t, 1, podsPerNode, options{settings: []string{"CAA_HANDOVER=false"}})
	e.rec.mark("caa:v1 applied (CAA_HANDOVER=false)")
	e.apply(ctx, "v1")
	e.waitRolledOut(ctx, "v1")
	before := e.liveVMs()
	require.Len(t, before, podsPerNode)
	old, ok := e.rec.timeline().FirstPod(func(s PodSample) bool { return s.Tag == "v1" && s.Ready })
	require.True(t, ok)

	// A surge stalls: the new caa finds nobody on the socket and waits
	// for the lock, which the old one never gives up.
	e.opts.settings = nil
	e.rec.mark("caa:v2 applied (surge)")
	e.apply(ctx, "v2")
	var surged PodSample
	e.eventually(ctx, 2*time.Minute, "the surged v2 caa waits for the ledger lock", func() (bool, error) {
		tl := e.rec.timeline()
		if surged, ok = tl.FirstPod(func(s PodSample) bool { return s.Tag == "v2" && s.Node == old.Node }); !ok {
			return false, nil
		}
		return slices.ContainsFunc(tl.Procs, func(s ProcSample) bool {
			return s.UID == surged.UID && strings.Contains(s.Reason, "waiting for the ledger lock")
		}), nil
	})
	out, err := e.kubectlErr(ctx, "-n", namespace, "rollout", "status", "daemonset/caa", "--timeout=5s")
	assert.Error(t, err, "the surge stalls: %s", out)
	assert.True(t, e.lastProc(old.UID).Reconciling, "the old caa keeps the node")
	assert.True(t, e.podNow(ctx, old.UID), "the controller keeps the old pod")

	// Without a surge the controller deletes the waiting pod (two pods on
	// a node that does not surge), then the old one, then starts v2.
	e.opts.noSurge = true
	e.rec.mark("caa:v2 applied with components/no-surge")
	e.apply(ctx, "v2")
	e.waitRolledOut(ctx, "v2")
	pods, err := e.c.Client().CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: nodeagent.Selector})
	require.NoError(t, err)
	require.Len(t, pods.Items, 1)
	assert.NotEqual(t, surged.UID, string(pods.Items[0].UID), "the pod that waited for the lock was replaced")
	_, gone := e.rec.timeline().FirstPod(func(s PodSample) bool { return s.UID == surged.UID && s.Gone })
	assert.True(t, gone, "the pod that waited for the lock was deleted")
	e.rec.mu.Lock()
	fr, ok := e.rec.ready[string(pods.Items[0].UID)]
	e.rec.mu.Unlock()
	if assert.True(t, ok, "the v2 caa's first readiness was recorded") && assert.NoError(t, fr.Err) {
		assert.Nil(t, fr.Status.Handover, "the v2 caa opened the ledger itself, with no hand-over")
		assert.Empty(t, fr.Status.Pending)
	}

	counters := e.core.Counters()
	assert.Zero(t, counters["deleted"], "no VM deleted")
	assert.Equal(t, int64(podsPerNode), counters["created"], "no VM created but the v1 deploy's")
	assert.Equal(t, before, e.liveVMs(), "every peer pod kept its VM")
	e.rec.mu.Lock()
	assert.Empty(t, e.rec.trouble, "no caa process exited, restarted or failed to start")
	e.rec.mu.Unlock()
	assert.Empty(t, e.agent.Errors())
}
