package rollout

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// scenario is one rolling update from v1 to v2.
type scenario struct {
	nodes, podsPerNode int
	// kills VMs are killed behind caa's back, on a node not yet updated
	// (the only node when there is one), when the rollout begins.
	kills int
	// noSurge deploys with deploy/components/no-surge (maxUnavailable 1,
	// maxSurge 0) instead of the default surge.
	noSurge bool
	// addOnReady creates each node's added peer pod when its new caa pod
	// turns Ready, instead of when it appears (then the pod's VM is
	// still booting when the node's caa is replaced, and the new caa's
	// readiness waits for the boot).
	addOnReady bool
	// suffix names the report's files.
	suffix string
}

// TestRollingUpdateSurge is the default strategy (maxSurge 1,
// maxUnavailable 0) on 3 nodes with 30 peer pods each on the fake EC2:
// caa v1 deployed from deploy/overlays/aws, the image changed to v2 and
// rolled by the real DaemonSet controller, each node's new caa taking the
// ledger over from the old one; three VMs killed behind caa's back on a
// node not yet updated, and a peer pod created on each node as its update
// begins.
func TestRollingUpdateSurge(t *testing.T) {
	t.Parallel() // its own control plane, kwok nodes, fake EC2 and report files
	runRollout(t, scenario{nodes: 3, podsPerNode: 30, kills: 3, suffix: "-surge"})
}

// TestRollingUpdateSurgeSingleNode is the surge on a one-node cluster:
// the node is without a reconciling caa only for the hand-over's gap.
func TestRollingUpdateSurgeSingleNode(t *testing.T) {
	t.Parallel() // its own control plane, kwok nodes, fake EC2 and report files
	runRollout(t, scenario{nodes: 1, podsPerNode: 30, addOnReady: true, suffix: "-surge-single-node"})
}

// TestRollingUpdateNoSurge is the same as TestRollingUpdateSurge with
// deploy/components/no-surge: the old caa exits before the new one starts.
func TestRollingUpdateNoSurge(t *testing.T) {
	t.Parallel() // its own control plane, kwok nodes, fake EC2 and report files
	runRollout(t, scenario{nodes: 3, podsPerNode: 30, kills: 3, noSurge: true, suffix: "-no-surge"})
}

// TestRollingUpdateNoSurgeSingleNode is the no-surge update of a one-node
// cluster: the node is without caa while it is updated, and nothing else is.
func TestRollingUpdateNoSurgeSingleNode(t *testing.T) {
	t.Parallel() // its own control plane, kwok nodes, fake EC2 and report files
	runRollout(t, scenario{nodes: 1, podsPerNode: 20, kills: 3, noSurge: true, suffix: "-no-surge-single-node"})
}

func runRollout(t *testing.T, sc scenario) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := start(ctx, t, sc.nodes, sc.podsPerNode, options{noSurge: sc.noSurge})
	total := sc.nodes * sc.podsPerNode

	// v1, until the DaemonSet is fully available.
	e.rec.mark("caa:v1 applied")
	e.apply(ctx, "v1")
	e.waitRolledOut(ctx, "v1")
	before := e.liveVMs()
	require.Len(t, before, total, "v1 gave every peer pod a VM")

	// The first step of the rollout (the first v1 pod deleted, or the
	// first v2 pod created) picks the victim node: another node, still on
	// v1, when there is one. Each node gets a new peer pod when its v2 pod
	// appears (while its old caa still holds the ledger, with a surge, or
	// while no caa runs there, without), or when it turns Ready.
	victimCh := make(chan string, 1)
	var once sync.Once
	addedOn := map[string]bool{} // only the informer's goroutine touches it
	e.rec.mu.Lock()
	e.rec.onPod = func(s PodSample) {
		if s.Node == "" {
			return // a new pod the scheduler has not bound yet
		}
		if s.Tag == "v2" && !addedOn[s.Node] && !s.Gone && (s.Ready || !sc.addOnReady) {
			addedOn[s.Node] = true
			e.addPeerPod(ctx, s.Node, s.Node+"-added")
		}
		if (s.Tag != "v1" || !s.Deleting) && s.Tag != "v2" {
			return
		}
		once.Do(func() {
			victim := s.Node
			for _, n := range e.nodes {
				if n != s.Node {
					victim = n
					break
				}
			}
			victimCh <- victim
		})
	}
	e.rec.mu.Unlock()

	t0 := e.rec.mark("caa:v2 applied")
	e.apply(ctx, "v2")

	var victim string
	select {
	case victim = <-victimCh:
	case <-time.After(3 * time.Minute):
		t.Fatal("the DaemonSet controller never began the rollout")
	}
	killed := map[string]string{}
	if sc.kills > 0 {
		killed = e.kill(victim, sc.kills)
		e.rec.mark(fmt.Sprintf("%d VMs killed on %s", sc.kills, victim))
		t.Logf("killed %d VMs on %s: %v", sc.kills, victim, killed)
	}

	e.waitRolledOut(ctx, "v2")
	end := time.Now()
	added := e.waitAdded(ctx, len(e.nodes))
	e.rec.sampleVMs()
	tl := e.rec.timeline()
	pods, _ := e.peerPods()

	// Pods: never more nodes without a Ready caa pod than the strategy
	// updates at once.
	_, allowed := e.strategy(ctx)
	worst := tl.MaxUnavailable(t0, end)
	assert.LessOrEqual(t, worst.Max, allowed, "nodes without a ready caa pod at once (worst at %s: %v)", worst.At.Sub(t0), worst.Nodes)

	// No VM deleted or replaced but the killed ones; each of those got
	// exactly one new VM, and so did each pod added during the rollout.
	counters := e.core.Counters()
	assert.Zero(t, counters["deleted"], "no VM deleted during the whole test")
	assert.Equal(t, int64(total+len(killed)+len(added)), counters["created"],
		"VMs created: one per peer pod, plus one per killed VM")
	after := e.liveVMs()
	assert.Len(t, after, len(pods), "every peer pod has a live VM after the rollout")
	created := e.createdSince(t0)
	for uid, id := range before {
		if _, wasKilled := killed[uid]; wasKilled {
			assert.NotEqual(t, id, after[uid], "killed pod %s has a new VM", pods[uid].Name)
			assert.Len(t, created[uid], 1, "killed pod %s got exactly one new VM", pods[uid].Name)
		} else {
			assert.Equal(t, id, after[uid], "pod %s kept its VM", pods[uid].Name)
			assert.Empty(t, created[uid], "no VM created for pod %s", pods[uid].Name)
		}
	}
	for uid := range added {
		assert.Len(t, created[uid], 1, "pod %s, added during the rollout, got exactly one VM", pods[uid].Name)
		assert.NotEmpty(t, after[uid], "pod %s, added during the rollout, has a live VM", pods[uid].Name)
	}

	rows := e.checkNewPods(tl, t0, end, sc, killed, added)
	// What an operator sees: each node's two caa name each other in
	// events on the Node.
	if !sc.noSurge {
		for _, row := range rows {
			ev := e.waitNodeEvents(ctx, row.Node, "CaaHandedOver", "CaaTookOver")
			assert.Contains(t, ev["CaaHandedOver"], row.NewPod, "%s: CaaHandedOver names the new caa", row.Node)
			assert.Contains(t, ev["CaaTookOver"], row.OldPod, "%s: CaaTookOver names the old caa", row.Node)
		}
	}
	assert.Empty(t, e.rec.trouble, "no caa process exited, restarted or failed to start")
	assert.Empty(t, e.agent.Errors(), "the node agent met no error")

	// Sanity of the recording itself: the picture must show what happened.
	if sc.kills > 0 {
		vms := tl.NodeVMs()[victim]
		require.NotEmpty(t, vms)
		dipped := slices.ContainsFunc(vms, func(s Step) bool { return s.At.After(t0) && s.Value == sc.podsPerNode-sc.kills })
		assert.True(t, dipped, "the VM sampler saw the kill on %s", victim)
	}

	e.writeReport(ctx, tl, e.outcome(ctx, t0, end, before, after, killed), rows, sc)
	if t.Failed() {
		logProcs(t, tl, t0)
	}
}

// logProcs logs every recorded /status answer, for a failed run.
func logProcs(t *testing.T, tl Timeline, t0 time.Time) {
	var b strings.Builder
	for _, s := range tl.Procs {
		fmt.Fprintf(&b, "%s (sent %s) %s %s %s ready=%v reconciling=%v gone=%v %q", since(t0, s.At), since(t0, s.Sent), s.Node, s.Pod, s.Tag,
			s.Ready, s.Reconciling, s.Gone, s.Reason)
		if h := s.Handover; h != nil {
			fmt.Fprintf(&b, " handover=%s/%s", h.Role, h.Outcome)
		}
		b.WriteString("\n")
	}
	t.Logf("/status answers, as recorded:\n%s", b.String())
}

// waitAdded waits for the n peer pods added during the rollout to have
// been created and to have a live VM each, and returns them by UID.
func (e *env) waitAdded(ctx context.Context, n int) map[string]bool {
	e.t.Helper()
	e.addWG.Wait()
	e.mu.Lock()
	errs := slices.Clone(e.addErrs)
	e.mu.Unlock()
	require.Empty(e.t, errs, "create the peer pods added during the rollout")
	_, added := e.peerPods()
	require.Len(e.t, added, n, "one peer pod added per node during the rollout")
	e.eventually(ctx, time.Minute, "every peer pod added during the rollout has a live VM", func() (bool, error) {
		live := e.liveVMs()
		for uid := range added {
			if live[uid] == "" {
				return false, nil
			}
		}
		return true, nil
	})
	return added
}

// outcome gathers what the report's facts are computed from besides the
// timeline: the allowed unavailability, every peer pod's VMs, the cloud's
// writes and the processes that failed.
func (e *env) outcome(ctx context.Context, t0, end time.Time, before, after, killed map[string]string) Outcome {
	_, allowed := e.strategy(ctx)
	counters := e.core.Counters()
	o := Outcome{Start: t0, End: end, Allowed: allowed, Creates: counters["created"], Deletes: counters["deleted"],
		Surge: !e.opts.noSurge}
	created := e.createdSince(t0)
	pods, added := e.peerPods()
	for uid, pod := range pods {
		p := PeerPod{Name: pod.Name, Node: pod.Spec.NodeName, VMBefore: before[uid], VMAfter: after[uid], Added: added[uid]}
		_, p.Killed = killed[uid]
		for _, in := range created[uid] {
			p.NewVMs = append(p.NewVMs, in.CreatedAt)
		}
		o.PeerPods = append(o.PeerPods, p)
	}
	sort.Slice(o.PeerPods, func(i, j int) bool { return o.PeerPods[i].Name < o.PeerPods[j].Name })
	e.rec.mu.Lock()
	for _, ob := range e.rec.trouble {
		line := fmt.Sprintf("%s %s on %s (%s)", ob.Pod.Name, ob.Kind, ob.Node, ob.Tag)
		if ob.Err != nil {
			line += ": " + ob.Err.Error()
		}
		o.Trouble = append(o.Trouble, line)
	}
	e.rec.mu.Unlock()
	for _, err := range e.agent.Errors() {
		o.Trouble = append(o.Trouble, "node agent: "+err.Error())
	}
	return o
}

// strategy reads the DaemonSet's update strategy as deployed: its text
// for the report, and how many nodes it updates at once (maxUnavailable
// plus maxSurge, scaled to the node count): the most nodes that may be
// without a Ready caa pod at once.
func (e *env) strategy(ctx context.Context) (string, int) {
	d, err := e.c.Client().AppsV1().DaemonSets(namespace).Get(ctx, "caa", metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("update strategy unknown: %v", err), 0
	}
	ru := d.Spec.UpdateStrategy.RollingUpdate
	if ru == nil {
		return string(d.Spec.UpdateStrategy.Type), 0
	}
	unavailable, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, len(e.nodes), true)
	if err != nil {
		return fmt.Sprintf("maxUnavailable unreadable: %v", err), 0
	}
	text := fmt.Sprintf("%s, maxUnavailable %s", d.Spec.UpdateStrategy.Type, ru.MaxUnavailable)
	surge := 0
	if ru.MaxSurge != nil {
		text += ", maxSurge " + ru.MaxSurge.String()
		if surge, err = intstr.GetScaledValueFromIntOrPercent(ru.MaxSurge, len(e.nodes), true); err != nil {
			return fmt.Sprintf("maxSurge unreadable: %v", err), 0
		}
	}
	return text, unavailable + surge
}

// waitRolledOut polls the DaemonSet until every node runs a ready,
// updated caa of tag and the controller has seen the current spec.
func (e *env) waitRolledOut(ctx context.Context, tag string) {
	e.t.Helper()
	ds := e.c.Client().AppsV1().DaemonSets(namespace)
	e.eventually(ctx, 5*time.Minute, "caa:"+tag+" is rolled out on every node", func() (bool, error) {
		d, err := ds.Get(ctx, "caa", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		st, n := d.Status, int32(len(e.nodes))
		if d.Spec.Template.Spec.Containers[0].Image != "caa:"+tag || st.ObservedGeneration < d.Generation {
			return false, nil
		}
		if st.DesiredNumberScheduled != n || st.UpdatedNumberScheduled != n || st.NumberReady != n || st.NumberAvailable != n {
			return false, nil
		}
		pods, err := e.c.Client().CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=caa"})
		if err != nil {
			return false, err
		}
		// No pod of another version lingers.
		return len(pods.Items) == len(e.nodes), nil
	})
}

// kill kills n VMs of node's peer pods behind caa's back and returns them
// by pod UID.
func (e *env) kill(node string, n int) map[string]string {
	e.t.Helper()
	pods, _ := e.peerPods()
	var uids []string
	for uid, pod := range pods {
		if pod.Spec.NodeName == node {
			uids = append(uids, uid)
		}
	}
	sort.Slice(uids, func(i, j int) bool { return pods[uids[i]].Name < pods[uids[j]].Name })
	live := e.liveVMs()
	out := map[string]string{}
	for _, uid := range uids[:n] {
		require.NoError(e.t, e.core.Kill(live[uid]), "kill the VM of %s", pods[uid].Name)
		out[uid] = live[uid]
	}
	return out
}

// createdSince returns, by pod UID, the VMs created after t.
func (e *env) createdSince(t time.Time) map[string][]cloud.Instance {
	out := map[string][]cloud.Instance{}
	for _, in := range e.core.Instances() {
		if in.CreatedAt.After(t) {
			uid := in.Tags[provider.TagPodUID]
			out[uid] = append(out[uid], in)
		}
	}
	return out
}

// handoverOf returns the last hand-over the process of pod UID showed on
// /status with the given role, if any.
func (tl Timeline) handoverOf(uid, role string) (HandoverView, bool) {
	var out HandoverView
	found := false
	for _, s := range tl.Procs {
		if s.UID == uid && s.Handover != nil && s.Handover.Role == role {
			out, found = *s.Handover, true
		}
	}
	return out, found
}

// checkNewPods checks each node's v2 caa against what it said at its first
// readiness and each node's window without a reconciling caa against the
// update (the hand-over, or the old pod's exit), and returns the report's
// rows in the order of the update.
func (e *env) checkNewPods(tl Timeline, t0, end time.Time, sc scenario, killed map[string]string, added map[string]bool) []NodeRow {
	t := e.t
	created := e.createdSince(t0)
	pods, _ := e.peerPods()
	e.rec.mu.Lock()
	ready := e.rec.ready
	e.rec.mu.Unlock()
	noReconciler := tl.NoReconciler(t0, end)
	podGaps := tl.gaps(t0, end)
	var rows []NodeRow
	for _, node := range e.nodes {
		row := NodeRow{Node: node, PeerPods: sc.podsPerNode}
		for uid := range added {
			if pods[uid].Spec.NodeName == node {
				row.PeerPods++
			}
		}
		for _, g := range podGaps[node] {
			row.PodGap += g.to.Sub(g.from)
		}
		oldStop, ok := tl.FirstPod(func(s PodSample) bool { return s.Node == node && s.Tag == "v1" && s.Deleting })
		if assert.True(t, ok, "the v1 pod on %s was deleted", node) {
			row.OldPod, row.OldDeletedAt = oldStop.Pod, oldStop.At
		}
		if gone, ok := tl.FirstPod(func(s PodSample) bool { return s.Node == node && s.Tag == "v1" && s.Gone }); ok {
			row.OldGoneAt = gone.At
		}
		// The old caa stopped reconciling when it was asked to hand over
		// (surge), or when its pod's deletion began (no surge).
		row.OldStopAt = row.OldDeletedAt
		if !sc.noSurge && oldStop.UID != "" {
			if h, ok := tl.handoverOf(oldStop.UID, health.RoleHandedOver); assert.True(t, ok, "%s: the old caa showed its hand-over on /status", node) {
				row.OldStopAt = h.StartedAt
				row.Handover = true
				assert.Equal(t, health.HandoverDone, h.Outcome, "%s: the old caa's hand-over outcome", node)
			}
		}
		// Every node gets a row, also one whose checks fail here: the
		// report's facts then say what is missing.
		newReady, ok := tl.FirstPod(func(s PodSample) bool { return s.Node == node && s.Tag == "v2" && s.Ready })
		if !assert.True(t, ok, "a v2 pod turned Ready on %s", node) {
			rows = append(rows, row)
			continue
		}
		row.NewPod, row.NewReadyAt = newReady.Pod, newReady.At
		fr, ok := ready[newReady.UID]
		if !assert.True(t, ok, "the agent saw the v2 pod on %s turn ready", node) || !assert.NoError(t, fr.Err) {
			rows = append(rows, row)
			continue
		}
		row.Reported = true

		// Ready only after its startup pass: what caa said at that moment.
		st := fr.Status
		assert.True(t, st.Ready, "%s: /status at the first readiness", node)
		if assert.NotNil(t, st.LastPass, "%s: a pass had run", node) {
			assert.Empty(t, st.LastPass.Error, "%s: the pass ran to the end", node)
			assert.False(t, st.ReadyAt.Before(st.LastPass.At), "%s: ready after its pass began", node)
		}
		assert.Empty(t, st.Pending, "%s: nothing pending at readiness", node)
		assert.GreaterOrEqual(t, metric(fr.Metrics, `caa_reconcile_passes_total{result="converged"}`), 1.0, "%s: a converged pass", node)
		row.PendingAtReady = len(st.Pending)
		row.Converged = st.Ready && st.LastPass != nil && st.LastPass.Error == "" &&
			metric(fr.Metrics, `caa_reconcile_passes_total{result="converged"}`) >= 1
		row.CaaTimeToReady = time.Duration(st.TimeToReady)
		row.CaaReadyAt = st.ReadyAt
		if sc.noSurge {
			assert.False(t, row.OldStopAt.IsZero() || st.StartedAt.Before(row.OldStopAt), "%s: v2 started after v1 was told to stop", node)
			assert.Nil(t, st.Handover, "%s: no hand-over without a surge", node)
		} else if h := st.Handover; assert.NotNil(t, h, "%s: the new caa took the ledger over", node) {
			assert.Equal(t, health.RoleTookOver, h.Role, "%s", node)
			assert.Equal(t, health.HandoverDone, h.Outcome, "%s", node)
			assert.Contains(t, h.Peer, row.OldPod, "%s: taken over from the node's old caa", node)
			assert.Equal(t, 1.0, metric(fr.Metrics, `caa_handovers_total{outcome="done",role="took_over"}`), "%s: one hand-over counted", node)
			row.CaaGap = time.Duration(h.Gap)
		}

		// The node was without a reconciling caa once at most: from the old
		// caa's stop to the new caa's readiness, and no longer. A surge's
		// hand-over can be shorter than one poll of /status: then the
		// poller sees no window, and caa's own gap must say as much.
		ws := noReconciler[node]
		if len(ws) == 0 && !sc.noSurge {
			assert.Less(t, row.CaaGap, poll, "%s: no window seen, so the hand-over's gap fell between two polls", node)
		} else if assert.Len(t, ws, 1, "%s: one window without a reconciling caa, the update's: %v", node, ws) {
			w := ws[0]
			row.NoReconciler = w
			assert.False(t, w.Open, "%s: a reconciling caa at the end", node)
			from := row.OldStopAt
			if sc.noSurge {
				// The agent's SIGTERM follows the deletion as its informer
				// sees it, which may be before the recorder's does.
				from = from.Add(-time.Second)
			}
			assert.False(t, w.From.Before(from), "%s: no reconciler from %s, before the old caa was told to stop (%s)",
				node, since(t0, w.From), since(t0, row.OldStopAt))
			assert.False(t, w.To.After(st.ReadyAt.Add(windowSlack)), "%s: no reconciler until %s, after the new caa was ready (%s)",
				node, since(t0, w.To), since(t0, st.ReadyAt))
			if row.CaaGap > 0 {
				// The poller sees the old caa stop at most a poll (and a
				// request) after it did.
				assert.LessOrEqual(t, row.CaaGap, w.Len()+windowSlack, "%s: caa's own gap agrees with the recorded window", node)
			}
		}

		// Each killed VM's replacement came from this caa before it was
		// ready; a pod added during the rollout got its VM from the old
		// caa or the new one.
		wantCreates, addedHere := 0, 0
		for uid := range killed {
			if pods[uid].Spec.NodeName != node {
				continue
			}
			wantCreates++
			for _, in := range created[uid] {
				assert.True(t, in.CreatedAt.After(st.StartedAt), "%s: the replacement of %s came from the new caa", node, pods[uid].Name)
				assert.True(t, in.CreatedAt.Before(st.ReadyAt), "%s: the replacement of %s existed before caa was ready", node, pods[uid].Name)
				assert.True(t, in.CreatedAt.Before(newReady.At), "%s: ... and before the pod turned Ready", node)
			}
			row.Recreated += len(created[uid])
		}
		for uid := range added {
			if pods[uid].Spec.NodeName == node {
				addedHere++
				row.Added += len(created[uid])
			}
		}
		creates := metric(fr.Metrics, `caa_reconcile_actions_total{kind="Create"}`)
		assert.GreaterOrEqual(t, creates, float64(wantCreates), "%s: creates decided by the new caa before its readiness", node)
		assert.LessOrEqual(t, creates, float64(wantCreates+addedHere), "%s: creates decided by the new caa before its readiness", node)
		if node == victim(killed, pods) {
			assert.Equal(t, len(killed), wantCreates)
		}
		row.Adopted = sc.podsPerNode - row.Recreated
		rows = append(rows, row)
	}
	// In the order the old caas were told to stop; a node never stopped last.
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i].OldStopAt, rows[j].OldStopAt
		return !a.IsZero() && (b.IsZero() || a.Before(b))
	})
	return rows
}

// victim is the node of the killed VMs' pods ("" when none was killed).
func victim(killed map[string]string, pods map[string]*corev1.Pod) string {
	for uid := range killed {
		return pods[uid].Spec.NodeName
	}
	return ""
}

// writeReport writes the markdown report and the SVG into
// $CAA_ROLLOUT_REPORT_DIR, or a temporary directory. Its facts are computed
// from the timeline and the outcome, so the report of a failed run says
// what failed.
func (e *env) writeReport(ctx context.Context, tl Timeline, o Outcome, rows []NodeRow, sc scenario) {
	t := e.t
	strategy, _ := e.strategy(ctx)
	killed, added, victims := 0, 0, map[string]bool{}
	for _, p := range o.PeerPods {
		if p.Killed {
			killed++
			victims[p.Node] = true
		}
		if p.Added {
			added++
		}
	}
	how := "deploy/overlays/aws"
	if sc.noSurge {
		how += " with deploy/components/no-surge"
	}
	r := Report{
		Title: fmt.Sprintf("caa rolling update v1 → v2 (%s): %d node(s), %d peer pods", strategyName(sc.noSurge), len(e.nodes), len(o.PeerPods)),
		Scenario: fmt.Sprintf("Recorded by `%s` (test/e2e/rollout) on %s: etcd, kube-apiserver, kube-controller-manager "+
			"(the real DaemonSet controller) and kube-scheduler, kwok for the nodes and the peer pods, the test node agent "+
			"running the real caa binaries for the DaemonSet's pods under the deploy/ ServiceAccount's token, and the fake EC2. "+
			"caa was deployed with `kubectl apply -k` over %s (probe periods: %s), then its image changed from v1 to v2 "+
			"(%s); %d VMs were killed behind caa's back on %s when the rollout began, and %d peer pods were created "+
			"during the rollout, one on each node as its new caa pod %s. Every caa process's /status was polled "+
			"every %s. A VM boots for %s in the fake cloud; a caa waits for its new VMs to boot before it turns ready.",
			t.Name(), time.Now().UTC().Format("2006-01-02"), how, e.probePeriods(ctx), strategy, killed, joinKeys(victims), added,
			map[bool]string{false: "appeared", true: "turned Ready"}[sc.addOnReady], poll, e.core.Faults().BootDelay),
		Start: o.Start, Rows: rows,
		Facts: Facts(tl, o, rows),
	}
	e.writeFiles(tl, r, "rollout-report"+sc.suffix+".md", "rollout-timeline"+sc.suffix+".svg")
}

// writeFiles writes r and the timeline's picture into
// $CAA_ROLLOUT_REPORT_DIR, or a temporary directory.
func (e *env) writeFiles(tl Timeline, r Report, md, svg string) {
	t := e.t
	dir := os.Getenv("CAA_ROLLOUT_REPORT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	r.Picture = svg
	require.NoError(t, os.WriteFile(filepath.Join(dir, md), []byte(r.Markdown()), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, svg), []byte(SVG(tl, r.Title, r.Start)), 0o644))
	t.Logf("rollout report: %s (picture %s)\n%s", filepath.Join(dir, md), filepath.Join(dir, svg), strings.TrimSpace(r.Markdown()))
}

func strategyName(noSurge bool) string {
	if noSurge {
		return "no surge"
	}
	return "surge"
}

// probePeriods reads the caa container's startup and readiness probe
// periods from the DaemonSet as deployed.
func (e *env) probePeriods(ctx context.Context) string {
	d, err := e.c.Client().AppsV1().DaemonSets(namespace).Get(ctx, "caa", metav1.GetOptions{})
	if err != nil || len(d.Spec.Template.Spec.Containers) == 0 {
		return fmt.Sprintf("unknown: %v", err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	period := func(p *corev1.Probe) string {
		if p == nil {
			return "none"
		}
		return fmt.Sprintf("%ds", p.PeriodSeconds)
	}
	readiness := period(c.ReadinessProbe)
	if p := c.ReadinessProbe; p != nil {
		readiness += fmt.Sprintf(" with a failure threshold of %d", p.FailureThreshold)
	}
	return fmt.Sprintf("startup %s, readiness %s", period(c.StartupProbe), readiness)
}

// joinKeys lists a set's members in order.
func joinKeys(m map[string]bool) string {
	if len(m) == 0 {
		return "no node"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ", ")
}
