package cluster

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

func TestLedgerAnnotationIsReconciles(t *testing.T) {
	assert.Equal(t, reconcile.LedgerAnnotation, ledgerAnnotation)
}

func uninstallVM(id, cluster, node, podUID string) provider.VM {
	return provider.VM{ID: id, State: provider.StateRunning,
		Tags: provider.Spec{Key: id + "-k", Cluster: cluster, Node: node, PodUID: podUID, PodNamespace: "team", PodName: id}.Tags()}
}

// TestUninstallDeletesOnlyOnPositiveEvidence: a VM whose pod UID a pod of
// the cluster still has (a pod of a runtime class caa no longer watches)
// is kept and reported; the others of the cluster are deleted, another
// cluster's never; a terminal peer pod does not block; the dry run changes
// nothing.
func TestUninstallDeletesOnlyOnPositiveEvidence(t *testing.T) {
	runc := "runc"
	client := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "kept", UID: types.UID("uid-kept")},
			Spec: corev1.PodSpec{RuntimeClassName: &runc}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "done", UID: types.UID("uid-done")},
			Spec: corev1.PodSpec{RuntimeClassName: ptr("kata-remote")}, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
	)
	cloud := &fakeCloud{vms: []provider.VM{uninstallVM("vm-kept", "c1", "n1", "uid-kept"), uninstallVM("vm-gone", "c1", "n1", "uid-gone"),
		uninstallVM("vm-departed", "c1", "n9", "uid-x"), uninstallVM("vm-other", "c2", "n1", "uid-y")}}
	var out strings.Builder
	u := &Uninstall{Client: client, Cloud: cloud, Cluster: "c1", Namespace: "caa-system", RuntimeClasses: []string{"kata-remote"},
		DryRun: true, Out: &out}
	rep, err := u.Run(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []string{"vm-gone"}, rep.VMsDeleted)
	assert.Equal(t, []string{"vm-departed"}, rep.VMsOfUnknownNodes, "a VM of a node the cluster lacks needs --departed-nodes")
	assert.Empty(t, cloud.deleted, "a dry run deletes nothing")

	u.DryRun = false
	rep, err = u.Run(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []string{"vm-kept"}, rep.VMsKept)
	assert.Equal(t, []string{"vm-gone"}, cloud.deleted)
	assert.Contains(t, out.String(), "kept VM vm-kept: its pod team/kept still exists")
	assert.Contains(t, out.String(), `kept VM vm-departed: its node "n9" is not a Node of this cluster`)

	u.DepartedNodes = true
	_, err = u.Run(context.Background())
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"vm-gone", "vm-departed"}, cloud.deleted)
}

// TestUninstallWithAnotherClustersID: --cluster-id naming another cluster
// on the same account lists that cluster's VMs; none of their nodes is a
// Node here and none of their pods is gone from here as evidence, so
// nothing is deleted.
func TestUninstallWithAnotherClustersID(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	cloud := &fakeCloud{vms: []provider.VM{uninstallVM("vm-a", "other", "their-n1", "uid-a"), uninstallVM("vm-b", "other", "their-n2", "uid-b")}}
	u := &Uninstall{Client: client, Cloud: cloud, Cluster: "other", Namespace: "caa-system", RuntimeClasses: []string{"kata-remote"}}
	rep, err := u.Run(context.Background())
	require.NoError(t, err)
	assert.Empty(t, cloud.deleted)
	assert.Equal(t, []string{"vm-a", "vm-b"}, rep.VMsOfUnknownNodes)
}

// TestUninstallRefusesWhileCaaOrPeerPodsRun: a caa pod in caa's namespace,
// or a live peer pod anywhere, stops it before any cloud call.
func TestUninstallRefusesWhileCaaOrPeerPodsRun(t *testing.T) {
	for name, pod := range map[string]*corev1.Pod{
		"caa pod": {ObjectMeta: metav1.ObjectMeta{Namespace: "caa-system", Name: "caa-abc", Labels: map[string]string{"app.kubernetes.io/name": "caa"}}},
		"caa pod in another namespace": {ObjectMeta: metav1.ObjectMeta{Namespace: "peerpods", Name: "caa-def",
			Labels: map[string]string{"app.kubernetes.io/name": "caa"}}},
		"cluster caa": {ObjectMeta: metav1.ObjectMeta{Namespace: "caa-system", Name: "caa-cluster-1",
			Labels: map[string]string{"app.kubernetes.io/name": "caa-cluster"}}},
		"peer pod": {ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web"}, Spec: corev1.PodSpec{RuntimeClassName: ptr("kata-remote")}},
	} {
		t.Run(name, func(t *testing.T) {
			cloud := &fakeCloud{vms: []provider.VM{uninstallVM("vm-1", "c1", "n1", "uid-1")}}
			u := &Uninstall{Client: fake.NewClientset(pod), Cloud: cloud, Cluster: "c1", Namespace: "caa-system", RuntimeClasses: []string{"kata-remote"}}
			_, err := u.Run(context.Background())
			require.Error(t, err)
			assert.Contains(t, err.Error(), pod.Name)
			assert.Zero(t, cloud.lists, "no cloud call")
			assert.Empty(t, cloud.deleted)
		})
	}
}

func ptr[T any](v T) *T { return &v }
