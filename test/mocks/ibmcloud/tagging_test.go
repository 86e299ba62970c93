package vpcfake_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/conformance"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// TestAttachTagsShowsOnTheInstanceInTheIndex: an instance made through
// the API carries no tags of its own; once Global Tagging attaches them,
// the index finds the instance by them, with its VPC document (status
// among it) under doc, nested as asked.
func TestAttachTagsShowsOnTheInstanceInTheIndex(t *testing.T) {
	e := newSearchEnv(t, &conformance.Clock{})
	id := e.create("vm-a", "caa-node:n1")
	_, in, _ := e.call(http.MethodGet, "/v1/instances/"+id+version, nil)
	crn := str(in, "crn")
	q := `family:is AND type:instance AND tags:"caa-node:n1"`
	search := func() []any {
		status, page, _ := e.call(http.MethodPost, searchPath+"?limit=10",
			map[string]any{"query": q, "fields": []string{"crn", "tags", "doc.status", "doc.boot_volume_attachment.volume.id"}})
		require.Equal(t, http.StatusOK, status, "%v", page)
		return page["items"].([]any)
	}
	assert.Empty(t, search(), "the create tagged only the boot volume")

	status, body, _ := e.call(http.MethodPost, "/v3/tags/attach?tag_type=user",
		map[string]any{"resources": []map[string]string{{"resource_id": crn}}, "tag_names": []string{"CAA-NODE:n1", "caa-cluster:c"}})
	require.Equal(t, http.StatusOK, status, "%v", body)
	results := body["results"].([]any)
	require.Len(t, results, 1)
	assert.Equal(t, false, results[0].(map[string]any)["is_error"])
	assert.EqualValues(t, 1, e.cloud.Counters()[vpcfake.OpTagAttach])

	items := search()
	require.Len(t, items, 1)
	hit := items[0].(map[string]any)
	assert.Equal(t, crn, hit["crn"])
	assert.ElementsMatch(t, []any{"caa-node:n1", "caa-cluster:c"}, hit["tags"], "kept lower case")
	doc := hit["doc"].(map[string]any)
	assert.Len(t, doc, 2, "only the parts asked for")
	assert.Equal(t, "running", doc["status"])
	assert.NotEmpty(t, doc["boot_volume_attachment"].(map[string]any)["volume"].(map[string]any)["id"])
}

func TestAttachTagsRefusesWhatTheServiceRefuses(t *testing.T) {
	e := newSearchEnv(t, &conformance.Clock{})
	id := e.create("vm-a")
	_, in, _ := e.call(http.MethodGet, "/v1/instances/"+id+version, nil)
	crn := str(in, "crn")
	for _, tc := range []struct {
		name, query string
		body        map[string]any
	}{
		{"service tags", "?tag_type=service", map[string]any{"resources": []map[string]string{{"resource_id": crn}}, "tag_names": []string{"a:b"}}},
		{"no resources", "", map[string]any{"tag_names": []string{"a:b"}}},
		{"no tags", "", map[string]any{"resources": []map[string]string{{"resource_id": crn}}}},
		{"a tag with a slash", "", map[string]any{"resources": []map[string]string{{"resource_id": crn}}, "tag_names": []string{"pod:ns/name"}}},
		{"an unknown field", "", map[string]any{"resources": []map[string]string{{"resource_id": crn}}, "tag_names": []string{"a:b"}, "tags": []string{"x"}}},
	} {
		status, body, _ := e.call(http.MethodPost, "/v3/tags/attach"+tc.query, tc.body)
		assert.Equal(t, http.StatusBadRequest, status, "%s: %v", tc.name, body)
	}
	// A resource that does not exist: 200, with is_error for it.
	status, body, _ := e.call(http.MethodPost, "/v3/tags/attach",
		map[string]any{"resources": []map[string]string{{"resource_id": crn + "-gone"}}, "tag_names": []string{"a:b"}})
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, true, body["results"].([]any)[0].(map[string]any)["is_error"])
}
