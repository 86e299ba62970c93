package daemon

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/pkg/sandbox"
	fakecloud "github.com/caa-project/caa/test/mocks/cloud"
	"github.com/caa-project/caa/test/mocks/memory"
)

type podMap map[string]*reconcile.Pod

func (m podMap) Pods() []*reconcile.Pod {
	var out []*reconcile.Pod
	for _, p := range m {
		out = append(out, p)
	}
	return out
}
func (m podMap) Pod(uid string) *reconcile.Pod { return m[uid] }
func (m podMap) Synced() bool                  { return true }

// A lost ledger on a node of the remote hypervisor mode: the rebuild
// records each sandbox VM of a live pod as a Lost sandbox (not as the pod's
// record), leaves a gone pod's sandbox VM to the orphan collection, and
// the daemon that starts on the rebuilt ledger deletes nothing.
func TestRebuildRecordsSandboxVMsAsLostSandboxes(t *testing.T) {
	ctx := context.Background()
	c := fakecloud.New(fakecloud.Options{IDPrefix: "i-", KeepTerminated: time.Hour})
	prov := memory.New(c)
	create := func(podUID, pod, key, sb string) provider.VM {
		t.Helper()
		spec := provider.Spec{Key: key, Cluster: "c1", Node: "node-1", PodUID: podUID, PodNamespace: "shop", PodName: pod,
			InstanceType: "small", Image: "podvm"}
		if sb != "" {
			spec.ExtraTags = map[string]string{sandbox.TagSandbox: sb}
		}
		vm, err := prov.Create(ctx, spec)
		require.NoError(t, err)
		return vm
	}
	// Sandbox ids: 64 hex digits, as kata makes them.
	sb1, sb2, sb3 := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64)
	informer := create("uid-a", "a", "uid-a-a1", "")
	older := create("uid-b", "b", sandbox.Key(sb1, 1), sb1)
	newer := create("uid-b", "b", sandbox.Key(sb2, 2), sb2)
	gone := create("uid-c", "c", sandbox.Key(sb3, 1), sb3)
	vms, err := prov.List(ctx, provider.Selector{Cluster: "c1", Node: "node-1"})
	require.NoError(t, err)
	pods := podMap{
		"uid-a": {UID: "uid-a", Namespace: "shop", Name: "a", RuntimeClass: "kata-remote"},
		"uid-b": {UID: "uid-b", Namespace: "shop", Name: "b", RuntimeClass: "kata-remote"},
	}

	led, err := ledger.Open(ledger.Options{Path: filepath.Join(t.TempDir(), "ledger.db"), Node: "node-1", Cluster: "c1", Timeout: time.Second})
	require.NoError(t, err)
	defer led.Close()
	exec := &reconcile.Executor{Ledger: led, Provider: prov, Cluster: "c1", Node: "node-1"}
	var out bytes.Buffer
	n, err := rebuildRecords(ctx, &out, led, exec, prov.Name(), vms, pods, false)
	require.NoError(t, err)
	assert.Equal(t, rebuildCounts{adopted: 3, orphaned: 1, sandboxes: 2}, n, out.String())
	assert.Contains(t, out.String(), "orphan   "+gone.ID)

	rec, err := led.Get("uid-a")
	require.NoError(t, err)
	assert.Equal(t, informer.ID, rec.VMID)
	_, err = led.Get("uid-b")
	require.ErrorIs(t, err, ledger.ErrNotFound, "a sandbox VM is not the pod's record")
	for id, vm := range map[string]provider.VM{sb1: older, sb2: newer} {
		s, err := led.GetSandbox(id)
		require.NoError(t, err)
		assert.Equal(t, ledger.SandboxLost, s.Phase)
		assert.Equal(t, sandbox.ReasonRebuilt, s.Reason)
		assert.Equal(t, vm.ID, s.VMID)
		assert.Equal(t, "uid-b", s.PodUID)
		assert.Equal(t, vm.Tags[provider.TagKey], s.Key)
	}
	assert.Equal(t, 2, mustSandbox(t, led, sb2).Attempt, "the attempt is read back from the key")
	_, err = led.GetSandbox(sb3)
	require.ErrorIs(t, err, ledger.ErrNotFound)
	probs, err := led.Verify()
	require.NoError(t, err)
	assert.Empty(t, probs)

	// Run again: everything is already recorded.
	out.Reset()
	n, err = rebuildRecords(ctx, &out, led, exec, prov.Name(), vms, pods, false)
	require.NoError(t, err)
	assert.Equal(t, rebuildCounts{kept: 3, orphaned: 1}, n)

	// The daemon on the rebuilt ledger: no cloud write, the lost sandboxes
	// reported, only the gone pod's VM pending as an orphan.
	c.ResetCounters()
	m := sandbox.New(sandbox.Config{Ledger: led, Provider: prov, Pods: pods, Cluster: "c1", Node: "node-1", ConfirmMissing: time.Hour})
	rep, err := m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{sb1, sb2}, rep.Lost)
	require.Len(t, rep.Orphans, 1)
	assert.Equal(t, gone.ID, rep.Orphans[0].ID)
	assert.Zero(t, c.Counters()[fakecloud.OpCreate]+c.Counters()[fakecloud.OpDelete])
	assert.Len(t, c.Live(), 4)
}

func mustSandbox(t *testing.T, led *ledger.Ledger, id string) ledger.Sandbox {
	t.Helper()
	s, err := led.GetSandbox(id)
	require.NoError(t, err)
	return s
}

// TestRebuildRecordsNoOrdinaryVMWhileConfidential: with --confidential on,
// the rebuild records a pod's confidential VM with its TEE and leaves an
// ordinary one unrecorded (the daemon replaces it); off, it records both.
func TestRebuildRecordsNoOrdinaryVMWhileConfidential(t *testing.T) {
	ctx := context.Background()
	c := fakecloud.New(fakecloud.Options{IDPrefix: "i-", KeepTerminated: time.Hour})
	prov := memory.New(c)
	create := func(uid string, tee provider.TEE) provider.VM {
		t.Helper()
		vm, err := prov.Create(ctx, provider.Spec{Key: uid + "-a1", Cluster: "c1", Node: "node-1", PodUID: uid, PodNamespace: "shop",
			PodName: uid, InstanceType: "small", Image: "podvm", TEE: tee})
		require.NoError(t, err)
		return vm
	}
	snp := create("uid-snp", provider.TEESEVSNP)
	plain := create("uid-plain", provider.TEENone)
	vms, err := prov.List(ctx, provider.Selector{Cluster: "c1", Node: "node-1"})
	require.NoError(t, err)
	pods := podMap{
		"uid-snp":   {UID: "uid-snp", Namespace: "shop", Name: "uid-snp", RuntimeClass: "kata-remote"},
		"uid-plain": {UID: "uid-plain", Namespace: "shop", Name: "uid-plain", RuntimeClass: "kata-remote"},
	}
	for _, confidential := range []bool{true, false} {
		led, err := ledger.Open(ledger.Options{Path: filepath.Join(t.TempDir(), "ledger.db"), Node: "node-1", Cluster: "c1", Timeout: time.Second})
		require.NoError(t, err)
		exec := &reconcile.Executor{Ledger: led, Provider: prov, Cluster: "c1", Node: "node-1"}
		var out bytes.Buffer
		n, err := rebuildRecords(ctx, &out, led, exec, prov.Name(), vms, pods, confidential)
		require.NoError(t, err)
		rec, err := led.Get("uid-snp")
		require.NoError(t, err)
		assert.Equal(t, snp.ID, rec.VMID)
		assert.Equal(t, "sev-snp", rec.Confidential, "recorded with the TEE the cloud reports")
		rec, err = led.Get("uid-plain")
		if confidential {
			require.ErrorIs(t, err, ledger.ErrNotFound, "an ordinary VM is not adopted while --confidential is on")
			assert.Equal(t, rebuildCounts{adopted: 1, ordinary: 1}, n)
			assert.Contains(t, out.String(), "ordinary "+plain.ID)
		} else {
			require.NoError(t, err)
			assert.Equal(t, plain.ID, rec.VMID)
			assert.Empty(t, rec.Confidential)
			assert.Equal(t, rebuildCounts{adopted: 2}, n)
		}
		require.NoError(t, led.Close())
	}
}
