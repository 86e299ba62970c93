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

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/test/e2e/cluster"
)

// TestNodeWritesOnTheAPIServer (issues 30.1 and 42.2-3) creates caa's
// roles and the base's admission policies (every install's) on a real
// kube-apiserver and patches Nodes under real ServiceAccount tokens, each
// bound to a pod as the kubelet's are: node A's caa may change, on its own
// Node only, the caa.dev/ledger-id annotation and the kata.peerpods.io/vm
// capacity, and nothing else there or on node B (labels, taints, cordon,
// capacity); a caa token bound to no pod changes no Node; the cluster caa
// writes the views and nothing else; nobody else writes a view.
func TestNodeWritesOnTheAPIServer(t *testing.T) {
	t.Parallel() // an apiserver of its own: its start-up and waits overlap the others'
	needBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)
	// The objects as the repository has them (no kubectl needed): the
	// ServiceAccounts, both roles, and the admission policies.
	require.NoError(t, c.EnsureNamespace(ctx, namespace))
	for _, f := range []string{"base/serviceaccount.yaml", "base/rbac.yaml", "base/admission.yaml",
		"components/cluster-scope/serviceaccount.yaml", "components/cluster-scope/rbac.yaml"} {
		createAll(ctx, t, c.Client(), f)
	}

	var err error
	for _, n := range []string{"node-a", "node-b"} {
		_, err := c.CreateNode(ctx, n)
		require.NoError(t, err)
		// What a kubelet would have set: a taint, and the node's capacity.
		_, err = c.Client().CoreV1().Nodes().Patch(ctx, n, types.MergePatchType,
			[]byte(`{"spec":{"taints":[{"key":"dedicated","value":"tenant","effect":"NoSchedule"}]}}`), metav1.PatchOptions{})
		require.NoError(t, err)
		_, err = c.Client().CoreV1().Nodes().Patch(ctx, n, types.MergePatchType,
			[]byte(`{"status":{"capacity":{"cpu":"4","pods":"110"},"allocatable":{"cpu":"4","pods":"110"}}}`), metav1.PatchOptions{}, "status")
		require.NoError(t, err)
	}
	nodeA := boundClient(ctx, t, c, "caa", "caa-node-a", "node-a")
	nodeB := boundClient(ctx, t, c, "caa", "caa-node-b", "node-b")
	clusterCaa := boundClient(ctx, t, c, "caa-cluster", "caa-cluster-0", "node-b")
	unbound := tokenClient(ctx, t, c, "caa", nil)

	ledgerPatch := func(v string) []byte { return annotationPatch(t, "caa.dev/ledger-id", v) }
	viewPatch := func(v string) []byte { return annotationPatch(t, "caa.dev/cloud-view", v) }
	patch := func(client kubernetes.Interface, node string, body []byte, sub ...string) error {
		_, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{}, sub...)
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
	capacity := []byte(`{"status":{"capacity":{"kata.peerpods.io/vm":"10"},"allocatable":{"kata.peerpods.io/vm":"10"}}}`)
	assert.NoError(t, patch(nodeA, "node-a", capacity, "status"), "node A's caa advertises its own peer-pod capacity")

	// Neither on node B nor on its own Node may node A's caa change
	// anything but its two fields.
	forged := map[string]struct {
		body []byte
		sub  []string
		want string // on its own Node
	}{
		"relabel":                 {body: []byte(`{"metadata":{"labels":{"tenant":"evil"}}}`), want: "may not change its Node's labels"},
		"a node-role label":       {body: []byte(`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`), want: "may not change its Node's labels"},
		"a restriction label":     {body: []byte(`{"metadata":{"labels":{"node-restriction.kubernetes.io/pool":"secure"}}}`), want: "may not change its Node's labels"},
		"drop a label":            {body: []byte(`{"metadata":{"labels":{"kubernetes.io/hostname":null}}}`), want: "may not change its Node's labels"},
		"another annotation":      {body: annotationPatch(t, "example.com/owner", "evil"), want: "no annotation of its Node but caa.dev/ledger-id"},
		"a finalizer":             {body: []byte(`{"metadata":{"finalizers":["example.com/hold"]}}`), want: "may not change its Node's labels, finalizers"},
		"taint":                   {body: []byte(`{"spec":{"taints":[{"key":"dedicated","value":"tenant","effect":"NoSchedule"},{"key":"evil","effect":"NoExecute"}]}}`), want: "may not change its Node's spec"},
		"remove the taints":       {body: []byte(`{"spec":{"taints":null}}`), want: "may not change its Node's spec"},
		"cordon":                  {body: []byte(`{"spec":{"unschedulable":true}}`), want: "may not change its Node's spec"},
		"zero the pods":           {body: []byte(`{"status":{"capacity":{"pods":"0"},"allocatable":{"pods":"0"}}}`), sub: []string{"status"}, want: "no status of its Node but the kata.peerpods.io/vm"},
		"another resource":        {body: []byte(`{"status":{"capacity":{"example.com/gpu":"8"}}}`), sub: []string{"status"}, want: "no status of its Node but the kata.peerpods.io/vm"},
		"a condition":             {body: []byte(`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Evil"}]}}`), sub: []string{"status"}, want: "no status of its Node but the kata.peerpods.io/vm"},
		"zero node B's peer-pods": {body: capacity, sub: []string{"status"}},
	}
	for name, f := range forged {
		err := patch(nodeA, "node-b", f.body, f.sub...)
		require.Error(t, err, "node A's caa on node B: %s", name)
		assert.True(t, apierrors.IsForbidden(err), "%s on node B: %v", name, err)
		if f.want == "" {
			continue
		}
		err = patch(nodeA, "node-a", f.body, f.sub...)
		require.Error(t, err, "node A's caa on its own Node: %s", name)
		assert.True(t, apierrors.IsForbidden(err), "%s on node A: %v", name, err)
		assert.Contains(t, err.Error(), f.want, name)
	}
	err = nodeA.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{})
	assert.True(t, apierrors.IsForbidden(err), "node A's caa deletes its Node: %v", err)

	for _, target := range []string{"node-a", "node-b"} {
		err := patch(nodeA, target, viewPatch(`{"forged":true}`))
		require.Error(t, err, "node A's caa writes a view on %s", target)
		assert.True(t, apierrors.IsForbidden(err), "%v", err)
	}
	// Nor may node A's kubelet, which the Node authorizer and
	// NodeRestriction let patch its own Node.
	kubeconfig, err := c.NodeKubeconfig("node-a")
	require.NoError(t, err)
	kubeletA, err := cli.KubeClient(kubeconfig, "kubelet", 5)
	require.NoError(t, err)
	require.NoError(t, patch(kubeletA, "node-a", annotationPatch(t, "example.com/kubelet", "yes")), "the kubelet patches its Node")
	err = patch(kubeletA, "node-a", viewPatch(`{"forged":true}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "only the cluster caa (caa-system/caa-cluster) may write the caa.dev/cloud-view annotation")

	err = patch(unbound, "node-a", ledgerPatch("unbound"))
	require.Error(t, err, "a caa token bound to no pod changes no Node")
	assert.True(t, apierrors.IsForbidden(err), "%v", err)

	for _, target := range []string{"node-a", "node-b"} {
		assert.NoError(t, patch(clusterCaa, target, viewPatch(`{"at":"2026-01-01T00:00:00Z","every":"10m0s","vms":[]}`)),
			"the cluster caa writes %s's view", target)
	}
	// The cluster caa writes the view and nothing else.
	for name, body := range map[string][]byte{
		"a label":       []byte(`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`),
		"the ledger id": ledgerPatch("forged-by-the-cluster"),
		"a taint":       []byte(`{"spec":{"taints":null}}`),
		"cordon":        []byte(`{"spec":{"unschedulable":true}}`),
	} {
		err := patch(clusterCaa, "node-a", body)
		require.Error(t, err, "the cluster caa writes %s", name)
		assert.True(t, apierrors.IsForbidden(err), "%s: %v", name, err)
		assert.Contains(t, err.Error(), "the cluster caa may change on a Node only the caa.dev/cloud-view annotation", name)
	}
	// Once a view is there, node A's caa can neither change nor remove it.
	err = patch(nodeA, "node-a", []byte(`{"metadata":{"annotations":{"caa.dev/cloud-view":null}}}`))
	assert.True(t, apierrors.IsForbidden(err), "node A's caa removes its view: %v", err)

	for node, want := range map[string]string{"node-a": "ledger-a", "node-b": "ledger-b"} {
		n, err := c.Client().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, want, n.Annotations["caa.dev/ledger-id"], "%s's own caa wrote its ledger id, and nobody else", node)
		assert.Contains(t, n.Annotations["caa.dev/cloud-view"], `"every":"10m0s"`, "%s's view is the cluster caa's", node)
		assert.Equal(t, map[string]string{corev1.LabelHostname: node}, n.Labels, "%s's labels", node)
		assert.Len(t, n.Spec.Taints, 1, "%s's taint", node)
		assert.False(t, n.Spec.Unschedulable, node)
		assert.Equal(t, "110", n.Status.Capacity.Pods().String(), node)
	}
	a, err := c.Client().CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	require.NoError(t, err)
	vm := a.Status.Capacity["kata.peerpods.io/vm"]
	assert.Equal(t, "10", vm.String(), "node A's peer-pod capacity, from its own caa")
}

// TestNodeEventsOnTheAPIServer (issue 42.3): node A's caa writes events
// that name node A as their source, on pods and on its own Node; it cannot
// write one as node B, on node B's Node, or change node B's.
func TestNodeEventsOnTheAPIServer(t *testing.T) {
	t.Parallel() // an apiserver of its own: its start-up and waits overlap the others'
	needBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)
	require.NoError(t, c.EnsureNamespace(ctx, namespace))
	for _, f := range []string{"base/serviceaccount.yaml", "base/rbac.yaml", "base/admission.yaml"} {
		createAll(ctx, t, c.Client(), f)
	}
	for _, n := range []string{"node-a", "node-b"} {
		_, err := c.CreateNode(ctx, n)
		require.NoError(t, err)
	}
	nodeA := boundClient(ctx, t, c, "caa", "caa-node-a", "node-a")
	nodeB := boundClient(ctx, t, c, "caa", "caa-node-b", "node-b")
	unbound := tokenClient(ctx, t, c, "caa", nil)

	n := 0
	event := func(client kubernetes.Interface, host string, about corev1.ObjectReference) (*corev1.Event, error) {
		n++
		ns := about.Namespace
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		now := metav1.Now()
		return client.CoreV1().Events(ns).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("caa-e2e.%d", n), Namespace: ns},
			InvolvedObject: about, Reason: "VMCreated", Message: "e2e", Type: corev1.EventTypeNormal,
			Source: corev1.EventSource{Component: "caa", Host: host}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
		}, metav1.CreateOptions{})
	}
	pod := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: namespace, Name: "peer-0", UID: "uid-0"}
	node := func(name string) corev1.ObjectReference {
		return corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: types.UID(name)}
	}

	// The policies load asynchronously: wait until the first refusal.
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := event(nodeA, "node-b", pod)
		return err != nil && apierrors.IsForbidden(err), nil
	}), "node A's caa writing an event as node B is refused")

	_, err := event(nodeA, "node-a", pod)
	assert.NoError(t, err, "node A's caa writes an event on a pod")
	_, err = event(nodeA, "node-a", node("node-a"))
	assert.NoError(t, err, "node A's caa writes an event on its Node")
	_, err = event(nodeA, "node-b", pod)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "caa on node node-a writes only events that name its node as their source")
	_, err = event(nodeA, "node-a", node("node-b"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "caa on node node-a writes events only on pods and on its own Node")
	_, err = event(nodeA, "node-a", corev1.ObjectReference{Kind: "Secret", APIVersion: "v1", Namespace: namespace, Name: "x"})
	assert.True(t, apierrors.IsForbidden(err), "an event on a Secret: %v", err)
	_, err = event(unbound, "node-a", pod)
	assert.True(t, apierrors.IsForbidden(err), "a token bound to no pod writes an event: %v", err)

	// Node B's event: node A's caa can neither bump nor rewrite it.
	bs, err := event(nodeB, "node-b", pod)
	require.NoError(t, err)
	_, err = nodeA.CoreV1().Events(bs.Namespace).Patch(ctx, bs.Name, types.StrategicMergePatchType, []byte(`{"count":7,"message":"forged"}`), metav1.PatchOptions{})
	require.Error(t, err)
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	_, err = nodeA.CoreV1().Events(bs.Namespace).Patch(ctx, bs.Name, types.StrategicMergePatchType, []byte(`{"source":{"host":"node-a"}}`), metav1.PatchOptions{})
	assert.True(t, apierrors.IsForbidden(err), "node A's caa takes node B's event over: %v", err)
	_, err = nodeB.CoreV1().Events(bs.Namespace).Patch(ctx, bs.Name, types.StrategicMergePatchType, []byte(`{"count":2}`), metav1.PatchOptions{})
	assert.NoError(t, err, "node B's caa bumps its own event's count, as client-go's recorder does")
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
