package vpcfake_test

import (
	"fmt"
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

// newServedEnv is newSearchEnv with the server at hand.
func newServedEnv(t *testing.T, clk *conformance.Clock) (*env, *vpcfake.Server) {
	t.Helper()
	c := cloud.New(cloud.Options{IDPrefix: "0717_", PageSize: 3, Images: []string{image}, Types: []string{profile}, Now: clk.Now})
	srv := vpcfake.NewServer(c, vpcfake.WithAPIKey(apiKey)).(*vpcfake.Server)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e := &env{t: t, cloud: c, url: hs.URL}
	status, body := e.iam(url.Values{"grant_type": {"urn:ibm:params:oauth:grant-type:apikey"}, "apikey": {apiKey}})
	require.Equal(t, http.StatusOK, status, "%v", body)
	e.token = body["access_token"].(string)
	return e, srv
}

// The fake builds its search index again only when something may have
// changed it: the same search asked again sees a change on the core behind
// the API's back, a boot the clock finishes, a status a test pins, a tag
// attached through Global Tagging, each in the very next answer.
func TestRepeatedSearchSeesEveryChange(t *testing.T) {
	clk := &conformance.Clock{}
	e, srv := newServedEnv(t, clk)
	q := map[string]any{"query": `family:is AND type:instance AND tags:"caa-node:n1"`, "fields": []string{"name", "doc.status"}}
	look := func() map[string]string {
		t.Helper()
		status, body, _ := e.call(http.MethodPost, searchPath+"?limit=100", q)
		require.Equal(t, http.StatusOK, status, "%v", body)
		out := map[string]string{}
		for _, it := range body["items"].([]any) {
			m := it.(map[string]any)
			out[m["name"].(string)] = m["doc"].(map[string]any)["status"].(string)
		}
		return out
	}
	seed := func(name string) string {
		in, err := e.cloud.Create(cloud.CreateRequest{Name: name, Image: image, InstanceType: profile, Tags: map[string]string{"caa-node": "n1"}})
		require.NoError(t, err)
		return in.ID
	}
	a, b := seed("vm-a"), seed("vm-b")
	want := map[string]string{"vm-a": "running", "vm-b": "running"}
	assert.Equal(t, want, look())
	assert.Equal(t, want, look(), "nothing changed")

	require.NoError(t, e.cloud.Stop(a))
	want["vm-a"] = "stopped"
	assert.Equal(t, want, look(), "a stop on the core")
	require.NoError(t, e.cloud.Kill(b))
	delete(want, "vm-b")
	assert.Equal(t, want, look(), "a kill on the core")

	e.cloud.SetFaults(cloud.Faults{BootDelay: time.Minute})
	seed("vm-c")
	want["vm-c"] = "pending"
	assert.Equal(t, want, look(), "booting")
	assert.Equal(t, want, look(), "still booting")
	clk.Advance(time.Minute)
	want["vm-c"] = "running"
	assert.Equal(t, want, look(), "the clock finished the boot, with no other change")

	srv.PinIndexStatus(a, "running")
	want["vm-a"] = "running"
	assert.Equal(t, want, look(), "a pinned status")
	srv.PinIndexStatus(a, "")
	want["vm-a"] = "stopped"
	assert.Equal(t, want, look(), "unpinned")

	e.cloud.SetFaults(cloud.Faults{})
	id := e.create("vm-d")
	_, in, _ := e.call(http.MethodGet, "/v1/instances/"+id+version, nil)
	assert.Equal(t, want, look(), "made through the API with no tags on the instance")
	status, body, _ := e.call(http.MethodPost, "/v3/tags/attach?tag_type=user",
		map[string]any{"resources": []map[string]string{{"resource_id": str(in, "crn")}}, "tag_names": []string{"caa-node:n1"}})
	require.Equal(t, http.StatusOK, status, "%v", body)
	want["vm-d"] = "running"
	assert.Equal(t, want, look(), "a tag attached through Global Tagging")
}

// A cursor's next page is cut from an index that shows a change made
// between the pages; and a lagging index still hides a VM made less than
// the lag ago however often it is asked.
func TestSearchPagesAndLagSeeChanges(t *testing.T) {
	clk := &conformance.Clock{}
	e := newSearchEnv(t, clk)
	var ids []string
	for i := range 6 {
		in, err := e.cloud.Create(cloud.CreateRequest{Name: fmt.Sprintf("vm-%d", i), Image: image, InstanceType: profile, Tags: map[string]string{"caa-node": "n1"}})
		require.NoError(t, err)
		ids = append(ids, in.ID)
	}
	q := map[string]any{"query": `family:is AND type:instance AND tags:"caa-node:n1"`, "fields": []string{"name"}}
	names := func(body map[string]any) []string {
		var out []string
		for _, it := range body["items"].([]any) {
			out = append(out, it.(map[string]any)["name"].(string))
		}
		return out
	}
	status, first, _ := e.call(http.MethodPost, searchPath+"?limit=2", q)
	require.Equal(t, http.StatusOK, status, "%v", first)
	assert.Equal(t, []string{"vm-0", "vm-1"}, names(first))
	next := map[string]any{"search_cursor": first["search_cursor"]}
	_, page, _ := e.call(http.MethodPost, searchPath+"?limit=2", next)
	assert.Equal(t, []string{"vm-2", "vm-3"}, names(page), "nothing changed")
	require.NoError(t, e.cloud.Kill(ids[2]))
	_, page, _ = e.call(http.MethodPost, searchPath+"?limit=2", next)
	assert.Equal(t, []string{"vm-3", "vm-4"}, names(page), "the killed VM is gone from the next page")

	lagged := newSearchEnv(t, clk, vpcfake.WithSearchLag(30*time.Second))
	_, err := lagged.cloud.Create(cloud.CreateRequest{Name: "fresh", Image: image, InstanceType: profile, Tags: map[string]string{"caa-node": "n1"}})
	require.NoError(t, err)
	for range 3 {
		_, body, _ := lagged.call(http.MethodPost, searchPath, q)
		assert.Empty(t, names(body), "created less than the lag ago")
	}
	clk.Advance(30 * time.Second)
	_, body, _ := lagged.call(http.MethodPost, searchPath, q)
	assert.Equal(t, []string{"fresh"}, names(body), "a lag after, on the clock alone")
}
