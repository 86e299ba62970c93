package armfake_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

const graphURL = armfake.GraphPath + "?api-version=" + armfake.GraphAPIVersion

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

func newGraphFake(t *testing.T, opts ...armfake.Option) (*fake, *clock) {
	t.Helper()
	clk := &clock{now: time.Date(2026, 9, 10, 11, 12, 13, 0, time.UTC)}
	c := cloud.New(cloud.Options{PageSize: 2, Images: []string{image}, Types: []string{size}, Now: clk.Now})
	srv := httptest.NewServer(armfake.NewServer(c, append([]armfake.Option{armfake.WithBearerToken(token), armfake.WithClock(clk.Now)}, opts...)...))
	t.Cleanup(srv.Close)
	return &fake{t: t, cloud: c, url: srv.URL}, clk
}

func query(q string, options map[string]any) map[string]any {
	body := map[string]any{"subscriptions": []string{armfake.DefaultSubscription}, "query": q}
	if options != nil {
		body["options"] = options
	}
	return body
}

// seedVM makes a VM on the core with caa's tags for node.
func seedVM(t *testing.T, c *cloud.Cloud, name, node string) cloud.Instance {
	t.Helper()
	in, err := c.Create(cloud.CreateRequest{Name: name, Image: image, InstanceType: size,
		Tags: map[string]string{provider.TagManagedBy: provider.ManagedByValue, provider.TagCluster: "c1", provider.TagNode: node}})
	require.NoError(t, err)
	return in
}

func names(r reply) []string {
	var out []string
	data, _ := r.body["data"].([]any)
	for _, d := range data {
		out = append(out, str(d, "name"))
	}
	sort.Strings(out)
	return out
}

const vmsOfNode = `Resources
| where type =~ 'Microsoft.Compute/virtualMachines'
| where resourceGroup =~ 'CAA-FAKE-RG' and tags['caa-node'] == 'n1'
| extend power = tostring(properties.extended.instanceView.powerState.code), size = tostring(properties.hardwareProfile.vmSize)
| project id, name, tags, power, size`

func TestGraphAnswersTheSubsetWithProjection(t *testing.T) {
	f, _ := newGraphFake(t, armfake.WithGraphPageSize(100))
	seedVM(t, f.cloud, "vm-1", "n1")
	stopped := seedVM(t, f.cloud, "vm-2", "n1")
	seedVM(t, f.cloud, "vm-3", "n2")
	require.NoError(t, f.cloud.Deallocate(stopped.ID))

	r := f.do(http.MethodPost, graphURL, query(vmsOfNode, nil))
	require.Equal(t, http.StatusOK, r.status, r.raw)
	assert.Equal(t, []string{"vm-1", "vm-2"}, names(r))
	assert.EqualValues(t, 2, r.body["totalRecords"])
	assert.EqualValues(t, 2, r.body["count"])
	assert.Equal(t, "false", r.body["resultTruncated"])
	row := r.body["data"].([]any)[1].(map[string]any)
	assert.Len(t, row, 5, "only the projected columns: %v", row)
	assert.Equal(t, "PowerState/deallocated", row["power"])
	assert.Equal(t, size, row["size"])
	assert.Equal(t, "n1", str(row, "tags", provider.TagNode))

	// Another subscription sees nothing of this one.
	other := query(vmsOfNode, nil)
	other["subscriptions"] = []string{"00000000-0000-4000-8000-000000000000"}
	r = f.do(http.MethodPost, graphURL, other)
	require.Equal(t, http.StatusOK, r.status)
	assert.Empty(t, names(r))
}

// TestGraphRefusesWhatItDoesNotParse: anything outside the subset caa sends
// gets Resource Graph's own refusal: 400 BadRequest whose details say
// InvalidQuery and where the parser stopped.
func TestGraphRefusesWhatItDoesNotParse(t *testing.T) {
	f, _ := newGraphFake(t)
	for _, q := range []string{
		`Resources | summarize count() by type`,
		`Resources | where name contains 'vm'`,
		`Resources | where type == 'x' or type == 'y'`,
		`ResourceContainers | project id`,
		`Resources | where tags['a'] == 'unterminated`,
		`Resources | where tags['a'] == 'bad \q escape'`,
		`Resources | project nosuchcolumn`,
		`Resources | extend x = tolower(name)`,
		`Resources | where type == 'x' | take 5`,
		`Resources | where type == 'x';`,
		`Resources | extend node = tostring(tags['caa-node']) | summarize n = count() by node | project node`,
		`Resources | extend node = tostring(tags['caa-node']) | where abs(hash(node) % 0) == 0`,
		`Resources | summarize vms = make_list(nosuchcolumn)`,
	} {
		r := f.do(http.MethodPost, graphURL, query(q, nil))
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", q, r.raw)
		assert.Equal(t, "BadRequest", r.code(), q)
		details, _ := r.body["error"].(map[string]any)["details"].([]any)
		require.Len(t, details, 2, q)
		assert.Equal(t, "InvalidQuery", str(details[0], "code"), q)
		assert.Equal(t, "ParserFailure", str(details[1], "code"), q)
		assert.NotEmpty(t, str(details[1], "message"), q)
		assert.Contains(t, details[1], "line", q)
	}
	r := f.do(http.MethodPost, armfake.GraphPath+"?api-version=2021-03-01", query(`Resources`, nil))
	assert.Equal(t, http.StatusBadRequest, r.status, "an api-version the fake does not serve")
	r = f.do(http.MethodPost, graphURL, map[string]any{"query": "Resources", "managementGroups": []string{"mg"}})
	assert.Equal(t, http.StatusBadRequest, r.status, "management group scopes are not served")
	r = f.do(http.MethodPost, graphURL, query("Resources", map[string]any{"resultFormat": "table"}))
	assert.Equal(t, http.StatusBadRequest, r.status, "the table format is not served")
}

// TestGraphStringLiteralsAreData: quotes and backslashes inside a literal,
// escaped as KQL escapes them, compare as data.
func TestGraphStringLiteralsAreData(t *testing.T) {
	f, _ := newGraphFake(t)
	seedVM(t, f.cloud, "vm-q", `it's "quoted" \ here`)
	seedVM(t, f.cloud, "vm-o", "other")
	for _, q := range []string{
		`Resources | where tags['caa-node'] == 'it\'s "quoted" \\ here' | project name`,
		`Resources | where tags["caa-node"] == "it's \"quoted\" \\ here" | project name`,
	} {
		r := f.do(http.MethodPost, graphURL, query(q, nil))
		require.Equal(t, http.StatusOK, r.status, r.raw)
		assert.Equal(t, []string{"vm-q"}, names(r), q)
	}
}

func TestGraphPagesWithSkipToken(t *testing.T) {
	f, _ := newGraphFake(t)
	for _, n := range []string{"vm-a", "vm-b", "vm-c", "vm-d", "vm-e"} {
		seedVM(t, f.cloud, n, "n1")
	}
	q := `Resources | where tags['caa-node'] == 'n1' | project id, name`
	var got []string
	opts := map[string]any{}
	pages := 0
	for {
		r := f.do(http.MethodPost, graphURL, query(q, opts))
		require.Equal(t, http.StatusOK, r.status, r.raw)
		pages++
		assert.EqualValues(t, 5, r.body["totalRecords"])
		assert.LessOrEqual(t, len(r.body["data"].([]any)), 2, "the core's page size")
		got = append(got, names(r)...)
		tok, _ := r.body["$skipToken"].(string)
		if tok == "" {
			break
		}
		opts = map[string]any{"$skipToken": tok}
	}
	sort.Strings(got)
	assert.Equal(t, []string{"vm-a", "vm-b", "vm-c", "vm-d", "vm-e"}, got)
	assert.Equal(t, 3, pages)
	assert.EqualValues(t, 3, f.cloud.Counters()[cloud.OpList], "each page counts as a listing")

	r := f.do(http.MethodPost, graphURL, query(q, map[string]any{"$top": 1}))
	assert.Len(t, r.body["data"].([]any), 1, "$top asks for fewer")
	tok := r.body["$skipToken"].(string)
	r = f.do(http.MethodPost, graphURL, query(`Resources | project id`, map[string]any{"$skipToken": tok}))
	assert.Equal(t, http.StatusBadRequest, r.status, "a token belongs to its query")
	r = f.do(http.MethodPost, graphURL, query(q, map[string]any{"$skipToken": "bm90LWEtdG9rZW4"}))
	assert.Equal(t, http.StatusBadRequest, r.status, "a token the fake never handed out")
}

// TestGraphQuotaHeadersAndRefusal: every answer says how many queries the
// caller has left in its window and when the window resets; the 16th query
// of a window is refused with 429 and Retry-After. Other callers have
// buckets of their own.
func TestGraphQuotaHeadersAndRefusal(t *testing.T) {
	clk := &clock{now: time.Date(2026, 9, 10, 11, 12, 13, 0, time.UTC)}
	b := armfake.NewBudget(clk.Now)
	c := cloud.New(cloud.Options{PageSize: 2, Now: clk.Now})
	srv := httptest.NewServer(armfake.NewServer(c, armfake.WithBudget(b), armfake.WithClock(clk.Now))) // any bearer token
	t.Cleanup(srv.Close)
	f := &fake{t: t, cloud: c, url: srv.URL}
	q := query(`Resources | project id`, nil)
	for i := range 15 {
		r := f.do(http.MethodPost, graphURL, q)
		require.Equal(t, http.StatusOK, r.status)
		assert.Equal(t, strconv.Itoa(14-i), r.header.Get("x-ms-user-quota-remaining"), "query %d", i+1)
		assert.Regexp(t, `^\d\d:\d\d:\d\d$`, r.header.Get("x-ms-user-quota-resets-after"))
	}
	r := f.do(http.MethodPost, graphURL, q)
	assert.Equal(t, "00:00:05", r.header.Get("x-ms-user-quota-resets-after"))
	require.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Equal(t, "RateLimiting", r.code())
	assert.Equal(t, "0", r.header.Get("x-ms-user-quota-remaining"))
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.EqualValues(t, 1, b.Counts()[armfake.ClassGraphUser].Throttled)
	assert.EqualValues(t, 1, f.cloud.Counters()["throttled"])

	r = f.do(http.MethodPost, graphURL, q, "Authorization", "Bearer another-caller")
	assert.Equal(t, http.StatusOK, r.status, "another caller has a bucket of its own")
	assert.Equal(t, "14", r.header.Get("x-ms-user-quota-remaining"))
	assert.Equal(t, http.StatusOK, f.do(http.MethodGet, vms, nil).status, "the VM listing has its own bucket")

	clk.Advance(5 * time.Second)
	r = f.do(http.MethodPost, graphURL, q)
	assert.Equal(t, http.StatusOK, r.status, "the window reset")
	assert.Equal(t, "14", r.header.Get("x-ms-user-quota-remaining"))
}

func TestGraphQuotaHeadersWithoutABudget(t *testing.T) {
	f, _ := newGraphFake(t)
	for range 20 {
		r := f.do(http.MethodPost, graphURL, query(`Resources | project id`, nil))
		require.Equal(t, http.StatusOK, r.status)
		assert.Equal(t, "15", r.header.Get("x-ms-user-quota-remaining"), "unmetered: a full quota")
		assert.Equal(t, "00:00:00", r.header.Get("x-ms-user-quota-resets-after"))
	}
}

func TestGraphGoesThroughFaultsAndAuth(t *testing.T) {
	f, _ := newGraphFake(t)
	q := query(`Resources | project id`, nil)
	r := f.do(http.MethodPost, graphURL, q, "Authorization", "")
	assert.Equal(t, http.StatusUnauthorized, r.status)
	f.cloud.SetFaults(cloud.Faults{DenyAuth: true})
	r = f.do(http.MethodPost, graphURL, q)
	assert.Equal(t, http.StatusForbidden, r.status)
	assert.Contains(t, r.raw, "Microsoft.ResourceGraph/resources/read")
	assert.Equal(t, "15", r.header.Get("x-ms-user-quota-remaining"), "quota headers on a refusal too")
	f.cloud.SetFaults(cloud.Faults{ThrottleEvery: 1, RetryAfter: 3 * time.Second})
	r = f.do(http.MethodPost, graphURL, q)
	assert.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Equal(t, "3", r.header.Get("Retry-After"))
	assert.Equal(t, "00:00:00", r.header.Get("x-ms-user-quota-resets-after"))
	f.cloud.SetFaults(cloud.Faults{ServerErrorRate: 1})
	assert.Equal(t, http.StatusInternalServerError, f.do(http.MethodPost, graphURL, q).status)
	f.cloud.SetFaults(cloud.Faults{})
	assert.Equal(t, http.StatusOK, f.do(http.MethodPost, graphURL, q).status)
}

// TestGraphIndexLags: with a lag, the index is the core as it was lag ago
// on the fake's clock: a new VM is absent, a deleted one still present with
// its last state, a state change late.
func TestGraphIndexLags(t *testing.T) {
	f, clk := newGraphFake(t, armfake.WithSearchLag(time.Minute))
	q := query(`Resources | where type =~ 'microsoft.compute/virtualmachines' | extend power = tostring(properties.extended.instanceView.powerState.code) | project name, power`, nil)
	look := func() map[string]string {
		r := f.do(http.MethodPost, graphURL, q)
		require.Equal(t, http.StatusOK, r.status, r.raw)
		out := map[string]string{}
		for _, d := range r.body["data"].([]any) {
			out[str(d, "name")] = str(d, "power")
		}
		return out
	}
	a := seedVM(t, f.cloud, "vm-a", "n1")
	assert.Empty(t, look(), "created less than the lag ago: absent")
	clk.Advance(59 * time.Second)
	assert.Empty(t, look())
	clk.Advance(time.Second)
	assert.Equal(t, map[string]string{"vm-a": "PowerState/running"}, look(), "a lag after its creation it shows")

	require.NoError(t, f.cloud.Stop(a.ID))
	look() // the fake sees the change now
	clk.Advance(30 * time.Second)
	assert.Equal(t, map[string]string{"vm-a": "PowerState/running"}, look(), "the stop shows a lag late")
	clk.Advance(30 * time.Second)
	assert.Equal(t, map[string]string{"vm-a": "PowerState/stopped"}, look())

	// A delete through the fake's own route is seen at once.
	assert.Equal(t, http.StatusAccepted, f.do(http.MethodDelete, vms+"/vm-a", nil).status)
	clk.Advance(59 * time.Second)
	assert.Equal(t, map[string]string{"vm-a": "PowerState/stopped"}, look(), "deleted less than the lag ago: still there, as it was")
	clk.Advance(time.Second)
	assert.Empty(t, look(), "a lag after the delete it is gone")
}

// TestGraphSummarizeAnswersOnePage: a summarize is answered as Resource
// Graph answers it, its first page only: the groups that fit, totalRecords
// counting them all, resultTruncated "true" and no $skipToken to follow.
// Grouped rows carry what make_list gathered; count and dcount are
// numbers.
func TestGraphSummarizeAnswersOnePage(t *testing.T) {
	f, _ := newGraphFake(t) // the core's pages hold 2
	for i := range 5 {
		seedVM(t, f.cloud, fmt.Sprintf("vm-%d", i), fmt.Sprintf("n%d", i%3))
	}
	const base = `Resources | where tags['caa-cluster'] == 'c1' | extend node = tostring(tags['caa-node'])`

	r := f.do(http.MethodPost, graphURL, query(base+` | summarize vms = count(), nodes = dcount(node)`, nil))
	require.Equal(t, http.StatusOK, r.status, r.raw)
	data := r.body["data"].([]any)
	require.Len(t, data, 1)
	assert.EqualValues(t, 5, data[0].(map[string]any)["vms"])
	assert.EqualValues(t, 3, data[0].(map[string]any)["nodes"])

	grouped := base + ` | extend vm = pack_array(name, node) | summarize vms = make_list(vm) by node`
	r = f.do(http.MethodPost, graphURL, query(grouped, nil))
	require.Equal(t, http.StatusOK, r.status, r.raw)
	assert.Len(t, r.body["data"].([]any), 2, "one page of the core's size")
	assert.EqualValues(t, 3, r.body["totalRecords"])
	assert.Equal(t, "true", r.body["resultTruncated"])
	assert.NotContains(t, r.body, "$skipToken", "a summarize is not paged")
	for _, d := range r.body["data"].([]any) {
		row := d.(map[string]any)
		for _, vm := range row["vms"].([]any) {
			assert.Equal(t, row["node"], vm.([]any)[1], "each VM in its node's row")
		}
	}

	// Split by a hash of the node: every node in exactly one part.
	seen := map[string]int{}
	for part := range 3 {
		r = f.do(http.MethodPost, graphURL, query(base+fmt.Sprintf(` | where abs(hash(node) %% 3) == %d | summarize vms = make_list(name) by node`, part), nil))
		require.Equal(t, http.StatusOK, r.status, r.raw)
		for _, d := range r.body["data"].([]any) {
			seen[str(d, "node")] += len(d.(map[string]any)["vms"].([]any))
		}
	}
	assert.Equal(t, map[string]int{"n0": 2, "n1": 2, "n2": 1}, seen)
}

// TestGraphTagConditionsBeforeRendering: the fake renders only the
// resources a query's leading conditions on tags can keep; each operator
// must still answer as it does on the rendered documents (a VM without the
// tag, another node's, a value in another case).
func TestGraphTagConditionsBeforeRendering(t *testing.T) {
	f, _ := newGraphFake(t, armfake.WithGraphPageSize(100))
	seedVM(t, f.cloud, "vm-1", "n1")
	seedVM(t, f.cloud, "vm-2", "N1")
	seedVM(t, f.cloud, "vm-3", "n2")
	_, err := f.cloud.Create(cloud.CreateRequest{Name: "vm-untagged", Image: image, InstanceType: size})
	require.NoError(t, err)
	for _, tc := range []struct {
		cond string
		want []string
	}{
		{`tags['caa-node'] == 'n1'`, []string{"vm-1"}},
		{`tags['caa-node'] =~ 'n1'`, []string{"vm-1", "vm-2"}},
		{`tags['caa-node'] != 'n1'`, []string{"vm-2", "vm-3", "vm-untagged"}},
		{`tags['caa-node'] !~ 'n1'`, []string{"vm-3", "vm-untagged"}},
		{`tags['caa-node'] in ('n1', 'n2')`, []string{"vm-1", "vm-3"}},
		{`tags['caa-node'] in~ ('n1')`, []string{"vm-1", "vm-2"}},
	} {
		q := "Resources\n| where type =~ 'Microsoft.Compute/virtualMachines'\n| where " + tc.cond + "\n| project id, name"
		r := f.do(http.MethodPost, graphURL, query(q, nil))
		require.Equal(t, http.StatusOK, r.status, "%s: %s", tc.cond, r.raw)
		assert.Equal(t, tc.want, names(r), tc.cond)
	}
}
