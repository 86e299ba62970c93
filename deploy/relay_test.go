package deploy_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// TestRelayComponent renders overlays/aws with the remote hypervisor and
// relay components: a caa-relay DaemonSet that updates only OnDelete, runs
// the overlay's image with `relay`, shares caa's hostPaths, holds no
// credentials (no token, no Secret, no ConfigMap) and no capability; and
// caa pointed at its control socket in the hostPath they share.
func TestRelayComponent(t *testing.T) {
	t.Parallel() // an apiserver of its own: its start-up and waits overlap the others'
	needBinaries(t)
	bin := kubectl(t)
	rendered := withComponentList(t, bin, "overlays/aws", "components/no-surge", "components/kata-remote-hypervisor", "components/relay")
	all := decode(t, rendered)
	ds := map[string]*appsv1.DaemonSet{}
	for _, o := range all {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		var d appsv1.DaemonSet
		require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &d, true))
		ds[d.Name] = &d
	}
	require.Contains(t, ds, "caa")
	require.Contains(t, ds, "caa-relay")
	caa, rel := ds["caa"], ds["caa-relay"]

	assert.Equal(t, appsv1.OnDeleteDaemonSetStrategyType, rel.Spec.UpdateStrategy.Type, "caa's upgrades never restart the relay")
	assert.Equal(t, "caa-system", rel.Namespace)
	spec := rel.Spec.Template.Spec
	require.Len(t, spec.Containers, 1)
	c := spec.Containers[0]
	assert.Equal(t, []string{"relay"}, c.Args)
	assert.Equal(t, caa.Spec.Template.Spec.Containers[0].Image, c.Image, "the overlay's image")
	assert.Empty(t, c.EnvFrom, "no ConfigMap, no Secret: no cloud credentials")
	require.NotNil(t, spec.AutomountServiceAccountToken)
	assert.False(t, *spec.AutomountServiceAccountToken, "no apiserver access")
	assert.True(t, spec.HostNetwork, "it dials the VMs from the node's address, as caa does")
	require.Len(t, c.Ports, 1, "one TCP port: /metrics")
	assert.Equal(t, corev1.ContainerPort{Name: "metrics", ContainerPort: 8001, Protocol: corev1.ProtocolTCP}, c.Ports[0])
	// Its probes ask the health socket in its own emptyDir (caa probe reads
	// CAA_HEALTH_ADDR as the relay does); the liveness probe is lenient, as
	// a restart cuts the node's shim connections.
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		require.NotNil(t, p, name)
		require.NotNil(t, p.Exec, name)
		assert.Equal(t, []string{"/usr/local/bin/caa", "probe", map[string]string{"readiness": "/readyz", "liveness": "/healthz"}[name]}, p.Exec.Command, name)
	}
	assert.GreaterOrEqual(t, c.LivenessProbe.PeriodSeconds*c.LivenessProbe.FailureThreshold, int32(120), "minutes of silence before a restart")
	require.NotNil(t, c.SecurityContext)
	assert.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)
	assert.Empty(t, c.SecurityContext.Capabilities.Add)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	for _, v := range spec.Volumes {
		if v.Name == "health" {
			require.NotNil(t, v.EmptyDir, "the health socket's directory is its own")
			continue
		}
		assert.NotNil(t, v.HostPath, "volume %s: only the hostPaths it shares with caa", v.Name)
	}

	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	caaEnv := map[string]string{}
	for _, e := range caa.Spec.Template.Spec.Containers[0].Env {
		caaEnv[e.Name] = e.Value
	}
	assert.Equal(t, "/var/lib/caa/relay/relay.sock", caaEnv["CAA_RELAY_SOCKET"], "caa calls the relay")
	assert.Equal(t, caaEnv["CAA_RELAY_SOCKET"], env["CAA_RELAY_SOCKET"], "on the socket the relay serves")
	assert.Equal(t, "/run/peerpod/hypervisor.sock", caaEnv["CAA_HYPERVISOR_SOCKET"])
	assert.Equal(t, "unix:/run/caa-relay/health.sock", env["CAA_HEALTH_ADDR"])
	assert.Equal(t, ":8001", env["CAA_METRICS_ADDR"], "the declared port")

	// The same host directories, mounted at the same paths, so the socket
	// and file paths caa passes mean the same inside the relay.
	hostPaths := func(d *appsv1.DaemonSet) map[string]string {
		byVol := map[string]string{}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.HostPath != nil {
				byVol[v.Name] = v.HostPath.Path
			}
		}
		out := map[string]string{}
		for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
			if p, ok := byVol[m.Name]; ok {
				out[m.MountPath] = p
			}
		}
		return out
	}
	// The relay sees only its own directory and the agent sockets: not
	// caa's /var/lib/caa (the ledger, the agent CA's key), not kata's
	// hypervisor socket in /run/peerpod.
	relayPaths, caaPaths := hostPaths(rel), hostPaths(caa)
	assert.Equal(t, map[string]string{"/var/lib/caa/relay": "/var/lib/caa/relay", "/run/peerpod/pods": "/run/peerpod/pods"}, relayPaths)
	for mount, host := range relayPaths {
		shared := false
		for cm, ch := range caaPaths { // caa reaches it at the same path
			if strings.HasPrefix(mount+"/", cm+"/") && strings.TrimPrefix(mount, cm) == strings.TrimPrefix(host, ch) {
				shared = true
			}
		}
		assert.True(t, shared, "caa reaches the relay's %s at %s", host, mount)
	}
	assert.Equal(t, filepath.Dir(caaEnv["CAA_RELAY_SOCKET"]), "/var/lib/caa/relay", "caa writes its client file beside the socket, in the relay's directory")

	// Every variable the manifests set is one the command reads.
	caaBin := repoCaa(t, "aws")
	for cmd, vars := range map[string][]string{"relay": {"CAA_RELAY_SOCKET", "CAA_HEALTH_ADDR", "CAA_METRICS_ADDR"}, "run": {"CAA_RELAY_SOCKET"}, "probe": {"CAA_HEALTH_ADDR"}} {
		hctx, hcancel := context.WithTimeout(context.Background(), time.Minute)
		help, err := exec.CommandContext(hctx, caaBin, cmd, "--help").CombinedOutput()
		hcancel()
		require.NoError(t, err, "caa %s --help:\n%s", cmd, help)
		for _, v := range vars {
			assert.Contains(t, string(help), v, "caa %s reads %s", cmd, v)
		}
	}
	for _, e := range c.Env {
		assert.Contains(t, []string{"CAA_RELAY_SOCKET", "CAA_HEALTH_ADDR", "CAA_METRICS_ADDR"}, e.Name, "the relay's env %s is checked above", e.Name)
	}

	// The real apiserver accepts both DaemonSets (server-side dry run).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	api := cluster.Start(ctx, t)
	require.NoError(t, api.EnsureNamespace(ctx, namespace))
	out, err := runKubectl(ctx, bin, rendered, "--kubeconfig", api.Kubeconfig(),
		"apply", "--server-side", "--dry-run=server", "--field-manager=caa-deploy-test", "-f", "-")
	require.NoError(t, err, "the apiserver refuses the relay component")
	assert.Contains(t, string(out), "daemonset.apps/caa-relay serverside-applied (server dry run)")
}

// withComponentList renders overlay with several components, in order.
func withComponentList(t *testing.T, kubectlBin, overlay string, components ...string) []byte {
	t.Helper()
	dir := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(deployDir(t), p))
		require.NoError(t, err)
		return r
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n", rel(overlay))
	for _, c := range components {
		k += "  - " + rel(c) + "\n"
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := runKubectl(ctx, kubectlBin, nil, "kustomize", dir)
	require.NoError(t, err, "render %s with %v", overlay, components)
	return out
}
