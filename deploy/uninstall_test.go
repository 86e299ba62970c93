package deploy_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// TestUninstallNodeCleanup renders deploy/uninstall: a DaemonSet on every
// node (every taint tolerated) whose init container runs `caa uninstall
// node` on the host's /var/lib/caa, with no token and no capability, in a
// namespace of its own that admits the hostPath; the command it runs is
// the binary's; the real apiserver accepts it.
func TestUninstallNodeCleanup(t *testing.T) {
	needBinaries(t)
	bin := kubectl(t)
	rendered := render(t, bin, "uninstall")
	objs := manifests{name: "uninstall", all: decode(t, rendered)}
	ns := objs.one(t, "Namespace")
	assert.Equal(t, "caa-uninstall", ns.GetName())
	assert.Equal(t, "privileged", ns.GetLabels()["pod-security.kubernetes.io/enforce"])
	var ds appsv1.DaemonSet
	require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(objs.one(t, "DaemonSet").Object, &ds, true))
	spec := ds.Spec.Template.Spec
	assert.Equal(t, "caa-uninstall", ds.Namespace)
	require.NotNil(t, spec.AutomountServiceAccountToken)
	assert.False(t, *spec.AutomountServiceAccountToken)
	require.Len(t, spec.Tolerations, 1)
	assert.Equal(t, "Exists", string(spec.Tolerations[0].Operator), "every node caa ran on")
	require.Len(t, spec.InitContainers, 1)
	require.Len(t, spec.Containers, 1)
	assert.Equal(t, []string{"uninstall", "node", "--dir", "/host/var/lib/caa"}, spec.InitContainers[0].Args)
	assert.Equal(t, append(spec.InitContainers[0].Args, "--hold"), spec.Containers[0].Args)
	require.Len(t, spec.Volumes, 1)
	require.NotNil(t, spec.Volumes[0].HostPath)
	assert.Equal(t, "/var/lib/caa", spec.Volumes[0].HostPath.Path)
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		assert.Equal(t, "/host/var/lib/caa", c.VolumeMounts[0].MountPath)
		assert.Empty(t, c.SecurityContext.Capabilities.Add)
	}

	// The binary takes these arguments.
	caaBin := repoCaa(t, "aws")
	hctx, hcancel := context.WithTimeout(context.Background(), time.Minute)
	help, err := exec.CommandContext(hctx, caaBin, append(spec.Containers[0].Args, "--help")...).CombinedOutput()
	hcancel()
	require.NoError(t, err, "%s", help)
	assert.Contains(t, string(help), "--hold")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	api := cluster.Start(ctx, t)
	require.NoError(t, api.EnsureNamespace(ctx, "caa-uninstall")) // a dry run creates no namespace
	out, err := runKubectl(ctx, bin, rendered, "--kubeconfig", api.Kubeconfig(),
		"apply", "--server-side", "--dry-run=server", "--field-manager=caa-deploy-test", "-f", "-")
	require.NoError(t, err, "the apiserver refuses deploy/uninstall: %s", out)
	assert.Contains(t, string(out), "daemonset.apps/caa-uninstall-node serverside-applied (server dry run)")
}
