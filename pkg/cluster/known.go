package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// KnownNodesKey is the ConfigMap key that holds the node names, one a line.
const KnownNodesKey = "nodes"

// KnownNodes is the durable set of node names this cluster has had as
// Nodes, kept in a ConfigMap beside the Lease. The leader deletes the VMs
// of a departed node only if the node is in it: a VM tagged with this
// cluster's id for a node this cluster never had is evidence of a second
// cluster on the same id (a restore from an etcd snapshot keeps the
// kube-system UID), and is never deleted from here. A name leaves the set
// once no Node and no listed VM has it, so the set stays as large as the
// cluster. Not safe for concurrent use (the leader's sweep owns it).
type KnownNodes struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string

	names   map[string]bool
	version string // the ConfigMap's resourceVersion, the guard of an update
	exists  bool   // whether the ConfigMap exists
	loaded  bool
	dirty   bool
}

// Load reads the set (an absent ConfigMap is an empty set: a first run).
func (k *KnownNodes) Load(ctx context.Context) error {
	cm, err := k.Client.CoreV1().ConfigMaps(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		k.names, k.version, k.exists = map[string]bool{}, "", false
	case err != nil:
		return fmt.Errorf("read the known node names (ConfigMap %s/%s): %w", k.Namespace, k.Name, err)
	default:
		k.names, k.version, k.exists = map[string]bool{}, cm.ResourceVersion, true
		for _, n := range strings.Split(cm.Data[KnownNodesKey], "\n") {
			if n = strings.TrimSpace(n); n != "" {
				k.names[n] = true
			}
		}
	}
	k.loaded, k.dirty = true, false
	return nil
}

// Loaded reports whether Load succeeded since the last failed Save.
func (k *KnownNodes) Loaded() bool { return k.loaded }

// Add puts names in the set.
func (k *KnownNodes) Add(names ...string) {
	for _, n := range names {
		if n != "" && !k.names[n] {
			k.names[n] = true
			k.dirty = true
		}
	}
}

// Has reports whether this cluster has had a Node of this name.
func (k *KnownNodes) Has(name string) bool { return k.names[name] }

// Len is the size of the set.
func (k *KnownNodes) Len() int { return len(k.names) }

// Forget drops the names keep does not hold.
func (k *KnownNodes) Forget(keep func(name string) bool) {
	for n := range k.names {
		if !keep(n) {
			delete(k.names, n)
			k.dirty = true
		}
	}
}

// Save writes the set when it changed, guarded by the resourceVersion it
// was read at; a conflict (another leader wrote meanwhile) makes the next
// sweep read it again, and nothing is deleted until then.
func (k *KnownNodes) Save(ctx context.Context) error {
	if !k.dirty {
		return nil
	}
	names := slices.Sorted(maps.Keys(k.names))
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace, ResourceVersion: k.version,
			Labels: map[string]string{"app.kubernetes.io/name": "caa-cluster"}},
		Data: map[string]string{KnownNodesKey: strings.Join(names, "\n")},
	}
	var (
		saved *corev1.ConfigMap
		err   error
	)
	if !k.exists {
		saved, err = k.Client.CoreV1().ConfigMaps(k.Namespace).Create(ctx, cm, metav1.CreateOptions{FieldManager: "caa-cluster"})
	} else {
		saved, err = k.Client.CoreV1().ConfigMaps(k.Namespace).Update(ctx, cm, metav1.UpdateOptions{FieldManager: "caa-cluster"})
	}
	if err != nil {
		k.loaded = false
		return fmt.Errorf("write the known node names (ConfigMap %s/%s): %w", k.Namespace, k.Name, err)
	}
	k.version, k.exists, k.dirty = saved.ResourceVersion, true, false
	return nil
}
