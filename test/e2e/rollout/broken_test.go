package rollout

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/nodeagent"
)

// The broken releases' test shortens the old caa's wait for a new one to
// turn ready, and the grace it gives cloud calls when it stops, so the
// handback comes within seconds instead of minutes.
const (
	brokenReadyTimeout  = 10 * time.Second
	brokenShutdownGrace = 5 * time.Second
)

// brokenPhase is what one broken release did, as recorded.
type brokenPhase struct {
	Name, Tag string
	// Applied: the broken release applied; Undo: `kubectl rollout undo`
	// run; RolledBack: the DaemonSet seen fully on v1 again.
	Applied, Undo, RolledBack time.Time
	NewPod                    string
	// Exits counts the broken process's exits (CrashLoopBackOff).
	Exits int
	// TookOver is when the broken caa got the ledger (the old caa's
	// hand-over request), HandedBack when the old caa showed the handback
	// on /status, with its reason.
	TookOver, HandedBack time.Time
	HandbackReason       string
	// NoReconciler are the node's windows without a reconciling caa
	// between Applied and RolledBack.
	NoReconciler []Window
	// RolloutStatus is what `kubectl rollout status --timeout` said while
	// the rollout stalled.
	RolloutStatus string
	// AddedPod was created while the rollout stalled; AddedVMAt is when
	// its VM was created.
	AddedPod  string
	AddedVMAt time.Time
	// OldKept: the v1 caa pod of before was the node's caa after the undo.
	OldKept bool
	// PodGaps are the times the node had no Ready caa pod in the phase.
	PodGaps []gap
}

// TestBrokenReleaseStalls rolls out, on one node with the default surge,
// two broken releases of caa in turn, each followed by `kubectl rollout
// undo`: one that exits at start (a provider it does not know), and one
// that takes the ledger over but never turns ready (its cloud endpoint
// never answers the node's VM listing). In both the rollout stalls as
// Kubernetes stalls a surge whose new pod is not ready, the v1 caa keeps
// (or, after the handback, resumes) reconciling (a peer pod created during
// the stall gets its VM), no VM is lost, and the undo completes with the
// v1 pod that never went away.
func TestBrokenReleaseStalls(t *testing.T) {
	t.Parallel() // its own control plane, kwok nodes, fake EC2 and report files
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const podsPerNode = 10
	e := start(ctx, t, 1, podsPerNode, options{settings: []string{
		"CAA_HANDOVER_READY_TIMEOUT=" + brokenReadyTimeout.String(),
		"CAA_SHUTDOWN_GRACE=" + brokenShutdownGrace.String(),
		// caa refuses a ready timeout that does not exceed the boot
		// timeout; the fake cloud's VMs boot in well under this.
		"CAA_BOOT_TIMEOUT=" + (brokenReadyTimeout / 2).String(),
	}})
	e.rec.mark("caa:v1 applied")
	e.apply(ctx, "v1")
	e.waitRolledOut(ctx, "v1")
	before := e.liveVMs()
	require.Len(t, before, podsPerNode)
	old, ok := e.rec.timeline().FirstPod(func(s PodSample) bool { return s.Tag == "v1" && s.Ready })
	require.True(t, ok, "the v1 pod turned Ready")
	t0 := time.Now()

	var phases []brokenPhase
	for _, b := range []struct {
		name      string
		r         release
		handsOver bool
	}{
		{"exits at start", release{tag: tagExits}, false},
		{"never ready", release{tag: tagHangs, endpoint: e.hangURL}, true},
	} {
		phases = append(phases, e.stallAndUndo(ctx, old, b.name, b.r, b.handsOver))
	}
	e.rec.sampleVMs()

	// Nothing lost: every VM of before is the same and alive, the peer
	// pods created during the stalls got one each, nothing was deleted.
	counters := e.core.Counters()
	pods, added := e.peerPods()
	after := e.liveVMs()
	assert.Zero(t, counters["deleted"], "no VM deleted")
	assert.Equal(t, int64(podsPerNode+len(added)), counters["created"], "VMs created: one per peer pod")
	for uid, id := range before {
		assert.Equal(t, id, after[uid], "pod %s kept its VM", pods[uid].Name)
	}
	created := e.createdSince(t0)
	for uid := range added {
		assert.Len(t, created[uid], 1, "pod %s, created during a stall, got exactly one VM", pods[uid].Name)
	}
	// The only trouble is the crash loop of the release that exits.
	e.rec.mu.Lock()
	for _, o := range e.rec.trouble {
		assert.True(t, o.Kind == nodeagent.Exited && o.Tag == tagExits, "unexpected: %s %s (%s): %v", o.Pod.Name, o.Kind, o.Tag, o.Err)
	}
	e.rec.mu.Unlock()
	assert.Empty(t, e.agent.Errors(), "the node agent met no error")

	tl := e.rec.timeline()
	e.writeBrokenReport(tl, t0, phases, before, after, counters["created"], counters["deleted"], len(added))
}

// stallAndUndo applies a broken release r, checks that the rollout stalls
// with the v1 caa (old) reconciling, creates a peer pod to prove it, and
// rolls back with `kubectl rollout undo`.
func (e *env) stallAndUndo(ctx context.Context, old PodSample, name string, r release, handsOver bool) brokenPhase {
	t := e.t
	node := old.Node
	ph := brokenPhase{Name: name, Tag: r.tag}
	ph.Applied = e.rec.mark("caa:" + r.tag + " applied (" + name + ")")
	e.applyRelease(ctx, r)

	var newPod PodSample
	e.eventually(ctx, 2*time.Minute, "the DaemonSet controller starts a caa:"+r.tag+" pod beside the v1 one", func() (bool, error) {
		var ok bool
		newPod, ok = e.rec.timeline().FirstPod(func(s PodSample) bool { return s.Tag == r.tag && s.Node == node })
		return ok, nil
	})
	ph.NewPod = newPod.Pod

	if handsOver {
		// The broken caa gets the ledger, is not ready in time, and the
		// old one takes the ledger back and turns ready again.
		e.eventually(ctx, 2*time.Minute, "the v1 caa takes the ledger back and is ready again", func() (bool, error) {
			tl := e.rec.timeline()
			h, ok := tl.handoverOf(old.UID, health.RoleHandedOver)
			if !ok || h.Outcome != health.HandoverHandedBack || h.StartedAt.Before(ph.Applied) {
				return false, nil
			}
			ph.TookOver, ph.HandbackReason = h.StartedAt, h.Reason
			for _, s := range tl.Procs {
				if s.UID == old.UID && s.Handover != nil && s.Handover.Outcome == health.HandoverHandedBack && ph.HandedBack.IsZero() {
					ph.HandedBack = s.At
				}
			}
			last := e.lastProc(old.UID)
			return last.Ready, nil
		})
		// The recorder samples each process in turn: the broken caa's
		// aborted status can reach the timeline a poll after the old
		// caa's handback.
		e.eventually(ctx, 30*time.Second, "the broken caa shows it gave the ledger back", func() (bool, error) {
			h, ok := e.rec.timeline().handoverOf(newPod.UID, health.RoleTookOver)
			return ok && h.Outcome == health.HandoverAborted, nil
		})
		assert.Contains(t, ph.HandbackReason, "--handover-ready-timeout", "the old caa says why it took the ledger back")
		ev := e.waitNodeEvents(ctx, node, "CaaHandedBack", "CaaHandoverAborted")
		assert.Contains(t, ev["CaaHandedBack"], "--handover-ready-timeout", "the Node's event says why")
		assert.Contains(t, ev["CaaHandoverAborted"], old.Pod, "the broken caa's event names the caa it gave the ledger back to")
	} else {
		// The broken caa exits before it asks for the ledger, again and
		// again; the old one is never disturbed.
		e.eventually(ctx, 2*time.Minute, "the caa:"+r.tag+" process exits twice (a crash loop)", func() (bool, error) {
			return e.exits(newPod.UID) >= 2, nil
		})
	}

	// Kubernetes stalls the rollout: the new pod is not ready, so the
	// controller keeps the old one, and `kubectl rollout status` waits.
	out, err := e.kubectlErr(ctx, "-n", namespace, "rollout", "status", "daemonset/caa", "--timeout=5s")
	assert.Error(t, err, "kubectl rollout status says the rollout is stuck: %s", out)
	ph.RolloutStatus = lastLine(out)
	d, err := e.c.Client().AppsV1().DaemonSets(namespace).Get(ctx, "caa", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, int32(1), d.Status.NumberAvailable, "the v1 pod is still available")
	oldNow := e.podNow(ctx, old.UID)
	assert.True(t, oldNow, "the v1 pod is still there and not being deleted")

	// The v1 caa reconciles: a peer pod created now gets its VM.
	ph.AddedPod = fmt.Sprintf("%s-during-%s", node, r.tag)
	e.addPeerPod(ctx, node, ph.AddedPod)
	e.addWG.Wait()
	var addedUID string
	pods, added := e.peerPods()
	for uid := range added {
		if pods[uid].Name == ph.AddedPod {
			addedUID = uid
		}
	}
	require.NotEmpty(t, addedUID, "%s was created", ph.AddedPod)
	e.eventually(ctx, time.Minute, ph.AddedPod+" gets its VM while the rollout is stalled", func() (bool, error) {
		vms := e.createdSince(ph.Applied)[addedUID]
		if len(vms) == 0 {
			return false, nil
		}
		ph.AddedVMAt = vms[0].CreatedAt
		return true, nil
	})
	assert.False(t, e.everReady(newPod.UID), "the broken caa was never ready")
	assert.True(t, e.lastProc(old.UID).Reconciling, "the v1 caa is the node's reconciler")

	// Roll back.
	ph.Undo = e.rec.mark("kubectl rollout undo")
	t.Logf("kubectl rollout undo: %s", e.kubectl(ctx, "-n", namespace, "rollout", "undo", "daemonset/caa"))
	e.waitRolledOut(ctx, "v1")
	ph.RolledBack = e.rec.mark("rolled back to v1")
	caas, err := e.c.Client().CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: nodeagent.Selector})
	require.NoError(t, err)
	ph.OldKept = len(caas.Items) == 1 && string(caas.Items[0].UID) == old.UID
	ph.Exits = e.exits(newPod.UID)
	assert.True(t, ph.OldKept, "the v1 pod of before is the node's caa after the undo")
	assert.True(t, e.lastProc(old.UID).Ready, "the v1 caa is ready after the undo")

	// The node's windows without a reconciling caa: none when the broken
	// caa never got the ledger; one, the hand-over's and the handback's,
	// when it did.
	tl := e.rec.timeline()
	ph.NoReconciler = tl.NoReconciler(ph.Applied, ph.RolledBack)[node]
	// The v1 pod stayed Ready all along: the DaemonSet controller, under
	// a surge, deletes an old pod that is not Ready while the new one is
	// not Ready either, and then nobody could take the ledger back.
	ph.PodGaps = tl.gaps(ph.Applied, ph.RolledBack)[node]
	assert.Empty(t, ph.PodGaps, "the v1 caa pod stayed Ready throughout")
	if !handsOver {
		assert.Empty(t, ph.NoReconciler, "the v1 caa kept reconciling throughout")
	} else if assert.Len(t, ph.NoReconciler, 1, "one window without a reconciler: the failed hand-over") {
		w := ph.NoReconciler[0]
		assert.False(t, w.From.Before(ph.TookOver), "the window began at the hand-over request")
		// The ready timeout, then the broken caa's stop (its grace) and
		// the old caa's startup pass.
		assert.Less(t, w.Len(), brokenReadyTimeout+brokenShutdownGrace+10*time.Second, "the handback came in time")
		assert.True(t, ph.AddedVMAt.After(w.To), "the added pod's VM came from the v1 caa after the handback")
	}
	return ph
}

// kubectlErr runs kubectl and returns its output and error.
func (e *env) kubectlErr(ctx context.Context, args ...string) (string, error) {
	bins, err := cluster.EnsureBinaries(ctx)
	require.NoError(e.t, err)
	cmd := exec.CommandContext(ctx, bins.Kubectl, append([]string{"--kubeconfig", e.c.Kubeconfig()}, args...)...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// lastProc is the last answer recorded from a process.
func (e *env) lastProc(uid string) ProcSample {
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	return e.rec.lastProc[uid]
}

// everReady reports whether a process ever answered ready.
func (e *env) everReady(uid string) bool {
	return slices.ContainsFunc(e.rec.timeline().Procs, func(s ProcSample) bool { return s.UID == uid && s.Ready })
}

// exits counts the recorded exits of a pod's process.
func (e *env) exits(uid string) int {
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	n := 0
	for _, o := range e.rec.trouble {
		if string(o.UID) == uid && o.Kind == nodeagent.Exited {
			n++
		}
	}
	return n
}

// podNow reports whether the caa pod uid exists and is not being deleted.
func (e *env) podNow(ctx context.Context, uid string) bool {
	pods, err := e.c.Client().CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: nodeagent.Selector})
	require.NoError(e.t, err)
	for _, p := range pods.Items {
		if string(p.UID) == uid {
			return p.DeletionTimestamp == nil
		}
	}
	return false
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// writeBrokenReport writes what the broken releases did, every sentence
// computed from the recording.
func (e *env) writeBrokenReport(tl Timeline, t0 time.Time, phases []brokenPhase, before, after map[string]string, created, deleted int64, added int) {
	var facts []string
	for _, ph := range phases {
		var b strings.Builder
		fmt.Fprintf(&b, "**%s** (caa:%s, applied at %s): the DaemonSet controller started %s beside the v1 caa; ", ph.Name, ph.Tag, since(t0, ph.Applied), ph.NewPod)
		switch {
		case ph.Exits > 0 || ph.TookOver.IsZero():
			fmt.Fprintf(&b, "it exited at start %d times (CrashLoopBackOff) without asking for the ledger", ph.Exits)
		default:
			fmt.Fprintf(&b, "it asked for the ledger at %s and got it, was not ready in time, and the v1 caa took the ledger back (its /status at %s: %q)",
				since(t0, ph.TookOver), since(t0, ph.HandedBack), ph.HandbackReason)
		}
		switch len(ph.NoReconciler) {
		case 0:
			b.WriteString("; the node never was without a reconciling caa")
		default:
			var ws []string
			for _, w := range ph.NoReconciler {
				ws = append(ws, fmt.Sprintf("%s (%s to %s)", seconds(w.Len()), since(t0, w.From), since(t0, w.To)))
			}
			fmt.Fprintf(&b, "; the node was without a reconciling caa for %s", strings.Join(ws, ", "))
		}
		if len(ph.PodGaps) == 0 {
			b.WriteString("; the v1 caa pod stayed Ready throughout")
		} else {
			var gs []string
			for _, g := range ph.PodGaps {
				gs = append(gs, fmt.Sprintf("%s to %s", since(t0, g.from), since(t0, g.to)))
			}
			fmt.Fprintf(&b, "; VIOLATED: the node had no Ready caa pod from %s", strings.Join(gs, ", "))
		}
		fmt.Fprintf(&b, "; the rollout stalled (`kubectl rollout status --timeout=5s`: %q)", ph.RolloutStatus)
		if ph.AddedVMAt.IsZero() {
			fmt.Fprintf(&b, "; VIOLATED: %s, created during the stall, got no VM", ph.AddedPod)
		} else {
			fmt.Fprintf(&b, "; %s, created during the stall, got its VM at %s from the v1 caa", ph.AddedPod, since(t0, ph.AddedVMAt))
		}
		fmt.Fprintf(&b, "; `kubectl rollout undo` at %s was rolled out at %s", since(t0, ph.Undo), since(t0, ph.RolledBack))
		if ph.OldKept {
			b.WriteString(", with the v1 pod of before still the node's caa")
		} else {
			b.WriteString(", VIOLATED: not with the v1 pod of before")
		}
		facts = append(facts, b.String())
	}
	kept := 0
	for uid, id := range before {
		if after[uid] == id {
			kept++
		}
	}
	w := "VMs deleted: 0"
	if deleted != 0 {
		w = fmt.Sprintf("VIOLATED: VMs deleted: %d", deleted)
	}
	facts = append(facts, fmt.Sprintf("%s; VMs created: %d for %d peer pods (%d of them created during the stalls); %d of the %d VMs of before the stalls kept",
		w, created, len(before)+added, added, kept, len(before)))
	r := Report{
		Title: "caa rolling update to a broken release (surge), then kubectl rollout undo: 1 node",
		Scenario: fmt.Sprintf("Recorded by `%s` (test/e2e/rollout) on %s, on a cluster built like the other rollout tests' with one node "+
			"and %d peer pods: caa v1 deployed from deploy/overlays/aws with the default surge, with CAA_HANDOVER_READY_TIMEOUT=%s and "+
			"CAA_SHUTDOWN_GRACE=%s for the test (probe periods 1s, thresholds as shipped); then "+
			"two broken releases in turn, each followed by `kubectl rollout undo`: %s. "+
			"Times are seconds after v1 was rolled out (T0). Every caa process's /status was polled every %s.",
			e.t.Name(), time.Now().UTC().Format("2006-01-02"), len(before), brokenReadyTimeout, brokenShutdownGrace,
			"caa:"+tagExits+" (caa v2 run with --provider=no-such-cloud: it exits at start) and caa:"+tagHangs+
				" (caa v2 whose cloud endpoint answers the preflight but never the node's VM listing: it takes the ledger and never turns ready)",
			poll),
		Start: t0,
		Facts: facts,
	}
	e.writeFiles(tl, r, "rollout-report-broken.md", "rollout-timeline-broken.svg")
}
