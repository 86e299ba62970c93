package realnode

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/katanode"
)

const (
	kubeletNode = "node-a"
	caaSelector = "app.kubernetes.io/name=caa"
	// samplePeriod is how often the peer pod is sampled during the rollout.
	samplePeriod = 200 * time.Millisecond
)

// TestKubeletPeerPodThroughRollout is level 2 of issue 40: a real kubelet,
// registered with the apiserver as system:node:node-a, runs on the node's
// containerd (cgroupfs, cgroup v1) in the node's network namespace; the real
// scheduler and DaemonSet controller place caa's pods from the shipped kata
// manifests (overlays/aws, components kata-remote-hypervisor and relay)
// with the image `make image CLOUDS=aws` builds, imported into containerd
// and run by runc; a peer pod (runtimeClassName kata-remote) is scheduled
// to the node and turns Running and Ready; its logs and exec go through the
// apiserver to the kubelet. Then caa's DaemonSet is rolled (maxSurge 1)
// while the peer pod is sampled every 200 ms: never not Ready, never
// restarted, and no VM created or deleted in the cloud.
func TestKubeletPeerPodThroughRollout(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	image := buildCAAImage(ctx, t)
	egress, err := StartEgress(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(egress.Close)
	c := cluster.StartWith(ctx, t, cluster.Options{RealKubelets: true,
		APIServerArgs: []string{"--egress-selector-config-file=" + egress.Config}})
	require.NoError(t, c.StartControlPlane(ctx))

	// The node's network: its namespace, the fake EC2 on its loopback, the
	// cloud network its pod VMs boot on, the apiserver at the same address.
	kn, err := katanode.New(ctx, c, "", kubeletNode)
	require.NoError(t, err)
	t.Cleanup(kn.Close)
	egress.SetNetNS(kn.Net.NodeNS)
	serveKubernetesService(ctx, t, c, kn.Net.NodeNS)

	peer := peerRuntime(t)
	n := Start(t, Options{NetNS: kn.Net.NodeNS, Runtimes: []Runtime{peer.runtime}, PathDirs: peer.path})
	k, err := n.StartKubelet(ctx, KubeletOptions{Cluster: c, Name: kubeletNode, NodeIP: kn.Net.NodeIP.Addr().String()})
	require.NoError(t, err)
	require.NoError(t, n.ImportImage(ctx, image))

	objs := renderCAA(ctx, t, kn.EC2URL(), caaImageVersion+"-aws", map[string]string{
		"/var/lib/caa":     n.Dir + "/host/var/lib/caa",
		"/var/lib/kubelet": k.RootDir,
	})
	applyObjects(ctx, t, c, objs)
	caaPods := func() (names []string, ready int) {
		list, err := c.Client().CoreV1().Pods("caa-system").List(ctx, metav1.ListOptions{LabelSelector: caaSelector})
		require.NoError(t, err)
		for _, p := range list.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			names = append(names, p.Name)
			if podReady(&p) {
				ready++
			}
		}
		return names, ready
	}
	require.Eventually(t, func() bool { names, ready := caaPods(); return len(names) == 1 && ready == 1 },
		5*time.Minute, 500*time.Millisecond, "caa's DaemonSet pod on %s turns Ready under the kubelet", kubeletNode)
	first, _ := caaPods()

	// The peer pod: placed by the scheduler, run by kata's shim through caa.
	pod := peer.pod("peer-a")
	_, err = c.Client().CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)
	var running *corev1.Pod
	require.Eventually(t, func() bool {
		p, err := c.Client().CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		require.NoError(t, err)
		running = p
		return p.Status.Phase == corev1.PodRunning && podReady(p)
	}, 5*time.Minute, 500*time.Millisecond, "the peer pod turns Running and Ready")
	assert.Equal(t, kubeletNode, running.Spec.NodeName, "the scheduler placed the peer pod on the kubelet's node")
	peer.checkVM(ctx, t, kn, running)

	logs, err := kubectl(ctx, c, "logs", "-n", "default", pod.Name)
	require.NoError(t, err, "kubectl logs through the apiserver and the kubelet")
	assert.Contains(t, logs, peer.logLine, "the peer pod's container output")
	out, err := kubectl(ctx, c, append([]string{"exec", "-n", "default", pod.Name, "--"}, peer.execCmd...)...)
	require.NoError(t, err, "kubectl exec through the apiserver and the kubelet")
	assert.Contains(t, out, peer.execOut)

	// The rollout: a new template (kubectl rollout restart's annotation),
	// one surge pod beside the old one, the ledger handed over.
	runsBefore, terminatesBefore := kn.Calls.Writes()
	samples := sampleReadiness(ctx, t, c, "default", pod.Name)
	_, err = kubectl(ctx, c, "-n", "caa-system", "rollout", "restart", "daemonset/caa")
	require.NoError(t, err)
	sawTwo := false
	require.Eventually(t, func() bool {
		names, ready := caaPods()
		if len(names) == 2 {
			sawTwo = true
		}
		return len(names) == 1 && ready == 1 && !slices.Contains(first, names[0])
	}, 5*time.Minute, 200*time.Millisecond, "the DaemonSet controller rolls caa on %s", kubeletNode)
	out, err = kubectl(ctx, c, "-n", "caa-system", "rollout", "status", "daemonset/caa", "--timeout=2m")
	require.NoError(t, err, "rollout status: %s", out)
	s := samples.stop()
	runs, terminates := kn.Calls.Writes()

	assert.True(t, sawTwo, "a surge: the new caa pod ran beside the old one")
	assert.Positive(t, s.total, "the peer pod was sampled")
	assert.Zero(t, s.notReady, "samples of the peer pod not Ready during the rollout (of %d): %v", s.total, s.firstBad)
	assert.Zero(t, s.maxRestarts, "the peer pod's restartCount during the rollout")
	assert.Equal(t, runsBefore, runs, "RunInstances during the rollout")
	assert.Equal(t, terminatesBefore, terminates, "TerminateInstances during the rollout")
	t.Logf("rollout of caa under the kubelet: %d samples of the peer pod, %d not ready, restartCount %d; cloud writes during it: %d RunInstances, %d TerminateInstances",
		s.total, s.notReady, s.maxRestarts, runs-runsBefore, terminates-terminatesBefore)
	if t.Failed() {
		t.Logf("kubelet log:\n%s", k.Log(80))
	}
}

// readinessSamples are what sampleReadiness saw.
type readinessSamples struct {
	total, notReady int
	maxRestarts     int32
	firstBad        []string
}

type sampler struct {
	mu     sync.Mutex
	s      readinessSamples
	cancel context.CancelFunc
	done   chan struct{}
}

// sampleReadiness reads the pod every samplePeriod until stop, counting
// samples whose Ready condition is not True and the highest restart count.
func sampleReadiness(ctx context.Context, t testing.TB, c *cluster.Cluster, ns, name string) *sampler {
	ctx, cancel := context.WithCancel(ctx)
	sm := &sampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(sm.done)
		tick := time.NewTicker(samplePeriod)
		defer tick.Stop()
		for {
			p, err := c.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			sm.mu.Lock()
			if err == nil {
				sm.s.total++
				if !podReady(p) {
					sm.s.notReady++
					if len(sm.s.firstBad) < 5 {
						sm.s.firstBad = append(sm.s.firstBad, time.Now().Format(time.StampMilli)+" "+string(p.Status.Phase))
					}
				}
				sm.s.maxRestarts = max(sm.s.maxRestarts, restarts(p))
			} else if ctx.Err() == nil {
				sm.s.notReady++
				sm.s.firstBad = append(sm.s.firstBad, "get: "+err.Error())
			}
			sm.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { sm.stop() })
	return sm
}

func (sm *sampler) stop() readinessSamples {
	sm.cancel()
	<-sm.done
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.s
}

// peerSetup is how the peer pod runs: the kata-remote handler, the pod, and
// what its logs and exec show.
type peerSetup struct {
	runtime Runtime
	path    []string
	pod     func(name string) *corev1.Pod
	logLine string
	execCmd []string
	execOut string
	checkVM func(ctx context.Context, t *testing.T, kn *katanode.Node, p *corev1.Pod)
}
