package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/pkg/nodecap"
	"github.com/caa-project/caa/pkg/provider"
)

// UninstallCloud is what the uninstall needs of the cloud: the cluster's
// listing and a delete.
type UninstallCloud interface {
	provider.ClusterLister
	Delete(ctx context.Context, id string) error
}

// Uninstall is `caa uninstall`'s work, once caa is removed from the
// cluster (no caa pod runs): it deletes every VM the cloud lists for the
// cluster, and removes what caa wrote on the Nodes (the peer-pod capacity,
// the ledger id, the cluster view). It refuses to start while a caa pod or
// a peer pod still exists: a running caa would write beside it, and a peer
// pod's VM is its pod's (delete the pod, and caa deletes its VM, first).
// A VM is deleted only on positive evidence: its node tag names a Node of
// this cluster (or DepartedNodes says the Nodes that left may be trusted)
// and no pod of the cluster has its pod UID. A wrong --cluster-id, naming
// another cluster on the same account, therefore finds that cluster's VMs
// on Nodes this one does not have and keeps them. Every step is
// idempotent: run it again after a failure.
type Uninstall struct {
	Client kubernetes.Interface
	Cloud  UninstallCloud
	// Cluster is the cluster id the VMs are tagged with.
	Cluster string
	// Namespace is caa's; RuntimeClasses the peer pods' (caa's --runtime-classes).
	Namespace      string
	RuntimeClasses []string
	// DryRun says what would be done and does nothing.
	DryRun bool
	// DepartedNodes deletes the VMs tagged for Nodes the cluster no
	// longer has too; without it they are kept and listed.
	DepartedNodes bool
	// Wait bounds the wait for the cloud to list the deleted VMs as gone;
	// Poll is the period of its listings.
	Wait, Poll time.Duration
	Out        io.Writer
}

// UninstallReport is what an uninstall did (or, dry, would do).
type UninstallReport struct {
	VMsDeleted []string // VM ids
	VMsKept    []string // VMs whose pod UID a pod of the cluster still has
	// VMsOfUnknownNodes are kept: tagged for a Node the cluster does not
	// have (a node that left, or another cluster's under a wrong id).
	VMsOfUnknownNodes []string
	NodesCleaned      []string
}

// caaPodNames are the app.kubernetes.io/name labels of caa's pods that
// write to the cloud or the Nodes.
var caaPodNames = []string{"caa", "caa-cluster"}

// Run runs the uninstall.
func (u *Uninstall) Run(ctx context.Context) (UninstallReport, error) {
	var rep UninstallReport
	if u.Cluster == "" {
		return rep, errors.New("uninstall: no cluster id: pass --cluster-id, or let it be read from kube-system")
	}
	if u.Poll <= 0 {
		u.Poll = 5 * time.Second
	}
	if u.Out == nil {
		u.Out = io.Discard
	}
	if err := u.checkNoCaa(ctx); err != nil {
		return rep, err
	}
	pods, err := u.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return rep, fmt.Errorf("uninstall: list the cluster's pods: %w", err)
	}
	if err := u.checkNoPeerPods(pods.Items); err != nil {
		return rep, err
	}
	uids := map[string]string{}
	for _, p := range pods.Items {
		uids[string(p.UID)] = p.Namespace + "/" + p.Name
	}
	nodes, err := u.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return rep, fmt.Errorf("uninstall: list the Nodes: %w", err)
	}
	known := map[string]bool{}
	for _, n := range nodes.Items {
		known[n.Name] = true
	}
	if rep, err = u.deleteVMs(ctx, uids, known); err != nil {
		return rep, err
	}
	rep.NodesCleaned, err = u.cleanNodes(ctx)
	return rep, err
}

// checkNoCaa looks for caa's pods in every namespace, not only in
// --namespace: a caa installed elsewhere, or a wrong flag, must still stop
// the uninstall.
func (u *Uninstall) checkNoCaa(ctx context.Context) error {
	sel := "app.kubernetes.io/name in (" + strings.Join(caaPodNames, ",") + ")"
	pods, err := u.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("uninstall: list caa's pods: %w", err)
	}
	var names []string
	for _, p := range pods.Items {
		if p.Namespace == u.Namespace {
			names = append(names, p.Name)
		} else {
			names = append(names, p.Namespace+"/"+p.Name)
		}
	}
	if len(names) > 0 {
		return fmt.Errorf("uninstall: caa still runs in namespace %s (%s): remove it first (helm uninstall, or kubectl delete -k with your overlay), "+
			"so that no caa creates or deletes beside this command; its VMs and Nodes are left as they are", u.Namespace, listed(names))
	}
	return nil
}

func (u *Uninstall) checkNoPeerPods(pods []corev1.Pod) error {
	var names []string
	for _, p := range pods {
		if p.Spec.RuntimeClassName == nil || !slices.Contains(u.RuntimeClasses, *p.Spec.RuntimeClassName) {
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		names = append(names, p.Namespace+"/"+p.Name)
	}
	if len(names) > 0 {
		return fmt.Errorf("uninstall: %d peer pods (runtime class %s) still exist (%s): delete them, or the workloads that make them, "+
			"before caa is removed (caa deletes each one's VM), then run this again; nothing was deleted", len(names),
			strings.Join(u.RuntimeClasses, ", "), listed(names))
	}
	return nil
}

// deleteVMs deletes every listed VM of the cluster whose pod UID no pod of
// the cluster has and whose node is one of known (or any, with
// DepartedNodes), then lists again until none shows but as terminated.
func (u *Uninstall) deleteVMs(ctx context.Context, uids map[string]string, known map[string]bool) (UninstallReport, error) {
	var rep UninstallReport
	vms, err := u.Cloud.ListCluster(ctx, u.Cluster)
	if err != nil {
		return rep, fmt.Errorf("uninstall: list the cluster's VMs: %w", err)
	}
	sort.Slice(vms, func(i, j int) bool { return vms[i].ID < vms[j].ID })
	var errs []error
	for _, vm := range vms {
		if vm.State.Gone() {
			continue
		}
		o := vm.Owner()
		if pod, ok := uids[o.PodUID]; ok && o.PodUID != "" {
			rep.VMsKept = append(rep.VMsKept, vm.ID)
			fmt.Fprintf(u.Out, "kept VM %s: its pod %s still exists\n", vm.ID, pod)
			continue
		}
		if !known[o.Node] && !u.DepartedNodes {
			rep.VMsOfUnknownNodes = append(rep.VMsOfUnknownNodes, vm.ID)
			fmt.Fprintf(u.Out, "kept VM %s: its node %q is not a Node of this cluster (a node that left, or another cluster's VM if --cluster-id is wrong)\n", vm.ID, o.Node)
			continue
		}
		rep.VMsDeleted = append(rep.VMsDeleted, vm.ID)
		if u.DryRun {
			fmt.Fprintf(u.Out, "would delete VM %s (node %s, pod %s)\n", vm.ID, o.Node, o.Pod)
			continue
		}
		if err := u.Cloud.Delete(ctx, vm.ID); err != nil {
			errs = append(errs, fmt.Errorf("delete VM %s: %w", vm.ID, err))
			continue
		}
		fmt.Fprintf(u.Out, "deleted VM %s (node %s, pod %s)\n", vm.ID, o.Node, o.Pod)
	}
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("uninstall: %w (run it again once the cause is fixed)", err)
	}
	if u.DryRun || len(rep.VMsDeleted) == 0 {
		return rep, nil
	}
	// The deletes were accepted; the cloud shows them done a while later.
	deadline := time.Now().Add(u.Wait)
	for {
		vms, err := u.Cloud.ListCluster(ctx, u.Cluster)
		if err != nil {
			return rep, fmt.Errorf("uninstall: list the cluster's VMs again: %w", err)
		}
		var left []string
		for _, vm := range vms {
			if slices.Contains(rep.VMsDeleted, vm.ID) && !vm.State.Gone() {
				left = append(left, vm.ID+" ("+string(vm.State)+")")
			}
		}
		if len(left) == 0 {
			return rep, nil
		}
		if time.Now().After(deadline) {
			return rep, fmt.Errorf("uninstall: %d deleted VMs are not terminated after %s: %s; look at them in the cloud's console, "+
				"or run this again", len(left), u.Wait, listed(left))
		}
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case <-time.After(u.Poll):
		}
	}
}

// nodeAnnotations are what caa writes in a Node's metadata.
var nodeAnnotations = []string{ledgerAnnotation, ViewAnnotation}

// ledgerAnnotation is reconcile.LedgerAnnotation, which this package
// cannot import (reconcile's tests import this package);
// TestLedgerAnnotationIsReconciles keeps the two equal.
const ledgerAnnotation = "caa.dev/ledger-id"

// cleanNodes removes the peer-pod capacity and caa's annotations from
// every Node that has them.
func (u *Uninstall) cleanNodes(ctx context.Context) ([]string, error) {
	nodes, err := u.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("uninstall: list the Nodes: %w", err)
	}
	var cleaned []string
	var errs []error
	for _, n := range nodes.Items {
		var status []map[string]string
		for _, field := range []string{"capacity", "allocatable"} {
			list := n.Status.Capacity
			if field == "allocatable" {
				list = n.Status.Allocatable
			}
			if _, ok := list[nodecap.Resource]; ok {
				status = append(status, map[string]string{"op": "remove", "path": "/status/" + field + "/" + jsonPointer(string(nodecap.Resource))})
			}
		}
		annotations := map[string]any{}
		for _, a := range nodeAnnotations {
			if _, ok := n.Annotations[a]; ok {
				annotations[a] = nil
			}
		}
		if len(status) == 0 && len(annotations) == 0 {
			continue
		}
		cleaned = append(cleaned, n.Name)
		if u.DryRun {
			fmt.Fprintf(u.Out, "would clean Node %s\n", n.Name)
			continue
		}
		if len(status) > 0 {
			patch, _ := json.Marshal(status)
			if _, err := u.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.JSONPatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
				errs = append(errs, fmt.Errorf("remove %s from Node %s: %w", nodecap.Resource, n.Name, err))
			}
		}
		if len(annotations) > 0 {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
			if _, err := u.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				errs = append(errs, fmt.Errorf("remove caa's annotations from Node %s: %w", n.Name, err))
			}
		}
		fmt.Fprintf(u.Out, "cleaned Node %s\n", n.Name)
	}
	if err := errors.Join(errs...); err != nil {
		return cleaned, fmt.Errorf("uninstall: %w (run it again once the cause is fixed)", err)
	}
	return cleaned, nil
}

// jsonPointer escapes a key for a JSON patch path.
func jsonPointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// listed shows the first names of a list and how many more.
func listed(names []string) string {
	const show = 10
	if len(names) <= show {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:show], ", ") + fmt.Sprintf(" and %d more", len(names)-show)
}
