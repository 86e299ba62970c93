package azure_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/azure"
	"github.com/caa-project/caa/test/conformance"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// queries records the Resource Graph queries that reach the fake.
type queries struct {
	mu  sync.Mutex
	all []string
}

func (q *queries) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == armfake.GraphPath {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(strings.NewReader(string(body)))
			q.mu.Lock()
			q.all = append(q.all, string(body))
			q.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

func (q *queries) count() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.all)
}

// TestListQuotesHostileNodeNames: node names go into the query as string
// literals, so a name that is itself KQL (quotes, backslashes, pipes, a
// line break) selects the VMs tagged with exactly that name and never
// widens or breaks the query. The fake parses the query for real, so an
// unescaped quote would either fail to parse or select other VMs.
func TestListQuotesHostileNodeNames(t *testing.T) {
	e := newEnv(t, armfake.WithGraphPageSize(100))
	hostile := []string{
		`node-a' or tags['caa-node'] != 'x`,
		`x' | project id, name, type, tags //`,
		`back\slash\' and quote"s`,
		"line\nbreak' | where type =~ '",
		`node-a\`,
	}
	mine := map[string]string{}
	for i, node := range append([]string{"node-a", "node-b"}, hostile...) {
		vm, err := e.Provider.Create(e.ctx, conformance.Spec(40+i, node))
		require.NoError(t, err, node)
		mine[node] = vm.ID
	}
	for _, node := range append([]string{"node-a"}, hostile...) {
		vms, err := e.Provider.List(e.ctx, provider.Selector{Cluster: conformance.Cluster, Node: node})
		require.NoError(t, err, "node %q", node)
		require.Len(t, vms, 1, "node %q selects its own VM only", node)
		assert.Equal(t, mine[node], vms[0].ID, "node %q", node)
		assert.Equal(t, node, vms[0].Tags[provider.TagNode])
	}
	for _, node := range []string{`' or '1' == '1`, `*`, `node-%`, ``} {
		vms, err := e.Provider.List(e.ctx, provider.Selector{Cluster: conformance.Cluster, Node: node})
		require.NoError(t, err, "node %q", node)
		assert.Empty(t, vms, "node %q matches no VM", node)
	}
	cluster := `cluster-7f3a' or tags['caa-managed-by'] == 'caa`
	vms, err := e.Provider.List(e.ctx, provider.Selector{Cluster: cluster, Node: "node-a"})
	require.NoError(t, err)
	assert.Empty(t, vms, "a hostile cluster id widens nothing")

	_, err = e.Provider.List(e.ctx, provider.Selector{Cluster: conformance.Cluster, Node: "bell\a"})
	require.ErrorIs(t, err, provider.ErrInvalidSpec, "a control character has no safe KQL form: refused before any call")
	assert.Contains(t, err.Error(), "node")
}

// TestListKeepsTheQueryAConstant: whatever the node's name, the query sent
// is the same text outside its string literals.
func TestListKeepsTheQueryAConstant(t *testing.T) {
	q := &queries{}
	h, _ := newHarness(t, conformance.Options(&conformance.Clock{}), staticToken(testToken), q.wrap)
	for _, node := range []string{"node-a", `x' or 1 == 1 | project id //`, `\'\\"`} {
		_, err := h.Provider.List(context.Background(), provider.Selector{Cluster: conformance.Cluster, Node: node})
		require.NoError(t, err)
	}
	require.Equal(t, 3, q.count())
	shapes := map[string]bool{}
	for _, body := range q.all {
		shapes[stripLiterals(t, body)] = true
	}
	assert.Len(t, shapes, 1, "one query shape: %v", shapes)
}

// stripLiterals replaces every KQL string literal in a JSON-encoded query
// body with '?', following KQL's backslash escapes.
func stripLiterals(t *testing.T, body string) string {
	t.Helper()
	var req struct {
		Query string `json:"query"`
	}
	require.NoError(t, jsonUnmarshal(body, &req))
	var b strings.Builder
	s := req.Query
	for i := 0; i < len(s); i++ {
		if s[i] != '\'' {
			b.WriteByte(s[i])
			continue
		}
		i++
		for ; i < len(s) && s[i] != '\''; i++ {
			if s[i] == '\\' {
				i++
			}
		}
		b.WriteString("'?'")
	}
	return b.String()
}

// quotaRig is a provider on a fake with the published budgets, on a clock
// the test moves.
type quotaRig struct {
	env
	clock  *testClock
	budget *cloud.Budget
	q      *queries
}

func newQuotaRig(t *testing.T) quotaRig {
	t.Helper()
	clock := newTestClock()
	opts := conformance.Options(&conformance.Clock{})
	opts.Now = clock.Now
	b := armfake.NewBudget(clock.Now)
	c := cloud.New(opts)
	q := &queries{}
	srv := httptest.NewServer(q.wrap(armfake.NewServer(c, armfake.WithBearerToken(testToken), armfake.WithBudget(b), armfake.WithClock(clock.Now))))
	t.Cleanup(srv.Close)
	p, err := azure.New(context.Background(), testConfig(srv.URL), azure.WithCredential(staticToken(testToken)), azure.WithClock(clock.Now))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return quotaRig{env: env{Harness: conformance.Harness{Provider: p, Cloud: c}, ctx: ctx, url: srv.URL}, clock: clock, budget: b, q: q}
}

// TestListStopsAtTheUserQuota: Resource Graph's answers say how many
// queries the caller has left; at 0 List sends nothing until the window
// resets, returning ErrThrottled with the time left, and queries again
// after it.
func TestListStopsAtTheUserQuota(t *testing.T) {
	r := newQuotaRig(t)
	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-a"}
	for i := range 15 {
		_, err := r.Provider.List(r.ctx, sel)
		require.NoError(t, err, "query %d of the window's 15", i+1)
	}
	require.Equal(t, 15, r.q.count())

	_, err := r.Provider.List(r.ctx, sel)
	require.ErrorIs(t, err, provider.ErrThrottled)
	wait, ok := provider.RetryAfter(err)
	require.True(t, ok, "the time until the window resets: %v", err)
	assert.Equal(t, 5*time.Second, wait, "the quota reported 00:00:05 to reset")
	assert.Equal(t, 15, r.q.count(), "no query was sent past the quota")
	assert.Zero(t, r.budget.Throttled(), "the fake never had to refuse one")

	r.clock.Advance(3 * time.Second)
	_, err = r.Provider.List(r.ctx, sel)
	require.ErrorIs(t, err, provider.ErrThrottled)
	wait, _ = provider.RetryAfter(err)
	assert.Equal(t, 2*time.Second, wait)
	assert.Equal(t, 15, r.q.count())

	r.clock.Advance(2 * time.Second)
	_, err = r.Provider.List(r.ctx, sel)
	require.NoError(t, err, "after the reset List queries again")
	assert.Equal(t, 16, r.q.count())
}

// TestListReadsA429AsThrottled: a query Resource Graph refuses for the
// caller's quota (another process of the same identity used it up) is
// ErrThrottled with the Retry-After it sent, and the next List waits for
// the reset the refusal reported.
func TestListReadsA429AsThrottled(t *testing.T) {
	r := newQuotaRig(t)
	user := armfake.GraphUser(testToken)
	tokens, _ := r.budget.Tokens(armfake.ClassGraphUser, user)
	r.budget.Take("drain", cloud.Charge{Class: armfake.ClassGraphUser, Key: user, Tokens: tokens})

	_, err := r.Provider.List(r.ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	require.ErrorIs(t, err, provider.ErrThrottled)
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, http.StatusTooManyRequests, pe.Status)
	assert.Equal(t, "RateLimiting", pe.Code)
	wait, ok := provider.RetryAfter(err)
	require.True(t, ok)
	assert.Equal(t, time.Second, wait, "Retry-After: one query comes back in a third of a second, rounded up")
	assert.EqualValues(t, 1, r.budget.Throttled())
	assert.Equal(t, 1, r.q.count())

	_, err = r.Provider.List(r.ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	require.ErrorIs(t, err, provider.ErrThrottled)
	assert.Equal(t, 1, r.q.count(), "the refusal's quota headers said 0 left: nothing sent before the reset")
	r.clock.Advance(5 * time.Second)
	_, err = r.Provider.List(r.ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	require.NoError(t, err)
}

// TestListLeavesOutADeadVMThatIsGone: the index still shows a failed VM
// that has since been deleted; the read that confirms dead states finds
// nothing, and List leaves it out instead of reporting a dead VM.
func TestListLeavesOutADeadVMThatIsGone(t *testing.T) {
	clock := newTestClock()
	opts := conformance.Options(&conformance.Clock{})
	opts.Now = clock.Now
	h, _ := newHarnessOn(t, opts, staticToken(testToken),
		[]armfake.Option{armfake.WithSearchLag(time.Minute), armfake.WithClock(clock.Now)}, nil)
	ctx := context.Background()
	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-a"}
	var ids []string
	for i := range 2 {
		vm, err := h.Provider.Create(ctx, conformance.Spec(60+i, "node-a"))
		require.NoError(t, err)
		ids = append(ids, vm.ID)
	}
	failed := h.Cloud.Live()[0]
	require.NoError(t, h.Cloud.Fail(failed.ID))
	_, err := h.Provider.Get(ctx, ids[0]) // a request, so the index sees the failure now
	require.NoError(t, err)
	clock.Advance(2 * time.Minute)
	vms, err := h.Provider.List(ctx, sel)
	require.NoError(t, err)
	require.Len(t, vms, 2)
	assert.Equal(t, provider.StateFailed, vms[0].State)

	require.NoError(t, h.Provider.Delete(ctx, ids[0]))
	clock.Advance(10 * time.Second)
	h.Cloud.ResetCounters()
	vms, err = h.Provider.List(ctx, sel)
	require.NoError(t, err)
	require.Len(t, vms, 1, "the deleted VM the index still shows failed is left out")
	assert.Equal(t, ids[1], vms[0].ID)
	assert.Equal(t, int64(1), h.Cloud.Counters()[cloud.OpGet], "one read, for the VM the index called dead")

	clock.Advance(time.Minute)
	vms, err = h.Provider.List(ctx, sel)
	require.NoError(t, err)
	assert.Len(t, vms, 1)
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// testClock is a clock the test moves, from a fixed start.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock {
	return &testClock{now: time.Date(2026, 7, 8, 9, 10, 11, 0, time.UTC)}
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
