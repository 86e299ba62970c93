// Package nodecap advertises how many peer-pod VMs a node takes, as the node
// extended resource kata.peerpods.io/vm.
//
// Clusters that run upstream's peer-pods mutating webhook (confidential-
// containers/cloud-api-adaptor, src/webhook) ask every pod of a peer-pods
// runtime class for one kata.peerpods.io/vm; the scheduler places such a pod
// only on a node whose status.allocatable offers it. Upstream's adaptor
// advertises it at start from PEERPODS_LIMIT_PER_NODE (default 10; a negative
// value advertises nothing), confirmed at fbdde756. caa does the same from
// --max-pod-vms, and keeps it true: it re-asserts the value while it holds the
// ledger, so a kubelet re-registration that zeroes extended resources is
// repaired, and it never removes the resource when it stops (a surge
// hand-over's new caa already advertises it, and the old one leaving must
// not take it away).
package nodecap

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Resource is the extended resource upstream's webhook requests (its
// POD_VM_EXTENDED_RESOURCE default).
const Resource corev1.ResourceName = "kata.peerpods.io/vm"

// DefaultMax is upstream's default number of peer pods per node.
const DefaultMax = 10

// Advertiser keeps a Node's capacity and allocatable of Resource at Max.
type Advertiser struct {
	Client kubernetes.Interface
	Node   string
	// Max is the number of peer-pod VMs the node takes; negative: advertise
	// nothing (the Node's status is left alone).
	Max int
	Log *slog.Logger
}

// Ensure sets the Node's status.capacity and status.allocatable of Resource
// to Max, with one merge patch of the status subresource, unless both already
// say so (then it writes nothing). It reports whether it wrote.
func (a Advertiser) Ensure(ctx context.Context) (bool, error) {
	if a.Max < 0 {
		return false, nil
	}
	want := *resource.NewQuantity(int64(a.Max), resource.DecimalSI)
	n, err := a.Client.CoreV1().Nodes().Get(ctx, a.Node, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("read node %s: %w", a.Node, err)
	}
	if same(n.Status.Capacity, want) && same(n.Status.Allocatable, want) {
		return false, nil
	}
	v := want.String()
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"capacity":    map[string]string{string(Resource): v},
		"allocatable": map[string]string{string(Resource): v},
	}})
	if err != nil {
		return false, err
	}
	_, err = a.Client.CoreV1().Nodes().Patch(ctx, a.Node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "caa"}, "status")
	if apierrors.IsForbidden(err) {
		return false, fmt.Errorf("advertise %s=%s on node %s: %w (the ServiceAccount needs patch on nodes/status; "+
			"or set --max-pod-vms=-1 to advertise nothing)", Resource, v, a.Node, err)
	}
	if err != nil {
		return false, fmt.Errorf("advertise %s=%s on node %s: %w", Resource, v, a.Node, err)
	}
	return true, nil
}

func same(l corev1.ResourceList, want resource.Quantity) bool {
	q, ok := l[Resource]
	return ok && q.Cmp(want) == 0
}

// Run calls Ensure now and then about every interval (±25%), until ctx is
// done; a failure is logged and tried again at the next turn, sooner at
// first.
func (a Advertiser) Run(ctx context.Context, interval time.Duration) {
	if a.Max < 0 {
		return
	}
	log := a.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	retry := time.Second
	for {
		wait := interval
		wrote, err := a.Ensure(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("cannot advertise the node's peer-pod capacity", "resource", string(Resource), "max", a.Max, "err", err)
			wait = min(retry, interval)
			retry = min(2*retry, interval)
		case err == nil:
			retry = time.Second
			if wrote {
				log.Info("advertised the node's peer-pod capacity", "resource", string(Resource), "max", a.Max)
			}
		}
		wait += time.Duration((rand.Float64() - 0.5) * 0.5 * float64(wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
