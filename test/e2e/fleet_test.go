package e2e

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/e2e/cluster"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// fleetSeed is the churn schedule's seed unless CAA_E2E_SEED names another.
const fleetSeed = 20261130

// lowWater is the budget's low-water marks, rounded down to whole tokens.
func lowWater(b *cloud.Budget) map[string]int {
	out := map[string]int{}
	for class, v := range b.LowWater() {
		out[class] = int(math.Floor(v))
	}
	return out
}

// fleetPod is one peer pod the fleet test made and has not deleted.
type fleetPod struct{ uid, name string }

// TestFleetChurnStaysWithinPublishedBudgets runs one caa per node on five
// nodes, each with its own ledger, against one fake EC2 that enforces EC2's
// published request limits for the whole account. After the startup passes
// it churns pods for a minute (a create or a delete on a random node every
// 200ms) and checks what the account sees: no throttling reply during the
// churn, no listing (audits are 10m away), and at the end exactly one live
// VM per pod. It logs the calls each pod change cost.
func TestFleetChurnStaysWithinPublishedBudgets(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a fleet of five daemons for about two minutes")
	}
	ctx := testContext(t, 6*time.Minute)
	seed := uint64(fleetSeed)
	if s := os.Getenv("CAA_E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "CAA_E2E_SEED")
		seed = v
	}
	t.Logf("churn seed %d (replay with CAA_E2E_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0xf1ee7))

	c := cluster.Start(ctx, t)
	budget := ec2fake.NewBudget(nil)
	core := cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{ec2Image}}))
	srv := httptest.NewServer(ec2fake.NewServer(core, ec2fake.WithBudget(budget)))
	t.Cleanup(srv.Close)
	aws := &awsCloud{core: core, url: srv.URL}

	const nodes, perNode = 5, 10
	const ns = "fleet"
	want := map[string]string{} // every pod that should have a VM: name by UID
	pods := make([][]fleetPod, nodes)
	nodeName := func(i int) string { return fmt.Sprintf("fleet-%d", i) }
	for i := range nodes {
		_, err := c.CreateNode(ctx, nodeName(i))
		require.NoError(t, err)
		for uid, name := range createPods(ctx, t, c, ns, nodeName(i), nodeName(i), perNode) {
			want[uid] = name
			pods[i] = append(pods[i], fleetPod{uid, name})
		}
	}

	started := time.Now()
	daemons := make([]*daemon, nodes)
	for i := range nodes {
		ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
		daemons[i] = startCaa(t, c, aws, nodeName(i), ledgerPath, nodeName(i), "--audit-interval", "10m")
	}
	for _, d := range daemons {
		d.waitReady(t, func() {})
	}
	requireOneEach(t, core, want, time.Minute)
	startup := core.Counters()
	t.Logf("startup of %d nodes x %d pods in %s: cloud calls %v; budget %v; fewest tokens left by bucket %v", nodes, perNode,
		time.Since(started).Round(100*time.Millisecond), startup, budget.Counts(), lowWater(budget))
	assert.Positive(t, startup[cloud.OpList], "the startup passes listed the account")

	// The churn starts on a rested account (every bucket full again, as
	// after a quiet spell), so that its low-water marks are its own.
	// Counters start from zero so that everything counted below belongs to
	// the churn and to the convergence after it.
	require.Eventually(t, func() bool {
		for class, lim := range budget.Limits() {
			if tokens, _ := budget.Tokens(class, ""); tokens < lim.Burst {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "the account's buckets fill up again after the startup")
	core.ResetCounters()
	budget.ResetCounts()
	const churnFor, every = time.Minute, 200 * time.Millisecond
	creates, deletes, seq := 0, 0, 0
	tick := time.NewTicker(every)
	defer tick.Stop()
	for end := time.Now().Add(churnFor); time.Now().Before(end); <-tick.C {
		for _, d := range daemons {
			d.requireRunning(t)
		}
		i := rng.IntN(nodes)
		if len(pods[i]) == 0 || rng.IntN(2) == 0 {
			seq++
			p, err := c.CreatePeerPod(ctx, ns, fmt.Sprintf("churn-%04d", seq), nodeName(i), nil)
			require.NoError(t, err)
			want[string(p.UID)] = p.Namespace + "/" + p.Name
			pods[i] = append(pods[i], fleetPod{string(p.UID), p.Namespace + "/" + p.Name})
			creates++
			continue
		}
		k := rng.IntN(len(pods[i]))
		gone := pods[i][k]
		pods[i] = slices.Delete(pods[i], k, k+1)
		require.NoError(t, c.DeletePod(ctx, ns, gone.name[len(ns)+1:]))
		delete(want, gone.uid)
		deletes++
	}
	churned := time.Now()
	requireOneEach(t, core, want, 2*time.Minute)
	t.Logf("%d creates and %d deletes in %s; one VM per pod %s after the last change",
		creates, deletes, churnFor, time.Since(churned).Round(100*time.Millisecond))

	n := core.Counters()
	counts := budget.Counts()
	t.Logf("cloud calls during the churn: %v", n)
	t.Logf("budget by class: %v; fewest tokens left by bucket (of %v): %v", counts, ec2fake.PublishedLimits(), lowWater(budget))
	if creates > 0 && deletes > 0 {
		t.Logf("per pod created: %.2f RunInstances, %.2f token lookups; per pod deleted: %.2f TerminateInstances; "+
			"reads by instance id: %.2f per pod change; all calls: %.2f per pod change",
			float64(n[cloud.OpCreate])/float64(creates), float64(n[ec2fake.OpLookup])/float64(creates),
			float64(n[cloud.OpDelete])/float64(deletes), float64(n[cloud.OpGet])/float64(creates+deletes),
			float64(n["total"])/float64(creates+deletes))
	}

	assert.Zero(t, budget.Throttled(), "no call over EC2's published limits during the churn")
	assert.Zero(t, n["throttled"], "no throttling reply of any kind")
	assert.Zero(t, n[cloud.OpList], "no listing between audits")
	assert.Positive(t, counts[cloud.OpCreate].Calls, "the budget metered the churn's calls")
	// A pod deleted before its caa got to it may cost no call at all, so
	// these are bounds, not equalities.
	assert.LessOrEqual(t, n[cloud.OpCreate], int64(creates), "at most one RunInstances per pod created")
	assert.LessOrEqual(t, n[cloud.OpDelete], int64(deletes), "at most one TerminateInstances per pod deleted")
	assert.LessOrEqual(t, n[ec2fake.OpLookup], int64(creates), "at most one token lookup per pod created")

	for _, d := range daemons {
		d.stop(t)
	}
	ok, why := oneEach(core, want)
	assert.True(t, ok, "SIGTERM deleted nothing: %s", why)
}
