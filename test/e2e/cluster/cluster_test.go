package cluster_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// TestSmoke drives the harness the way caa's e2e tests will: nodes and peer
// pods in, a node-scoped list out, phase changes, forced deletes, and an
// apiserver restart under a client made before it.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver (and builds them on the first run)")
	}
	// A cold build takes minutes and is bounded by go test's -timeout only;
	// the cluster itself gets a tighter bound.
	if _, err := cluster.EnsureBinaries(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)

	// A client in another process gets only the kubeconfig file: use it.
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	if cfg.Host != c.URL() {
		t.Fatalf("kubeconfig server %q, want %q", cfg.Host, c.URL())
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{}); err != nil {
		t.Fatalf("kube-system: %v", err)
	}
	if _, err := client.NodeV1().RuntimeClasses().Get(ctx, cluster.RuntimeClassName, metav1.GetOptions{}); err != nil {
		t.Fatalf("RuntimeClass %s: %v", cluster.RuntimeClassName, err)
	}

	const node, other, ns = "node-a", "node-b", "peer"
	for _, n := range []string{node, other} {
		created, err := c.CreateNode(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if !nodeReady(created) {
			t.Fatalf("node %s not Ready: %+v", n, created.Status.Conditions)
		}
	}
	want := []string{"p1", "p2", "p3"}
	for _, name := range want {
		if _, err := c.CreatePeerPod(ctx, ns, name, node, map[string]string{"e2e": name}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CreatePeerPod(ctx, ns, "elsewhere", other, nil); err != nil {
		t.Fatal(err)
	}

	onNode := func(t *testing.T) []corev1.Pod {
		t.Helper()
		list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
		})
		if err != nil {
			t.Fatalf("list pods on %s: %v", node, err)
		}
		return list.Items
	}
	pods := onNode(t)
	if got := podNames(pods); !slices.Equal(got, want) {
		t.Fatalf("pods on %s = %v, want %v", node, got, want)
	}
	for _, p := range pods {
		if p.Spec.RuntimeClassName == nil || *p.Spec.RuntimeClassName != cluster.RuntimeClassName {
			t.Errorf("pod %s runtime class %v, want %s", p.Name, p.Spec.RuntimeClassName, cluster.RuntimeClassName)
		}
		if p.Status.Phase != corev1.PodPending {
			t.Errorf("pod %s phase %s, want Pending", p.Name, p.Status.Phase)
		}
		if p.Annotations["e2e"] != p.Name {
			t.Errorf("pod %s annotations %v", p.Name, p.Annotations)
		}
	}

	done, err := c.SetPodPhase(ctx, ns, "p1", corev1.PodSucceeded)
	if err != nil {
		t.Fatal(err)
	}
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("p1 phase %s after SetPodPhase", done.Status.Phase)
	}

	if err := c.DeletePod(ctx, ns, "p2"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods(ns).Get(ctx, "p2", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get deleted p2: %v, want NotFound", err)
	}

	if err := c.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	// The same client (and its connection pool) must work against the
	// restarted apiserver, and etcd must have kept every object.
	pods = onNode(t)
	if got := podNames(pods); !slices.Equal(got, []string{"p1", "p3"}) {
		t.Fatalf("pods on %s after restart = %v, want [p1 p3]", node, got)
	}
	for _, p := range pods {
		if p.Name == "p1" && p.Status.Phase != corev1.PodSucceeded {
			t.Errorf("p1 phase %s after restart, want Succeeded", p.Status.Phase)
		}
	}
	if _, err := c.Client().CoreV1().Pods(ns).Get(ctx, "elsewhere", metav1.GetOptions{}); err != nil {
		t.Fatalf("get pod through Client() after restart: %v", err)
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podNames(pods []corev1.Pod) []string {
	names := make([]string, 0, len(pods))
	for _, p := range pods {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}
