package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/holder"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/e2e/cluster"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// front is one caa's own door to a shared fake EC2: it records each call
// (its kind, when it arrived and when it was answered) and can slow the
// creates or hang the node listings that pass through it, so a test can
// tell which caa did what, and when.
type front struct {
	url string

	slowCreate atomic.Int64 // nanoseconds each RunInstances waits before the cloud sees it
	hangList   atomic.Bool  // listings by tag hang until the caller gives up
	creating   atomic.Int32 // RunInstances calls at the door now

	mu    sync.Mutex
	calls []call
}

type call struct {
	kind        string
	arrived     time.Time
	ended       time.Time // zero while the cloud has not answered
	nodeListing bool      // a listing of the node's instances by tag
}

// sharedEC2 is one fake EC2 server over core, for fronts to share (two
// servers over one core would hand out the same ids).
func sharedEC2(core *cloud.Cloud) http.Handler { return ec2fake.NewServer(core) }

func newFront(t *testing.T, next http.Handler) *front {
	t.Helper()
	f := &front{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		kind := ec2CallKind(string(body))
		switch {
		case kind == "list" && f.hangList.Load() && nodeListing(string(body)):
			<-r.Context().Done()
			return
		case kind == "RunInstances":
			f.creating.Add(1)
			defer f.creating.Add(-1)
			// The request is on the wire: it lands even if the caller
			// stops waiting for the answer, as on a real cloud.
			time.Sleep(time.Duration(f.slowCreate.Load()))
		}
		// Recorded before the cloud sees it: a test that waits on the
		// cloud's state (the VMs it holds) then finds the call here. Its
		// end is stamped once the cloud has answered.
		f.mu.Lock()
		i := len(f.calls)
		f.calls = append(f.calls, call{kind: kind, arrived: arrived, nodeListing: kind == "list" && nodeListing(string(body))})
		f.mu.Unlock()
		next.ServeHTTP(w, r)
		f.mu.Lock()
		f.calls[i].ended = time.Now()
		f.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// nodeListing reports whether an EC2 request lists a node's instances by
// caa's node tag (the startup pass does; the preflight's read does not).
func nodeListing(body string) bool {
	q, _ := url.ParseQuery(body)
	for k, v := range q {
		if strings.HasPrefix(k, "Filter.") && strings.HasSuffix(k, ".Name") && len(v) > 0 && v[0] == "tag:"+provider.TagNode {
			return true
		}
	}
	return false
}

// logTime is the time of the first JSON log line whose msg is msg.
func logTime(t *testing.T, logs, msg string) time.Time {
	t.Helper()
	for _, line := range strings.Split(logs, "\n") {
		var l struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg {
			return l.Time
		}
	}
	t.Fatalf("no log line %q", msg)
	return time.Time{}
}

func (f *front) args() []string { return ec2Args(f.url) }

// writes are the calls that change the cloud, in order of arrival.
func (f *front) writes() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if c.kind == "RunInstances" || c.kind == "TerminateInstances" {
			out = append(out, c)
		}
	}
	return out
}

// nodeListingCalls are the listings of the node's instances, in order of arrival.
func (f *front) nodeListingCalls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if c.nodeListing {
			out = append(out, c)
		}
	}
	return out
}

func (f *front) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// snapshot reads /status; ok is false when nothing answers.
func (d *daemon) snapshot() (health.Snapshot, bool) {
	code, body, err := d.fetch("/status")
	if err != nil || code != http.StatusOK {
		return health.Snapshot{}, false
	}
	var s health.Snapshot
	return s, json.Unmarshal([]byte(body), &s) == nil
}

// handoverOutcome is the outcome of the daemon's last hand-over, "" if none.
func (d *daemon) handoverOutcome() string {
	s, ok := d.snapshot()
	if !ok || s.Handover == nil {
		return ""
	}
	return s.Handover.Outcome
}

func (d *daemon) waitHandover(t *testing.T, outcome string, within time.Duration) health.Handover {
	t.Helper()
	var h health.Handover
	require.Eventually(t, func() bool {
		s, ok := d.snapshot()
		if ok && s.Handover != nil {
			h = *s.Handover
		}
		return h.Outcome == outcome
	}, within, condPoll, "hand-over outcome %q (last: %+v)", outcome, h)
	return h
}

func (d *daemon) readyBody() string {
	_, body, _ := d.fetch("/readyz")
	return body
}

// handoverNode is one node of a fresh cluster, its ledger path, and a
// fake EC2 core that the caa processes of a test reach through fronts.
type handoverNode struct {
	c          *cluster.Cluster
	core       *cloud.Cloud
	ec2        http.Handler
	ledgerPath string
}

const handoverNodeName = "worker-1"

// newHandoverNode is a hand-over test's start: its context, ending at the
// timeout, and the node on a cluster of its own.
func newHandoverNode(t *testing.T, timeout time.Duration) (context.Context, handoverNode) {
	t.Helper()
	ctx := testContext(t, timeout)
	c := startWithNode(ctx, t, handoverNodeName)
	core := cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{ec2Image}}))
	return ctx, handoverNode{c: c, core: core, ec2: sharedEC2(core), ledgerPath: filepath.Join(t.TempDir(), "caa", "ledger.db")}
}

// front is a new door of a caa to the node's cloud.
func (h handoverNode) front(t *testing.T) *front {
	t.Helper()
	return newFront(t, h.ec2)
}

// launch starts a caa on the node, through front f, as the DaemonSet's pod
// named pod; extra flags come last.
func (h handoverNode) launch(t *testing.T, f *front, label, pod string, extra ...string) *daemon {
	t.Helper()
	args := append(append(f.args(), "--pod-name", pod), extra...)
	return launchCaa(t, h.c, handoverNodeName, h.ledgerPath, label, args, awsEnv())
}

// launchStuck starts a caa as launch does, with its node listings through
// f hanging: once released the ledger, it stays in its startup pass,
// holding the ledger, until the test lets f go.
func (h handoverNode) launchStuck(t *testing.T, f *front, label, pod string, extra ...string) *daemon {
	t.Helper()
	f.hangList.Store(true)
	return h.launch(t, f, label, pod, extra...)
}

// waitReleased waits until the old caa has released the ledger to the new
// caa v, the DaemonSet's pod named pod, and v holds the ledger's lease.
func (h handoverNode) waitReleased(t *testing.T, old, v *daemon, pod string) {
	t.Helper()
	old.waitHandoverWith(t, health.HandoverUnderway, pod, time.Minute, "the old caa released the ledger")
	h.waitLeaseHeldBy(t, v, "the new caa holds the ledger and its lease")
}

// holding creates n peer pods and starts the caa "v1" (pod caa-v1) that
// holds the ledger, ready with one VM each; before is those VMs.
func (h handoverNode) holding(ctx context.Context, t *testing.T, f *front, n int, extra ...string) (v1 *daemon, pods, before map[string]string) {
	t.Helper()
	pods = createPods(ctx, t, h.c, "team", "web", handoverNodeName, n)
	v1 = h.launch(t, f, "v1", "caa-v1", extra...)
	v1.waitReady(t, func() {})
	requireOneEach(t, h.core, pods, time.Minute)
	return v1, pods, liveVMs(h.core)
}

// servesNewPods creates two more peer pods (named prefix-…) into pods and
// waits for one VM each: whichever caa reconciles, the node does.
func (h handoverNode) servesNewPods(ctx context.Context, t *testing.T, pods map[string]string, prefix string) {
	t.Helper()
	maps.Copy(pods, createPods(ctx, t, h.c, "team", prefix, handoverNodeName, 2))
	requireOneEach(t, h.core, pods, time.Minute)
}

// noneReplaced checks that every VM of before still serves its pod.
func (h handoverNode) noneReplaced(t *testing.T, before map[string]string) {
	t.Helper()
	live := liveVMs(h.core)
	for uid, id := range before {
		assert.Equal(t, id, live[uid], "no VM replaced")
	}
}

// verify runs `caa ledger verify` on the node's ledger.
func (h handoverNode) verify(t *testing.T) {
	t.Helper()
	assert.Contains(t, runCaa(t, "ledger", "verify", "--ledger", h.ledgerPath), "ok")
}

// waitHandoverWith waits until the caa's hand-over with the pod named
// peer has the outcome.
func (d *daemon) waitHandoverWith(t *testing.T, outcome, peer string, within time.Duration, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		s, ok := d.snapshot()
		return ok && s.Handover != nil && s.Handover.Outcome == outcome && strings.Contains(s.Handover.Peer, peer)
	}, within, condPoll, what)
}

// waitLeaseHeldBy waits until the ledger's lease names the process of v.
func (h handoverNode) waitLeaseHeldBy(t *testing.T, v *daemon, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		l, err := holder.ReadLease(holder.LeasePath(h.ledgerPath))
		return err == nil && l.PID == v.cmd.Process.Pid
	}, time.Minute, condPoll, what)
}

// TestSurgeHandOver: a second caa on the node's ledger (a DaemonSet update
// with maxSurge 1) takes the ledger over from the first; the first stays up,
// live and inert; no VM is touched; the node is without a reconciler only
// for the gap; and the new caa serves new pods.
func TestSurgeHandOver(t *testing.T) {
	t.Parallel()
	ctx, h := newHandoverNode(t, 5*time.Minute)
	core := h.core
	f1, f2 := h.front(t), h.front(t)
	v1, pods, before := h.holding(ctx, t, f1, 10)

	v2 := h.launch(t, f2, "v2", "caa-v2")
	v2.waitReady(t, func() {})
	took := v2.waitHandover(t, health.HandoverDone, 10*time.Second)
	gave := v1.waitHandover(t, health.HandoverDone, 10*time.Second)
	assert.Equal(t, health.RoleTookOver, took.Role)
	assert.Equal(t, health.RoleHandedOver, gave.Role)
	assert.Contains(t, took.Peer, "caa-v1")
	assert.Contains(t, gave.Peer, "caa-v2")
	assert.Positive(t, took.Gap, "the gap is measured")
	// The new caa lists the node once, after the release: no early listing
	// while the old caa held the ledger (every node would pay it twice).
	if ls := f2.nodeListingCalls(); assert.Len(t, ls, 1, "one listing of the node by the new caa") {
		assert.True(t, ls[0].arrived.After(logTime(t, v2.logs.String(), "the running caa released the ledger")),
			"the new caa's listing follows the release")
	}
	t.Logf("hand-over: took %s, gap %s", time.Duration(took.Took), time.Duration(took.Gap))

	// The old caa: up, live, not ready, and says why.
	v1.requireRunning(t)
	assert.Equal(t, http.StatusServiceUnavailable, v1.readyz())
	assert.Contains(t, v1.readyBody(), "handed over to caa-v2")
	code, _, err := v1.fetch("/healthz")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "the inert caa stays live")

	// No VM was touched by the hand-over, by either caa.
	assert.Equal(t, before, liveVMs(core), "no VM replaced")
	assert.Empty(t, f2.writes(), "the new caa adopts every VM")
	v1Writes := len(f1.writes())

	// New work goes to the new caa only; the old one never calls the cloud again.
	v1Calls := f1.count()
	h.servesNewPods(ctx, t, pods, "api")
	assert.Len(t, f2.writes(), 2, "the new caa creates the new pods' VMs")
	assert.Equal(t, v1Writes, len(f1.writes()))
	assert.Equal(t, v1Calls, f1.count(), "the inert caa makes no cloud call")

	v1.stop(t)
	v2.requireRunning(t)
	assert.Equal(t, http.StatusOK, v2.readyz())
	v2.stop(t)
	h.verify(t)
}

// TestHandOverWithACreateInFlight: the old caa is mid-create when the new
// one asks. With a shutdown grace longer than the create, the create
// finishes before the ledger is released, and no write of the old caa lands
// after the new caa's first read of the cloud. With a shorter grace the old
// caa abandons the call, which still lands at the cloud; the new caa finds
// that VM by the create's key and makes no second one.
func TestHandOverWithACreateInFlight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		grace string
	}{
		{"finished within the grace", "20s"},
		{"abandoned after the grace", "300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each its own cluster and caa pair
			ctx, h := newHandoverNode(t, 5*time.Minute)
			core := h.core
			f1, f2 := h.front(t), h.front(t)
			v1 := h.launch(t, f1, "v1", "caa-v1", "--shutdown-grace", tc.grace)
			v1.waitReady(t, func() {})

			const slow = 2 * time.Second
			f1.slowCreate.Store(int64(slow))
			pods := createPods(ctx, t, h.c, "team", "web", handoverNodeName, 2)
			require.Eventually(t, func() bool { return f1.creating.Load() > 0 }, time.Minute, condPoll, "the old caa has a create in flight")

			v2 := h.launch(t, f2, "v2", "caa-v2")
			v2.waitReady(t, func() {})
			v2.waitHandover(t, health.HandoverDone, 10*time.Second)
			requireOneEach(t, core, pods, time.Minute)
			// A create the old caa abandoned is still on its way: count
			// the VMs once it has landed.
			require.Eventually(t, func() bool { return f1.creating.Load() == 0 }, time.Minute, condPoll)
			ok, why := oneEach(core, pods)
			assert.True(t, ok, "one VM per pod, no duplicate: %s", why)
			assert.Len(t, core.Live(), len(pods))

			if tc.grace == "20s" {
				// Every write of the old caa ended before it released the
				// ledger, so before the new caa's startup pass read anything.
				released := logTime(t, v1.logs.String(), "ledger released to the new caa; waiting for it to turn ready")
				require.NotEmpty(t, f1.writes())
				for _, w := range f1.writes() {
					assert.True(t, !w.ended.IsZero() && w.ended.Before(released), "the old caa's %s ended at %s, after it released the ledger at %s",
						w.kind, w.ended.Format(time.StampMilli), released.Format(time.StampMilli))
				}
			}
			v1.stop(t)
			v2.stop(t)
			h.verify(t)
		})
	}
}

// TestHandbackWhenTheNewCaaFails: a new caa that dies after the ledger was
// released to it, or that does not turn ready in time, leaves the node with
// the old caa reconciling again.
func TestHandbackWhenTheNewCaaFails(t *testing.T) {
	t.Parallel()
	ctx, h := newHandoverNode(t, 6*time.Minute)
	f1, f2 := h.front(t), h.front(t)
	v1, pods, before := h.holding(ctx, t, f1, 5, "--handover-ready-timeout", "4s", "--boot-timeout", "3s", "--shutdown-grace", "2s")

	// A new version whose node listing hangs never finishes its startup
	// pass: it is released the ledger, then aborted, and gives it back.
	v2 := h.launchStuck(t, f2, "v2-hangs", "caa-v2", "--shutdown-grace", "1s")
	back := v1.waitHandover(t, health.HandoverHandedBack, time.Minute)
	assert.Contains(t, back.Reason, "not ready within 4s")
	v1.waitReady(t, func() {})
	v2.waitHandover(t, health.HandoverAborted, 10*time.Second)
	v2.requireRunning(t)
	assert.Equal(t, http.StatusServiceUnavailable, v2.readyz())
	assert.Contains(t, v2.readyBody(), "hand-over was aborted")
	h.servesNewPods(ctx, t, pods, "api")
	v2.stop(t)

	// The kubelet restarts the failed pod's container: the same pod asks
	// again and is refused for a while, so the node keeps its reconciler.
	again := h.launch(t, f2, "v2-restarted", "caa-v2", "--shutdown-grace", "1s")
	require.Eventually(t, func() bool { return strings.Contains(again.readyBody(), "failed a hand-over") }, time.Minute, condPoll,
		"the pod that failed a hand-over is refused")
	// v1 runs the shipped cooldown: it must outlast the shipped startup
	// probe plus the kubelet's longest back-off, so the restarted
	// container of a failed pod costs the node no second gap.
	until := refusedUntil(t, again.readyBody())
	startup, backoff := shippedStartupWindow(t), 5*time.Minute
	assert.Greater(t, time.Until(until), startup+backoff,
		"the refusal (until %s) outlasts the startup probe's %s plus the kubelet's %s back-off", until, startup, backoff)
	assert.Equal(t, http.StatusOK, v1.readyz())
	assert.Equal(t, health.HandoverHandedBack, v1.handoverOutcome(), "no new hand-over began")
	again.stop(t)

	// A new version killed after the release: the old caa sees the
	// connection drop and takes the ledger back at once.
	f3 := h.front(t)
	v3 := h.launchStuck(t, f3, "v3-killed", "caa-v3")
	v1.waitHandoverWith(t, health.HandoverUnderway, "caa-v3", time.Minute, "the old caa released the ledger")
	assert.Equal(t, http.StatusOK, v1.readyz(), "the old caa stays Ready while the new one starts, or the DaemonSet controller would delete it")
	v3.kill(t)
	back = v1.waitHandover(t, health.HandoverHandedBack, 30*time.Second)
	assert.Contains(t, back.Reason, "went away")
	v1.waitReady(t, func() {})
	h.servesNewPods(ctx, t, pods, "db")
	h.noneReplaced(t, before)
	v1.stop(t)
	h.verify(t)
}

// TestBrokenNewVersionNeverAsks: a new caa with a setting that fails before
// the hand-over (here, a flag that fails validation; refused credentials
// fail the preflight, which also runs before the ask) never disturbs the
// running one.
func TestBrokenNewVersionNeverAsks(t *testing.T) {
	t.Parallel()
	ctx, h := newHandoverNode(t, 4*time.Minute)
	f1 := h.front(t)
	v1, pods, _ := h.holding(ctx, t, f1, 0)

	// An unknown runtime-class flag value is fine, a bad flag is not: the
	// process exits on its usage error without touching the socket.
	bad := h.launch(t, f1, "bad-flags", "caa-v2", "--create-rate", "0")
	select {
	case err := <-bad.done:
		require.Error(t, err, "a usage error exits non-zero")
	case <-time.After(time.Minute):
		t.Fatal("caa with a bad flag did not exit")
	}
	assert.Equal(t, http.StatusOK, v1.readyz())
	assert.Empty(t, v1.handoverOutcome(), "no hand-over was started")
	h.servesNewPods(ctx, t, pods, "api")
	v1.stop(t)
}

// TestSigkillDuringHandOver kills the old or the new caa at a seeded random
// moment of the hand-over, many times. Whatever the moment, one caa ends up
// reconciling, each pod has exactly one VM, and the ledger verifies.
func TestSigkillDuringHandOver(t *testing.T) {
	t.Parallel()
	iterations := 20
	if testing.Short() {
		iterations = 4
	}
	ctx, h := newHandoverNode(t, 12*time.Minute)
	c, core, ledgerPath := h.c, h.core, h.ledgerPath
	const node = handoverNodeName
	all := createPods(ctx, t, c, "team", "web", node, 6)

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	f := h.front(t)
	args := func(name string) []string {
		return append(f.args(), "--pod-name", name, "--shutdown-grace", "2s", "--handover-ready-timeout", "20s", "--boot-timeout", "10s")
	}
	cur := launchCaa(t, c, node, ledgerPath, "caa-0", args("caa-0"), awsEnv())
	cur.waitReady(t, func() {})
	for i := 1; i <= iterations; i++ {
		name := fmt.Sprintf("caa-%d", i)
		next := launchCaa(t, c, node, ledgerPath, name, args(name), awsEnv())
		// Pods arrive during the hand-over, too.
		maps.Copy(all, createPods(ctx, t, c, "team", fmt.Sprintf("it%02d", i), node, 1))
		// The seeded moment of the kill: the new caa asks about 150-250ms
		// after its start, and the hand-over takes some 15ms, so kills fall
		// before, during and after it.
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		killOld := rng.IntN(2) == 0
		if killOld {
			cur.kill(t)
			cur = next
		} else {
			next.kill(t)
			// Killed after the hand-over completed, the new caa had the
			// ledger and the old one is inert for good: the kubelet
			// restarts the new pod, and that restart takes over.
			var inert bool
			require.Eventually(t, func() bool {
				inert = strings.Contains(cur.readyBody(), "handed over to")
				return inert || cur.readyz() == http.StatusOK
			}, time.Minute, condPoll, "the old caa resumes or stays inert")
			if inert {
				name += "-restarted"
				cur = launchCaa(t, c, node, ledgerPath, name, args(name), awsEnv())
			}
		}
		cur.waitReady(t, func() {})
		requireOneEach(t, core, all, time.Minute)
		t.Logf("iteration %d: killed the %s caa", i, map[bool]string{true: "old", false: "new"}[killOld])
	}
	ok, why := oneEach(core, all)
	require.True(t, ok, why)
	assert.Len(t, core.Live(), len(all), "no duplicate and no leaked VM")
	cur.stop(t)
	h.verify(t)
}

// refusedUntil is the time in a cooldown refusal's "refused until <time>:".
func refusedUntil(t *testing.T, body string) time.Time {
	t.Helper()
	m := regexp.MustCompile(`refused until (\S+):`).FindStringSubmatch(body)
	require.NotNil(t, m, "no refusal time in %q", body)
	until, err := time.Parse(time.RFC3339, m[1])
	require.NoError(t, err)
	return until
}

// shippedStartupWindow is the base DaemonSet's startup probe window.
func shippedStartupWindow(t *testing.T) time.Duration {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "base", "daemonset.yaml"))
	require.NoError(t, err)
	var ds appsv1.DaemonSet
	require.NoError(t, yaml.Unmarshal(raw, &ds))
	p := ds.Spec.Template.Spec.Containers[0].StartupProbe
	require.NotNil(t, p)
	return time.Duration(p.PeriodSeconds*p.FailureThreshold) * time.Second
}

// requireLiveFor polls /healthz for d and fails at the first answer that is
// not 200.
func (d *daemon) requireLiveFor(t *testing.T, dur time.Duration, what string) {
	t.Helper()
	end := time.Now().Add(dur)
	for time.Now().Before(end) {
		code, body, err := d.fetch("/healthz")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, "%s: /healthz %s", what, body)
		time.Sleep(condPoll)
	}
}

func (d *daemon) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(sig))
}

// freeze SIGSTOPs d (SIGCONT thaws it); a d still frozen at the test's
// end is SIGKILLed.
func (d *daemon) freeze(t *testing.T) {
	t.Helper()
	d.signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { _ = d.cmd.Process.Signal(syscall.SIGKILL) })
}

// e2eStale is /healthz's stale bound under launchCaa's --resync 2s; a
// wait that keeps /healthz 200 three times that long outlives the liveness
// probe's failure window scaled the same way (the shipped window is the
// 3 min bound plus 3 x 20s probes).
const e2eStale = 3 * 2 * time.Second

// TestHungNewCaaAfterItTookTheLedger (issue 17, item 1): the new caa takes
// the ledger and is then SIGSTOPped (the real binary, through the signal).
// The old caa aborts at its ready timeout, then waits for the lock: live
// for longer than the liveness window, not ready and saying who holds the
// lock, never breaking it; once the hung process ends (the kubelet's probe
// restarts it) the old caa takes the ledger back and reconciles.
func TestHungNewCaaAfterItTookTheLedger(t *testing.T) {
	t.Parallel()
	ctx, h := newHandoverNode(t, 4*time.Minute)
	f1, f2 := h.front(t), h.front(t)
	v1, pods, before := h.holding(ctx, t, f1, 3, "--handover-ready-timeout", "4s", "--boot-timeout", "3s", "--shutdown-grace", "1s")

	v2 := h.launchStuck(t, f2, "v2-hangs", "caa-v2") // in its startup pass, the ledger open
	h.waitReleased(t, v1, v2, "caa-v2")
	v2.freeze(t)

	require.Eventually(t, func() bool { return strings.Contains(v1.readyBody(), "the ledger lock is held by caa-v2") }, time.Minute, condPoll,
		"the old caa says who holds the lock")
	assert.Equal(t, http.StatusServiceUnavailable, v1.readyz(), "not ready while it does not reconcile")
	writes := len(f1.writes())
	v1.requireLiveFor(t, 3*e2eStale, "the old caa waiting on the hung caa's lock")
	assert.Contains(t, v1.readyBody(), "the ledger lock is held by caa-v2", "still waiting: the lock is never broken on a timeout")
	assert.Len(t, f1.writes(), writes, "no cloud write while waiting")

	v2.kill(t) // what the kubelet does when the hung caa's probe gives up
	v1.waitReady(t, func() {})
	h.servesNewPods(ctx, t, pods, "api")
	h.noneReplaced(t, before)
	v1.stop(t)
	h.verify(t)
}

// TestFrozenHolderAfterTheRelease (issue 17, item 6): the old caa is
// SIGSTOPped after it released the ledger, before it hears the new caa's
// ready, and thaws past its ready timeout. The new caa reconciles and turns
// ready meanwhile; the thawed old caa counts the ready that waited in its
// socket, retires, and the new caa serves the hand-over socket: a third caa
// takes the ledger from it.
func TestFrozenHolderAfterTheRelease(t *testing.T) {
	t.Parallel()
	ctx, h := newHandoverNode(t, 4*time.Minute)
	f1, f2, f3 := h.front(t), h.front(t), h.front(t)
	v1, pods, _ := h.holding(ctx, t, f1, 3, "--handover-ready-timeout", "4s", "--boot-timeout", "3s", "--shutdown-grace", "1s")

	v2 := h.launchStuck(t, f2, "v2", "caa-v2", "--cloud-timeout", "2s")
	h.waitReleased(t, v1, v2, "caa-v2")
	v1.freeze(t)
	f2.hangList.Store(false)
	// Ready after 10s of the old caa's silence: past v1's 4s ready
	// timeout, so its timer has fired when it thaws.
	v2.waitReady(t, func() {})
	v1.signal(t, syscall.SIGCONT)

	v1.waitHandover(t, health.HandoverDone, 30*time.Second)
	assert.Contains(t, v1.readyBody(), "handed over to caa-v2")
	v3 := h.launch(t, f3, "v3", "caa-v3")
	v3.waitReady(t, func() {})
	took := v3.waitHandover(t, health.HandoverDone, 30*time.Second)
	assert.Contains(t, took.Peer, "caa-v2", "the new caa served the hand-over socket")
	h.servesNewPods(ctx, t, pods, "api")
	v1.stop(t)
	v2.stop(t)
	v3.stop(t)
}

// TestFrozenHolderBeforeTheRelease (issue 17, item 6): the holder is
// SIGSTOPped before a new caa asks. The new caa waits, live and not ready,
// saying the holder's lease expired; when the holder thaws it hands over
// to the new caa, without a cooldown, and the new caa serves the socket.
func TestFrozenHolderBeforeTheRelease(t *testing.T) {
	t.Parallel()
	ctx, h := newHandoverNode(t, 4*time.Minute)
	f1, f2 := h.front(t), h.front(t)
	v1, pods, _ := h.holding(ctx, t, f1, 3)

	v1.freeze(t)
	v2 := h.launch(t, f2, "v2", "caa-v2", "--shutdown-grace", "1s")
	require.Eventually(t, func() bool { return strings.Contains(v2.readyBody(), "asking the caa that holds the ledger") }, time.Minute, condPoll)
	v2.requireLiveFor(t, 3*e2eStale, "the new caa asking a frozen holder")
	v1.signal(t, syscall.SIGCONT)
	v2.waitReady(t, func() {})
	v2.waitHandover(t, health.HandoverDone, 30*time.Second)
	assert.NotContains(t, v2.readyBody(), "failed a hand-over")
	h.servesNewPods(ctx, t, pods, "api")
	v1.stop(t)
	v2.stop(t)
}

// TestInertCaaTakesTheLedgerBackWhenItsSuccessorIsGone (issue 17, item 4):
// after a hand-over the old caa is inert; the new one is SIGKILLed and not
// restarted (the kubelet's back-off, or a pod deleted with nothing after
// it). The inert caa finds the ledger's lock free on two looks, takes the
// ledger back through the lock, turns ready and serves new pods with no
// VM replaced; and it hands the ledger over again to the next caa.
func TestInertCaaTakesTheLedgerBackWhenItsSuccessorIsGone(t *testing.T) {
	t.Parallel()
	ctx, h := newHandoverNode(t, 4*time.Minute)
	f1, f2, f3 := h.front(t), h.front(t), h.front(t)
	v1, pods, before := h.holding(ctx, t, f1, 3, "--handover-inert-check", "300ms")

	v2 := h.launch(t, f2, "v2", "caa-v2")
	v2.waitReady(t, func() {})
	v1.waitHandover(t, health.HandoverDone, 10*time.Second)
	require.Equal(t, http.StatusServiceUnavailable, v1.readyz())
	// While the successor holds the ledger the inert caa stays inert,
	// however many looks it takes, and calls no cloud.
	v1Calls := f1.count()
	v1.requireLiveFor(t, 2*time.Second, "the inert caa beside a working successor")
	assert.Equal(t, http.StatusServiceUnavailable, v1.readyz(), "still inert while the successor holds the lock")
	assert.Equal(t, v1Calls, f1.count(), "the inert caa makes no cloud call")

	v2.kill(t)
	v1.waitReady(t, func() {})
	assert.Contains(t, v1.logs.String(), "taking the ledger back")
	h.servesNewPods(ctx, t, pods, "api")
	h.noneReplaced(t, before)

	// It serves the hand-over socket again: the next caa takes over.
	v3 := h.launch(t, f3, "v3", "caa-v3")
	v3.waitReady(t, func() {})
	v1.waitHandoverWith(t, health.HandoverDone, "caa-v3", 10*time.Second, "the caa that took the ledger back hands it over again")
	assert.Empty(t, f3.writes(), "the next caa adopts every VM")
	v1.stop(t)
	v3.stop(t)
	h.verify(t)
}
