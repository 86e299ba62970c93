package holder

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	authv1 "k8s.io/api/authentication/v1"
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
// visible (hostPID). Without CheckProcess the asker proves its pod with its
// service account token, bound to the pod, which the apiserver reviews
// (TokenReview): the token must be of this caa's service account and bound
// to the pod the asker names. An asker that proves nothing is refused:
// what it says about itself is never enough.
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

// Token review's extra fields the apiserver sets for a token bound to a pod.
const (
	tokenPodName = "authentication.kubernetes.io/pod-name"
	tokenPodUID  = "authentication.kubernetes.io/pod-uid"
)

// Verify returns the asker's verified identity (its pod's UID, as the
// kernel or the apiserver vouch for it) when it may take the ledger, else
// an error whose text is the refusal the asker shows.
func (v *Verifier) Verify(ctx context.Context, asker handover.Peer, cred handover.Cred) (string, error) {
	pod, err := v.verify(ctx, asker, cred)
	if err != nil {
		return "", err
	}
	return string(pod.UID), nil
}

func (v *Verifier) verify(ctx context.Context, asker handover.Peer, cred handover.Cred) (*corev1.Pod, error) {
	ns, ds := v.Self.Namespace, v.DaemonSet
	if asker.Pod == "" || (asker.Namespace != "" && asker.Namespace != ns) {
		return nil, fmt.Errorf("refused: only a pod of DaemonSet %s/%s may take this ledger, and the asker names pod %q in namespace %q",
			ns, ds.Name, asker.Pod, asker.Namespace)
	}
	if asker.Pod == v.Self.Name {
		return nil, fmt.Errorf("refused: the asker names this caa's own pod %s (a `kubectl exec` into it?)", asker.Pod)
	}
	pod, err := v.Client.CoreV1().Pods(ns).Get(ctx, asker.Pod, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("refused: the asker's pod %s/%s: %w", ns, asker.Pod, err)
	}
	if owner := metav1.GetControllerOf(pod); owner == nil || owner.UID != ds.UID {
		return nil, fmt.Errorf("refused: pod %s/%s is not a pod of DaemonSet %s/%s", ns, pod.Name, ns, ds.Name)
	}
	if pod.Spec.NodeName != v.Node {
		return nil, fmt.Errorf("refused: pod %s/%s runs on node %q, not %q", ns, pod.Name, pod.Spec.NodeName, v.Node)
	}
	if asker.UID != "" && types.UID(asker.UID) != pod.UID {
		return nil, fmt.Errorf("refused: the asker says pod UID %s, but pod %s/%s is %s", asker.UID, ns, pod.Name, pod.UID)
	}
	if v.CheckProcess {
		root := v.ProcRoot
		if root == "" {
			root = "/proc"
		}
		uid, init, err := handover.ProcessPod(root, cred.PID)
		switch {
		case err != nil:
			return nil, fmt.Errorf("refused: %w", err)
		case types.UID(uid) != pod.UID:
			return nil, fmt.Errorf("refused: the asking process %d runs in pod UID %s, not in pod %s/%s (%s)", cred.PID, uid, ns, pod.Name, pod.UID)
		case !init:
			return nil, fmt.Errorf("refused: the asking process %d is not its container's main process (a `kubectl exec`?)", cred.PID)
		}
	} else if err := v.reviewToken(ctx, asker, pod); err != nil {
		return nil, err
	}
	current, err := v.currentRevision(ctx)
	if err != nil {
		return nil, fmt.Errorf("refused: %w", err)
	}
	if got := pod.Labels[revisionLabel]; got != current {
		return nil, fmt.Errorf("refused: pod %s/%s runs revision %q of DaemonSet %s, whose current revision is %q: only the current revision takes the ledger",
			ns, pod.Name, got, ds.Name, current)
	}
	return pod, nil
}

// reviewToken has the apiserver vouch that the asker holds a token of this
// caa's service account bound to pod.
func (v *Verifier) reviewToken(ctx context.Context, asker handover.Peer, pod *corev1.Pod) error {
	if asker.Token == "" {
		return fmt.Errorf("refused: the asker sent no service account token, so nothing proves it runs in pod %s/%s "+
			"(a caa from before tokens were sent, or a process outside the pod); set CAA_HANDOVER_CHECK_PROCESS=true with hostPID to "+
			"verify askers by their process instead", pod.Namespace, pod.Name)
	}
	tr, err := v.Client.AuthenticationV1().TokenReviews().Create(ctx,
		&authv1.TokenReview{Spec: authv1.TokenReviewSpec{Token: asker.Token}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("refused: the apiserver's review of the asker's token failed (caa's ClusterRole needs create on "+
			"tokenreviews.authentication.k8s.io): %w", err)
	}
	st := tr.Status
	if !st.Authenticated {
		return fmt.Errorf("refused: the apiserver does not accept the asker's token: %s", st.Error)
	}
	sa := v.Self.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	if want := "system:serviceaccount:" + v.Self.Namespace + ":" + sa; st.User.Username != want {
		return fmt.Errorf("refused: the asker's token is %s's, not %s's", st.User.Username, want)
	}
	uids, names := st.User.Extra[tokenPodUID], st.User.Extra[tokenPodName]
	if len(uids) != 1 || types.UID(uids[0]) != pod.UID || len(names) != 1 || names[0] != pod.Name {
		return fmt.Errorf("refused: the asker's token is bound to pod %v (UID %v), not to pod %s/%s (%s)", names, uids, pod.Namespace, pod.Name, pod.UID)
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
