package chart_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestClusterScopeReadsTheAdaptorsSettings: with the adaptor's ConfigMap
// and Secret (values-adaptor.yaml), caa-cluster mounts them as caa does and
// reads them with CAA_ADAPTOR_CONFIG_DIR: its own ConfigMap then has no
// cloud settings, so without them it could not start. The Secret's files
// are readable by its non-root user (fsGroup, group-readable), as caa's
// root never needed.
func TestClusterScopeReadsTheAdaptorsSettings(t *testing.T) {
	objs := decode(t, mustRender(t, []string{valuesFile("aws"), valuesFile("adaptor"), valuesFile("cluster-scope")}))
	ds := daemonSet(t, objs)
	var dep *appsv1.Deployment
	for _, o := range objs {
		if o.GetKind() == "Deployment" && o.GetName() == "caa-cluster" {
			dep = &appsv1.Deployment{}
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, dep))
		}
	}
	require.NotNil(t, dep)
	env := func(c corev1.Container) map[string]string {
		out := map[string]string{}
		for _, e := range c.Env {
			out[e.Name] = e.Value
		}
		return out
	}
	caa, cluster := ds.Spec.Template.Spec.Containers[0], dep.Spec.Template.Spec.Containers[0]
	require.NotEmpty(t, env(caa)["CAA_ADAPTOR_CONFIG_DIR"])
	assert.Equal(t, env(caa)["CAA_ADAPTOR_CONFIG_DIR"], env(cluster)["CAA_ADAPTOR_CONFIG_DIR"], "the same keys, read the same way")
	mounts := func(c corev1.Container) map[string]string {
		out := map[string]string{}
		for _, m := range c.VolumeMounts {
			if m.Name == "adaptor-config" || m.Name == "adaptor-secret" {
				out[m.Name] = m.MountPath
			}
		}
		return out
	}
	assert.Len(t, mounts(cluster), 2)
	assert.Equal(t, mounts(caa), mounts(cluster))
	sources := map[string]corev1.Volume{}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		sources[v.Name] = v
	}
	require.NotNil(t, sources["adaptor-config"].ConfigMap)
	assert.Equal(t, "peer-pods-cm", sources["adaptor-config"].ConfigMap.Name)
	require.NotNil(t, sources["adaptor-secret"].Secret)
	assert.Equal(t, "peer-pods-secret", sources["adaptor-secret"].Secret.SecretName)
	require.NotNil(t, sources["adaptor-secret"].Secret.DefaultMode)
	assert.Equal(t, int32(0o440), *sources["adaptor-secret"].Secret.DefaultMode&0o777)
	sc := dep.Spec.Template.Spec.SecurityContext
	require.NotNil(t, sc.FSGroup)
	assert.Equal(t, *sc.RunAsGroup, *sc.FSGroup, "the files' group is the user's")
}
