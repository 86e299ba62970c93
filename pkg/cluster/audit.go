package cluster

import (
	"context"
	"errors"
	"fmt"
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
// and hands the reconciler what it may skip reading. The view is written
// by another process, so it only narrows reads (docs/design.md, "A view
// narrows reads"): a recorded VM the view shows alive under the very pod
// UID and key its record names is vouched for (not read this audit, and
// read from the cloud before anything is done about it); a recorded VM the
// view shows otherwise (gone, dead, under another pod or key) or not at
// all is left for the reconciler to read by id; a VM no record names is
// handed over as an id to read, kept only if the cloud itself tags it for
// this node. Without a fresh view (no cluster caa, no leader for two
// intervals, or older than MaxAge), ok is false and the node lists the
// cloud as before.
type NodeAudit struct {
	Client kubernetes.Interface
	Log    *slog.Logger
	Now    func() time.Time
	// MaxAge is the oldest listing this node trusts, whatever the view
	// says of its own interval (default DefaultViewMaxAge): the writer's
	// word never stretches how stale a view may be.
	MaxAge time.Duration
	// ListEvery bounds how long this node goes without listing its VMs
	// itself (default DefaultListEvery): past it, an audit ignores the
	// view, however fresh, and the node lists the cloud. A view that is
	// kept fresh and calls a dead VM running (anyone with patch on Nodes
	// can write one; the pod UID and key are readable on the VM's tags)
	// would otherwise hide that VM for as long as it is written, and its
	// pod would never get a VM back.
	ListEvery time.Duration

	mu       sync.Mutex
	using    bool      // whether the last audit used a view (to log changes only)
	listedAt time.Time // when this node last listed on its own (the startup pass, at the first audit)
	// Counters, for /metrics and tests.
	Matched  atomic.Int64 // audits done from the view alone
	WithRead atomic.Int64 // audits from the view plus reads by id
	Alone    atomic.Int64 // audits that fell back to the node's own listing
	Bounded  atomic.Int64 // of those, the ones ListEvery called for
}

// DefaultViewMaxAge is NodeAudit.MaxAge's default: two of the cluster
// caa's default intervals (10 min).
const DefaultViewMaxAge = 20 * time.Minute

// DefaultListEvery is NodeAudit.ListEvery's default: every sixth audit at
// the default --audit-interval (10 min). A dead VM a forged view calls
// running is found within an hour and an audit (kata's shim finds a dead
// agent in seconds anyway; with the cluster scope's admission policies
// only the cluster caa can write a view). The price at 1,000 nodes is one
// listing per node an hour: a sixth of what the nodes cost alone (EC2
// 1.39% of DescribeInstances' refill; Azure 9.3% of a shared identity's
// Resource Graph quota), which a shorter bound would multiply.
const DefaultListEvery = time.Hour

// maxViewSkew is how far in the future a view's listing time may lie (the
// two processes' clocks differ a little, never by an interval).
const maxViewSkew = time.Minute

// AuditVMs returns, from the cluster view of sel's node, the recorded VMs
// the view vouches for (by id, with the state it shows) and the ids it
// shows that no record names; ok false when there is no fresh view.
func (a *NodeAudit) AuditVMs(ctx context.Context, sel provider.Selector, records []ledger.Record) (map[string]provider.State, []string, bool) {
	if a.listDue() {
		a.Alone.Add(1)
		a.Bounded.Add(1)
		if a.Log != nil {
			a.Log.Debug("listing this node's VMs on its own, whatever the cloud view says", "every", a.listEvery())
		}
		return nil, nil, false
	}
	view, err := a.view(ctx, sel.Node)
	if err != nil {
		a.Alone.Add(1)
		a.listed()
		a.switched(false, "err", err)
		return nil, nil, false
	}
	a.switched(true, "listedAt", view.At)
	recorded := map[string]*ledger.Record{}
	for i, rec := range records {
		if rec.VMID != "" {
			recorded[provider.VMKey(rec.VMID)] = &records[i]
		}
	}
	vouched := map[string]provider.State{}
	var unknown []string
	shown := make(map[string]bool, len(view.VMs))
	for _, v := range view.VMs {
		key := provider.VMKey(v.ID)
		if shown[key] {
			continue
		}
		shown[key] = true
		rec := recorded[key]
		switch {
		case rec == nil:
			unknown = append(unknown, v.ID)
		case v.State.Alive() && v.PodUID == rec.PodUID && v.Key == rec.Key:
			vouched[rec.VMID] = v.State
		}
		// Otherwise (gone, dead, or not what the record says): the
		// reconciler reads it by id.
	}
	if len(vouched) == len(recorded) && len(unknown) == 0 {
		a.Matched.Add(1)
	} else {
		a.WithRead.Add(1)
	}
	return vouched, unknown, true
}

var errNoView = errors.New("no cloud view on the Node")

func (a *NodeAudit) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *NodeAudit) listEvery() time.Duration {
	if a.ListEvery > 0 {
		return a.ListEvery
	}
	return DefaultListEvery
}

// listDue says whether this audit must list on its own (ListEvery has
// passed since the node last did), and if so counts it as done. The first
// audit starts the count: the startup pass before it listed.
func (a *NodeAudit) listDue() bool {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.listedAt.IsZero() {
		a.listedAt = now
		return false
	}
	if now.Sub(a.listedAt) < a.listEvery() {
		return false
	}
	a.listedAt = now
	return true
}

// listed notes that this audit lists on its own (no usable view).
func (a *NodeAudit) listed() {
	now := a.now()
	a.mu.Lock()
	a.listedAt = now
	a.mu.Unlock()
}

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
	now := a.now()
	maxAge := a.MaxAge
	if maxAge <= 0 {
		maxAge = DefaultViewMaxAge
	}
	if !v.Fresh(now) || now.Sub(v.At) > maxAge {
		return View{}, fmt.Errorf("the cloud view is stale (listed at %s, this node trusts one for at most %s): no cluster caa leader",
			v.At.Format(time.RFC3339), min(maxAge, 2*time.Duration(v.Every)))
	}
	if v.At.After(now.Add(maxViewSkew)) {
		return View{}, fmt.Errorf("the cloud view's listing time %s is in the future: not trusted", v.At.Format(time.RFC3339))
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
