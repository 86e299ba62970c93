package cluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

const (
	// RuntimeClassName is the runtime class of peer pods; Launch creates it.
	RuntimeClassName = "kata-remote"
	// PauseImage is the image of a peer pod's one container. Nothing pulls it.
	PauseImage = "registry.k8s.io/pause:3.10"
)

// bootstrap creates what a real cluster would have before caa starts.
func (c *Cluster) bootstrap(ctx context.Context) error {
	// The apiserver makes kube-system itself (it was there at /readyz in
	// every run of v1.37.2 here), but from a post-start controller; caa
	// reads its UID as the cluster id, so make sure before any test starts.
	if err := c.EnsureNamespace(ctx, metav1.NamespaceSystem); err != nil {
		return err
	}
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: RuntimeClassName}, Handler: RuntimeClassName}
	if _, err := c.client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create RuntimeClass %s: %w", RuntimeClassName, err)
	}
	return nil
}

// EnsureNamespace creates namespace name unless it exists.
func (c *Cluster) EnsureNamespace(ctx context.Context, name string) error {
	if _, ok := c.namespaces.Load(name); ok {
		return nil
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	c.namespaces.Store(name, struct{}{})
	return nil
}

// CreateNode registers a Node whose Ready condition is True. No kubelet
// heartbeats it and no node controller runs, so it stays Ready.
func (c *Cluster) CreateNode(ctx context.Context, name string) (*corev1.Node, error) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{corev1.LabelHostname: name},
	}}
	created, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create node %s: %w", name, err)
	}
	now := metav1.NewTime(time.Now())
	created.Status.Conditions = []corev1.NodeCondition{{
		Type:               corev1.NodeReady,
		Status:             corev1.ConditionTrue,
		Reason:             "E2EHarness",
		Message:            "set by the e2e harness; no kubelet runs",
		LastHeartbeatTime:  now,
		LastTransitionTime: now,
	}}
	updated, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("mark node %s ready: %w", name, err)
	}
	return updated, nil
}

// CreatePeerPod creates a pod bound to node with the kata-remote runtime
// class and one pause container, creating namespace ns if needed. Nothing
// runs it: it stays Pending until SetPodPhase moves it.
func (c *Cluster) CreatePeerPod(ctx context.Context, ns, name, node string, annotations map[string]string) (*corev1.Pod, error) {
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	runtimeClass := RuntimeClassName
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeName:         node,
			RuntimeClassName: &runtimeClass,
			Containers:       []corev1.Container{{Name: "pause", Image: PauseImage}},
		},
	}
	created, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", ns, name, err)
	}
	return created, nil
}

// SetPodPhase writes phase into the pod's status through the status
// subresource, as a kubelet would.
func (c *Cluster) SetPodPhase(ctx context.Context, ns, name string, phase corev1.PodPhase) (*corev1.Pod, error) {
	pods := c.client.CoreV1().Pods(ns)
	var updated *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod.Status.Phase = phase
		updated, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("set phase of pod %s/%s to %s: %w", ns, name, phase, err)
	}
	return updated, nil
}

// DeletePod removes the pod at once (grace period 0, as kubectl's --force):
// with no kubelet to confirm a graceful stop, a graceful delete would only
// set deletionTimestamp and leave the object in place. It returns after
// checking that the object is gone.
func (c *Cluster) DeletePod(ctx context.Context, ns, name string) error {
	pods := c.client.CoreV1().Pods(ns)
	zero := int64(0)
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return fmt.Errorf("delete pod %s/%s: %w", ns, name, err)
	}
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("check pod %s/%s is gone: %w", ns, name, err)
	default:
		return fmt.Errorf("pod %s/%s still exists after a forced delete (deletionTimestamp %v, finalizers %v)", ns, name, pod.DeletionTimestamp, pod.Finalizers)
	}
}
