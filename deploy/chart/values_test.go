package chart_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/cli/values"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// recommended are Kubernetes' recommended labels, which every object of
// the chart carries.
var recommended = []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
	"app.kubernetes.io/component", "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by", "helm.sh/chart"}

// TestRecommendedLabels: every object of every setting, the Namespace,
// the Secret and the `helm test` objects included, carries the recommended
// labels, with the release, the chart and the image's version.
func TestRecommendedLabels(t *testing.T) {
	check := func(t *testing.T, name string, objs []*unstructured.Unstructured) {
		for _, o := range objs {
			l := o.GetLabels()
			for _, k := range recommended {
				assert.NotEmpty(t, l[k], "%s: %s %s has no %s", name, o.GetKind(), o.GetName(), k)
			}
			assert.Equal(t, "caa", l["app.kubernetes.io/part-of"], "%s: %s %s", name, o.GetKind(), o.GetName())
			assert.Equal(t, "caa", l["app.kubernetes.io/instance"], "%s: %s %s", name, o.GetKind(), o.GetName())
			assert.Equal(t, "Helm", l["app.kubernetes.io/managed-by"], "%s: %s %s", name, o.GetKind(), o.GetName())
			assert.Equal(t, "caa-0.2.0", l["helm.sh/chart"], "%s: %s %s", name, o.GetKind(), o.GetName())
		}
	}
	var kinds []string
	for _, s := range settings() {
		objs := decode(t, s.render(t))
		check(t, s.name, objs)
		for _, o := range objs {
			if !slices.Contains(kinds, o.GetKind()) {
				kinds = append(kinds, o.GetKind())
			}
		}
	}
	for _, k := range []string{"DaemonSet", "Deployment", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole", "Role"} {
		assert.Contains(t, kinds, k, "the settings render a %s", k)
	}
	rel, err := renderRelease("kube-system", values.Options{ValueFiles: []string{valuesFile("aws")}, Values: []string{
		"namespaceOverride=caa-system", "createNamespace=true", "credentials.create=true", "credentials.data.AWS_ACCESS_KEY_ID=x",
		"image.tag=v1.2.3-aws"}})
	require.NoError(t, err)
	objs := decode(t, []byte(rel.Manifest))
	require.NotNil(t, find(objs, "Namespace", "caa-system"))
	require.NotNil(t, find(objs, "Secret", "caa-cloud-credentials"))
	check(t, "namespace and secret", objs)
	assert.Equal(t, "v1.2.3-aws", find(objs, "DaemonSet", "caa").GetLabels()["app.kubernetes.io/version"])
	require.Len(t, rel.Hooks, 2, "helm test: a Service and a Pod")
	for _, h := range rel.Hooks {
		hook := decode(t, []byte(h.Manifest))
		check(t, "helm test", hook)
		// The DaemonSet would adopt a pod its selector matches.
		assert.Equal(t, "caa-test", hook[0].GetLabels()["app.kubernetes.io/name"], "%s is not one of caa's pods", h.Name)
	}
}

// TestChartValues checks what the conventional values do to the rendered
// objects: the release's namespace, the image (a digest, the pull policy,
// pull secrets), placement, pod labels and annotations, extra
// environment, and the credentials Secret named or made.
func TestChartValues(t *testing.T) {
	aws := []string{valuesFile("aws")}

	// Defaults: everything in the release's namespace, no Namespace, no
	// Secret (only named), Linux nodes, every taint tolerated.
	out, err := renderWith("caa-ops", values.Options{ValueFiles: aws})
	require.NoError(t, err)
	objs := decode(t, out)
	assert.Nil(t, find(objs, "Namespace", "caa-ops"), "no Namespace unless asked")
	assert.Nil(t, find(objs, "Secret", "caa-cloud-credentials"), "the Secret is the user's unless credentials.create")
	for _, o := range objs {
		if o.GetNamespace() != "" && o.GetName() != "caa-cluster-info" {
			assert.Equal(t, "caa-ops", o.GetNamespace(), "%s %s", o.GetKind(), o.GetName())
		}
	}
	ds := daemonSet(t, objs)
	pod := ds.Spec.Template.Spec
	assert.Equal(t, map[string]string{"kubernetes.io/os": "linux"}, pod.NodeSelector)
	assert.Equal(t, []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, pod.Tolerations)
	assert.Equal(t, corev1.PullIfNotPresent, pod.Containers[0].ImagePullPolicy)
	assert.Equal(t, "caa", ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"])
	policy := find(objs, "ValidatingAdmissionPolicyBinding", "caa-node-own-node")
	require.NotNil(t, policy)
	assert.Contains(t, string(out), "system:serviceaccount:caa-ops:caa", "the policies name caa's ServiceAccount in the release's namespace")

	// Everything set.
	objs = decode(t, mustRender(t, []string{valuesFile("aws"), valuesFile("kata"), valuesFile("cluster-scope")},
		"image.repository=registry.example.com/caa", "image.tag=v1.2.3-aws",
		"image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "image.pullPolicy=Always",
		"imagePullSecrets[0].name=regcred", "nodeSelector.pool=peerpods", "tolerations[0].key=peerpods", "tolerations[0].operator=Exists",
		"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
		"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
		"podLabels.team=infra", "podLabels.app\\.kubernetes\\.io/name=other", "podAnnotations.example\\.com/owner=infra",
		"extraEnv[0].name=HTTPS_PROXY", "extraEnv[0].value=http://proxy:3128",
		"credentials.secretName=cloud", "credentials.create=true", "credentials.data.AWS_ACCESS_KEY_ID=AKIA", "credentials.data.AWS_SECRET_ACCESS_KEY=s"))
	image := "registry.example.com/caa:v1.2.3-aws@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	secret := find(objs, "Secret", "cloud")
	require.NotNil(t, secret, "credentials.create makes the Secret")
	data, _, _ := unstructured.NestedStringMap(secret.Object, "stringData")
	assert.Equal(t, map[string]string{"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s"}, data)
	for _, w := range []struct{ kind, name string }{{"DaemonSet", "caa"}, {"DaemonSet", "caa-relay"}, {"Deployment", "caa-cluster"}} {
		o := find(objs, w.kind, w.name)
		require.NotNil(t, o, "%s %s", w.kind, w.name)
		var tmpl corev1.PodTemplateSpec
		m, _, _ := unstructured.NestedMap(o.Object, "spec", "template")
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(m, &tmpl, true))
		sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
		assert.Equal(t, sel["app.kubernetes.io/name"], tmpl.Labels["app.kubernetes.io/name"], "%s: podLabels cannot move the pods off the selector", w.name)
		assert.Equal(t, "infra", tmpl.Labels["team"], w.name)
		assert.Equal(t, "infra", tmpl.Annotations["example.com/owner"], w.name)
		assert.Equal(t, []corev1.LocalObjectReference{{Name: "regcred"}}, tmpl.Spec.ImagePullSecrets, w.name)
		assert.Equal(t, "peerpods", tmpl.Spec.NodeSelector["pool"], w.name)
		ctr := tmpl.Spec.Containers[0]
		assert.Equal(t, image, ctr.Image, w.name)
		assert.Equal(t, corev1.PullAlways, ctr.ImagePullPolicy, w.name)
		if w.kind == "DaemonSet" {
			assert.Equal(t, []corev1.Toleration{{Key: "peerpods", Operator: corev1.TolerationOpExists}}, tmpl.Spec.Tolerations, w.name)
			require.NotNil(t, tmpl.Spec.Affinity, w.name)
			assert.Equal(t, "pool", tmpl.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key)
		}
		if ctr.Name == "caa" {
			assert.Contains(t, ctr.Env, envVar("HTTPS_PROXY", "http://proxy:3128"), w.name)
			var refs []string
			for _, e := range ctr.EnvFrom {
				if e.SecretRef != nil {
					refs = append(refs, e.SecretRef.Name)
				}
			}
			assert.Equal(t, []string{"cloud"}, refs, "%s reads credentials.secretName", w.name)
		}
	}
}

// TestNotes: the release's notes tell the next steps for the values given:
// the Pod Security label, the Secret to create (with the cloud's keys) when
// the chart does not make it, the rollout and the test or status to check.
func TestNotes(t *testing.T) {
	notes := func(files []string, sets ...string) string {
		t.Helper()
		rel, err := renderRelease("caa-ops", values.Options{ValueFiles: files, Values: sets})
		require.NoError(t, err)
		return rel.Info.Notes
	}
	n := notes([]string{valuesFile("aws")})
	assert.Contains(t, n, "kubectl label namespace caa-ops pod-security.kubernetes.io/enforce=privileged")
	assert.Contains(t, n, "kubectl -n caa-ops create secret generic caa-cloud-credentials")
	assert.Contains(t, n, "--from-literal=AWS_ACCESS_KEY_ID=")
	assert.Contains(t, n, "kubectl -n caa-ops rollout status daemonset/caa")
	assert.Contains(t, n, "helm test caa -n caa-ops")
	assert.Contains(t, n, "runtimeClassName kata-remote")

	n = notes([]string{valuesFile("ibmcloud")}, "credentials.create=true", "credentials.data.IBMCLOUD_API_KEY=x")
	assert.NotContains(t, n, "create secret", "the chart made the Secret")
	n = notes([]string{valuesFile("azure"), valuesFile("kata")}, "identity.route=azure-managed-identity")
	assert.NotContains(t, n, "create secret", "a keyless route reads no Secret")
	assert.NotContains(t, n, "helm test", "no test in the hypervisor mode")
	assert.Contains(t, n, "kubectl -n caa-ops exec daemonset/caa -- caa status")
	n = notes([]string{valuesFile("aws")}, "namespaceOverride=caa-system", "createNamespace=true")
	assert.NotContains(t, n, "kubectl label namespace", "the chart's Namespace has the label")
}
