package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/adaptorvm"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// adaptorNode is the on-node state the cloud-api-adaptor leaves: its pods
// directory of sandbox records (apf.json, with the VM's TLS key beside the
// pod's name) and kata's sandbox directory.
type adaptorNode struct{ pods, kata string }

func newAdaptorNode(t *testing.T) adaptorNode {
	t.Helper()
	root := t.TempDir()
	n := adaptorNode{pods: filepath.Join(root, "run", "peerpod", "pods"), kata: filepath.Join(root, "run", "vc", "sbs")}
	require.NoError(t, os.MkdirAll(n.pods, 0o755))
	require.NoError(t, os.MkdirAll(n.kata, 0o755))
	return n
}

// record writes the adaptor's record of sandbox id for pod namespace/name.
func (n adaptorNode) record(t *testing.T, id, namespace, name string) {
	t.Helper()
	data, err := json.Marshal(map[string]any{"pod-namespace": namespace, "pod-name": name,
		"tls-server-key": "-----BEGIN EC PRIVATE KEY-----ADAPTORSECRET", "pod-network": map[string]any{"podip": "10.244.1.9/24"}})
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(n.pods, id), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(n.pods, id, "apf.json"), data, 0o644))
}

// seedAdaptorVM makes an instance as the adaptor does (Name tag only),
// launched at, and returns its id.
func seedAdaptorVM(t *testing.T, core *cloud.Cloud, name string, at time.Time) string {
	t.Helper()
	in, err := core.Create(cloud.CreateRequest{Name: name, Tags: map[string]string{"Name": name},
		InstanceType: ec2Type, Image: "ami-0123456789abcdef0"})
	require.NoError(t, err)
	require.NoError(t, core.Backdate(in.ID, at))
	return in.ID
}

func sid(prefix string) string { return prefix + strings.Repeat("0", 64-len(prefix)) }

// TestAdaptorVMsOfAMigratedNode: caa started on a node where the adaptor
// ran finds the adaptor's VMs in the fake EC2 and, by the apiserver's and
// the node's evidence, reports what it would do with each; by default it
// deletes nothing, a mistyped mode refuses the start, and with
// --adaptor-vms=collect it deletes exactly the VMs whose pods are gone:
// never a live pod's, never one nothing on the node ties, never one a
// forged record ties to a pod alive on another node, never one kata still
// has a sandbox for.
func TestAdaptorVMsOfAMigratedNode(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	aws := newAWSCloud(t)
	const node = "worker-1"
	for _, n := range []string{node, "worker-2"} {
		_, err := c.CreateNode(ctx, n)
		require.NoError(t, err)
	}
	// The pods as the apiserver has them: one live here, one live on
	// another node, and a pod of a name an adaptor VM names, made after it.
	for _, p := range []struct{ name, node string }{{"live", node}, {"elsewhere", "worker-2"}, {"reborn", node}} {
		_, err := c.CreatePeerPod(ctx, "team", p.name, p.node, nil)
		require.NoError(t, err)
	}

	an := newAdaptorNode(t)
	vms := map[string]string{}
	// The adaptor's VMs: those of the live pods made after them (as every
	// pod's VM is), the others an hour ago.
	hourAgo := time.Now().Add(-time.Hour)
	seedAt := func(key, pod, sandbox string, at time.Time) {
		vms[key] = seedAdaptorVM(t, aws.core, adaptorvm.Name(pod, sandbox), at)
	}
	seed := func(key, pod, sandbox string) { seedAt(key, pod, sandbox, hourAgo) }
	// Dead: the pod is gone from the apiserver.
	an.record(t, sid("1111aaaa"), "team", "gone")
	seed("gone", "gone", sid("1111aaaa"))
	// Dead: a pod of that name exists, made long after the VM.
	an.record(t, sid("4444dddd"), "team", "reborn")
	seed("reborn", "reborn", sid("4444dddd"))
	// Live: its pod exists from before.
	an.record(t, sid("2222bbbb"), "team", "live")
	seedAt("live", "live", sid("2222bbbb"), time.Now())
	// Kata still has the sandbox, though its pod is gone.
	an.record(t, sid("3333cccc"), "team", "tearing-down")
	require.NoError(t, os.MkdirAll(filepath.Join(an.kata, sid("3333cccc")), 0o755))
	seed("kata", "tearing-down", sid("3333cccc"))
	// Forged: this node's root wrote a record tying another node's live
	// pod's VM to this node.
	an.record(t, sid("5555eeee"), "team", "elsewhere")
	seedAt("forged", "elsewhere", sid("5555eeee"), time.Now())
	// Mismatched: a record of the VM's sandbox prefix names another pod.
	an.record(t, "6666ffff"+strings.Repeat("1", 56), "team", "other")
	seed("mismatch", "victim", sid("6666ffff"))
	// Untied: nothing on this node names its sandbox, and no pod has its name.
	seed("untied", "stray", sid("7777aaaa"))

	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	adaptorArgs := []string{"--adaptor-pods-dir", an.pods, "--adaptor-kata-dir", an.kata, "--gc-grace", "2s"}
	actions := func(d *daemon) map[string]health.AdaptorVM {
		snap := statusOf(t, d)
		out := map[string]health.AdaptorVM{}
		if snap.AdaptorVMs == nil {
			return out
		}
		for key, id := range vms {
			for _, vm := range snap.AdaptorVMs.VMs {
				if vm.ID == id {
					out[key] = vm
				}
			}
		}
		return out
	}
	wantKept := map[string]string{
		"live": "keep", "kata": "keep", "forged": "keep", "mismatch": "keep", "untied": "report",
	}

	// The default: report. Both dead VMs reach would-delete (two
	// sightings past the grace); nothing is deleted.
	d := startDaemon(t, c, aws, node, ledgerPath, adaptorArgs...)
	d.waitReady(t, func() {})
	require.Eventually(t, func() bool {
		a := actions(d)
		return a["gone"].Action == adaptorvm.ActionWouldDelete && a["reborn"].Action == adaptorvm.ActionWouldDelete
	}, time.Minute, 100*time.Millisecond, "the dead VMs are reported as ones collect would delete")
	got := actions(d)
	for key, want := range wantKept {
		assert.Equal(t, want, got[key].Action, "%s: %s", key, got[key].Why)
	}
	assert.Contains(t, got["gone"].Why, "team/gone")
	assert.Contains(t, got["reborn"].Why, "a later pod of the same name")
	assert.Contains(t, got["forged"].Why, "exists and may still use it")
	assert.Contains(t, got["mismatch"].Why, "forged or colliding")
	assert.Contains(t, got["untied"].Why, "never deleted")
	assert.Contains(t, got["kata"].Why, "kata still has")
	out := runCaa(t, "status", "--addr", d.health)
	assert.Contains(t, out, "Adaptor VM:")
	assert.Contains(t, out, "would-delete")
	d.stop(t)
	for key, id := range vms {
		assert.True(t, mustGet(t, aws.core, id).State.Alive(), "report mode deleted %s", key)
	}
	assert.NotContains(t, d.logs.String(), "ADAPTORSECRET", "the adaptor's TLS key is never read into caa's output")

	// A wrong mode is refused at the start, naming the flag.
	bad := startDaemon(t, c, aws, node, ledgerPath, append(adaptorArgs, "--adaptor-vms", "colect")...)
	assert.NotZero(t, exitCode(t, bad))
	assert.Contains(t, bad.logs.String(), "--adaptor-vms")

	// Collect: exactly the two dead VMs are deleted.
	aws.core.ResetCounters()
	d = startDaemon(t, c, aws, node, ledgerPath, append(adaptorArgs, "--adaptor-vms", "collect")...)
	d.waitReady(t, func() {})
	require.Eventually(t, func() bool {
		return !mustGet(t, aws.core, vms["gone"]).State.Alive() && !mustGet(t, aws.core, vms["reborn"]).State.Alive()
	}, time.Minute, 100*time.Millisecond, "the dead adaptor VMs are deleted")
	require.Eventually(t, func() bool {
		a := actions(d)
		return a["gone"].Action == adaptorvm.ActionDeleted && a["reborn"].Action == adaptorvm.ActionDeleted
	}, 30*time.Second, 100*time.Millisecond, "/status says they were deleted")
	got = actions(d)
	for key, want := range wantKept {
		assert.Equal(t, want, got[key].Action, "%s: %s", key, got[key].Why)
		assert.True(t, mustGet(t, aws.core, vms[key]).State.Alive(), "%s is kept", key)
	}
	assert.Equal(t, int64(2), aws.core.Counters()[cloud.OpDelete], "two deletes, the dead adaptor VMs'")
	d.stop(t)
	assert.Contains(t, d.logs.String(), `"action":"deleted"`)
	assert.NotContains(t, d.logs.String(), "ADAPTORSECRET")
}

// TestAdaptorVMsOnAzure: collect on Azure through the real binary: the
// dead adaptor VM (its pod gone) is deleted; the live one, the untied one
// and the one a forged record ties to a pod alive on another node stay.
func TestAdaptorVMsOnAzure(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	fc := newAzureFake(t)
	an := newAdaptorNode(t)
	seed := func(pod, sandbox string, at time.Time) string {
		name := adaptorvm.Name(pod, sandbox)
		in, err := fc.core.Create(cloud.CreateRequest{Name: name, UniqueName: true, Tags: map[string]string{"team": "blue"},
			InstanceType: azureSize, Image: azureImage})
		require.NoError(t, err)
		require.NoError(t, fc.core.Backdate(in.ID, at))
		return in.ID
	}
	d, _ := adaptorCollect(ctx, t, c, fc, an, seed)
	deadName := adaptorvm.Name("gone", sid("1111aaaa"))
	// ARM forgets a deleted VM (adaptorCollect's check allows for that):
	// /status still names it.
	require.Eventually(t, func() bool {
		snap := statusOf(t, d)
		if snap.AdaptorVMs == nil {
			return false
		}
		for _, vm := range snap.AdaptorVMs.VMs {
			if vm.Name == deadName {
				return vm.Action == adaptorvm.ActionDeleted
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "/status says it was deleted")
	d.stop(t)
}

// adaptorSet is the adaptor VMs adaptorCollect seeds, by their cloud ids.
type adaptorSet struct{ dead, live, forged, untied string }

// adaptorCollect is the shared run of the collect e2e on a fake cloud fc:
// nodes worker-1 (caa's) and worker-2, the pods "live" on worker-1 and
// "elsewhere" on worker-2, then, seeded through seed (pod, sandbox,
// creation time → cloud id) with the adaptor's records on the node: a
// dead VM (its pod gone, made an hour ago), a live one, one a forged
// record ties to the pod on worker-2, and an untied one. It runs caa with
// --adaptor-vms=collect, waits for the dead VM to go and checks the others
// stay; the caller checks the rest and stops the daemon.
func adaptorCollect(ctx context.Context, t *testing.T, c *cluster.Cluster, fc *fakeCloud, an adaptorNode,
	seed func(pod, sandbox string, at time.Time) string) (*daemon, adaptorSet) {
	t.Helper()
	const node = "worker-1"
	for _, n := range []string{node, "worker-2"} {
		_, err := c.CreateNode(ctx, n)
		require.NoError(t, err)
	}
	for _, p := range []struct{ name, node string }{{"live", node}, {"elsewhere", "worker-2"}} {
		_, err := c.CreatePeerPod(ctx, "team", p.name, p.node, nil)
		require.NoError(t, err)
	}
	var vms adaptorSet
	an.record(t, sid("1111aaaa"), "team", "gone")
	vms.dead = seed("gone", sid("1111aaaa"), time.Now().Add(-time.Hour))
	an.record(t, sid("2222bbbb"), "team", "live")
	vms.live = seed("live", sid("2222bbbb"), time.Now())
	an.record(t, sid("5555eeee"), "team", "elsewhere")
	vms.forged = seed("elsewhere", sid("5555eeee"), time.Now())
	vms.untied = seed("stray", sid("7777aaaa"), time.Now().Add(-time.Hour))

	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	d := startCloudDaemon(t, c, fc, node, ledgerPath,
		"--adaptor-pods-dir", an.pods, "--adaptor-kata-dir", an.kata, "--gc-grace", "2s", "--adaptor-vms", "collect")
	d.waitReady(t, func() {})
	require.Eventually(t, func() bool { in, err := fc.core.Get(vms.dead); return err != nil || !in.State.Alive() }, time.Minute, 100*time.Millisecond,
		"the dead adaptor VM is deleted")
	for what, id := range map[string]string{"live": vms.live, "forged": vms.forged, "untied": vms.untied} {
		assert.True(t, mustGet(t, fc.core, id).State.Alive(), "%s is kept", what)
	}
	return d, vms
}
