package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/sandbox"
	"github.com/caa-project/caa/test/e2e/cluster"
	katafake "github.com/caa-project/caa/test/mocks/kata"
)

// TestHypervisorEveryRuntimesIdentityAndSizing drives the caa binary with
// what each kata runtime sends, on the real apiserver and the fake EC2
// behind the real SDK provider, with no --instance-types:
//   - the Go shim under CRI-O: the sandbox name is CRI-O's
//     k8s_<pod>_<namespace>_<uid>_<attempt>; the sandbox starts and its
//     agent answers through caa's relay;
//   - runtime-rs 3.11 to 3.22 (ttrpc service remote.Hypervisor) for a pod
//     with limits (default_vcpus and default_memory set, as
//     static_sandbox_resource_mgmt makes the Go shim send): it starts on
//     the default type, with a warning event on the pod that it got less;
//   - a pod of a runtime class caa does not serve (kata-qemu): refused,
//     naming the class and --runtime-class, and no VM is made.
func TestHypervisorEveryRuntimesIdentityAndSizing(t *testing.T) {
	t.Parallel()
	ctx, e := newHVEnv(t, 3*time.Minute)
	web := e.newPod(ctx, t, "shop", "web-0", nil)
	big := e.newPod(ctx, t, "shop", "big", nil)
	qemu := createPodOfClass(ctx, t, e, "shop", "local", "kata-qemu")
	d := e.startReady(t, "--runtime-class", "kata-remote,kata-remote-gpu")
	webPod, err := e.c.Client().CoreV1().Pods("shop").Get(ctx, "web-0", metav1.GetOptions{})
	require.NoError(t, err)

	// The Go shim under CRI-O.
	crio := sandboxID(21)
	ann := web.annotations(nil)
	ann[sandbox.AnnotationSandboxName] = katafake.CRIOSandboxName("web-0", "shop", string(webPod.UID), 0)
	sock, err := e.shim.CreateVM(ctx, crio, ann, web.net.NSPath)
	require.NoError(t, err)
	require.NoError(t, e.shim.StartVM(ctx, crio), "failed boots: %v", e.fleet.Failed())
	require.NoError(t, katafake.CheckAgent(ctx, sock))
	vms := e.liveSandboxVMs(crio)
	require.Len(t, vms, 1)
	assert.Equal(t, string(webPod.UID), vms[0].Tags[provider.TagPodUID], "the sandbox is the pod of the UID in CRI-O's name")
	vm := e.fleet.VM(vms[0].ID)
	require.NotNil(t, vm)
	assert.Equal(t, "web-0", vm.Files.Config.PodName, "the VM serves the pod CRI-O's name names")

	// runtime-rs 3.11 to 3.22, a pod with limits, no --instance-types.
	rs := katafake.Shim{Socket: e.socket, Service: katafake.ServiceRuntimeRsRemote}
	limited := sandboxID(22)
	sock, err = rs.CreateVM(ctx, limited, big.annotations(map[string]string{
		provider.AnnotationMachineType: "", provider.AnnotationImage: "", sandbox.AnnotationInitData: "",
		provider.AnnotationVCPUs: "4", provider.AnnotationMemory: "8192",
		provider.AnnotationGPUs: "0", provider.AnnotationGPUModel: "",
	}), big.net.NSPath)
	require.NoError(t, err, "a pod with limits is served without --instance-types")
	require.NoError(t, rs.StartVM(ctx, limited), "failed boots: %v", e.fleet.Failed())
	require.NoError(t, katafake.CheckAgent(ctx, sock))
	vms = e.liveSandboxVMs(limited)
	require.Len(t, vms, 1)
	assert.Equal(t, ec2Type, vms[0].InstanceType, "the default type (--aws-instance-type)")
	require.Eventually(t, func() bool {
		return hasEventIn(ctx, t, e.c, "shop", "big", corev1.EventTypeWarning, sandbox.EventSmallerThanAsked)
	}, 20*time.Second, 50*time.Millisecond, "the pod is told its VM is smaller than it asked")

	// A pod of a class caa does not serve.
	refused := sandboxID(23)
	_, err = e.shim.CreateVM(ctx, refused, map[string]string{
		sandbox.AnnotationSandboxName: qemu.Name, sandbox.AnnotationSandboxNamespace: qemu.Namespace}, web.net.NSPath)
	require.Error(t, err)
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	for _, s := range []string{`runtime class "kata-qemu"`, "--runtime-class kata-remote,kata-remote-gpu"} {
		assert.Contains(t, err.Error(), s)
	}
	assert.Equal(t, codes.NotFound, status.Code(e.shim.StartVM(ctx, refused)))
	assert.Empty(t, e.sandboxVMs(refused), "no VM for a pod of another runtime class")

	require.NoError(t, e.shim.StopVM(ctx, crio))
	require.NoError(t, rs.StopVM(ctx, limited))
	require.Eventually(t, func() bool {
		return len(e.liveSandboxVMs(crio)) == 0 && len(e.liveSandboxVMs(limited)) == 0
	}, 30*time.Second, 20*time.Millisecond, "the sandboxes' VMs are deleted")
	d.stop(t)
}

// createPodOfClass creates pod ns/name on the node with another runtime
// class than caa's.
func createPodOfClass(ctx context.Context, t *testing.T, e *hvEnv, ns, name, class string) *corev1.Pod {
	t.Helper()
	require.NoError(t, e.c.EnsureNamespace(ctx, ns))
	// The apiserver refuses a pod whose RuntimeClass does not exist.
	_, err := e.c.Client().NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: class}, Handler: class}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	p, err := e.c.Client().CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{NodeName: e.node, RuntimeClassName: &class,
			Containers: []corev1.Container{{Name: "pause", Image: cluster.PauseImage}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return p
}
