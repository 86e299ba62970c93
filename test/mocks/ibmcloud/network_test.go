package vpcfake_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// TestWorkersReachOnlyTheirSecurityGroup: with a worker group set, an
// instance outside it (the VPC's default group when the request names
// none, or only other groups) is one the workers cannot reach, as on IBM
// Cloud's Kubernetes service; the listing of the VPC's groups pages and
// names each group.
func TestWorkersReachOnlyTheirSecurityGroup(t *testing.T) {
	c := cloud.New(cloud.Options{IDPrefix: "0717_", Images: []string{image}, Types: []string{profile}})
	net := vpcfake.Network{VPC: "r006-vpc-a", Subnets: []string{"0717-subnet-a"},
		SecurityGroups: []string{"r006-sg-a", "r006-kube", "r006-sg-b"}, GroupNames: map[string]string{"r006-kube": "kube-c1"},
		WorkerGroup: "r006-kube"}
	srv := vpcfake.NewServer(c, vpcfake.WithAPIKey(apiKey), vpcfake.WithNetwork(net)).(*vpcfake.Server)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e := &env{t: t, cloud: c, url: hs.URL}
	_, body := e.iam(map[string][]string{"grant_type": {"urn:ibm:params:oauth:grant-type:apikey"}, "apikey": {apiKey}})
	e.token = body["access_token"].(string)

	create := func(name string, groups ...string) string {
		p := prototype(name)
		vni := p["primary_network_attachment"].(map[string]any)["virtual_network_interface"].(map[string]any)
		var refs []any
		for _, g := range groups {
			refs = append(refs, map[string]any{"id": g})
		}
		vni["security_groups"] = refs
		if len(groups) == 0 {
			delete(vni, "security_groups")
		}
		status, body, _ := e.call("POST", "/v1/instances"+version, p)
		require.Equal(t, http.StatusCreated, status, "%v", body)
		return body["id"].(string)
	}
	// The core's instance says so too, which is what the pod VM fleet
	// reads: it boots nothing for an unreachable instance.
	unreachable := func(id string) string {
		in, err := c.Get(id)
		require.NoError(t, err)
		return in.Unreachable
	}
	id := create("vm-default")
	ok, why := srv.Reachable(id)
	assert.False(t, ok)
	assert.Contains(t, why, vpcfake.DefaultSecurityGroup, "no group named: the VPC's default")
	assert.Contains(t, unreachable(id), vpcfake.DefaultSecurityGroup)
	id = create("vm-other", "r006-sg-a")
	ok, _ = srv.Reachable(id)
	assert.False(t, ok)
	assert.NotEmpty(t, unreachable(id))
	id = create("vm-kube", "r006-sg-a", "r006-kube")
	ok, why = srv.Reachable(id)
	assert.True(t, ok, why)
	assert.Empty(t, unreachable(id))

	status, page, _ := e.call("GET", "/v1/security_groups"+version+"&vpc.id=r006-vpc-a&limit=2", nil)
	require.Equal(t, http.StatusOK, status, "%v", page)
	groups := page["security_groups"].([]any)
	require.Len(t, groups, 2)
	assert.Equal(t, "kube-c1", groups[0].(map[string]any)["name"])
	next := str(page, "next", "href")
	require.NotEmpty(t, next)
	status, page, _ = e.call("GET", "/v1/security_groups"+version+"&vpc.id=r006-vpc-a&limit=2&start=r006-sg-b", nil)
	require.Equal(t, http.StatusOK, status)
	assert.Len(t, page["security_groups"].([]any), 1)
	assert.NotContains(t, page, "next")
	_, page, _ = e.call("GET", "/v1/security_groups"+version+"&vpc.id=r006-vpc-other", nil)
	assert.Empty(t, page["security_groups"], "another VPC's groups are not listed")
}
