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

// azureWorkloadIdentity is the overlay that runs caa on AKS's workload
// identity: overlays/azure without the client secret, plus the pod label
// and ServiceAccount annotation the webhook needs. Every check of
// overlays/azure (render_test.go, manifests_test.go, memory_test.go,
// static_test.go) holds for it as long as TestAzureWorkloadIdentityOverlay
// shows it differs from it in nothing else.
const azureWorkloadIdentity = "overlays/azure-workload-identity"

const (
	wiClientID = "azure.workload.identity/client-id"
	wiUse      = "azure.workload.identity/use"
)

// TestAzureWorkloadIdentityOverlay renders the workload identity overlay
// beside overlays/azure, alone and with every component: the same objects,
// field for field, except that the DaemonSet reads no Secret and labels
// its pods for the webhook, and the ServiceAccount names the identity. Its
// README says where the role is.
func TestAzureWorkloadIdentityOverlay(t *testing.T) {
	needBinaries(t)
	bin := kubectl(t)
	pairs := map[string][2][]byte{"alone": {render(t, bin, "overlays/azure"), render(t, bin, azureWorkloadIdentity)}}
	for _, component := range components {
		pairs[component] = [2][]byte{withComponent(t, bin, "overlays/azure", component), withComponent(t, bin, azureWorkloadIdentity, component)}
	}
	for name, pair := range pairs {
		t.Run(name, func(t *testing.T) {
			static, keyless := decode(t, pair[0]), decode(t, pair[1])
			require.Len(t, keyless, len(static), "the overlay renders the objects of overlays/azure")
			for i, want := range static {
				want, got := want.DeepCopy(), keyless[i].DeepCopy()
				switch want.GetKind() {
				case "DaemonSet":
					dropSecretRefs(t, want)
					labels, _, err := unstructured.NestedStringMap(got.Object, "spec", "template", "metadata", "labels")
					require.NoError(t, err)
					assert.Equal(t, "true", labels[wiUse], "the pods carry the webhook's label")
					delete(labels, wiUse)
					require.NoError(t, unstructured.SetNestedStringMap(got.Object, labels, "spec", "template", "metadata", "labels"))
				case "ServiceAccount":
					annotations := got.GetAnnotations()
					assert.NotEmpty(t, annotations[wiClientID], "the ServiceAccount names the identity's client id")
					delete(annotations, wiClientID)
					if len(annotations) == 0 {
						unstructured.RemoveNestedField(got.Object, "metadata", "annotations")
					} else {
						got.SetAnnotations(annotations)
					}
				}
				assert.Equal(t, want.Object, got.Object, "%s %s differs from overlays/azure beyond the credentials", want.GetKind(), want.GetName())
			}
			for _, o := range keyless {
				assert.Empty(t, findKeys(o.Object, "secretRef", "secretKeyRef"), "%s %s reads a Secret", o.GetKind(), o.GetName())
				assert.NotEqual(t, "Secret", o.GetKind())
			}
		})
	}
	readme, err := os.ReadFile(filepath.Join(deployDir(t), azureWorkloadIdentity, "README.md"))
	require.NoError(t, err)
	assert.Contains(t, string(readme), "overlays/azure/role.json", "the README says where the role is")
}

// TestAzureWorkloadIdentityOverlayOnTheAPIServer dry-runs the overlay
// against a real kube-apiserver.
func TestAzureWorkloadIdentityOverlayOnTheAPIServer(t *testing.T) {
	needBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := kubectl(t)
	c := cluster.Start(ctx, t)
	require.NoError(t, c.EnsureNamespace(ctx, namespace))
	out, err := runKubectl(ctx, bin, render(t, bin, azureWorkloadIdentity), "--kubeconfig", c.Kubeconfig(),
		"apply", "--server-side", "--dry-run=server", "--field-manager=caa-deploy-test", "-f", "-")
	require.NoError(t, err, "refused by the apiserver")
	for _, obj := range []string{"daemonset.apps/caa", "serviceaccount/caa", "configmap/caa-config-"} {
		assert.Contains(t, string(out), obj)
	}
}
