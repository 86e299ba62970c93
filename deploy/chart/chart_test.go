package chart_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/cli/values"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// setting is one way to install the chart, and the kustomize tree's way to
// the same objects: an overlay under deploy/ and its components.
type setting struct {
	name       string
	files      []string // the chart's values files, by short name
	sets       []string // --set
	overlay    string
	components []string
}

// settings are the installs the tests render: each cloud alone, each
// identity route, each mode, and everything at once.
func settings() []setting {
	var out []setting
	for _, c := range clouds {
		out = append(out,
			setting{name: c, files: []string{c}, overlay: "overlays/" + c},
			setting{name: c + "+no-surge", files: []string{c}, sets: []string{"surge=false"},
				overlay: "overlays/" + c, components: []string{"components/no-surge"}},
			setting{name: c + "+kata", files: []string{c, "kata"}, overlay: "overlays/" + c,
				components: []string{"components/kata-remote-hypervisor", "components/relay"}},
			setting{name: c + "+kata+no-surge", files: []string{c, "kata"}, sets: []string{"surge=false"}, overlay: "overlays/" + c,
				components: []string{"components/no-surge", "components/kata-remote-hypervisor", "components/relay"}},
			setting{name: c + "+cluster-scope", files: []string{c, "cluster-scope"}, overlay: "overlays/" + c,
				components: []string{"components/cluster-scope"}},
		)
	}
	return append(out,
		setting{name: "aws-pod-identity", files: []string{"aws"}, sets: []string{"identity.route=aws-pod-identity"},
			overlay: "overlays/aws-pod-identity"},
		setting{name: "aws-irsa", files: []string{"aws"},
			sets:    []string{"identity.route=aws-irsa", "identity.awsRoleArn=arn:aws:iam::111122223333:role/REPLACE_ME"},
			overlay: "overlays/aws-irsa"},
		setting{name: "azure-workload-identity", files: []string{"azure"},
			sets:    []string{"identity.route=azure-workload-identity", "identity.azureClientId=REPLACE_ME"},
			overlay: "overlays/azure-workload-identity"},
		setting{name: "ibmcloud-trusted-profile", files: []string{"ibmcloud"},
			sets:    []string{"identity.route=ibmcloud-trusted-profile", "identity.ibmcloudProfileId=REPLACE_ME"},
			overlay: "overlays/ibmcloud-trusted-profile"},
		setting{name: "aws+kata+cluster-scope", files: []string{"aws", "kata", "cluster-scope"}, overlay: "overlays/aws",
			components: []string{"components/kata-remote-hypervisor", "components/relay", "components/cluster-scope"}},
		// No overlay: caa reading the adaptor's ConfigMap and Secret.
		setting{name: "aws+adaptor", files: []string{"aws", "adaptor"}},
		// The cluster scope on each keyless route and with the adaptor's
		// settings (cluster_scope_test.go).
		setting{name: "aws-irsa+cluster-scope", files: []string{"aws", "cluster-scope"},
			sets:    []string{"identity.route=aws-irsa", "identity.awsRoleArn=arn:aws:iam::111122223333:role/REPLACE_ME"},
			overlay: "overlays/aws-irsa", components: []string{"components/cluster-scope", "components/cluster-scope-aws-irsa"}},
		setting{name: "azure-workload-identity+cluster-scope", files: []string{"azure", "cluster-scope"},
			sets:    []string{"identity.route=azure-workload-identity", "identity.azureClientId=REPLACE_ME"},
			overlay: "overlays/azure-workload-identity", components: []string{"components/cluster-scope", "components/cluster-scope-azure-workload-identity"}},
		setting{name: "ibmcloud-trusted-profile+cluster-scope", files: []string{"ibmcloud", "cluster-scope"},
			sets:    []string{"identity.route=ibmcloud-trusted-profile", "identity.ibmcloudProfileId=REPLACE_ME"},
			overlay: "overlays/ibmcloud-trusted-profile", components: []string{"components/cluster-scope", "components/cluster-scope-ibmcloud-trusted-profile"}},
		setting{name: "aws+adaptor+cluster-scope", files: []string{"aws", "adaptor", "cluster-scope"}},
		// No overlay: the nodes' managed identity is overlays/azure without
		// its Secret patch, which the kustomize tree leaves to the user.
		setting{name: "azure-managed-identity", files: []string{"azure"}, sets: []string{"identity.route=azure-managed-identity"}},
	)
}

func (s setting) render(t *testing.T, more ...string) []byte {
	t.Helper()
	files := make([]string, len(s.files))
	for i, f := range s.files {
		files[i] = valuesFile(f)
	}
	return mustRender(t, files, append(slices.Clone(s.sets), more...)...)
}

// TestEveryValuesFileRenders renders every install of settings() with
// Helm's SDK and checks that each values-*.yaml of the chart is among them,
// so a values file added later cannot go unrendered.
func TestEveryValuesFileRenders(t *testing.T) {
	used := map[string]bool{}
	for _, s := range settings() {
		objs := decode(t, s.render(t))
		ds := find(objs, "DaemonSet", "caa")
		require.NotNil(t, ds, "%s renders the DaemonSet caa", s.name)
		for _, f := range s.files {
			used[valuesFile(f)] = true
		}
	}
	files, err := filepath.Glob(filepath.Join(chartDir, "values-*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		assert.True(t, used[f], "%s is rendered by no test setting: add it to settings()", f)
	}
}

// TestChartSettings checks what each values file decides in the rendered
// DaemonSet: the cloud's image and memory, the update strategy, and the
// Secret only on the route that reads it.
func TestChartSettings(t *testing.T) {
	memory := map[string][2]string{"aws": {"88Mi", "264Mi"}, "azure": {"112Mi", "336Mi"}, "ibmcloud": {"120Mi", "360Mi"}}
	for _, c := range clouds {
		ds := daemonSet(t, decode(t, mustRender(t, []string{valuesFile(c)})))
		ctr := ds.Spec.Template.Spec.Containers[0]
		assert.Equal(t, "ghcr.io/caa-project/caa:dev-"+c, ctr.Image, "%s: the one-cloud image, <appVersion>-<cloud>", c)
		assert.Equal(t, memory[c][0], ctr.Resources.Requests.Memory().String(), "%s: memory request", c)
		assert.Equal(t, memory[c][1], ctr.Resources.Limits.Memory().String(), "%s: memory limit", c)
		assert.Equal(t, 1, ds.Spec.UpdateStrategy.RollingUpdate.MaxSurge.IntValue(), "%s: surge by default", c)
		require.Len(t, ctr.EnvFrom, 2)
		assert.Equal(t, "caa-cloud-credentials", ctr.EnvFrom[1].SecretRef.Name)
		assert.Equal(t, releaseNamespace, ds.Namespace, "%s: in the release's namespace", c)
		assert.NotEmpty(t, ds.Spec.Template.Annotations["checksum/config"])
	}
	ds := daemonSet(t, decode(t, mustRender(t, []string{valuesFile("aws")}, "image.repository=registry.example.com/caa", "image.tag=v1.2.3-aws")))
	assert.Equal(t, "registry.example.com/caa:v1.2.3-aws", ds.Spec.Template.Spec.Containers[0].Image)

	// A changed setting changes the pod template (the checksum), so the
	// DaemonSet rolls as kustomize's hashed ConfigMap name makes it.
	a := daemonSet(t, decode(t, mustRender(t, []string{valuesFile("aws")})))
	b := daemonSet(t, decode(t, mustRender(t, []string{valuesFile("aws")}, "settings.CAA_RESYNC=2m")))
	assert.NotEqual(t, a.Spec.Template.Annotations["checksum/config"], b.Spec.Template.Annotations["checksum/config"])

	// The pull secrets are read as the node, with its kubelet's files
	// mounted read-only; hypervisor.pullSecrets=false mounts nothing and
	// tells caa so. caa's own token reads no secret either way.
	objs := decode(t, mustRender(t, []string{valuesFile("aws"), valuesFile("kata")}, "hypervisor.pullSecrets=false"))
	assert.Contains(t, daemonSet(t, objs).Spec.Template.Spec.Containers[0].Env, envVar("CAA_PULL_SECRETS", "false"))
	for _, v := range daemonSet(t, objs).Spec.Template.Spec.Volumes {
		assert.NotContains(t, v.Name, "kubelet", "pullSecrets=false mounts no kubelet file")
	}
	objs = decode(t, mustRender(t, []string{valuesFile("aws"), valuesFile("kata")}, "hypervisor.kubeletKubeconfig=/etc/kubernetes/kubelet.conf"))
	assert.Nil(t, find(objs, "ClusterRole", "caa-pull-secrets"))
	ctr0 := daemonSet(t, objs).Spec.Template.Spec.Containers[0]
	assert.Contains(t, ctr0.Env, envVar("CAA_PULL_SECRETS_KUBECONFIG", "/etc/kubernetes/kubelet.conf"))
	mounted := map[string]bool{}
	for _, m := range ctr0.VolumeMounts {
		mounted[m.MountPath] = m.ReadOnly
	}
	assert.Equal(t, map[string]bool{"/etc/kubernetes/kubelet.conf": true, "/var/lib/kubelet/pki": true},
		map[string]bool{"/etc/kubernetes/kubelet.conf": mounted["/etc/kubernetes/kubelet.conf"], "/var/lib/kubelet/pki": mounted["/var/lib/kubelet/pki"]})

	// The admission policies come with every install, the cluster scope
	// or not (issue 42.2); the cluster caa runs on control-plane nodes
	// unless told otherwise.
	for _, files := range [][]string{{valuesFile("aws")}, {valuesFile("aws"), valuesFile("cluster-scope")}} {
		objs := decode(t, mustRender(t, files))
		for _, p := range []string{"caa-node-own-node", "caa-node-events", "caa-cluster-view-only", "caa-cloud-view-writer"} {
			assert.NotNil(t, find(objs, "ValidatingAdmissionPolicy", p), "%v: %s", files, p)
			assert.NotNil(t, find(objs, "ValidatingAdmissionPolicyBinding", p), "%v: %s", files, p)
		}
	}
	dep := find(decode(t, mustRender(t, []string{valuesFile("aws"), valuesFile("cluster-scope")})), "Deployment", "caa-cluster")
	require.NotNil(t, dep)
	terms, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "affinity", "nodeAffinity",
		"requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
	assert.Contains(t, fmt.Sprint(terms), "node-role.kubernetes.io/control-plane", "the cluster caa only on control-plane nodes")
	dep = find(decode(t, mustRender(t, []string{valuesFile("aws"), valuesFile("cluster-scope")}, "clusterScope.controlPlaneOnly=false")), "Deployment", "caa-cluster")
	require.NotNil(t, dep)
	_, found, _ := unstructured.NestedMap(dep.Object, "spec", "template", "spec", "affinity", "nodeAffinity")
	assert.False(t, found, "clusterScope.controlPlaneOnly=false: no node affinity")

	// The adaptor's ConfigMap and Secret: mounted, named to caa, and the
	// cloud settings of values-aws.yaml (placeholders) left out, since a
	// CAA_* variable would win over the adaptor's key.
	objs = decode(t, mustRender(t, []string{valuesFile("aws"), valuesFile("adaptor")}))
	ds = daemonSet(t, objs)
	ctr := ds.Spec.Template.Spec.Containers[0]
	assert.Contains(t, ctr.Env, envVar("CAA_ADAPTOR_CONFIG_DIR", "/etc/peer-pods/cm,/etc/peer-pods/secret"))
	require.Len(t, ctr.EnvFrom, 1, "no caa-cloud-credentials: the adaptor's Secret holds the credentials")
	var vols []string
	for _, v := range ds.Spec.Template.Spec.Volumes {
		switch {
		case v.ConfigMap != nil:
			vols = append(vols, "cm:"+v.ConfigMap.Name)
		case v.Secret != nil:
			vols = append(vols, "secret:"+v.Secret.SecretName)
		}
	}
	assert.Equal(t, []string{"cm:peer-pods-cm", "secret:peer-pods-secret"}, vols)
	cm := find(objs, "ConfigMap", "caa-config")
	require.NotNil(t, cm)
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	assert.Equal(t, "aws", data["CAA_PROVIDER"])
	for k := range data {
		assert.False(t, strings.HasPrefix(k, "CAA_AWS_"), "%s would win over the adaptor's key", k)
	}
}

// TestChartRefusesBadValues: values that cannot work stop the render with a
// message naming the value and the fix, rather than installing a caa that
// fails on the nodes.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		sets  []string
		want  string
	}{
		{"no cloud", nil, nil, `cloud="": set cloud to aws, azure or ibmcloud`},
		{"unknown cloud", nil, []string{"cloud=gcp"}, `cloud="gcp"`},
		{"unknown route", []string{"aws"}, []string{"identity.route=keyless"}, `identity.route="keyless": use one of`},
		{"another cloud's route", []string{"aws"}, []string{"identity.route=azure-workload-identity", "identity.azureClientId=x"},
			"identity.route=azure-workload-identity is a route of cloud azure, not of cloud=aws"},
		{"irsa without a role", []string{"aws"}, []string{"identity.route=aws-irsa"}, "needs identity.awsRoleArn"},
		{"workload identity without a client", []string{"azure"}, []string{"identity.route=azure-workload-identity"}, "needs identity.azureClientId"},
		{"trusted profile without a profile", []string{"ibmcloud"}, []string{"identity.route=ibmcloud-trusted-profile"}, "needs identity.ibmcloudProfileId"},
		{"a relative kubelet kubeconfig", []string{"aws", "kata"}, []string{"hypervisor.kubeletKubeconfig=kubeconfig"},
			`hypervisor.kubeletKubeconfig="kubeconfig": give the host path`},
		{"relay without the hypervisor", []string{"aws"}, []string{"relay.enabled=true"}, "relay.enabled=true needs hypervisor.enabled=true"},
		{"another cloud's setting", []string{"aws"}, []string{"cloudSettings.CAA_AZURE_LOCATION=westeurope"},
			"cloudSettings.CAA_AZURE_LOCATION is not a setting of cloud=aws"},
		{"the provider as a cloud setting", []string{"aws"}, []string{"cloudSettings.CAA_PROVIDER=azure"}, "cloud sets CAA_PROVIDER"},
		{"the adaptor's settings without the hypervisor", []string{"aws"}, []string{"adaptorConfig.enabled=true"},
			"adaptorConfig.enabled=true needs hypervisor.enabled=true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var files []string
			for _, f := range tc.files {
				files = append(files, valuesFile(f))
			}
			_, err := renderChart(files, tc.sets...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// A boolean given as a string ("false" is true to a template) is refused.
	ch := []string{valuesFile("aws")}
	_, err := renderChartStrings(ch, "surge=false")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "at '/surge': got string, want boolean")
}

// TestChartMatchesKustomize renders each setting both ways, the chart with
// Helm's SDK and deploy/ with kubectl kustomize, and compares every object
// field for field: the same kinds and names, the same containers (args,
// images, env, probes, resources, security), the same RBAC and policies.
// Only kustomize's hashed ConfigMap name and the chart's checksum
// annotation differ, by design (normalize).
func TestChartMatchesKustomize(t *testing.T) {
	bin := kubectl(t)
	for _, s := range settings() {
		if s.overlay == "" {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			// The kustomize tree's placeholder image, and its objects but
			// the Namespace, which a release into caa-system does not make.
			chart := normalize(t, decode(t, s.render(t, "image.repository=caa")))
			all := decode(t, kustomize(t, bin, s.overlay, s.components...))
			kust := normalize(t, slices.DeleteFunc(slices.Clone(all), func(o *unstructured.Unstructured) bool { return o.GetKind() == "Namespace" }))
			require.Equal(t, kinds(kust), kinds(chart), "the same objects")
			for i := range kust {
				assert.Equal(t, kust[i], chart[i])
			}
			// Asked for, the chart makes the same Namespace as deploy/base,
			// for objects outside the release's namespace.
			files := make([]string, len(s.files))
			for i, f := range s.files {
				files[i] = valuesFile(f)
			}
			out, err := renderWith("kube-system", values.Options{ValueFiles: files,
				Values: append(slices.Clone(s.sets), "image.repository=caa", "namespaceOverride=caa-system", "createNamespace=true")})
			require.NoError(t, err)
			assert.Equal(t, normalize(t, all), normalize(t, decode(t, out)), "with createNamespace, every object")
		})
	}
}

// TestChartOnTheAPIServer applies every setting's render server-side with
// a dry run on a real kube-apiserver: schema, defaulting, the policies'
// CEL compiled, admission. Then a broken render is refused, so the dry run
// does judge.
func TestChartOnTheAPIServer(t *testing.T) {
	bin := kubectl(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)
	// A dry run creates nothing, so the namespaced objects would find no
	// namespace; a real install has it first.
	require.NoError(t, c.EnsureNamespace(ctx, "caa-system"))
	apply := func(rendered []byte) ([]byte, error) {
		return runKubectl(ctx, bin, rendered, "--kubeconfig", c.Kubeconfig(),
			"apply", "--server-side", "--dry-run=server", "--field-manager=caa-chart-test", "-f", "-")
	}
	for _, s := range settings() {
		out, err := apply(s.render(t))
		require.NoError(t, err, "%s is refused by the apiserver", s.name)
		for _, o := range decode(t, s.render(t)) {
			assert.Contains(t, string(out), strings.ToLower(o.GetKind()), "%s: %s applied", s.name, o.GetKind())
		}
		assert.Contains(t, string(out), "daemonset.apps/caa serverside-applied (server dry run)", s.name)
	}
	aws := string(mustRender(t, []string{valuesFile("aws")}))
	require.Contains(t, aws, "maxSurge: 1")
	_, err := apply([]byte(strings.Replace(aws, "maxSurge: 1", "maxSurge: 0", 1)))
	require.Error(t, err, "the dry run accepted a DaemonSet whose rollout cannot progress")
	assert.Contains(t, err.Error(), "maxUnavailable")
}

func kinds(objs []string) []string {
	out := make([]string, len(objs))
	for i, o := range objs {
		out[i], _, _ = strings.Cut(o, "\n")
	}
	return out
}

func daemonSet(t *testing.T, objs []*unstructured.Unstructured) *appsv1.DaemonSet {
	t.Helper()
	o := find(objs, "DaemonSet", "caa")
	require.NotNil(t, o)
	var ds appsv1.DaemonSet
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &ds, true))
	return &ds
}

func envVar(name, value string) corev1.EnvVar { return corev1.EnvVar{Name: name, Value: value} }
