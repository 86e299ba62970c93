package deploy_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	for name, pair := range withComponents(t, bin, "overlays/azure", azureWorkloadIdentity) {
		t.Run(name, func(t *testing.T) {
			assertOnlyCredentialsDiffer(t, "the overlay", "overlays/azure", decode(t, pair[0]), decode(t, pair[1]), checkWorkloadIdentityRoute)
		})
	}
	assertReadmeSays(t, azureWorkloadIdentity, "overlays/azure/role.json", "the README says where the role is")
}

// checkWorkloadIdentityRoute checks what the overlay adds to an object and
// takes it out again: the webhook's label on the DaemonSet's pods, the
// identity's client id on the ServiceAccount.
func checkWorkloadIdentityRoute(t *testing.T, got *unstructured.Unstructured) {
	switch got.GetKind() {
	case "DaemonSet":
		labels, _, err := unstructured.NestedStringMap(got.Object, "spec", "template", "metadata", "labels")
		require.NoError(t, err)
		assert.Equal(t, "true", labels[wiUse], "the pods carry the webhook's label")
		delete(labels, wiUse)
		require.NoError(t, unstructured.SetNestedStringMap(got.Object, labels, "spec", "template", "metadata", "labels"))
	case "ServiceAccount":
		assert.NotEmpty(t, got.GetAnnotations()[wiClientID], "the ServiceAccount names the identity's client id")
		dropAnnotation(got, wiClientID)
	}
}

// TestAzureWorkloadIdentityOverlayOnTheAPIServer dry-runs the overlay
// against a real kube-apiserver.
func TestAzureWorkloadIdentityOverlayOnTheAPIServer(t *testing.T) {
	t.Parallel() // an apiserver of its own: its start-up and waits overlap the others'
	dryRunOnTheAPIServer(t, azureWorkloadIdentity)
}
