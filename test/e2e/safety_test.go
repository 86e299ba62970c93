package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/health"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// arrivals records when each request reached the fake EC2, and what kind
// of call it was.
type arrivals struct {
	mu    sync.Mutex
	times []time.Time
	kinds map[string]int
}

func (a *arrivals) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		a.mu.Lock()
		a.times = append(a.times, now)
		if a.kinds == nil {
			a.kinds = map[string]int{}
		}
		a.kinds[ec2CallKind(string(body))]++
		a.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

// ec2CallKind names an EC2 request: its action, and for DescribeInstances
// whether it reads instances by id ("get"), looks one up by its create's
// client token ("lookup", part of an idempotent create) or lists by tags
// ("list", what must not happen per pod change).
func ec2CallKind(body string) string {
	q, _ := url.ParseQuery(body)
	action := q.Get("Action")
	if q.Get("DryRun") == "true" {
		return action + " (dry run)" // a permission check: it changes nothing
	}
	if action != "DescribeInstances" {
		return action
	}
	for k, v := range q {
		switch {
		case strings.HasPrefix(k, "InstanceId."):
			return "get"
		case strings.HasPrefix(k, "Filter.") && strings.HasSuffix(k, ".Name") && len(v) > 0 && v[0] == "client-token":
			return "lookup"
		}
	}
	return "list"
}

func (a *arrivals) counts() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.kinds)
}

func (a *arrivals) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.kinds = nil
}

// after lists the arrivals later than t.
func (a *arrivals) after(t time.Time) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []time.Time
	for _, at := range a.times {
		if at.After(t) {
			out = append(out, at)
		}
	}
	return out
}

// newRecordedAWSCloud is newAWSCloud with every request's arrival recorded.
func newRecordedAWSCloud(t *testing.T) (*awsCloud, *arrivals) {
	t.Helper()
	core := cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{ec2Image}}))
	rec := &arrivals{}
	srv := httptest.NewServer(rec.wrap(ec2fake.NewServer(core)))
	t.Cleanup(srv.Close)
	return &awsCloud{core: core, url: srv.URL}, rec
}

// TestSigtermMidPassStartsNoCloudCall: SIGTERM lands while caa works through
// a pass with creates and deletes still to do (the write budget lets one
// through a second). From the signal on, no cloud call starts; the calls in
// flight finish; caa exits 0 without deleting a VM for the shutdown (I4);
// and the next caa finishes the work with one VM per pod (I1).
func TestSigtermMidPassStartsNoCloudCall(t *testing.T) {
	serial(t, "it asserts no cloud call reaches the fake more than 100 ms after SIGTERM, a window other tests' load would stretch")
	ctx := testContext(t, 8*time.Minute)
	const node = "worker-1"
	c := startWithNode(ctx, t, node)
	aws, calls := newRecordedAWSCloud(t)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")

	// First, six pods with their VMs.
	old := createPods(ctx, t, c, "team", "old", node, 6)
	d := startCaa(t, c, aws, node, ledgerPath, "first")
	d.waitReady(t, func() {})
	d.stop(t)

	// Then: the six are deleted (six deletes pending) and twelve new pods
	// arrive (twelve creates pending), with a slow cloud and a write budget
	// of one call a second.
	for _, name := range old {
		require.NoError(t, c.Client().CoreV1().Pods("team").Delete(ctx, name[len("team/"):], metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	}
	fresh := createPods(ctx, t, c, "team", "new", node, 12)
	aws.core.SetFaults(cloud.Faults{Latency: 150 * time.Millisecond})
	aws.core.ResetCounters()
	d = startCaa(t, c, aws, node, ledgerPath, "interrupted", "--create-rate", "1", "--create-burst", "1", "--create-concurrency", "2")

	// SIGTERM once the pass has made a few writes and has more to make.
	require.Eventually(t, func() bool {
		n := aws.core.Counters()
		return n[cloud.OpCreate]+n[cloud.OpDelete] >= 3
	}, 2*time.Minute, condPoll, "caa starts its writes")
	before := aws.core.Counters()
	signalled := time.Now()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-d.done:
		require.NoError(t, err, "caa exits 0 on SIGTERM")
	case <-time.After(time.Minute):
		t.Fatal("caa did not stop within a minute of SIGTERM")
	}

	// A request caa sent just before the signal can reach the fake a few
	// milliseconds after it; anything later was started after the signal.
	const inFlight = 100 * time.Millisecond
	late := calls.after(signalled.Add(inFlight))
	assert.Empty(t, late, "no cloud call starts after SIGTERM (%d arrived later than %s after it)", len(late), inFlight)
	after := aws.core.Counters()
	assert.LessOrEqual(t, after[cloud.OpCreate]+after[cloud.OpDelete]-before[cloud.OpCreate]-before[cloud.OpDelete], int64(2),
		"at most the writes already in flight (create concurrency 2) finish after the signal")
	writes := after[cloud.OpCreate] + after[cloud.OpDelete]
	assert.Less(t, writes, int64(18), "the signal came mid-pass: work was left for the next caa")

	// The next caa finishes the job: one VM per remaining pod, none left
	// for the deleted ones.
	aws.core.SetFaults(cloud.Faults{})
	d = startCaa(t, c, aws, node, ledgerPath, "next")
	d.waitReady(t, func() {})
	requireOneEach(t, aws.core, fresh, time.Minute)
	d.stop(t)
	assert.Contains(t, runCaa(t, "ledger", "verify", "--ledger", ledgerPath), "ok")
}

// TestRestartWithAnotherRuntimeClassDeletesNothing: caa restarted with a
// runtime class that matches none of its pods (a typo, a rename) keeps every
// VM, even past the orphan grace; it reports the records it keeps, on
// /status and in metrics; restarted with the right flag, it adopts them all
// without a cloud write (I3: configuration never deletes a VM).
func TestRestartWithAnotherRuntimeClassDeletesNothing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	const node = "worker-1"
	c := startWithNode(ctx, t, node)
	aws := newAWSCloud(t)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	uids := createPods(ctx, t, c, "team", "web", node, 5)

	d := startCaa(t, c, aws, node, ledgerPath, "right class")
	d.waitReady(t, func() {})
	before := liveVMs(aws.core)
	require.Len(t, before, 5)
	d.stop(t)

	aws.core.ResetCounters()
	d = startCaa(t, c, aws, node, ledgerPath, "typo", "--runtime-class", "kata-remtoe", "--gc-grace", "1s", "--resync", "1s", "--audit-interval", "1s")
	d.waitReady(t, func() {})
	d.waitPasses(t, 4) // several passes, each past the orphan grace
	assert.Equal(t, before, liveVMs(aws.core), "every VM kept")
	n := aws.core.Counters()
	assert.Zero(t, n[cloud.OpCreate]+n[cloud.OpDelete], "no cloud write")

	var snap health.Snapshot
	require.NoError(t, json.Unmarshal([]byte(d.get(t, "/status")), &snap))
	assert.Len(t, snap.NotWatched, 5, "each kept record is reported")
	for _, p := range snap.NotWatched {
		assert.Contains(t, p.Message, "kata-remote")
	}
	v, ok := metricValue(d.get(t, "/metrics"), "caa_records_not_watched")
	assert.True(t, ok)
	assert.InDelta(t, 5, v, 0)
	d.stop(t)

	aws.core.ResetCounters()
	d = startCaa(t, c, aws, node, ledgerPath, "fixed")
	d.waitReady(t, func() {})
	assert.Equal(t, before, liveVMs(aws.core))
	n = aws.core.Counters()
	assert.Zero(t, n[cloud.OpCreate]+n[cloud.OpDelete], "adopted without a cloud write")
	requireOneEach(t, aws.core, uids, time.Minute)
	d.stop(t)
}

// TestPodChurnCostsNoListing: with the default audit interval, pod creates
// and deletes after the startup cost only their own VMs' calls, counted at
// the fake EC2: one RunInstances and at most two reads per create, one
// TerminateInstances and at most one read per delete, and no listing.
func TestPodChurnCostsNoListing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	const node = "worker-1"
	c := startWithNode(ctx, t, node)
	aws, calls := newRecordedAWSCloud(t)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	first := createPods(ctx, t, c, "team", "first", node, 6)

	d := startCaa(t, c, aws, node, ledgerPath, "churn", "--audit-interval", "10m", "--resync", "2s")
	d.waitReady(t, func() {})
	calls.reset()

	const creates, deletes = 10, 4
	fresh := createPods(ctx, t, c, "team", "fresh", node, creates)
	want := map[string]string{}
	i := 0
	for uid, name := range first {
		if i < deletes {
			require.NoError(t, c.Client().CoreV1().Pods("team").Delete(ctx, name[len("team/"):], metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
		} else {
			want[uid] = name
		}
		i++
	}
	for uid, name := range fresh {
		want[uid] = name
	}
	requireOneEach(t, aws.core, want, 2*time.Minute)
	n := calls.counts()
	t.Logf("cloud calls for %d creates and %d deletes: %v", creates, deletes, n)
	assert.Zero(t, n["list"], "no listing per pod change")
	assert.Equal(t, creates, n["RunInstances"])
	assert.Equal(t, deletes, n["TerminateInstances"])
	assert.LessOrEqual(t, n["get"]+n["lookup"], 2*creates, "at most two reads per create, none per delete")
	d.stop(t)
}
