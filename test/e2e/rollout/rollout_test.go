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

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// TestRollingUpdate is the seed's scenario: 3 nodes with 30 peer pods each
// on the fake EC2; caa v1 deployed from deploy/overlays/aws; the image
// changed to v2 and rolled by the real DaemonSet controller; three VMs
// killed behind caa's back on a node not yet updated.
func TestRollingUpdate(t *testing.T) {
	runRollout(t, 3, 30, 3, "")
}

// TestRollingUpdateSingleNode is the same on a one-node cluster: the node
// is without a ready caa while it is updated, and nothing else is.
func TestRollingUpdateSingleNode(t *testing.T) {
	runRollout(t, 1, 20, 3, "-single-node")
}

func runRollout(t *testing.T, nodeCount, podsPerNode, kills int, suffix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := start(ctx, t, nodeCount, podsPerNode)
	total := nodeCount * podsPerNode

	// v1, until the DaemonSet is fully available.
	e.rec.mark("caa:v1 applied")
	e.apply(ctx, "v1")
	e.waitRolledOut(ctx, "v1")
	before := e.liveVMs()
	require.Len(t, before, total, "v1 gave every peer pod a VM")

	// The first deletion of the rollout picks the victim node: another
	// node, still on v1 with a ready caa, when there is one.
	victimCh := make(chan string, 1)
	var once sync.Once
	e.rec.mu.Lock()
	e.rec.onPod = func(s PodSample) {
		if s.Tag != "v1" || !s.Deleting {
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
	killed := e.kill(victim, kills)
	e.rec.mark(fmt.Sprintf("%d VMs killed on %s", kills, victim))
	t.Logf("killed %d VMs on %s: %v", kills, victim, killed)

	e.waitRolledOut(ctx, "v2")
	end := time.Now()
	e.rec.sampleVMs()
	tl := e.rec.timeline()

	// Never more than one node without a ready caa.
	worst := tl.MaxUnavailable(t0, end)
	assert.LessOrEqual(t, worst.Max, 1, "nodes without a ready caa at once (worst at %s: %v)", worst.At.Sub(t0), worst.Nodes)

	// No VM deleted or replaced but the killed ones; each of those got
	// exactly one new VM.
	counters := e.core.Counters()
	assert.Zero(t, counters[cloud.OpDelete], "no cloud delete during the whole test")
	assert.Equal(t, int64(total+kills), counters[cloud.OpCreate], "creates: one per peer pod, plus one per killed VM")
	after := e.liveVMs()
	assert.Len(t, after, total, "every peer pod has a live VM after the rollout")
	created := e.createdSince(t0)
	for uid, id := range before {
		if _, wasKilled := killed[uid]; wasKilled {
			assert.NotEqual(t, id, after[uid], "killed pod %s has a new VM", e.pods[uid].Name)
			assert.Len(t, created[uid], 1, "killed pod %s got exactly one new VM", e.pods[uid].Name)
		} else {
			assert.Equal(t, id, after[uid], "pod %s kept its VM", e.pods[uid].Name)
			assert.Empty(t, created[uid], "no VM created for pod %s", e.pods[uid].Name)
		}
	}

	rows := e.checkNewPods(tl, t0, victim, killed, podsPerNode)
	assert.Empty(t, e.rec.trouble, "no caa process exited, restarted or failed to start")
	assert.Empty(t, e.agent.Errors(), "the node agent met no error")

	// Sanity of the recording itself: the picture must show what happened.
	vms := tl.NodeVMs()[victim]
	require.NotEmpty(t, vms)
	dipped := slices.ContainsFunc(vms, func(s Step) bool { return s.At.After(t0) && s.Value == podsPerNode-kills })
	assert.True(t, dipped, "the VM sampler saw the kill on %s", victim)

	e.writeReport(ctx, tl, e.outcome(ctx, t0, end, before, after, killed), rows, suffix)
}

// outcome gathers what the report's facts are computed from besides the
// timeline: the allowed unavailability, every peer pod's VMs, the cloud's
// writes and the processes that failed.
func (e *env) outcome(ctx context.Context, t0, end time.Time, before, after, killed map[string]string) Outcome {
	_, allowed := e.strategy(ctx)
	counters := e.core.Counters()
	o := Outcome{Start: t0, End: end, Allowed: allowed, Creates: counters[cloud.OpCreate], Deletes: counters[cloud.OpDelete]}
	created := e.createdSince(t0)
	for uid, pod := range e.pods {
		p := PeerPod{Name: pod.Name, Node: pod.Spec.NodeName, VMBefore: before[uid], VMAfter: after[uid]}
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
// for the report, and maxUnavailable scaled to the node count.
func (e *env) strategy(ctx context.Context) (string, int) {
	d, err := e.c.Client().AppsV1().DaemonSets(namespace).Get(ctx, "caa", metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("update strategy unknown: %v", err), 0
	}
	ru := d.Spec.UpdateStrategy.RollingUpdate
	if ru == nil {
		return string(d.Spec.UpdateStrategy.Type), 0
	}
	allowed, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, len(e.nodes), true)
	if err != nil {
		return fmt.Sprintf("maxUnavailable unreadable: %v", err), 0
	}
	text := fmt.Sprintf("%s, maxUnavailable %s", d.Spec.UpdateStrategy.Type, ru.MaxUnavailable)
	if ru.MaxSurge != nil {
		text += ", maxSurge " + ru.MaxSurge.String()
	}
	return text, allowed
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
	var uids []string
	for uid, pod := range e.pods {
		if pod.Spec.NodeName == node {
			uids = append(uids, uid)
		}
	}
	sort.Slice(uids, func(i, j int) bool { return e.pods[uids[i]].Name < e.pods[uids[j]].Name })
	live := e.liveVMs()
	out := map[string]string{}
	for _, uid := range uids[:n] {
		require.NoError(e.t, e.core.Kill(live[uid]), "kill the VM of %s", e.pods[uid].Name)
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

// checkNewPods checks each node's v2 caa against what it said at its first
// readiness, and returns the report's rows in the order of the update.
func (e *env) checkNewPods(tl Timeline, t0 time.Time, victim string, killed map[string]string, podsPerNode int) []NodeRow {
	t := e.t
	created := e.createdSince(t0)
	e.rec.mu.Lock()
	ready := e.rec.ready
	e.rec.mu.Unlock()
	var rows []NodeRow
	for _, node := range e.nodes {
		row := NodeRow{Node: node, PeerPods: podsPerNode}
		oldStop, ok := tl.FirstPod(func(s PodSample) bool { return s.Node == node && s.Tag == "v1" && s.Deleting })
		if assert.True(t, ok, "the v1 pod on %s was deleted", node) {
			row.OldPod, row.OldStopAt = oldStop.Pod, oldStop.At
		}
		if gone, ok := tl.FirstPod(func(s PodSample) bool { return s.Node == node && s.Tag == "v1" && s.Gone }); ok {
			row.OldGoneAt = gone.At
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
		assert.False(t, row.OldStopAt.IsZero() || st.StartedAt.Before(row.OldStopAt), "%s: v2 started after v1 was told to stop", node)
		row.CaaTimeToReady = time.Duration(st.TimeToReady)

		// Each killed VM's replacement came from this caa before it was ready.
		wantCreates := 0
		for uid := range killed {
			if e.pods[uid].Spec.NodeName != node {
				continue
			}
			wantCreates++
			for _, in := range created[uid] {
				assert.True(t, in.CreatedAt.After(st.StartedAt), "%s: the replacement of %s came from the new caa", node, e.pods[uid].Name)
				assert.True(t, in.CreatedAt.Before(st.ReadyAt), "%s: the replacement of %s existed before caa was ready", node, e.pods[uid].Name)
				assert.True(t, in.CreatedAt.Before(newReady.At), "%s: ... and before the pod turned Ready", node)
			}
			row.Recreated += len(created[uid])
		}
		assert.Equal(t, float64(wantCreates), metric(fr.Metrics, `caa_reconcile_actions_total{kind="Create"}`),
			"%s: creates decided by the new caa before its readiness", node)
		if node == victim {
			assert.Equal(t, len(killed), wantCreates)
		}
		row.Adopted = podsPerNode - row.Recreated
		rows = append(rows, row)
	}
	// In the order the old caas were told to stop; a node never stopped last.
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i].OldStopAt, rows[j].OldStopAt
		return !a.IsZero() && (b.IsZero() || a.Before(b))
	})
	return rows
}

// writeReport writes the markdown report and the SVG into
// $CAA_ROLLOUT_REPORT_DIR, or a temporary directory. Its facts are computed
// from the timeline and the outcome, so the report of a failed run says
// what failed.
func (e *env) writeReport(ctx context.Context, tl Timeline, o Outcome, rows []NodeRow, suffix string) {
	t := e.t
	dir := os.Getenv("CAA_ROLLOUT_REPORT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	picture := "rollout-timeline" + suffix + ".svg"
	strategy, _ := e.strategy(ctx)
	killed, victims := 0, map[string]bool{}
	for _, p := range o.PeerPods {
		if p.Killed {
			killed++
			victims[p.Node] = true
		}
	}
	r := Report{
		Title: fmt.Sprintf("caa rolling update v1 → v2: %d node(s), %d peer pods", len(e.nodes), len(o.PeerPods)),
		Scenario: fmt.Sprintf("Recorded by `%s` (test/e2e/rollout) on %s: etcd, kube-apiserver, kube-controller-manager "+
			"(the real DaemonSet controller) and kube-scheduler, kwok for the nodes and the peer pods, the test node agent "+
			"running the real caa binaries for the DaemonSet's pods under the deploy/ ServiceAccount's token, and the fake EC2. "+
			"caa was deployed with `kubectl apply -k` over deploy/overlays/aws (probe periods: %s), then its image changed from v1 to v2 "+
			"(%s); %d VMs were killed behind caa's back on %s when the rollout began.",
			t.Name(), time.Now().UTC().Format("2006-01-02"), e.probePeriods(ctx), strategy, killed, joinKeys(victims)),
		Start: o.Start, Rows: rows, Picture: picture,
		Facts: Facts(tl, o, rows),
	}
	md := filepath.Join(dir, "rollout-report"+suffix+".md")
	require.NoError(t, os.WriteFile(md, []byte(r.Markdown()), 0o644))
	svg := SVG(tl, r.Title, o.Start)
	require.NoError(t, os.WriteFile(filepath.Join(dir, picture), []byte(svg), 0o644))
	t.Logf("rollout report: %s (picture %s)\n%s", md, filepath.Join(dir, picture), strings.TrimSpace(r.Markdown()))
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
	return fmt.Sprintf("startup %s, readiness %s", period(c.StartupProbe), period(c.ReadinessProbe))
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
