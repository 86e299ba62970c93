package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Nodes is the cluster's Node cache: an informer on every Node (names,
// UIDs and annotations are all this package reads), plus the last time
// each name was seen existing, so a Node deleted and re-created between two
// listings counts as a node that exists.
type Nodes struct {
	client   kubernetes.Interface
	informer cache.SharedIndexInformer
	now      func() time.Time

	mu       sync.Mutex
	lastSeen map[string]time.Time
}

// NewNodes builds the cache; Run starts it.
func NewNodes(client kubernetes.Interface, now func() time.Time) (*Nodes, error) {
	if now == nil {
		now = time.Now
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	n := &Nodes{client: client, informer: factory.Core().V1().Nodes().Informer(), now: now, lastSeen: map[string]time.Time{}}
	// Only what the cluster caa reads is kept: a Node's status (images,
	// conditions) is most of its size, and 1,000 of them add up.
	if err := n.informer.SetTransform(func(obj any) (any, error) {
		if node, ok := obj.(*corev1.Node); ok {
			return &corev1.Node{TypeMeta: node.TypeMeta, ObjectMeta: metav1.ObjectMeta{
				Name: node.Name, UID: node.UID, ResourceVersion: node.ResourceVersion,
				CreationTimestamp: node.CreationTimestamp, Annotations: node.Annotations,
			}}, nil
		}
		return obj, nil
	}); err != nil {
		return nil, fmt.Errorf("node cache: %w", err)
	}
	seen := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if node, ok := obj.(*corev1.Node); ok {
			n.mu.Lock()
			n.lastSeen[node.Name] = n.now()
			n.mu.Unlock()
		}
	}
	if _, err := n.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: seen,
	}); err != nil {
		return nil, fmt.Errorf("node cache: %w", err)
	}
	return n, nil
}

// Run runs the informer until ctx is done.
func (n *Nodes) Run(ctx context.Context) { n.informer.Run(ctx.Done()) }

// Synced reports whether the cache holds a complete list of Nodes.
func (n *Nodes) Synced() bool { return n.informer.HasSynced() }

// Presence reports whether a Node of this name is in the cache, and when
// one was last seen existing. A present node is seen now.
func (n *Nodes) Presence(name string) (bool, time.Time) {
	_, present, err := n.informer.GetStore().GetByKey(name)
	n.mu.Lock()
	defer n.mu.Unlock()
	if err == nil && present {
		n.lastSeen[name] = n.now()
		return true, n.lastSeen[name]
	}
	return false, n.lastSeen[name]
}

// Seen lists every name seen as a Node since this process started (and
// not forgotten), deleted ones too.
func (n *Nodes) Seen() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.lastSeen))
	for name := range n.lastSeen {
		out = append(out, name)
	}
	return out
}

// Names lists the Nodes in the cache.
func (n *Nodes) Names() []string { return n.informer.GetStore().ListKeys() }

// Node returns the cached Node of this name.
func (n *Nodes) Node(name string) (*corev1.Node, bool) {
	obj, ok, err := n.informer.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, false
	}
	node, ok := obj.(*corev1.Node)
	return node, ok
}

// Forget drops the memory of names no VM refers to any more, so a cluster
// that churns through node names keeps a bounded map.
func (n *Nodes) Forget(keep map[string]bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for name := range n.lastSeen {
		if !keep[name] {
			if _, ok, _ := n.informer.GetStore().GetByKey(name); !ok {
				delete(n.lastSeen, name)
			}
		}
	}
}

// ConfirmGone reads the Node from the apiserver itself (a quorum read, not
// the cache): nil only when the apiserver answers that no Node of this name
// exists. A Node that exists, whatever its UID or health, or any failure to
// read, is an error: no delete on anything less than a NotFound.
func (n *Nodes) ConfirmGone(ctx context.Context, name string) error {
	node, err := n.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("read node %s: %w", name, err)
	}
	n.mu.Lock()
	n.lastSeen[name] = n.now()
	n.mu.Unlock()
	return fmt.Errorf("%w: node %s exists (uid %s)", errNodeExists, name, node.UID)
}
