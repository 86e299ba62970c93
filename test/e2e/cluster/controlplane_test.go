package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// TestControlPlaneAndKwok checks what the rollout tests stand on: kwok turns
// its nodes Ready and runs peer pods (and only peer pods), the scheduler
// binds a DaemonSet's pods, and the DaemonSet controller makes one per node.
func TestControlPlaneAndKwok(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, the Kubernetes control plane and kwok")
	}
	if _, err := cluster.EnsureBinaries(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)
	if err := c.StartControlPlane(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.StartKwok(ctx); err != nil {
		t.Fatal(err)
	}
	client := c.Client()
	nodes := []string{"kwok-a", "kwok-b"}
	for _, n := range nodes {
		if _, err := c.CreateKwokNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		poll(ctx, t, "node "+n+" Ready", func() (bool, error) {
			node, err := client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					return cond.Status == corev1.ConditionTrue, nil
				}
			}
			return false, nil
		})
	}

	// A peer pod is run by kwok; a graceful delete is completed by kwok.
	peer, err := c.CreatePeerPod(ctx, "peer", "p1", nodes[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	poll(ctx, t, "peer pod Running", func() (bool, error) {
		p, err := client.CoreV1().Pods(peer.Namespace).Get(ctx, peer.Name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, err
	})

	// A DaemonSet gets one pod per node, bound by the scheduler; kwok must
	// leave those pods alone (no runtime class), so they stay Pending.
	labels := map[string]string{"app": "ds-probe"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "peer", Name: "probe"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: cluster.PauseImage}}},
			},
		},
	}
	if _, err := client.AppsV1().DaemonSets("peer").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var dsPods []corev1.Pod
	poll(ctx, t, "a DaemonSet pod bound on each node", func() (bool, error) {
		list, err := client.CoreV1().Pods("peer").List(ctx, metav1.ListOptions{LabelSelector: "app=ds-probe"})
		if err != nil {
			return false, err
		}
		bound := map[string]bool{}
		for _, p := range list.Items {
			if p.Spec.NodeName != "" {
				bound[p.Spec.NodeName] = true
			}
		}
		dsPods = list.Items
		return len(list.Items) == len(nodes) && len(bound) == len(nodes), nil
	})
	// The peer pod ran within moments of its creation, long before the
	// DaemonSet pods were bound; kwok's informer has seen them by now.
	for _, p := range dsPods {
		if p.Status.Phase != corev1.PodPending {
			t.Errorf("DaemonSet pod %s is %s: kwok must not run pods other than peer pods", p.Name, p.Status.Phase)
		}
	}

	grace := int64(30)
	if err := client.CoreV1().Pods(peer.Namespace).Delete(ctx, peer.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	poll(ctx, t, "peer pod deletion completed by kwok", func() (bool, error) {
		_, err := client.CoreV1().Pods(peer.Namespace).Get(ctx, peer.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

func poll(ctx context.Context, t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		t.Fatal(fmt.Errorf("waiting for %s: %w (last error: %v)", what, err, last))
	}
}
