package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// TestNodeWritesOnTheAPIServer (issue 30.1) creates caa's roles and the
// cluster-scope component's admission policies on a real kube-apiserver and patches
// Nodes under real ServiceAccount tokens, each bound to a pod as the
// kubelet's are: node A's caa may patch its own Node, but neither node B
// nor any Node's caa.dev/cloud-view annotation; a caa token bound to no
// pod changes no Node; the cluster caa writes the views.
func TestNodeWritesOnTheAPIServer(t *testing.T) {
	needBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)
	// The objects as the repository has them (no kubectl needed): the
	// ServiceAccounts, both roles, and the admission policies.
	require.NoError(t, c.EnsureNamespace(ctx, namespace))
	for _, f := range []string{"base/serviceaccount.yaml", "base/rbac.yaml", "components/cluster-scope/serviceaccount.yaml",
		"components/cluster-scope/rbac.yaml", "components/cluster-scope/admission.yaml"} {
		createAll(ctx, t, c.Client(), f)
	}

	var err error
	for _, n := range []string{"node-a", "node-b"} {
		_, err := c.CreateNode(ctx, n)
		require.NoError(t, err)
	}
	nodeA := boundClient(ctx, t, c, "caa", "caa-node-a", "node-a")
	nodeB := boundClient(ctx, t, c, "caa", "caa-node-b", "node-b")
	clusterCaa := boundClient(ctx, t, c, "caa-cluster", "caa-cluster-0", "node-b")
	unbound := tokenClient(ctx, t, c, "caa", nil)

	ledgerPatch := func(v string) []byte { return annotationPatch(t, "caa.dev/ledger-id", v) }
	viewPatch := func(v string) []byte { return annotationPatch(t, "caa.dev/cloud-view", v) }
	patch := func(client kubernetes.Interface, node string, body []byte) error {
		_, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{})
		return err
	}

	// The policies load asynchronously: wait until the first refusal.
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		err := patch(nodeA, "node-b", ledgerPatch("forged"))
		return err != nil && apierrors.IsForbidden(err), nil
	}), "node A's caa patching node B is refused")

	err = patch(nodeA, "node-b", ledgerPatch("forged"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "caa may change only the Node it runs on (its token names node node-a, not node-b)")
	assert.NoError(t, patch(nodeA, "node-a", ledgerPatch("ledger-a")), "node A's caa patches its own Node")
	assert.NoError(t, patch(nodeB, "node-b", ledgerPatch("ledger-b")), "node B's caa patches its own Node")

	for _, target := range []string{"node-a", "node-b"} {
		err := patch(nodeA, target, viewPatch(`{"forged":true}`))
		require.Error(t, err, "node A's caa writes a view on %s", target)
		assert.True(t, apierrors.IsForbidden(err), "%v", err)
	}
	err = patch(nodeA, "node-a", viewPatch(`{"forged":true}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "only the cluster caa (caa-system/caa-cluster) may write the caa.dev/cloud-view annotation")

	err = patch(unbound, "node-a", ledgerPatch("unbound"))
	require.Error(t, err, "a caa token bound to no pod changes no Node")
	assert.True(t, apierrors.IsForbidden(err), "%v", err)

	for _, target := range []string{"node-a", "node-b"} {
		assert.NoError(t, patch(clusterCaa, target, viewPatch(`{"at":"2026-01-01T00:00:00Z","every":"10m0s","vms":[]}`)),
			"the cluster caa writes %s's view", target)
	}
	// Once a view is there, node A's caa can neither change nor remove it.
	err = patch(nodeA, "node-a", []byte(`{"metadata":{"annotations":{"caa.dev/cloud-view":null}}}`))
	assert.True(t, apierrors.IsForbidden(err), "node A's caa removes its view: %v", err)

	for node, want := range map[string]string{"node-a": "ledger-a", "node-b": "ledger-b"} {
		n, err := c.Client().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, want, n.Annotations["caa.dev/ledger-id"], "%s's own caa wrote its ledger id, and nobody else", node)
		assert.Contains(t, n.Annotations["caa.dev/cloud-view"], `"every":"10m0s"`, "%s's view is the cluster caa's", node)
	}
}

func annotationPatch(t *testing.T, key, value string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	require.NoError(t, err)
	return b
}

// boundClient creates a pod of ServiceAccount sa on node and returns a
// client with a token bound to that pod, as the kubelet gives one: the
// apiserver then names the pod's node in the token.
func boundClient(ctx context.Context, t *testing.T, c *cluster.Cluster, sa, pod, node string) kubernetes.Interface {
	t.Helper()
	p, err := c.Client().CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: namespace},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node,
			Containers: []corev1.Container{{Name: "caa", Image: "caa"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return tokenClient(ctx, t, c, sa, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID})
}

// tokenClient takes a token of sa through the TokenRequest API.
func tokenClient(ctx context.Context, t *testing.T, c *cluster.Cluster, sa string, bound *authenticationv1.BoundObjectReference) kubernetes.Interface {
	t.Helper()
	expiry := int64(3600)
	tok, err := c.Client().CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry, BoundObjectRef: bound},
	}, metav1.CreateOptions{})
	require.NoError(t, err, "token for %s", sa)
	admin := c.RestConfig()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: admin.Host, BearerToken: tok.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: admin.CAData}, UserAgent: fmt.Sprintf("%s-%v", sa, bound != nil)})
	require.NoError(t, err)
	return client
}

// createAll creates every object of a manifest file under deploy/.
func createAll(ctx context.Context, t *testing.T, client kubernetes.Interface, file string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir(t), file))
	require.NoError(t, err)
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		require.NoError(t, err, "%s", file)
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = client.CoreV1().ServiceAccounts(namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = client.RbacV1().Roles(namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = client.RbacV1().RoleBindings(namespace).Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected %T", file, obj)
		}
		require.NoError(t, err, "%s: create %T", file, obj)
	}
}
