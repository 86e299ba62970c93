package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/pkg/provider"
)

// Cloud is what the leader needs of a provider: the cluster-wide listing
// and a delete.
type Cloud interface {
	provider.ClusterLister
	Delete(ctx context.Context, id string) error
}

// Sweeper is the leader's work, once per Interval: list the cluster's VMs,
// publish each node's View, and delete the VMs of departed nodes.
type Sweeper struct {
	Cloud    Cloud
	Client   kubernetes.Interface
	Cluster  string
	Nodes    *Nodes
	Departed *Departed
	// Known is the durable set of node names this cluster has had; only
	// the VMs of those nodes are ever collected.
	Known    *KnownNodes
	Interval time.Duration
	// Fence is asked before every delete; an error (the Lease is no longer
	// held) stops the sweep with nothing more deleted.
	Fence   func(ctx context.Context) error
	Event   func(warning bool, reason, message string)
	Log     *slog.Logger
	Metrics *Metrics
	Now     func() time.Time
	// Publishers bounds the Node patches in flight (default 4).
	Publishers int

	reported map[string]bool // nodes never had whose VMs were reported, this lead
}

// SweepResult reports one sweep.
type SweepResult struct {
	Listed    int
	Published int
	Deleted   []string // VM ids
	Waiting   int      // VMs of absent nodes still within the grace
	Strangers int      // VMs tagged for nodes this cluster never had
	Err       error
}

var (
	errNotSynced  = errors.New("the Node cache has not synced: nothing listed, nothing deleted")
	errNodeExists = errors.New("node exists")
)

// Run sweeps every Interval until ctx is done, the first at once.
func (s *Sweeper) Run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil {
			return
		}
		res := s.Sweep(ctx)
		if res.Err != nil && ctx.Err() == nil {
			s.Log.Warn("cluster sweep failed", "err", res.Err)
		}
		t.Reset(s.Interval)
	}
}

// Sweep runs once. Nothing is listed from an unsynced Node cache, and
// nothing is deleted unless the apiserver itself answers that the VM's
// node does not exist and the Lease is still held.
func (s *Sweeper) Sweep(ctx context.Context) SweepResult {
	var res SweepResult
	if !s.Nodes.Synced() {
		res.Err = errNotSynced
		s.Metrics.listing("unsynced")
		return res
	}
	at := s.now()
	vms, err := s.Cloud.ListCluster(ctx, s.Cluster)
	if err != nil {
		res.Err = fmt.Errorf("list the cluster's VMs: %w", err)
		s.Metrics.listing("error")
		return res
	}
	s.Metrics.listing("ok")
	res.Listed = len(vms)
	s.Metrics.ListedVMs.Set(float64(len(vms)))

	res.Published = s.publish(ctx, at, vms)
	keep := map[string]bool{}
	for _, vm := range vms {
		keep[vm.Owner().Node] = true
	}
	if err := s.learn(ctx); err != nil {
		// Without the set nothing is known to have been this cluster's:
		// nothing is deleted, and the next sweep tries again.
		res.Err = err
		res.Waiting = s.Departed.Waiting()
		return res
	}
	ours, strangers := s.split(vms)
	res.Strangers = len(strangers)
	s.reportStrangers(strangers)
	ready := s.Departed.Observe(at, ours, s.Nodes)
	res.Deleted, res.Err = s.collect(ctx, ready)
	res.Waiting = s.Departed.Waiting()
	s.Metrics.Waiting.Set(float64(res.Waiting))

	s.Nodes.Forget(keep)
	if s.Known != nil {
		s.Known.Forget(func(name string) bool {
			present, _ := s.Nodes.Presence(name)
			return keep[name] || present
		})
		if err := s.Known.Save(ctx); err != nil {
			s.Log.Warn("cannot trim the known node names", "err", err)
		}
	}
	return res
}

// learn loads the set of nodes this cluster has had (once per lead, and
// again after a failed write) and adds every name the Node cache has seen.
func (s *Sweeper) learn(ctx context.Context) error {
	if s.Known == nil {
		return nil
	}
	if !s.Known.Loaded() {
		if err := s.Known.Load(ctx); err != nil {
			return fmt.Errorf("nothing deleted: %w", err)
		}
	}
	s.Known.Add(s.Nodes.Names()...)
	s.Known.Add(s.Nodes.Seen()...)
	if err := s.Known.Save(ctx); err != nil {
		return fmt.Errorf("nothing deleted: %w", err)
	}
	return nil
}

// split parts the listing into the VMs this cluster may collect and those
// tagged with its id for a node it has never had (none without Known).
func (s *Sweeper) split(vms []provider.VM) (ours, strangers []provider.VM) {
	if s.Known == nil {
		return vms, nil
	}
	for _, vm := range vms {
		o := vm.Owner()
		if o.Managed && o.Cluster == s.Cluster && o.Node != "" && (vm.State.Alive() || vm.State.Dead()) && !s.Known.Has(o.Node) {
			if present, _ := s.Nodes.Presence(o.Node); !present {
				strangers = append(strangers, vm)
				continue
			}
		}
		ours = append(ours, vm)
	}
	return ours, strangers
}

// EventForeignNode is the Warning raised when VMs carry this cluster's id
// for a node this cluster never had.
const EventForeignNode = "ClusterIDShared"

// reportStrangers sets the metric and raises one Warning per node name
// (per lead): such VMs say another cluster uses this cluster id.
func (s *Sweeper) reportStrangers(vms []provider.VM) {
	s.Metrics.Strangers.Set(float64(len(vms)))
	byNode := map[string][]string{}
	for _, vm := range vms {
		byNode[vm.Owner().Node] = append(byNode[vm.Owner().Node], vm.ID)
	}
	if s.reported == nil {
		s.reported = map[string]bool{}
	}
	for _, node := range slices.Sorted(maps.Keys(byNode)) {
		if s.reported[node] {
			continue
		}
		s.reported[node] = true
		msg := fmt.Sprintf("%d VM(s) tagged with this cluster's id %s name node %s, which this cluster never had: "+
			"another cluster uses the same id (a restore from an etcd snapshot keeps it). They are not deleted; "+
			"give each cluster its own --cluster-id (CAA_CLUSTER_ID). VMs: %s",
			len(byNode[node]), s.Cluster, node, strings.Join(byNode[node], ", "))
		s.Log.Warn("VMs of a node this cluster never had: not deleted", "node", node, "vms", byNode[node], "cluster", s.Cluster)
		if s.Event != nil {
			s.Event(true, EventForeignNode, msg)
		}
	}
}

// collect deletes the ready VMs, node by node, each node confirmed gone by
// the apiserver first.
func (s *Sweeper) collect(ctx context.Context, ready []Candidate) ([]string, error) {
	byNode := map[string][]Candidate{}
	for _, c := range ready {
		byNode[c.Node] = append(byNode[c.Node], c)
	}
	var deleted []string
	for _, node := range slices.Sorted(maps.Keys(byNode)) {
		if err := s.Nodes.ConfirmGone(ctx, node); err != nil {
			if errors.Is(err, errNodeExists) {
				for _, c := range byNode[node] {
					s.Departed.Forget(c.VM.ID)
				}
				s.Log.Info("a node the cache showed absent exists: its VMs are kept", "departedNode", node, "err", err)
				continue
			}
			return deleted, fmt.Errorf("confirm node %s is gone (nothing of it deleted): %w", node, err)
		}
		for _, c := range byNode[node] {
			if err := s.Fence(ctx); err != nil {
				return deleted, fmt.Errorf("stop before deleting VM %s: %w", c.VM.ID, err)
			}
			if err := s.Cloud.Delete(ctx, c.VM.ID); err != nil {
				s.Metrics.Deletes.WithLabelValues("error").Inc()
				s.Log.Warn("delete of a departed node's VM failed", "vm", c.VM.ID, "departedNode", node, "err", err)
				continue
			}
			s.Departed.Forget(c.VM.ID)
			s.Metrics.Deletes.WithLabelValues("ok").Inc()
			deleted = append(deleted, c.VM.ID)
			o := c.VM.Owner()
			s.Log.Info("deleted a VM of a departed node", "vm", c.VM.ID, "departedNode", node, "pod", o.Pod, "podUID", o.PodUID,
				"state", c.VM.State, "absentSince", c.FirstSeen, "absentAgain", c.SecondSeen, "tags", c.VM.Tags)
			if s.Event != nil {
				s.Event(false, "DepartedNodeVMDeleted", fmt.Sprintf("deleted VM %s of node %s (gone from the cluster since %s; pod %s, uid %s)",
					c.VM.ID, node, c.FirstSeen.Format(time.RFC3339), o.Pod, o.PodUID))
			}
		}
	}
	return deleted, nil
}

// publish writes each existing node's View (see ViewAnnotation). A failed
// patch is counted and logged; the node then audits alone once its view
// goes stale, which costs cloud reads, never a wrong action.
func (s *Sweeper) publish(ctx context.Context, at time.Time, vms []provider.VM) int {
	views := Views(at, s.Interval, vms, s.Nodes.Names())
	names := slices.Sorted(maps.Keys(views))
	workers := s.Publishers
	if workers <= 0 {
		workers = 4
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done int
		next = make(chan string)
	)
	for range min(workers, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range next {
				if err := s.patchView(ctx, name, views[name]); err != nil {
					s.Metrics.Published.WithLabelValues("error").Inc()
					s.Log.Warn("cannot publish a node's cloud view", "target", name, "err", err)
					continue
				}
				s.Metrics.Published.WithLabelValues("ok").Inc()
				mu.Lock()
				done++
				mu.Unlock()
			}
		}()
	}
	for _, name := range names {
		if ctx.Err() != nil {
			break
		}
		next <- name
	}
	close(next)
	wg.Wait()
	return done
}

// patchView merge-patches the annotation, guarded by the Node's UID: a
// Node re-created under the same name meanwhile gets nothing of the old
// one's view.
func (s *Sweeper) patchView(ctx context.Context, name string, v View) error {
	node, ok := s.Nodes.Node(name)
	if !ok {
		return nil
	}
	val, err := v.Encode()
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         node.UID,
		"annotations": map[string]string{ViewAnnotation: val},
	}})
	if err != nil {
		return fmt.Errorf("encode the patch: %w", err)
	}
	_, err = s.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "caa-cluster"})
	return err
}

func (s *Sweeper) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}
