package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/nodeagent"
	"github.com/caa-project/caa/test/e2e/rollout"
	katafake "github.com/caa-project/caa/test/mocks/kata"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// kataOverlay is the test's kustomization over deploy/overlays/aws with
// components/kata-remote-hypervisor: the shipped manifests, only pointed
// at this node's fake EC2.
var kataOverlay = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {{BASE}}
  - credentials.yaml
components:
  - {{KATA}}
images:
  - name: caa
    newTag: {{TAG}}
configMapGenerator:
  - name: caa-config
    behavior: merge
    literals:
` + rollout.FakeEC2Literals(ec2Image, ec2Type) + `
      # A socket path short enough for a unix address under the test's
      # directory (kata's default is /run/peerpod/pods).
      - CAA_AGENT_SOCKET_DIR={{AGENTS}}
patches:
` + rollout.FastProbesPatch

// TestKataDaemonSetSurgeRollout (issue 31): the kata-mode DaemonSet as
// deploy/ ships it (host network, exec probes on a unix socket, no host
// port, maxSurge 1) rolled by the real DaemonSet controller and scheduler
// from v1 to v2 on a node whose caa pods run the real binary in the node's
// network namespace (the test's node agent plays kubelet), while kata's
// shim keeps calling CreateVM, StartVM and StopVM through the hostPath
// socket. No call is refused or lost, the surge's second pod is placed
// beside the first (no port clash), the running sandboxes are served by
// v2 afterwards, and every churned sandbox's VM is gone.
func TestKataDaemonSetSurgeRollout(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	c := cluster.Start(ctx, t)
	require.NoError(t, c.StartControlPlane(ctx))
	require.NoError(t, c.StartKwok(ctx))
	const node = "w1"
	_, err := c.CreateKwokNode(ctx, node)
	require.NoError(t, err)
	cn := podvmfake.NewCloudNetwork(t)
	e := newHVEnvIn(ctx, t, c, cn, node, "aws")

	// Short directories: the node's hostPaths and the agent sockets must
	// fit unix socket addresses.
	agentDir, err := os.MkdirTemp("", "kd")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(agentDir) })
	sockets, err := os.MkdirTemp("", "ka")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(sockets) })
	e.shim = katafake.Shim{Socket: filepath.Join(agentDir, node, "run", "peerpod", "hypervisor.sock")}

	agent, err := nodeagent.New(nodeagent.Config{
		Client: c.Client(), REST: c.RestConfig(), Dir: agentDir, Logf: t.Logf,
		Binaries: map[string]string{"v1": caaBin, "v2": caaBin},
		// A pod on the host network runs in the node's namespace, where
		// the fake EC2, the apiserver's address and the VMs are reached.
		Start:  func(_ string, cmd *exec.Cmd) error { return podvmfake.InNetNS(cn.NodeNS, cmd.Start) },
		HostIP: func(string) string { return cn.NodeIP.Addr().String() },
	})
	require.NoError(t, err)
	// The node's kubelet kubeconfig and certificate directory, which the
	// component mounts read-only for the pull secrets (read as the node).
	kubeletKubeconfig, err := c.NodeKubeconfig(node)
	require.NoError(t, err)
	kc, err := os.ReadFile(kubeletKubeconfig)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(agent.HostDir(node, "/var/lib/kubelet/pki"), 0o700))
	require.NoError(t, os.WriteFile(agent.HostDir(node, "/var/lib/kubelet/kubeconfig"), kc, 0o600))
	agentCtx, stopAgent := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = agent.Run(agentCtx) })
	t.Cleanup(func() {
		stopAgent()
		wg.Wait()
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(agentDir, "*", "*", "*", "caa.log"))
			more, _ := filepath.Glob(filepath.Join(agentDir, "*", "*", "caa.log"))
			for _, l := range append(logs, more...) {
				b, _ := os.ReadFile(l)
				t.Logf("%s (last 40 lines):\n%s", l, tailLines(string(b), 40))
			}
		}
	})

	endpoint := ""
	for i, a := range e.cloudArgs {
		if a == "--aws-endpoint" {
			endpoint = e.cloudArgs[i+1]
		}
	}
	require.NotEmpty(t, endpoint)
	kust := t.TempDir()
	apply := func(tag string) {
		t.Helper()
		deploy, err := filepath.Abs(filepath.Join("..", "..", "deploy"))
		require.NoError(t, err)
		rel := func(p string) string {
			r, err := filepath.Rel(kust, filepath.Join(deploy, p))
			require.NoError(t, err)
			return r
		}
		k := strings.NewReplacer("{{BASE}}", rel("overlays/aws"), "{{KATA}}", rel("components/kata-remote-hypervisor"),
			"{{TAG}}", tag, "{{ENDPOINT}}", endpoint, "{{AGENTS}}", sockets).Replace(kataOverlay)
		require.NoError(t, os.WriteFile(filepath.Join(kust, "kustomization.yaml"), []byte(k), 0o600))
		require.NoError(t, os.WriteFile(filepath.Join(kust, "credentials.yaml"), []byte(rollout.CredentialsSecret("AKIDE2ETEST", "e2e-secret-key")), 0o600))
		bins, err := cluster.EnsureBinaries(ctx)
		require.NoError(t, err)
		out, err := exec.CommandContext(ctx, bins.Kubectl, "--kubeconfig", c.Kubeconfig(), "apply", "-k", kust).CombinedOutput()
		require.NoError(t, err, "kubectl apply -k:\n%s", out)
	}
	// caaPods are the node's caa pods: their image tags and readiness.
	caaPods := func() (tags []string, ready int) {
		list, err := c.Client().CoreV1().Pods("caa-system").List(ctx, metav1.ListOptions{LabelSelector: nodeagent.Selector})
		require.NoError(t, err)
		for _, p := range list.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			img := p.Spec.Containers[0].Image
			tags = append(tags, img[strings.LastIndex(img, ":")+1:])
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		slices.Sort(tags)
		return tags, ready
	}
	onlyReady := func(tag string, within time.Duration) {
		t.Helper()
		require.Eventually(t, func() bool {
			tags, ready := caaPods()
			return slices.Equal(tags, []string{tag}) && ready == 1
		}, within, condPoll, "the node's one caa pod runs %s and is ready", tag)
	}

	apply("v1")
	onlyReady("v1", 2*time.Minute)
	// Two running sandboxes, and the shim churning others.
	var running []string
	for i := range 2 {
		id := sandboxID(i)
		pod := e.newPod(ctx, t, "kata", "running-"+string(rune('a'+i)), nil)
		sock, err := e.shim.CreateVM(ctx, id, pod.annotations(nil), pod.net.NSPath)
		require.NoError(t, err)
		require.NoError(t, e.shim.StartVM(ctx, id))
		running = append(running, sock)
	}
	loop := e.shimLoop(ctx, t, 2)
	loop.throughout(t, 2)

	before := loop.calls.Load()
	sawTwo := false
	apply("v2")
	require.Eventually(t, func() bool {
		tags, ready := caaPods()
		if len(tags) == 2 {
			sawTwo = true
		}
		return slices.Equal(tags, []string{"v2"}) && ready == 1
	}, 3*time.Minute, condPoll, "the controller rolls the node's caa to v2")
	during := loop.calls.Load() - before
	loop.throughout(t, 2)
	errs := loop.finish()
	assert.True(t, sawTwo, "a surge: the v2 pod ran beside the v1 pod")
	assert.Zero(t, len(errs), "no hypervisor call refused or lost across the rollout; the first failures: %v", errs[:min(len(errs), 8)])
	assert.Positive(t, during, "the shim called caa during the rollout")
	for i, sock := range running {
		assert.NoError(t, katafake.CheckAgent(ctx, sock), "running sandbox %d is served by v2", i)
	}
	require.Eventually(t, func() bool { return len(e.core.Live()) == len(running) }, time.Minute, condPoll,
		"only the running sandboxes' VMs are left")
	for _, id := range loop.ids {
		assert.LessOrEqual(t, len(instanceIDs(e.sandboxVMs(id))), 1, "sandbox %s: at most one VM", id)
	}
	t.Logf("rollout v1 -> v2 under the DaemonSet controller: %d hypervisor calls during it, %d in all, %d sandboxes through their whole life, 0 failed",
		during, loop.calls.Load(), loop.done.Load())
}
