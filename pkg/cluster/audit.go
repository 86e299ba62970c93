package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

// NodeAudit is the node caa's side of the cluster audit: it reads the View
// the leader put on this node's Node (one apiserver read, no cloud call)
// and turns it into the audit's listing. What the view agrees with the
// ledger on costs nothing; a recorded VM the view shows gone, dead or not
// at all is left out of the listing, so the reconciler reads it by id and
// acts under its own rules (I3: one listing never deletes or recreates by
// itself); a VM the view shows and no record names is read by id too, and
// kept only if the cloud itself tags it for this node. Without a fresh
// view (no cluster caa, or no leader for two intervals), ok is false and
// the node lists the cloud as before.
type NodeAudit struct {
	Client   kubernetes.Interface
	Provider provider.Provider
	Log      *slog.Logger
	Now      func() time.Time

	mu    sync.Mutex
	using bool // whether the last audit used a view (to log changes only)
	// Counters, for /metrics and tests.
	Matched  atomic.Int64 // audits done from the view alone
	WithRead atomic.Int64 // audits from the view plus reads by id
	Alone    atomic.Int64 // audits that fell back to the node's own listing
}

// AuditVMs returns the listing for sel's node built from the cluster view,
// or ok false when there is no fresh view to trust.
func (a *NodeAudit) AuditVMs(ctx context.Context, sel provider.Selector, records []ledger.Record) ([]provider.VM, bool) {
	view, err := a.view(ctx, sel.Node)
	if err != nil {
		a.Alone.Add(1)
		a.switched(false, "err", err)
		return nil, false
	}
	a.switched(true, "listedAt", view.At)
	recorded := map[string]bool{}
	for _, rec := range records {
		if rec.VMID != "" {
			recorded[rec.VMID] = true
		}
	}
	var vms []provider.VM
	reads := 0
	for _, v := range view.VMs {
		switch {
		case recorded[v.ID] && v.State.Alive():
			vms = append(vms, provider.VM{ID: v.ID, Name: v.ID, State: v.State, Tags: map[string]string{
				provider.TagCluster: sel.Cluster, provider.TagNode: sel.Node, provider.TagManagedBy: provider.ManagedByValue,
				provider.TagPodUID: v.PodUID, provider.TagKey: v.Key,
			}})
		case recorded[v.ID]:
			// Gone or dead in the view: the reconciler reads it by id.
			reads++
		default:
			// Unknown to the ledger: what the cloud says now, if it is ours.
			reads++
			vm, err := a.Provider.Get(ctx, v.ID)
			if err == nil && sel.Matches(vm.Tags) {
				vms = append(vms, vm)
			}
		}
	}
	shown := make(map[string]bool, len(view.VMs))
	for _, v := range view.VMs {
		shown[v.ID] = true
	}
	for id := range recorded {
		if !shown[id] {
			reads++ // not in the view: read by id
		}
	}
	if reads == 0 {
		a.Matched.Add(1)
	} else {
		a.WithRead.Add(1)
	}
	return vms, true
}

var errNoView = errors.New("no cloud view on the Node")

func (a *NodeAudit) view(ctx context.Context, node string) (View, error) {
	n, err := a.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		return View{}, err
	}
	s, ok := n.Annotations[ViewAnnotation]
	if !ok {
		return View{}, errNoView
	}
	v, err := ParseView(s)
	if err != nil {
		return View{}, err
	}
	now := time.Now()
	if a.Now != nil {
		now = a.Now()
	}
	if !v.Fresh(now) {
		return View{}, errors.New("the cloud view is stale (listed at " + v.At.Format(time.RFC3339) + "): no cluster caa leader")
	}
	return v, nil
}

// switched logs when the node starts or stops auditing from the view.
func (a *NodeAudit) switched(using bool, args ...any) {
	a.mu.Lock()
	changed := a.using != using
	a.using = using
	a.mu.Unlock()
	if !changed || a.Log == nil {
		return
	}
	if using {
		a.Log.Info("auditing from the cluster caa's cloud view", args...)
		return
	}
	a.Log.Info("auditing alone: listing this node's VMs", args...)
}
