package deploy_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// The keyless overlays (aws_identity_test.go, azure_identity_test.go,
// ibmcloud_identity_test.go) are their cloud's static overlay without the
// credentials Secret, plus what the cloud's identity route needs. These
// are the checks they share; each cloud says what its route adds.

// withComponents renders overlay beside base, alone and with every
// component, keyed by "alone" or the component.
func withComponents(t *testing.T, bin, base, overlay string) map[string][2][]byte {
	pairs := map[string][2][]byte{"alone": {render(t, bin, base), render(t, bin, overlay)}}
	for _, component := range components {
		pairs[component] = [2][]byte{withComponent(t, bin, base, component), withComponent(t, bin, overlay, component)}
	}
	return pairs
}

// assertOnlyCredentialsDiffer checks that keyless (what, e.g. "the
// overlay") renders the objects of base, field for field, except that its
// DaemonSet reads no Secret, and that none of its objects reads or is a
// Secret. route checks what the identity route adds to each of keyless's
// objects and takes it out again.
func assertOnlyCredentialsDiffer(t *testing.T, what, base string, static, keyless []*unstructured.Unstructured,
	route func(t *testing.T, got *unstructured.Unstructured)) {
	t.Helper()
	require.Len(t, keyless, len(static), "%s renders the objects of %s", what, base)
	for i, want := range static {
		want, got := want.DeepCopy(), keyless[i].DeepCopy()
		if want.GetKind() == "DaemonSet" {
			dropSecretRefs(t, want)
		}
		route(t, got)
		assert.Equal(t, want.Object, got.Object, "%s: %s %s differs from %s beyond the credentials", what, want.GetKind(), want.GetName(), base)
	}
	for _, o := range keyless {
		assert.Empty(t, findKeys(o.Object, "secretRef", "secretKeyRef"), "%s %s reads a Secret", o.GetKind(), o.GetName())
		assert.NotEqual(t, "Secret", o.GetKind())
	}
}

// dropAnnotation removes the annotation key from o, and the annotations
// with it when it was the only one.
func dropAnnotation(o *unstructured.Unstructured, key string) {
	annotations := o.GetAnnotations()
	delete(annotations, key)
	if len(annotations) == 0 {
		unstructured.RemoveNestedField(o.Object, "metadata", "annotations")
	} else {
		o.SetAnnotations(annotations)
	}
}

// dropSecretRefs removes the envFrom entries of the DaemonSet's container
// that read a Secret, failing t unless there was exactly one.
func dropSecretRefs(t *testing.T, ds *unstructured.Unstructured) {
	t.Helper()
	containers, _, err := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	require.NoError(t, err)
	require.Len(t, containers, 1)
	c := containers[0].(map[string]any)
	from, _ := c["envFrom"].([]any)
	var kept []any
	for _, f := range from {
		if _, secret := f.(map[string]any)["secretRef"]; !secret {
			kept = append(kept, f)
		}
	}
	require.Len(t, kept, len(from)-1, "the static overlay reads exactly one Secret")
	c["envFrom"] = kept
	require.NoError(t, unstructured.SetNestedSlice(ds.Object, containers, "spec", "template", "spec", "containers"))
}

// assertReadmeSays checks that overlay's README.md contains where.
func assertReadmeSays(t *testing.T, overlay, where, msg string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(deployDir(t), overlay, "README.md"))
	require.NoError(t, err)
	assert.Contains(t, string(readme), where, msg)
}

// dryRunOnTheAPIServer server-side dry-runs each overlay against a real
// kube-apiserver: accepted, with caa's DaemonSet, ServiceAccount and
// ConfigMap.
func dryRunOnTheAPIServer(t *testing.T, overlays ...string) {
	needBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := kubectl(t)
	c := cluster.Start(ctx, t)
	require.NoError(t, c.EnsureNamespace(ctx, namespace))
	for _, name := range overlays {
		out, err := runKubectl(ctx, bin, render(t, bin, name), "--kubeconfig", c.Kubeconfig(),
			"apply", "--server-side", "--dry-run=server", "--field-manager=caa-deploy-test", "-f", "-")
		require.NoError(t, err, "%s is refused by the apiserver", name)
		for _, obj := range []string{"daemonset.apps/caa", "serviceaccount/caa", "configmap/caa-config-"} {
			assert.Contains(t, string(out), obj, "%s", name)
		}
	}
}
