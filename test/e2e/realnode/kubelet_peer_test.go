package realnode

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/katanode"
	"github.com/caa-project/caa/test/e2e/upstream"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// requireRoot fails t unless it runs as root (CI does).
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("the real node needs root (containerd, runc, the kubelet, network namespaces); CI runs as root: sudo go test -run %s ./test/e2e/realnode", t.Name())
	}
}

const (
	peerGreeting = "realnode peer pod: up"
	peerExecOut  = "realnode peer pod: exec"
	// kataHypervisorSocket is where the shipped kata manifests have caa
	// serve kata's remote hypervisor API (a hostPath), and kata's own
	// default remote_hypervisor_socket.
	kataHypervisorSocket = "/run/peerpod/hypervisor.sock"
)

// peerSetup is how the node runs peer pods: kata 4.1.0's shim under the
// kata-remote handler, its calls to caa counted on the way, and the pod VMs
// booted by the fake cloud running upstream's pod VM programs and the test
// kata agent.
type peerSetup struct {
	shim   KataShim
	calls  *HypervisorCalls
	syslog *Syslog
	upvm   *podvmfake.Upstream
}

// newPeerSetup builds kata's shim and upstream's pod VM programs (or finds
// them cached).
func newPeerSetup(ctx context.Context, t *testing.T) *peerSetup {
	t.Helper()
	podvmDir, err := upstream.Build(ctx, upstream.PodVM)
	require.NoError(t, err)
	agentDir, err := upstream.Build(ctx, upstream.KataAgent)
	require.NoError(t, err)
	require.NoError(t, podvmfake.CheckUpstream(podvmDir))
	p := &peerSetup{upvm: &podvmfake.Upstream{Dir: podvmDir, KataAgent: filepath.Join(agentDir, upstream.AgentBin)}}
	p.syslog = ServeSyslog(t)
	work := t.TempDir()
	// The shim dials the counter, which relays each connection to caa's
	// socket on the hostPath (served by whichever caa pod holds it).
	p.calls = CountHypervisorCalls(t, filepath.Join(work, "hv.sock"), kataHypervisorSocket)
	p.shim, err = BuildKataShim(ctx, work, p.calls.Socket)
	require.NoError(t, err)
	return p
}

// pod is the peer pod: runtime class kata-remote, no node named (the
// scheduler places it), an image-pull secret, one container whose command
// the test kata agent runs in the VM.
func (p *peerSetup) pod(name string) *corev1.Pod {
	rc := cluster.RuntimeClassName
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{
			RuntimeClassName: &rc,
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: pullSecretName}},
			Containers: []corev1.Container{{
				Name: "app", Image: PauseImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", "echo " + peerGreeting + "; exec sleep 100000"},
			}},
		},
	}
}

// The peer pod's image-pull secret: caa reads it with the kubelet's own
// identity (the kata manifests mount the kubelet's kubeconfig), which the
// Node authorizer admits only for a secret a pod bound to the node names.
const (
	pullSecretName = "regcred"
	pullRegistry   = "registry.realnode.example:5000"
)

var pullAuth = base64.StdEncoding.EncodeToString([]byte("robot:realnode-pull-password"))

// createPullSecret creates the peer pod's image-pull secret.
func createPullSecret(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	cfg, err := json.Marshal(map[string]any{"auths": map[string]any{pullRegistry: map[string]string{"auth": pullAuth}}})
	require.NoError(t, err)
	_, err = c.Client().CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: pullSecretName}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: cfg},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// checkVM checks the one live VM of the fake cloud is the pod's, booted
// with the test kata agent and the pod's pull credentials, and returns that
// agent.
func (p *peerSetup) checkVM(t *testing.T, kn *katanode.Node, pod *corev1.Pod) *podvmfake.KataAgent {
	t.Helper()
	live := kn.Core.Live()
	require.Len(t, live, 1, "one VM in the fake cloud behind the peer pod")
	vm := live[0]
	assert.Equal(t, pod.Namespace+"/"+pod.Name, vm.Tags[provider.TagPod], "the VM's pod tag")
	assert.Equal(t, string(pod.UID), vm.Tags[provider.TagPodUID], "the VM's pod UID tag")
	fvm := kn.Fleet.VM(vm.ID)
	require.NotNil(t, fvm, "VM %s booted in the fake cloud", vm.ID)
	require.NotNil(t, fvm.VM.KataAgent, "VM %s runs the test kata agent", vm.ID)
	var auth struct {
		Auths map[string]struct {
			Auth string `json:"auth"`
		} `json:"auths"`
	}
	require.NoError(t, json.Unmarshal(fvm.VM.Files.Config.AuthJSON, &auth),
		"the VM got the pod's pull credentials, read by caa as the node: %q", fvm.VM.Files.Config.AuthJSON)
	assert.Equal(t, pullAuth, auth.Auths[pullRegistry].Auth, "the pod's pull credentials in the VM")
	return fvm.VM.KataAgent
}
