package vpcfake_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

const searchPath = "/v3/resources/search"

// newSearchEnv is newEnv on a clock the test moves, with server options.
func newSearchEnv(t *testing.T, clk *conformance.Clock, opts ...vpcfake.Option) *env {
	t.Helper()
	c := cloud.New(cloud.Options{
		IDPrefix: "0717_", PageSize: 3, Images: []string{image}, Types: []string{profile}, Now: clk.Now,
	})
	srv := httptest.NewServer(vpcfake.NewServer(c, append([]vpcfake.Option{vpcfake.WithAPIKey(apiKey)}, opts...)...))
	t.Cleanup(srv.Close)
	e := &env{t: t, cloud: c, url: srv.URL}
	status, body := e.iam(url.Values{"grant_type": {"urn:ibm:params:oauth:grant-type:apikey"}, "apikey": {apiKey}})
	require.Equal(t, http.StatusOK, status, "%v", body)
	e.token = body["access_token"].(string)
	return e
}

// create makes an instance through the API with these boot volume tags.
func (e *env) create(name string, tags ...string) string {
	e.t.Helper()
	status, body, _ := e.call(http.MethodPost, "/v1/instances"+version, prototype(name, tags...))
	require.Equal(e.t, http.StatusCreated, status, "%v", body)
	return str(body, "id")
}

// crns are the CRNs of a search page's items.
func crns(t *testing.T, body map[string]any) []string {
	t.Helper()
	items, ok := body["items"].([]any)
	require.True(t, ok, "items: %v", body)
	var out []string
	for _, it := range items {
		m := it.(map[string]any)
		out = append(out, m["crn"].(string))
	}
	return out
}

func TestSearchFollowsTheCursor(t *testing.T) {
	e := newSearchEnv(t, &conformance.Clock{})
	for i := range 7 {
		e.create("mine-"+string(rune('a'+i)), "caa-node:n1", "caa-cluster:c")
	}
	e.create("other", "caa-node:n2", "caa-cluster:c")
	e.create("untagged")

	q := `family:is AND type:volume AND tags:"CAA-NODE:N1" AND tags:caa-cluster:c`
	status, body, _ := e.call(http.MethodPost, searchPath+"?limit=1000&account_id=fakeaccount", map[string]any{"query": q, "fields": []string{"crn"}})
	require.Equal(t, http.StatusBadRequest, status, "a bare value holds no ':': %v", body)

	q = `family:is AND type:volume AND tags:"CAA-NODE:N1" AND tags:"caa-cluster:c"`
	var all []string
	var pages []int
	body = map[string]any{"query": q, "fields": []string{"crn"}}
	for range 10 {
		status, page, _ := e.call(http.MethodPost, searchPath+"?limit=3", body)
		require.Equal(t, http.StatusOK, status, "%v", page)
		got := crns(t, page)
		for _, it := range page["items"].([]any) {
			assert.Len(t, it.(map[string]any), 1, "only the fields asked for")
		}
		assert.EqualValues(t, 3, page["limit"])
		all = append(all, got...)
		pages = append(pages, len(got))
		cursor, ok := page["search_cursor"].(string)
		require.True(t, ok, "every answer carries a live cursor, as the real service's do: %v", page)
		if len(got) == 0 {
			break
		}
		// With a cursor, the rest of the body is ignored.
		body = map[string]any{"search_cursor": cursor, "query": "family:nonsense"}
	}
	assert.Equal(t, []int{3, 3, 1, 0}, pages, "pages of the limit, a cursor on each, until an empty one")
	assert.Len(t, all, 7)
	seen := map[string]bool{}
	for _, crn := range all {
		assert.Regexp(t, `^crn:v1:bluemix:public:is:us-south-1:a/fakeaccount::volume:r006-vol-[0-9a-f]+$`, crn)
		assert.False(t, seen[crn], "once each")
		seen[crn] = true
	}

	status, page, _ := e.call(http.MethodPost, searchPath, map[string]any{"query": `type:volume AND tags:"caa-node:n2"`, "fields": []string{"*"}})
	require.Equal(t, http.StatusOK, status)
	require.Len(t, crns(t, page), 1)
	item := page["items"].([]any)[0].(map[string]any)
	assert.Equal(t, "is", item["family"])
	assert.Equal(t, "us-south", item["region"])
	assert.ElementsMatch(t, []any{"caa-cluster:c", "caa-node:n2"}, item["tags"])
}

func TestSearchRefusesWhatItCannotAnswer(t *testing.T) {
	e := newSearchEnv(t, &conformance.Clock{})
	e.create("mine", "caa-node:n1")
	good := `family:is AND type:volume AND tags:"caa-node:n1"`
	status, body, _ := e.call(http.MethodPost, searchPath, map[string]any{"query": good})
	require.Equal(t, http.StatusOK, status, "%v", body)
	require.Len(t, crns(t, body), 1)

	for _, q := range []string{
		`family:is OR type:volume`,
		`NOT family:is`,
		`family:is AND NOT tags:"x"`,
		`(family:is AND type:volume)`,
		`tags:caa-node*`,
		`tags:*`,
		`*`,
		`name:mine`,
		`region:us-south`,
		`family:is AND`,
		`family:is and type:volume`,
		`tags:"caa-node:n1`,
		`tags:"caa-node:n1"x`,
		`tags:"x\`,
		`family:`,
		`family:is AND AND type:volume`,
		``,
	} {
		status, body, _ := e.call(http.MethodPost, searchPath, map[string]any{"query": q})
		assert.Equal(t, http.StatusBadRequest, status, "query %q: %v", q, body)
		assert.Equal(t, "bad_request", code(body), q)
		assert.EqualValues(t, 400, body["status_code"], q)
		assert.NotEmpty(t, body["trace"], q)
	}
	status, body, _ = e.call(http.MethodPost, searchPath, map[string]any{})
	assert.Equal(t, http.StatusBadRequest, status, "no query is '*', which the fake does not serve: %v", body)

	for _, params := range []string{"?limit=0", "?limit=1001", "?limit=ten", "?is_deleted=true", "?is_reclaimed=any", "?sort=name", "?version=2026-01-01"} {
		status, body, _ := e.call(http.MethodPost, searchPath+params, map[string]any{"query": good})
		assert.Equal(t, http.StatusBadRequest, status, "%s: %v", params, body)
		assert.Equal(t, "bad_request", code(body), params)
	}
	status, body, _ = e.call(http.MethodPost, searchPath, map[string]any{"query": good, "filter": "x"})
	assert.Equal(t, http.StatusBadRequest, status, "unknown body field: %v", body)
	status, body, _ = e.call(http.MethodPost, searchPath, map[string]any{"search_cursor": "not-a-cursor"})
	assert.Equal(t, http.StatusBadRequest, status, "%v", body)

	status, body, _ = e.raw(http.MethodPost, searchPath, map[string]any{"query": good}, "")
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Equal(t, "not_authorized", code(body))
	status, _, _ = e.raw(http.MethodPost, searchPath, map[string]any{"query": good}, "Bearer forged")
	assert.Equal(t, http.StatusUnauthorized, status)
}

func TestSearchIndexLagsOnTheCoreClock(t *testing.T) {
	clk := &conformance.Clock{}
	e := newSearchEnv(t, clk, vpcfake.WithSearchLag(30*time.Second))
	q := map[string]any{"query": `family:is AND type:volume AND tags:"caa-node:n1"`}
	found := func() int {
		t.Helper()
		status, body, _ := e.call(http.MethodPost, searchPath, q)
		require.Equal(t, http.StatusOK, status, "%v", body)
		return len(crns(t, body))
	}
	id := e.create("mine", "caa-node:n1")
	assert.Zero(t, found(), "created just now")
	clk.Advance(29 * time.Second)
	assert.Zero(t, found(), "created 29s ago")
	clk.Advance(time.Second)
	assert.Equal(t, 1, found(), "created 30s ago")

	status, _, _ := e.call(http.MethodDelete, "/v1/instances/"+id+version, nil)
	require.Equal(t, http.StatusNoContent, status)
	status, _, _ = e.call(http.MethodGet, "/v1/instances/"+id+version, nil)
	require.Equal(t, http.StatusNotFound, status, "VPC no longer shows it")
	assert.Equal(t, 1, found(), "deleted just now: still in the index")
	clk.Advance(29 * time.Second)
	assert.Equal(t, 1, found())
	clk.Advance(time.Second)
	assert.Zero(t, found(), "deleted 30s ago")

	// A VM killed behind the API's back lags the same way.
	id = e.create("killed", "caa-node:n1")
	clk.Advance(30 * time.Second)
	require.Equal(t, 1, found())
	require.NoError(t, e.cloud.Kill(id))
	assert.Equal(t, 1, found())
	clk.Advance(30 * time.Second)
	assert.Zero(t, found())
}

func TestSearchBudgetAndFaults(t *testing.T) {
	clk := &conformance.Clock{}
	b := vpcfake.NewBudget(clk.Now)
	e := newSearchEnv(t, clk, vpcfake.WithBudget(b))
	q := map[string]any{"query": `family:is AND type:volume AND tags:"caa-node:n1"`}

	b.Drain(vpcfake.ClassSearch)
	status, body, h := e.call(http.MethodPost, searchPath, q)
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.Equal(t, "rate_limit_exceeded", code(body))
	assert.EqualValues(t, 429, body["status_code"])
	assert.Equal(t, "1", h.Get("Retry-After"))
	status, _, _ = e.call(http.MethodGet, "/v1/instances"+version, nil)
	assert.Equal(t, http.StatusOK, status, "VPC reads have a bucket of their own")
	clk.Advance(100 * time.Millisecond)
	status, _, _ = e.call(http.MethodPost, searchPath, q)
	assert.Equal(t, http.StatusOK, status, "a token back after 1/10 s")
	assert.Equal(t, cloud.ClassCount{Calls: 3, Throttled: 1}, b.Counts()[cloud.OpList], "searches and the VPC listing count as listings")
	assert.EqualValues(t, 1, e.cloud.Counters()["throttled"])

	clk.Advance(time.Second)
	b.Drain(vpcfake.ClassRead)
	status, _, _ = e.call(http.MethodPost, searchPath, q)
	assert.Equal(t, http.StatusOK, status, "searches are not VPC reads")

	for _, tc := range []struct {
		faults cloud.Faults
		status int
		code   string
	}{
		{cloud.Faults{ThrottleEvery: 1, RetryAfter: 3 * time.Second}, http.StatusTooManyRequests, "rate_limit_exceeded"},
		{cloud.Faults{ServerErrorRate: 1}, http.StatusInternalServerError, "internal_error"},
		{cloud.Faults{DenyAuth: true}, http.StatusUnauthorized, "not_authorized"},
	} {
		e.cloud.SetFaults(tc.faults)
		status, body, h := e.call(http.MethodPost, searchPath, q)
		assert.Equal(t, tc.status, status, "%+v", tc.faults)
		assert.Equal(t, tc.code, code(body))
		if tc.faults.RetryAfter > 0 {
			assert.Equal(t, "3", h.Get("Retry-After"))
		}
	}
}
