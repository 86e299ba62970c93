package ibmcloud

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/caa-project/caa/pkg/provider"
)

func TestSearchQuery(t *testing.T) {
	assert.Equal(t,
		`family:is AND tags:"caa-managed-by:caa" AND tags:"caa-cluster:c-1" AND tags:"caa-node:node-a"`,
		searchQuery(provider.Selector{Cluster: "c-1", Node: "node-a"}))
	// Whatever a node is called, its tag is escaped to [a-z0-9_.:-] before
	// it is quoted: the query keeps its four terms.
	assert.Equal(t,
		`family:is AND tags:"caa-managed-by:caa" AND tags:"caa-cluster:c" AND tags:"caa-node:x_22_20_4f_52_20tags_3a_2a_5c"`,
		searchQuery(provider.Selector{Cluster: "c", Node: `x" OR tags:*\`}))
	// The cluster's listing: no node term.
	assert.Equal(t,
		`family:is AND tags:"caa-managed-by:caa" AND tags:"caa-cluster:c-1"`,
		searchQuery(provider.Selector{Cluster: "c-1"}))
}

func TestQuoteTerm(t *testing.T) {
	assert.Equal(t, `"plain"`, quoteTerm("plain"))
	assert.Equal(t, `"a\"b\\c"`, quoteTerm(`a"b\c`))
	assert.Equal(t, `""`, quoteTerm(""))
}

func TestVolumeIDOfCRN(t *testing.T) {
	for crn, want := range map[string]string{
		"crn:v1:bluemix:public:is:us-south-1:a/acct::volume:r006-1234": "r006-1234",
		"crn:v1:bluemix:public:is:us-south-1:a/acct::instance:0717_1":  "",
		"crn:v1:bluemix:public:cloudantnosqldb:us-south:a/acct:x::":    "",
		"not a crn": "",
	} {
		assert.Equal(t, want, volumeIDOfCRN(crn), crn)
	}
}

func TestTaggingEndpointBesideTheSearchOne(t *testing.T) {
	for search, want := range map[string]string{
		"": "https://tags.global-search-tagging.cloud.ibm.com",
		"https://api.private.global-search-tagging.cloud.ibm.com": "https://tags.private.global-search-tagging.cloud.ibm.com",
		"http://127.0.0.1:8080":                                   "http://127.0.0.1:8080",
	} {
		assert.Equal(t, want, Config{SearchEndpoint: search}.taggingEndpoint(), search)
	}
	assert.Equal(t, "https://tags.example", Config{SearchEndpoint: "http://127.0.0.1:8080", TaggingEndpoint: "https://tags.example"}.taggingEndpoint())
}
