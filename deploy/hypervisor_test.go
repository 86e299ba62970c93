package deploy_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/caa-project/caa/pkg/tunnel"
)

// TestKataRemoteHypervisorComponent renders overlays/aws with
// components/kata-remote-hypervisor and checks what the remote hypervisor
// mode needs: the socket flag's variable, the node's IP, the hostPaths kata
// shares with caa, host networking and the two capabilities of the tunnel.
func TestKataRemoteHypervisorComponent(t *testing.T) {
	needBinaries(t)
	bin := kubectl(t)
	with := manifests{name: "aws+kata", all: decode(t, withComponent(t, bin, "overlays/aws", "components/kata-remote-hypervisor"))}
	ds := with.daemonSet(t)
	spec := ds.Spec.Template.Spec
	c := container(t, ds)
	assert.True(t, spec.HostNetwork)
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	assert.Equal(t, "/run/peerpod/hypervisor.sock", env["CAA_HYPERVISOR_SOCKET"].Value)
	require.NotNil(t, env["NODE_IP"].ValueFrom)
	assert.Equal(t, "status.hostIP", env["NODE_IP"].ValueFrom.FieldRef.FieldPath)
	assert.ElementsMatch(t, []corev1.Capability{"NET_ADMIN", "SYS_ADMIN"}, c.SecurityContext.Capabilities.Add)
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	assert.Equal(t, "/run/peerpod", mounts["peerpod"])
	assert.Equal(t, "/run/netns", mounts["netns"])
	assert.Equal(t, tunnel.NetNSDir, mounts["netns"], "kata's /var/run/netns paths are read where the host's namespaces are mounted")
	assert.Equal(t, "/var/lib/caa", mounts["ledger"], "the ledger stays where it was")
	paths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			paths[v.Name] = v.HostPath.Path
		}
	}
	assert.Equal(t, "/run/peerpod", paths["peerpod"])
	assert.Equal(t, "/run/netns", paths["netns"])
	// The image-pull secrets are read as the node (issue 42.1): its
	// kubelet's kubeconfig and certificates, read-only; caa's own
	// ServiceAccount gets no secret.
	assert.NotContains(t, string(withComponent(t, bin, "overlays/aws", "components/kata-remote-hypervisor")), "caa-pull-secrets",
		"a role that lets caa's own token read secrets")
	assert.Equal(t, "/var/lib/kubelet/kubeconfig", env["CAA_PULL_SECRETS_KUBECONFIG"].Value)
	readOnly := map[string]string{}
	for _, m := range c.VolumeMounts {
		if m.ReadOnly {
			readOnly[m.Name] = m.MountPath
		}
	}
	assert.Equal(t, "/var/lib/kubelet/kubeconfig", readOnly["kubelet-kubeconfig"])
	assert.Equal(t, "/var/lib/kubelet/pki", readOnly["kubelet-pki"])
	assert.Equal(t, "/var/lib/kubelet/kubeconfig", paths["kubelet-kubeconfig"])
	assert.Equal(t, "/var/lib/kubelet/pki", paths["kubelet-pki"])

	// Surge-safe on the host network: no declared port (it would be a host
	// port, and the scheduler would not place the surge's second pod),
	// exec probes against the pod's own unix socket, the scrape port
	// served once free, and the default surge strategy kept.
	assert.Empty(t, c.Ports, "no host port")
	assert.Equal(t, "unix:/run/caa/health.sock", env["CAA_HEALTH_ADDR"].Value)
	assert.Equal(t, ":8000", env["CAA_METRICS_ADDR"].Value)
	assert.Equal(t, "/run/caa", mounts["health"])
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		require.NotNil(t, p, name)
		require.NotNil(t, p.Exec, "%s: an exec probe", name)
		assert.Nil(t, p.HTTPGet, name)
		assert.Equal(t, "/usr/local/bin/caa", p.Exec.Command[0], name)
		assert.Equal(t, "probe", p.Exec.Command[1], name)
	}
	assert.Equal(t, "/healthz", c.LivenessProbe.Exec.Command[2])
	assert.Equal(t, "/readyz", c.ReadinessProbe.Exec.Command[2])
	for _, v := range spec.Volumes {
		if v.Name == "health" {
			require.NotNil(t, v.EmptyDir, "the health socket is the pod's own, never a hostPath")
		}
	}
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	require.NotNil(t, ru)
	assert.Equal(t, int32(1), ru.MaxSurge.IntVal, "the kata mode surges too")
}
