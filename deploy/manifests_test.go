package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const (
	namespace      = "caa-system"
	secretName     = "caa-cloud-credentials"
	ledgerDir      = "/var/lib/caa"
	healthPortName = "health"
	healthPort     = 8000
	// minStartup is the least time the startup probe must allow: a full
	// cloud listing, recreating a node's VMs at the default rate, and VM
	// boot (see the comment on the probe).
	minStartup = 15 * time.Minute
	// graceMargin is what terminationGracePeriodSeconds must leave beyond
	// CAA_SHUTDOWN_GRACE for closing the ledger after in-flight calls.
	graceMargin = 10 * time.Second
)

// TestRenderedManifests renders the base and every overlay with kubectl
// kustomize and checks what docs/design.md asks of them.
func TestRenderedManifests(t *testing.T) {
	needBinaries(t)
	for name, m := range renderAll(t) {
		t.Run(name, func(t *testing.T) {
			checkObjects(t, m)
			ds := m.daemonSet(t)
			cm := m.configMap(t)
			checkUpdateStrategy(t, ds)
			checkPodShape(t, ds, cm)
			checkProbes(t, ds)
			checkSecurity(t, ds)
			checkLedgerVolume(t, ds)
			checkIdentity(t, m, ds)
			if provider, ok := providerOf[name]; ok {
				checkOverlay(t, name, provider, ds, cm)
			} else {
				_, set := cm.Data["CAA_PROVIDER"]
				assert.False(t, set, "the base leaves the provider to the overlays")
			}
		})
	}
}

// checkObjects: the expected kinds, all in caa-system when namespaced (but
// the IBM overlay's Role and RoleBinding caa-cluster-info in kube-system,
// checkClusterInfoRole), no Secret (credentials are never committed), and
// nothing anywhere that reaches into the host's network or process
// namespaces.
func checkObjects(t *testing.T, m manifests) {
	var kinds []string
	for _, o := range m.all {
		if o.GetName() == "caa-cluster-info" && o.GetNamespace() == "kube-system" {
			checkClusterInfoRole(t, o)
			continue
		}
		kinds = append(kinds, o.GetKind())
		switch o.GetKind() {
		case "Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			assert.Empty(t, o.GetNamespace(), "%s %s is cluster-scoped", o.GetKind(), o.GetName())
		default:
			assert.Equal(t, namespace, o.GetNamespace(), "%s %s", o.GetKind(), o.GetName())
		}
		for _, path := range findKeys(o.Object, "hostNetwork", "hostPort", "hostPID", "hostIPC") {
			t.Errorf("%s %s sets %s: caa uses none of the host's namespaces or ports", o.GetKind(), o.GetName(), path)
		}
	}
	assert.Equal(t, "privileged", m.one(t, "Namespace").GetLabels()["pod-security.kubernetes.io/enforce"],
		"the hostPath is outside Pod Security's baseline, so the namespace says so rather than being refused")
	slices.Sort(kinds)
	// The admission policies come with every install (issue 42.2).
	var policies []string
	for _, o := range m.ofKind("ValidatingAdmissionPolicy") {
		policies = append(policies, o.GetName())
	}
	assert.ElementsMatch(t, []string{"caa-node-own-node", "caa-node-events", "caa-cluster-view-only", "caa-cloud-view-writer"}, policies)
	kinds = slices.Compact(kinds)
	assert.Equal(t, []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Namespace", "Role", "RoleBinding", "ServiceAccount",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}, kinds)
}

// checkClusterInfoRole: the IBM overlay's one grant in kube-system is get
// on the ConfigMap cluster-info, by name, bound to caa's ServiceAccount.
func checkClusterInfoRole(t *testing.T, o *unstructured.Unstructured) {
	switch o.GetKind() {
	case "Role":
		var role rbacv1.Role
		require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role))
		assert.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
			ResourceNames: []string{"cluster-info"}, Verbs: []string{"get"}}}, role.Rules)
	case "RoleBinding":
		var b rbacv1.RoleBinding
		require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b))
		assert.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: "caa", Namespace: namespace}}, b.Subjects)
		assert.Equal(t, "caa-cluster-info", b.RoleRef.Name)
	default:
		t.Errorf("%s caa-cluster-info in kube-system: only a Role and its RoleBinding belong there", o.GetKind())
	}
}

// findKeys walks any decoded object and returns the paths of the keys
// named, whatever their value: the checks above forbid the fields outright.
func findKeys(v any, names ...string) []string {
	var found []string
	var walk func(v any, path string)
	walk = func(v any, path string) {
		switch x := v.(type) {
		case map[string]any:
			for k, child := range x {
				if slices.Contains(names, k) {
					found = append(found, path+"."+k)
				}
				walk(child, path+"."+k)
			}
		case []any:
			for i, child := range x {
				walk(child, fmt.Sprintf("%s[%d]", path, i))
			}
		}
	}
	walk(v, "")
	return found
}

// checkUpdateStrategy: the default is a surge, one node at a time, that
// never takes a node's ready caa away before its successor is ready (the
// ledger goes from one to the other by the hand-over).
func checkUpdateStrategy(t *testing.T, ds *appsv1.DaemonSet) {
	s := ds.Spec.UpdateStrategy
	require.Equal(t, appsv1.RollingUpdateDaemonSetStrategyType, s.Type)
	require.NotNil(t, s.RollingUpdate)
	one, zero := intstr.FromInt32(1), intstr.FromInt32(0)
	assert.Equal(t, &zero, s.RollingUpdate.MaxUnavailable, "the old caa stays until the new one is ready")
	assert.Equal(t, &one, s.RollingUpdate.MaxSurge, "one node at a time, the new caa started beside the old")
	// Both pods of a surge run on the node at once: they may share the
	// hostPath (the hand-over needs it) but nothing that would clash.
	spec := ds.Spec.Template.Spec
	assert.False(t, spec.HostNetwork, "two caa pods on one node would clash on the host's ports")
	for _, p := range container(t, ds).Ports {
		assert.Zero(t, p.HostPort, "port %s: two caa pods on one node would clash on a hostPort", p.Name)
	}
}

// TestNoSurgeComponent renders every overlay with components/no-surge and
// checks that the component sets maxUnavailable 1 and maxSurge 0 and
// changes nothing else: every other object and every other field of the
// DaemonSet is the overlay's own.
func TestNoSurgeComponent(t *testing.T) {
	needBinaries(t)
	bin := kubectl(t)
	one, zero := intstr.FromInt32(1), intstr.FromInt32(0)
	for _, component := range components {
		for overlay := range providerOf {
			t.Run(overlay+"+"+component, func(t *testing.T) {
				plain := manifests{name: overlay, all: decode(t, render(t, bin, overlay))}
				with := manifests{name: overlay + "+" + component, all: decode(t, withComponent(t, bin, overlay, component))}
				ds := with.daemonSet(t)
				s := ds.Spec.UpdateStrategy
				require.Equal(t, appsv1.RollingUpdateDaemonSetStrategyType, s.Type)
				require.NotNil(t, s.RollingUpdate)
				assert.Equal(t, &one, s.RollingUpdate.MaxUnavailable, "no-surge: one node at a time")
				assert.Equal(t, &zero, s.RollingUpdate.MaxSurge, "no-surge: never two caa pods on a node")

				// The rest is untouched.
				want := plain.daemonSet(t)
				want.Spec.UpdateStrategy = ds.Spec.UpdateStrategy
				assert.Equal(t, want, ds, "the component changes only the update strategy")
				require.Len(t, with.all, len(plain.all))
				for i, o := range plain.all {
					if o.GetKind() == "DaemonSet" {
						continue
					}
					assert.Equal(t, o.Object, with.all[i].Object, "%s %s is the overlay's own", o.GetKind(), o.GetName())
				}
				// And it is a shape the other checks accept.
				checkPodShape(t, ds, with.configMap(t))
				checkLedgerVolume(t, ds)
				checkSecurity(t, ds)
			})
		}
	}
}

// container returns the caa container, the pod's only one.
func container(t *testing.T, ds *appsv1.DaemonSet) *corev1.Container {
	t.Helper()
	spec := &ds.Spec.Template.Spec
	require.Len(t, spec.Containers, 1)
	assert.Empty(t, spec.InitContainers)
	return &spec.Containers[0]
}

func checkPodShape(t *testing.T, ds *appsv1.DaemonSet, cm *corev1.ConfigMap) {
	spec := ds.Spec.Template.Spec
	c := container(t, ds)
	assert.Equal(t, "system-node-critical", spec.PriorityClassName)
	assert.Contains(t, spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists},
		"tolerates every taint, so it runs on every node that may host peer pods")
	assert.Equal(t, "caa", ds.Spec.Template.Labels["app.kubernetes.io/name"])
	assert.Equal(t, ds.Spec.Selector.MatchLabels, map[string]string{"app.kubernetes.io/name": "caa"})
	// Which build (the tag's cloud suffix) is memory_test.go's to check.
	assert.Regexp(t, `^caa:dev(-[a-z]+)?$`, c.Image, "the image is the kustomize placeholder caa:<tag>")
	assert.Equal(t, []string{"run"}, c.Args)

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	node := env["NODE_NAME"]
	require.NotNil(t, node.ValueFrom, "NODE_NAME comes from the downward API")
	require.NotNil(t, node.ValueFrom.FieldRef)
	assert.Equal(t, "spec.nodeName", node.ValueFrom.FieldRef.FieldPath)
	// The two caa of a hand-over name each other by their pods' names.
	podName := env["POD_NAME"]
	require.NotNil(t, podName.ValueFrom, "POD_NAME comes from the downward API")
	require.NotNil(t, podName.ValueFrom.FieldRef)
	assert.Equal(t, "metadata.name", podName.ValueFrom.FieldRef.FieldPath)
	assert.Equal(t, fmt.Sprintf(":%d", healthPort), env["CAA_HEALTH_ADDR"].Value, "caa listens where the probes knock")
	assert.Equal(t, ledgerDir+"/ledger.db", env["CAA_LEDGER"].Value)
	for k := range cm.Data {
		_, twice := env[k]
		assert.False(t, twice, "%s is set both in the ConfigMap and in the container's env", k)
	}
	require.NotEmpty(t, c.EnvFrom)
	require.NotNil(t, c.EnvFrom[0].ConfigMapRef)
	assert.Equal(t, cm.Name, c.EnvFrom[0].ConfigMapRef.Name, "the settings come from the rendered ConfigMap")

	// The pod must outlive caa's own shutdown grace.
	grace, err := time.ParseDuration(cm.Data["CAA_SHUTDOWN_GRACE"])
	require.NoError(t, err, "CAA_SHUTDOWN_GRACE")
	require.NotNil(t, spec.TerminationGracePeriodSeconds)
	assert.GreaterOrEqual(t, time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second, grace+graceMargin,
		"terminationGracePeriodSeconds leaves room after CAA_SHUTDOWN_GRACE=%s", grace)

	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		_, req := c.Resources.Requests[r]
		_, lim := c.Resources.Limits[r]
		assert.True(t, req && lim, "%s has a request and a limit", r)
	}
	// How much memory: memory_test.go, against the measured peaks.
}

func checkProbes(t *testing.T, ds *appsv1.DaemonSet) {
	c := container(t, ds)
	require.Len(t, c.Ports, 1)
	assert.Equal(t, corev1.ContainerPort{Name: healthPortName, ContainerPort: healthPort, Protocol: corev1.ProtocolTCP}, c.Ports[0])
	probes := map[string]struct {
		probe *corev1.Probe
		path  string
	}{
		"startup":   {c.StartupProbe, "/readyz"},
		"readiness": {c.ReadinessProbe, "/readyz"},
		"liveness":  {c.LivenessProbe, "/healthz"},
	}
	for name, p := range probes {
		require.NotNil(t, p.probe, "%s probe", name)
		require.NotNil(t, p.probe.HTTPGet, "%s probe is an httpGet", name)
		assert.Equal(t, p.path, p.probe.HTTPGet.Path, "%s probe path", name)
		assert.Equal(t, intstr.FromString(healthPortName), p.probe.HTTPGet.Port, "%s probe on the named port", name)
	}
	s := c.StartupProbe
	allowed := time.Duration(s.FailureThreshold*s.PeriodSeconds) * time.Second
	assert.GreaterOrEqual(t, allowed, minStartup, "the startup probe allows a cold start on a loaded node")
}

func checkSecurity(t *testing.T, ds *appsv1.DaemonSet) {
	spec := ds.Spec.Template.Spec
	c := container(t, ds)
	assert.False(t, spec.HostNetwork || spec.HostPID || spec.HostIPC)
	require.NotNil(t, spec.SecurityContext)
	require.NotNil(t, spec.SecurityContext.SeccompProfile)
	assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, spec.SecurityContext.SeccompProfile.Type)

	sc := c.SecurityContext
	require.NotNil(t, sc)
	require.NotNil(t, sc.ReadOnlyRootFilesystem)
	assert.True(t, *sc.ReadOnlyRootFilesystem)
	require.NotNil(t, sc.AllowPrivilegeEscalation)
	assert.False(t, *sc.AllowPrivilegeEscalation)
	assert.True(t, sc.Privileged == nil || !*sc.Privileged)
	require.NotNil(t, sc.Capabilities)
	assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	assert.Empty(t, sc.Capabilities.Add, "root in the pod holds no capability")
	if sc.SeccompProfile != nil {
		assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, sc.SeccompProfile.Type)
	}
}

func checkLedgerVolume(t *testing.T, ds *appsv1.DaemonSet) {
	spec := ds.Spec.Template.Spec
	c := container(t, ds)
	var hostPaths []corev1.Volume
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v)
		}
	}
	require.Len(t, hostPaths, 1, "the ledger directory is the only thing from the host")
	v := hostPaths[0]
	assert.Equal(t, ledgerDir, v.HostPath.Path)
	require.NotNil(t, v.HostPath.Type)
	assert.Equal(t, corev1.HostPathDirectoryOrCreate, *v.HostPath.Type)
	var mounts []string
	for _, m := range c.VolumeMounts {
		if m.Name == v.Name {
			mounts = append(mounts, m.MountPath)
			assert.False(t, m.ReadOnly, "caa writes its ledger")
		}
	}
	assert.Equal(t, []string{ledgerDir}, mounts)
}

// checkIdentity: the pod runs as the rendered ServiceAccount, which the
// binding ties to the rendered ClusterRole.
func checkIdentity(t *testing.T, m manifests, ds *appsv1.DaemonSet) {
	sa := m.one(t, "ServiceAccount")
	assert.Equal(t, sa.GetName(), ds.Spec.Template.Spec.ServiceAccountName)
	var binding rbacv1.ClusterRoleBinding
	require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructured(m.one(t, "ClusterRoleBinding").Object, &binding))
	assert.Equal(t, m.one(t, "ClusterRole").GetName(), binding.RoleRef.Name)
	assert.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.GetName(), Namespace: namespace}}, binding.Subjects)
}

// checkOverlay: the provider is set, the credentials come from the
// documented Secret, and the Secret's keys are the same in the example,
// the overlay's README and its kustomization comments.
func checkOverlay(t *testing.T, name, provider string, ds *appsv1.DaemonSet, cm *corev1.ConfigMap) {
	assert.Equal(t, provider, cm.Data["CAA_PROVIDER"])
	for k := range cm.Data {
		if cloudSetting.MatchString(k) {
			assert.True(t, strings.HasPrefix(k, "CAA_"+strings.ToUpper(provider)+"_"), "%s sets %s, another cloud's setting", name, k)
		}
	}
	c := container(t, ds)
	var secrets []string
	for _, from := range c.EnvFrom {
		if from.SecretRef != nil {
			secrets = append(secrets, from.SecretRef.Name)
			assert.True(t, from.SecretRef.Optional == nil || !*from.SecretRef.Optional,
				"a missing Secret stops the pod at start, where it is visible")
		}
	}
	assert.Equal(t, []string{secretName}, secrets, "credentials come from the one documented Secret")

	dir := filepath.Join(deployDir(t), name)
	raw, err := os.ReadFile(filepath.Join(dir, "secret.example.yaml"))
	require.NoError(t, err)
	var example corev1.Secret
	require.NoError(t, yaml.UnmarshalStrict(raw, &example))
	assert.Equal(t, secretName, example.Name)
	assert.Equal(t, namespace, example.Namespace)
	require.NotEmpty(t, example.StringData)
	docs := map[string][]byte{}
	for _, f := range []string{"README.md", "kustomization.yaml"} {
		docs[f], err = os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
	}
	for key, value := range example.StringData {
		assert.Equal(t, "REPLACE_ME", value, "the example holds placeholders only")
		for f, text := range docs {
			assert.Contains(t, string(text), key, "%s/%s documents the Secret key %s", name, f, key)
		}
	}
}

var cloudSetting = regexp.MustCompile(`^CAA_(AWS|AZURE|IBMCLOUD)_`)
