package deploy_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// keylessAWS are the overlays that run caa on AWS without static keys,
// each with the ServiceAccount annotation it adds ("" for none). Both are
// overlays/aws without the credentials Secret, so every check of
// overlays/aws (render_test.go, manifests_test.go, memory_test.go,
// static_test.go) holds for them as long as TestAWSKeylessOverlays shows
// they differ from it in nothing else.
var keylessAWS = map[string]string{
	"overlays/aws-pod-identity": "",
	"overlays/aws-irsa":         "eks.amazonaws.com/role-arn",
}

var roleARN = regexp.MustCompile(`^arn:aws:iam::[0-9]{12}:role/[\w+=,.@/-]+$`)

// TestAWSKeylessOverlays renders each keyless AWS overlay beside
// overlays/aws: the same objects, field for field, except that the
// DaemonSet reads no Secret and, for IRSA, the ServiceAccount names the
// role. Their READMEs say where the permissions are.
func TestAWSKeylessOverlays(t *testing.T) {
	needBinaries(t)
	bin := kubectl(t)
	static := decode(t, render(t, bin, "overlays/aws"))
	for name, annotation := range keylessAWS {
		t.Run(name, func(t *testing.T) {
			keyless := decode(t, render(t, bin, name))
			require.Len(t, keyless, len(static), "%s renders the objects of overlays/aws", name)
			for i, want := range static {
				want, got := want.DeepCopy(), keyless[i].DeepCopy()
				switch want.GetKind() {
				case "DaemonSet":
					dropSecretRefs(t, want)
				case "ServiceAccount":
					value := got.GetAnnotations()[annotation]
					if annotation == "" {
						assert.Empty(t, got.GetAnnotations(), "Pod Identity needs no annotation: the association is made in EKS")
						break
					}
					assert.Regexp(t, roleARN, value, "%s names an IAM role", annotation)
					annotations := got.GetAnnotations()
					delete(annotations, annotation)
					if len(annotations) == 0 {
						unstructured.RemoveNestedField(got.Object, "metadata", "annotations")
					} else {
						got.SetAnnotations(annotations)
					}
				}
				assert.Equal(t, want.Object, got.Object, "%s: %s %s differs from overlays/aws beyond the credentials", name, want.GetKind(), want.GetName())
			}
			for _, o := range keyless {
				assert.Empty(t, findKeys(o.Object, "secretRef", "secretKeyRef"), "%s %s reads a Secret", o.GetKind(), o.GetName())
				assert.NotEqual(t, "Secret", o.GetKind())
			}
			readme, err := os.ReadFile(filepath.Join(deployDir(t), name, "README.md"))
			require.NoError(t, err)
			assert.Contains(t, string(readme), "overlays/aws/iam-policy.json", "%s/README.md says where the permissions are", name)
		})
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
	require.Len(t, kept, len(from)-1, "overlays/aws reads exactly one Secret")
	c["envFrom"] = kept
	require.NoError(t, unstructured.SetNestedSlice(ds.Object, containers, "spec", "template", "spec", "containers"))
}

// TestAWSKeylessOverlaysOnTheAPIServer dry-runs each keyless AWS overlay
// against a real kube-apiserver.
func TestAWSKeylessOverlaysOnTheAPIServer(t *testing.T) {
	needBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := kubectl(t)
	c := cluster.Start(ctx, t)
	require.NoError(t, c.EnsureNamespace(ctx, namespace))
	for name := range keylessAWS {
		out, err := runKubectl(ctx, bin, render(t, bin, name), "--kubeconfig", c.Kubeconfig(),
			"apply", "--server-side", "--dry-run=server", "--field-manager=caa-deploy-test", "-f", "-")
		require.NoError(t, err, "%s is refused by the apiserver", name)
		for _, obj := range []string{"daemonset.apps/caa", "serviceaccount/caa", "configmap/caa-config-"} {
			assert.Contains(t, string(out), obj, "%s", name)
		}
	}
}
