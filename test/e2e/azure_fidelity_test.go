package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/caa-project/caa/pkg/provider"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// The real `caa run` binary against the fake ARM answering as Azure does
// where caa once agreed with a simpler fake (test/mocks/azure/fidelity.go).

// TestAzureVMsWhoseExtensionFailsAreKept: an extension that fails on every
// new VM (as one Azure Policy pushes) leaves each VM running with
// provisioning state Failed. caa turns ready, keeps every VM through many
// passes (no second create, no delete), and reports each pod's VM as
// degraded: on /status, in the metric and with one warning event per pod.
func TestAzureVMsWhoseExtensionFailsAreKept(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	fc := newAzureFake(t, armfake.WithFailingPolicyExtension())
	const node, n = "worker-1", 3
	c := startWithNode(ctx, t, node)
	var names []string
	for i := range n {
		name := fmt.Sprintf("pod-%02d", i)
		_, err := c.CreatePeerPod(ctx, "team", name, node, nil)
		require.NoError(t, err)
		names = append(names, name)
	}
	d := startCloudDaemon(t, c, fc, node, filepath.Join(t.TempDir(), "caa", "ledger.db"))
	d.waitReady(t, func() {})
	first := fc.live()
	require.Len(t, first, n)
	d.waitPasses(t, 4)

	assert.Equal(t, first, fc.live(), "every pod kept its first VM")
	counters := fc.core.Counters()
	assert.Equal(t, int64(n), counters["created"], "one create per pod, none after")
	assert.Zero(t, counters["deleted"], "no VM deleted")
	snap, ok := d.snapshot()
	require.True(t, ok)
	assert.Len(t, snap.Degraded, n, "/status lists each pod's degraded VM")
	// The listing comes from Resource Graph, which carries the provisioning
	// state but not the failed operation's code; the message says what it knows.
	for _, note := range snap.Degraded {
		assert.Contains(t, note.Message, "provisioning state Failed")
	}
	v, ok := metricValue(d.get(t, "/metrics"), "caa_vms_degraded")
	assert.True(t, ok)
	assert.Equal(t, float64(n), v)
	for _, name := range names {
		assert.Eventually(t, func() bool { return hasEvent(ctx, t, c, name, corev1.EventTypeWarning, "VMDegraded") },
			30*time.Second, condPoll, "pod %s has a VMDegraded event", name)
	}
	d.stop(t)
}

// TestAzureLeftoverNICIsCollected: a create fails for capacity and Azure
// keeps its NIC reserved for the failed VM (NicReservedForAnotherVm, here
// for seconds rather than 180), so caa's cleanup cannot delete it; the pod
// is deleted during the capacity backoff. caa collects the NIC by the
// orphan rule (seen twice, --gc-grace apart), retrying the refused delete
// after the reservation, and makes no VM for the deleted pod.
func TestAzureLeftoverNICIsCollected(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	const reservation = 4 * time.Second
	fc := newAzureFake(t, armfake.WithNICReservation(reservation))
	fc.args = append(fc.args, "--gc-grace", "2s")
	const node = "worker-1"
	c := startWithNode(ctx, t, node)
	keep, err := c.CreatePeerPod(ctx, "team", "keep", node, nil)
	require.NoError(t, err)
	d := startCloudDaemon(t, c, fc, node, filepath.Join(t.TempDir(), "caa", "ledger.db"))
	d.waitReady(t, func() {})

	fc.core.SetFaults(cloud.Faults{CapacityFailures: 1})
	gone, err := c.CreatePeerPod(ctx, "team", "gone", node, nil)
	require.NoError(t, err)
	nicOf := func(uid string) (cloud.Resource, bool) {
		for _, r := range fc.core.Resources("Microsoft.Network/networkInterfaces") {
			if r.Tags[provider.TagPodUID] == uid {
				return r, true
			}
		}
		return cloud.Resource{}, false
	}
	require.Eventually(t, func() bool {
		_, ok := nicOf(string(gone.UID))
		return ok && fc.core.Counters()[armfake.OpNICDelete] > 0
	}, time.Minute, condPoll, "the refused create's NIC is there, its delete refused")
	require.NoError(t, c.DeletePod(ctx, "team", "gone"))

	require.Eventually(t, func() bool {
		_, ok := nicOf(string(gone.UID))
		return !ok
	}, time.Minute, condPoll, "the leftover NIC is collected")
	for uid := range fc.live() {
		assert.NotEqual(t, string(gone.UID), uid, "no VM for the deleted pod")
	}
	_, ok := nicOf(string(keep.UID))
	assert.True(t, ok, "the live VM's NIC stays")
	assert.Contains(t, fc.live(), string(keep.UID))
	assert.True(t, strings.Contains(d.logs.String(), "NicReservedForAnotherVm"), "the reservation was met")
	d.stop(t)
}
