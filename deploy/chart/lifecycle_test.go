package chart_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// helmOn drives Helm's SDK against the test cluster, as the helm CLI does
// with -n ns.
type helmOn struct {
	t     *testing.T
	c     *cluster.Cluster
	chart *chart.Chart
}

func (h helmOn) config(ns string) *action.Configuration {
	h.t.Helper()
	kubeconfig := h.c.Kubeconfig()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &kubeconfig, &ns
	cfg := new(action.Configuration)
	require.NoError(h.t, cfg.Init(flags, ns, "secret", func(string, ...any) {}))
	return cfg
}

func (h helmOn) values(sets ...string) map[string]any {
	h.t.Helper()
	opts := values.Options{ValueFiles: []string{valuesFile("aws")}, Values: sets}
	vals, err := opts.MergeValues(getter.Providers{})
	require.NoError(h.t, err)
	return vals
}

// install is `helm install caa -n ns [--create-namespace] -f values-aws.yaml --set sets...`.
func (h helmOn) install(ns string, createNamespace bool, sets ...string) (*release.Release, error) {
	in := action.NewInstall(h.config(ns))
	in.ReleaseName, in.Namespace, in.CreateNamespace = "caa", ns, createNamespace
	return in.Run(h.chart, h.values(sets...))
}

// install010 installs the release as chart 0.1.0 left it: the objects in
// the namespace objNS, which the release owned and `helm upgrade` or
// `helm uninstall` deleted (no resource policy). That is this chart with
// namespaceOverride and createNamespace, less the Namespace's keep policy.
func (h helmOn) install010(ns, objNS string) *release.Release {
	h.t.Helper()
	in := action.NewInstall(h.config(ns))
	in.ReleaseName, in.Namespace = "caa", ns
	in.PostRenderer = noKeep{}
	rel, err := in.Run(h.chart, h.values("namespaceOverride="+objNS, "createNamespace=true"))
	require.NoError(h.t, err)
	require.NotContains(h.t, rel.Manifest, "helm.sh/resource-policy")
	return rel
}

func (h helmOn) upgrade(ns string, sets ...string) (*release.Release, error) {
	up := action.NewUpgrade(h.config(ns))
	up.Namespace = ns
	return up.Run("caa", h.chart, h.values(sets...))
}

func (h helmOn) uninstall(ns string) {
	h.t.Helper()
	_, err := action.NewUninstall(h.config(ns)).Run("caa")
	require.NoError(h.t, err, "helm uninstall -n %s", ns)
}

// noKeep is a post-renderer that drops the Namespace's keep policy.
type noKeep struct{}

func (noKeep) Run(in *bytes.Buffer) (*bytes.Buffer, error) {
	return bytes.NewBufferString(strings.ReplaceAll(in.String(), "helm.sh/resource-policy: keep", "chart-version: 0.1.0")), nil
}

// TestChartLifecycle installs, upgrades and uninstalls the chart with
// Helm's SDK on a real kube-apiserver, the ways an operator does: into a
// namespace Helm creates, into one that holds the credentials Secret
// already, with a Namespace of its own, and upgrading a release of chart
// 0.1.0, whose Namespace was a release object.
func TestChartLifecycle(t *testing.T) {
	bin := kubectl(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)
	ch, err := loader.Load(chartDir)
	require.NoError(t, err)
	h := helmOn{t: t, c: c, chart: ch}
	kc := c.Client()

	// The cluster-scoped objects (ClusterRole caa, the admission policies)
	// allow one release per cluster, so each case uninstalls before the
	// next.

	t.Run("install --create-namespace", func(t *testing.T) {
		h.t = t
		rel, err := h.install("caa-system", true)
		require.NoError(t, err)
		assert.Equal(t, release.StatusDeployed, rel.Info.Status)
		ds, err := kc.AppsV1().DaemonSets("caa-system").Get(ctx, "caa", metav1.GetOptions{})
		require.NoError(t, err)
		for _, k := range recommended {
			assert.NotEmpty(t, ds.Labels[k], "the live DaemonSet's %s", k)
		}
		ns, err := kc.CoreV1().Namespaces().Get(ctx, "caa-system", metav1.GetOptions{})
		require.NoError(t, err)
		assert.NotContains(t, ns.Annotations, "meta.helm.sh/release-name", "Helm made the namespace, the chart has none")
		// The `helm test` objects are valid for this apiserver (nothing
		// runs their pod here: no kubelet).
		require.Len(t, rel.Hooks, 2)
		for _, hook := range rel.Hooks {
			out, err := runKubectl(ctx, bin, []byte(hook.Manifest), "--kubeconfig", c.Kubeconfig(), "-n", "caa-system",
				"apply", "--server-side", "--dry-run=server", "--field-manager=caa-chart-test", "-f", "-")
			require.NoError(t, err, hook.Name)
			assert.Contains(t, string(out), "caa-status-test", hook.Name)
		}
		h.uninstall("caa-system")
		_, err = kc.AppsV1().DaemonSets("caa-system").Get(ctx, "caa", metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "uninstalled: %v", err)
	})

	t.Run("existing namespace, Secret first, upgrade, uninstall", func(t *testing.T) {
		h.t = t
		require.NoError(t, c.EnsureNamespace(ctx, "caa-ops"))
		secret := userSecret(ctx, t, kc, "caa-ops")
		_, err := h.install("caa-ops", false)
		require.NoError(t, err, "install beside the user's Secret")
		ds, err := kc.AppsV1().DaemonSets("caa-ops").Get(ctx, "caa", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "caa-cloud-credentials", ds.Spec.Template.Spec.Containers[0].EnvFrom[1].SecretRef.Name)

		rel, err := h.upgrade("caa-ops", "surge=false", "settings.CAA_RESYNC=2m")
		require.NoError(t, err)
		assert.Equal(t, 2, rel.Version)
		up, err := kc.AppsV1().DaemonSets("caa-ops").Get(ctx, "caa", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, ds.UID, up.UID, "the DaemonSet is updated in place, not recreated")
		assert.Equal(t, 0, up.Spec.UpdateStrategy.RollingUpdate.MaxSurge.IntValue())
		assert.NotEqual(t, ds.Spec.Template.Annotations["checksum/config"], up.Spec.Template.Annotations["checksum/config"])
		cm, err := kc.CoreV1().ConfigMaps("caa-ops").Get(ctx, "caa-config", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "2m", cm.Data["CAA_RESYNC"])

		h.uninstall("caa-ops")
		kept, err := kc.CoreV1().Secrets("caa-ops").Get(ctx, "caa-cloud-credentials", metav1.GetOptions{})
		require.NoError(t, err, "uninstall leaves the user's Secret")
		assert.Equal(t, secret.UID, kept.UID)
		assert.Nil(t, kept.DeletionTimestamp)
		_, err = kc.RbacV1().ClusterRoles().Get(ctx, "caa", metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "the ClusterRole goes: %v", err)
	})

	t.Run("credentials.create", func(t *testing.T) {
		h.t = t
		_, err := h.install("caa-cred", true, "credentials.create=true", "credentials.data.AWS_ACCESS_KEY_ID=AKIAEXAMPLE")
		require.NoError(t, err)
		s, err := kc.CoreV1().Secrets("caa-cred").Get(ctx, "caa-cloud-credentials", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "AKIAEXAMPLE", string(s.Data["AWS_ACCESS_KEY_ID"]))
		h.uninstall("caa-cred")
		_, err = kc.CoreV1().Secrets("caa-cred").Get(ctx, "caa-cloud-credentials", metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "a Secret the release made goes with it: %v", err)
	})

	t.Run("createNamespace keeps the Namespace", func(t *testing.T) {
		h.t = t
		require.NoError(t, c.EnsureNamespace(ctx, "caa-releases"))
		_, err := h.install("caa-releases", false, "namespaceOverride=caa-own", "createNamespace=true")
		require.NoError(t, err)
		ns, err := kc.CoreV1().Namespaces().Get(ctx, "caa-own", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "privileged", ns.Labels["pod-security.kubernetes.io/enforce"])
		_, err = kc.AppsV1().DaemonSets("caa-own").Get(ctx, "caa", metav1.GetOptions{})
		require.NoError(t, err)
		userSecret(ctx, t, kc, "caa-own")
		h.uninstall("caa-releases")
		ns, err = kc.CoreV1().Namespaces().Get(ctx, "caa-own", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Nil(t, ns.DeletionTimestamp, "helm uninstall keeps the Namespace")
		_, err = kc.CoreV1().Secrets("caa-own").Get(ctx, "caa-cloud-credentials", metav1.GetOptions{})
		require.NoError(t, err)

		// The Namespace exists, so `helm install --create-namespace` into
		// the release's own namespace with createNamespace is refused
		// with the way out.
		_, err = h.install("caa-own", true, "createNamespace=true")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "createNamespace=true would make the release's own namespace")
	})

	t.Run("upgrade from chart 0.1.0", func(t *testing.T) {
		h.t = t
		require.NoError(t, c.EnsureNamespace(ctx, "kube-system"))
		h.install010("kube-system", "caa-old")
		secret := userSecret(ctx, t, kc, "caa-old")
		ds, err := kc.AppsV1().DaemonSets("caa-old").Get(ctx, "caa", metav1.GetOptions{})
		require.NoError(t, err)

		// As deploy/README.md says: the objects stay where they are and
		// the Namespace becomes a kept one.
		_, err = h.upgrade("kube-system", "namespaceOverride=caa-old", "createNamespace=true")
		require.NoError(t, err)
		ns, err := kc.CoreV1().Namespaces().Get(ctx, "caa-old", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Nil(t, ns.DeletionTimestamp)
		assert.Equal(t, "keep", ns.Annotations["helm.sh/resource-policy"])
		up, err := kc.AppsV1().DaemonSets("caa-old").Get(ctx, "caa", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, ds.UID, up.UID, "the same DaemonSet, updated in place: its pods roll by surge, the VMs stay")
		kept, err := kc.CoreV1().Secrets("caa-old").Get(ctx, "caa-cloud-credentials", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, secret.UID, kept.UID)
		h.uninstall("kube-system")
		ns, err = kc.CoreV1().Namespaces().Get(ctx, "caa-old", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Nil(t, ns.DeletionTimestamp, "kept on uninstall")

		// Without them, the upgrade moves the objects to the release's
		// namespace and deletes the old Namespace, the user's Secret with
		// it: what deploy/README.md warns of.
		h.install010("kube-system", "caa-old2")
		userSecret(ctx, t, kc, "caa-old2")
		_, err = h.upgrade("kube-system")
		require.NoError(t, err)
		ns, err = kc.CoreV1().Namespaces().Get(ctx, "caa-old2", metav1.GetOptions{})
		if err == nil {
			assert.NotNil(t, ns.DeletionTimestamp, "the 0.1.0 Namespace is deleted by a plain upgrade")
		} else {
			assert.True(t, apierrors.IsNotFound(err), "%v", err)
		}
		_, err = kc.AppsV1().DaemonSets("kube-system").Get(ctx, "caa", metav1.GetOptions{})
		require.NoError(t, err, "the DaemonSet moved to the release's namespace")
		h.uninstall("kube-system")
	})
}

// userSecret creates the credentials Secret as a user does before or
// after installing.
func userSecret(ctx context.Context, t *testing.T, kc kubernetes.Interface, ns string) *corev1.Secret {
	t.Helper()
	s, err := kc.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "caa-cloud-credentials", Namespace: ns},
		StringData: map[string]string{"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "example"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return s
}
