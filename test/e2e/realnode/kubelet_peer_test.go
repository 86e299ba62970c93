package realnode

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/katanode"
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
)

// peerRuntime is the kata-remote handler of the node. STAND-IN until kata's
// shim is wired in: runc under the kata-remote handler name, so the kubelet,
// the RuntimeClass, the scheduler and caa's DaemonSet are real and the
// peer pod runs without a VM.
func peerRuntime(t *testing.T) peerSetup {
	t.Logf("STAND-IN: the kata-remote handler runs runc here; kata's shim is not wired in yet, so no VM backs the peer pod")
	return peerSetup{
		runtime: Runtime{Handler: cluster.RuntimeClassName, Type: "io.containerd.runc.v2"},
		pod: func(name string) *corev1.Pod {
			rc := cluster.RuntimeClassName
			return &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
				Spec: corev1.PodSpec{
					RuntimeClassName: &rc,
					Containers: []corev1.Container{{
						Name: "app", Image: PauseImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{"/pause", "-greet", peerGreeting},
					}},
				},
			}
		},
		logLine: peerGreeting,
		execCmd: []string{"/pause", "echo", peerExecOut},
		execOut: peerExecOut,
		checkVM: func(_ context.Context, t *testing.T, kn *katanode.Node, _ *corev1.Pod) {
			assert.Empty(t, kn.Core.Live(), "STAND-IN runc: no VM")
		},
	}
}
