package deploy_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
)

const clusterScope = "components/cluster-scope"

// TestClusterScopeComponent renders the cluster-scope component on every
// overlay: two replicas of `caa cluster` from the overlay's image and
// settings, spread over nodes, and a role that reads Nodes (patching only
// their annotation in code), the Lease and its events, and nothing else.
func TestClusterScopeComponent(t *testing.T) {
	needBinaries(t)
	bin := kubectl(t)
	for overlay := range providerOf {
		t.Run(overlay, func(t *testing.T) {
			plain := manifests{name: overlay, all: decode(t, render(t, bin, overlay))}
			with := manifests{name: overlay + "+cluster-scope", all: decode(t, withComponent(t, bin, overlay, clusterScope))}
			ds := plain.daemonSet(t)
			// The DaemonSet is untouched but for its settings' name: the
			// component turns CAA_CLUSTER_VIEW on (a node reads views only
			// where the cluster scope writes them).
			withDS := with.daemonSet(t)
			assert.Equal(t, with.configMap(t).Name, withDS.Spec.Template.Spec.Containers[0].EnvFrom[0].ConfigMapRef.Name)
			withDS.Spec.Template.Spec.Containers[0].EnvFrom[0].ConfigMapRef.Name = ds.Spec.Template.Spec.Containers[0].EnvFrom[0].ConfigMapRef.Name
			assert.Equal(t, ds, withDS, "the DaemonSet is untouched but for its settings' hashed name")
			assert.Equal(t, "true", with.configMap(t).Data["CAA_CLUSTER_VIEW"], "the nodes audit against the view")
			assert.NotContains(t, plain.configMap(t).Data, "CAA_CLUSTER_VIEW", "off without the cluster scope")

			var dep appsv1.Deployment
			require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(with.one(t, "Deployment").Object, &dep, true))
			assert.Equal(t, "caa-cluster", dep.Name)
			assert.Equal(t, "caa-system", dep.Namespace)
			require.NotNil(t, dep.Spec.Replicas)
			assert.Equal(t, int32(2), *dep.Spec.Replicas, "a leader and a stand-by")
			pod := dep.Spec.Template.Spec
			assert.Equal(t, "caa-cluster", pod.ServiceAccountName)
			require.Len(t, pod.Containers, 1)
			c := pod.Containers[0]
			assert.Equal(t, []string{"cluster"}, c.Args)
			assert.Equal(t, ds.Spec.Template.Spec.Containers[0].Image, c.Image, "the overlay's image")
			cm := with.configMap(t)
			require.NotEmpty(t, c.EnvFrom)
			require.NotNil(t, c.EnvFrom[0].ConfigMapRef)
			assert.Equal(t, cm.Name, c.EnvFrom[0].ConfigMapRef.Name, "the overlay's settings, hashed name and all")
			assert.True(t, strings.HasPrefix(cm.Name, "caa-config-"))
			require.NotNil(t, c.SecurityContext)
			assert.Equal(t, false, *c.SecurityContext.AllowPrivilegeEscalation)
			assert.Equal(t, true, *c.SecurityContext.ReadOnlyRootFilesystem)
			require.NotNil(t, pod.Affinity, "replicas spread over nodes")
			// Control-plane nodes only (issue 42.3): a worker's root could
			// take this token.
			require.NotNil(t, pod.Affinity.NodeAffinity)
			require.NotNil(t, pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
			assert.Equal(t, []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.NodeSelectorOpExists}}}},
				pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms)
			assert.Contains(t, pod.Tolerations, corev1.Toleration{Key: "node-role.kubernetes.io/control-plane",
				Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
			// The admission policies come with every install, not with
			// this component (issue 42.2).
			var policies []string
			for _, o := range plain.ofKind("ValidatingAdmissionPolicy") {
				policies = append(policies, o.GetName())
			}
			assert.ElementsMatch(t, []string{"caa-node-own-node", "caa-node-events", "caa-cluster-view-only", "caa-cloud-view-writer"}, policies,
				"the overlay alone has the policies")
			assert.Len(t, with.ofKind("ValidatingAdmissionPolicy"), 4, "the component adds none of its own")

			var verbs []string
			for _, kind := range []string{"ClusterRole", "Role"} {
				for _, o := range with.ofKind(kind) {
					if o.GetName() != "caa-cluster" {
						continue
					}
					var role rbacv1.ClusterRole
					require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role))
					for _, r := range role.Rules {
						for _, res := range r.Resources {
							for _, v := range r.Verbs {
								verbs = append(verbs, kind+" "+res+" "+v+" "+strings.Join(r.ResourceNames, ","))
							}
						}
					}
				}
			}
			assert.ElementsMatch(t, []string{
				"ClusterRole nodes get ", "ClusterRole nodes list ", "ClusterRole nodes watch ", "ClusterRole nodes patch ",
				"ClusterRole namespaces get kube-system",
				"Role leases create ", "Role leases get caa-cluster", "Role leases update caa-cluster",
				"Role events create ", "Role events patch ",
				"Role configmaps create ", "Role configmaps get caa-cluster-nodes", "Role configmaps update caa-cluster-nodes",
			}, verbs, "the cluster caa's RBAC, and nothing more")
		})
	}
}

// keylessRoutes are the overlays whose cloud identity is not a Secret, and
// what of caa's pod and ServiceAccount makes it: caa-cluster must carry
// the same on each.
var keylessRoutes = []struct {
	overlay     string
	annotations []string // the ServiceAccount's
	podLabels   []string
	env         []string // the container's, with a projected token volume
}{
	{overlay: "aws-irsa", annotations: []string{"eks.amazonaws.com/role-arn"}},
	{overlay: "azure-workload-identity", annotations: []string{"azure.workload.identity/client-id"}, podLabels: []string{"azure.workload.identity/use"}},
	{overlay: "ibmcloud-trusted-profile", env: []string{"IBMCLOUD_AUTH_TYPE", "IBMCLOUD_IAM_PROFILE_ID", "IBMCLOUD_CR_TOKEN_FILENAME"}},
}

// TestClusterScopeGetsTheKeylessIdentity: on each keyless route, the
// cluster scope with its route's component gives caa-cluster caa's cloud
// identity, copied from caa's objects (one place to write the role, the
// client id or the profile): the ServiceAccount's annotation, the pod's
// label, the variables and the projected token. The cluster scope alone
// gives it none, which is why the route's component exists.
func TestClusterScopeGetsTheKeylessIdentity(t *testing.T) {
	needBinaries(t)
	bin := kubectl(t)
	for _, r := range keylessRoutes {
		t.Run(r.overlay, func(t *testing.T) {
			overlay := "overlays/" + r.overlay
			all := decode(t, withComponentList(t, bin, overlay, clusterScope, "components/cluster-scope-"+r.overlay))
			sa := map[string]*corev1.ServiceAccount{}
			var ds appsv1.DaemonSet
			var dep appsv1.Deployment
			for _, o := range all {
				switch o.GetKind() {
				case "ServiceAccount":
					var s corev1.ServiceAccount
					require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &s))
					sa[s.Name] = &s
				case "DaemonSet":
					require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds))
				case "Deployment":
					require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &dep))
				}
			}
			require.Contains(t, sa, "caa")
			require.Contains(t, sa, "caa-cluster")
			for _, a := range r.annotations {
				require.NotEmpty(t, sa["caa"].Annotations[a], "the overlay sets %s", a)
				assert.Equal(t, sa["caa"].Annotations[a], sa["caa-cluster"].Annotations[a], "caa-cluster's %s is caa's", a)
			}
			for _, l := range r.podLabels {
				require.NotEmpty(t, ds.Spec.Template.Labels[l])
				assert.Equal(t, ds.Spec.Template.Labels[l], dep.Spec.Template.Labels[l], "caa-cluster's pods carry %s", l)
			}
			if len(r.env) > 0 {
				envOf := func(c corev1.Container) map[string]string {
					out := map[string]string{}
					for _, e := range c.Env {
						out[e.Name] = e.Value
					}
					return out
				}
				dsEnv, depEnv := envOf(ds.Spec.Template.Spec.Containers[0]), envOf(dep.Spec.Template.Spec.Containers[0])
				for _, e := range r.env {
					require.NotEmpty(t, dsEnv[e])
					assert.Equal(t, dsEnv[e], depEnv[e], "caa-cluster's %s is caa's", e)
				}
				token := func(vols []corev1.Volume) *corev1.ProjectedVolumeSource {
					for _, v := range vols {
						if v.Projected != nil {
							return v.Projected
						}
					}
					return nil
				}
				require.NotNil(t, token(ds.Spec.Template.Spec.Volumes))
				assert.Equal(t, token(ds.Spec.Template.Spec.Volumes), token(dep.Spec.Template.Spec.Volumes), "the same projected token, its own")
				mount := func(c corev1.Container) []corev1.VolumeMount {
					var out []corev1.VolumeMount
					for _, m := range c.VolumeMounts {
						if m.Name == "iam-token" {
							out = append(out, m)
						}
					}
					return out
				}
				assert.Equal(t, mount(ds.Spec.Template.Spec.Containers[0]), mount(dep.Spec.Template.Spec.Containers[0]))
			}

			// The cluster scope alone leaves caa-cluster without it.
			alone := manifests{name: overlay, all: decode(t, withComponent(t, bin, overlay, clusterScope))}
			for _, o := range alone.ofKind("ServiceAccount") {
				if o.GetName() == "caa-cluster" {
					for _, a := range r.annotations {
						assert.NotContains(t, o.GetAnnotations(), a)
					}
				}
			}
		})
	}
}
