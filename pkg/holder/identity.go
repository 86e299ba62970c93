package holder

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/pkg/handover"
)

// revisionLabel is the label the DaemonSet controller puts on its pods and
// ControllerRevisions: the hash of the pod template's revision.
const revisionLabel = "controller-revision-hash"

// Verifier decides whether an asker may take this node's ledger: it must
// be a pod of this caa's DaemonSet, on this node, of the DaemonSet's
// current revision (a `kubectl rollout undo` in flight does not hand the
// ledger to the older pod), and not this caa's own pod. With
// CheckProcess, the kernel's word on the asking process (SO_PEERCRED ->
// pid -> cgroup -> pod UID) must match that pod, and the process must be
// its container's first one; that needs the processes of the node's pods
// visible (hostPID).
type Verifier struct {
	Client       kubernetes.Interface
	Node         string
	Self         *corev1.Pod       // this caa's pod
	DaemonSet    *appsv1.DaemonSet // its controller
	CheckProcess bool
	ProcRoot     string // "/proc"
}

// SelfAndDaemonSet reads this caa's pod and the DaemonSet that controls it.
func SelfAndDaemonSet(ctx context.Context, client kubernetes.Interface, namespace, name string) (*corev1.Pod, *appsv1.DaemonSet, error) {
	pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("this caa's pod %s/%s: %w", namespace, name, err)
	}
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "DaemonSet" {
		return pod, nil, fmt.Errorf("this caa's pod %s/%s is not controlled by a DaemonSet", namespace, name)
	}
	ds, err := client.AppsV1().DaemonSets(namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if err != nil {
		return pod, nil, fmt.Errorf("this caa's DaemonSet %s/%s: %w", namespace, owner.Name, err)
	}
	return pod, ds, nil
}

// Verify returns nil when asker may take the ledger, else an error whose
// text is the refusal the asker shows.
func (v *Verifier) Verify(ctx context.Context, asker handover.Peer, cred handover.Cred) error {
	ns, ds := v.Self.Namespace, v.DaemonSet
	if asker.Pod == "" || (asker.Namespace != "" && asker.Namespace != ns) {
		return fmt.Errorf("refused: only a pod of DaemonSet %s/%s may take this ledger, and the asker names pod %q in namespace %q",
			ns, ds.Name, asker.Pod, asker.Namespace)
	}
	if asker.Pod == v.Self.Name {
		return fmt.Errorf("refused: the asker names this caa's own pod %s (a `kubectl exec` into it?)", asker.Pod)
	}
	pod, err := v.Client.CoreV1().Pods(ns).Get(ctx, asker.Pod, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("refused: the asker's pod %s/%s: %w", ns, asker.Pod, err)
	}
	if owner := metav1.GetControllerOf(pod); owner == nil || owner.UID != ds.UID {
		return fmt.Errorf("refused: pod %s/%s is not a pod of DaemonSet %s/%s", ns, pod.Name, ns, ds.Name)
	}
	if pod.Spec.NodeName != v.Node {
		return fmt.Errorf("refused: pod %s/%s runs on node %q, not %q", ns, pod.Name, pod.Spec.NodeName, v.Node)
	}
	if asker.UID != "" && types.UID(asker.UID) != pod.UID {
		return fmt.Errorf("refused: the asker says pod UID %s, but pod %s/%s is %s", asker.UID, ns, pod.Name, pod.UID)
	}
	if v.CheckProcess {
		root := v.ProcRoot
		if root == "" {
			root = "/proc"
		}
		uid, init, err := handover.ProcessPod(root, cred.PID)
		switch {
		case err != nil:
			return fmt.Errorf("refused: %w", err)
		case types.UID(uid) != pod.UID:
			return fmt.Errorf("refused: the asking process %d runs in pod UID %s, not in pod %s/%s (%s)", cred.PID, uid, ns, pod.Name, pod.UID)
		case !init:
			return fmt.Errorf("refused: the asking process %d is not its container's main process (a `kubectl exec`?)", cred.PID)
		}
	}
	current, err := v.currentRevision(ctx)
	if err != nil {
		return fmt.Errorf("refused: %w", err)
	}
	if got := pod.Labels[revisionLabel]; got != current {
		return fmt.Errorf("refused: pod %s/%s runs revision %q of DaemonSet %s, whose current revision is %q: only the current revision takes the ledger",
			ns, pod.Name, got, ds.Name, current)
	}
	return nil
}

// currentRevision is the hash of the DaemonSet's newest ControllerRevision.
func (v *Verifier) currentRevision(ctx context.Context) (string, error) {
	ds := v.DaemonSet
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return "", fmt.Errorf("DaemonSet %s selector: %w", ds.Name, err)
	}
	list, err := v.Client.AppsV1().ControllerRevisions(ds.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return "", fmt.Errorf("the revisions of DaemonSet %s: %w", ds.Name, err)
	}
	var newest *appsv1.ControllerRevision
	for i := range list.Items {
		r := &list.Items[i]
		if owner := metav1.GetControllerOf(r); owner == nil || owner.UID != ds.UID {
			continue
		}
		if newest == nil || r.Revision > newest.Revision {
			newest = r
		}
	}
	if newest == nil {
		return "", fmt.Errorf("DaemonSet %s has no revision yet", ds.Name)
	}
	return newest.Labels[revisionLabel], nil
}

// Surge reports whether the DaemonSet's update strategy runs two pods on
// a node at once.
func Surge(ds *appsv1.DaemonSet) bool {
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ds.Spec.UpdateStrategy.Type == appsv1.OnDeleteDaemonSetStrategyType || ru == nil || ru.MaxSurge == nil {
		return false
	}
	if ru.MaxSurge.StrVal != "" {
		return ru.MaxSurge.StrVal != "0%" && ru.MaxSurge.StrVal != "0"
	}
	return ru.MaxSurge.IntVal > 0
}
