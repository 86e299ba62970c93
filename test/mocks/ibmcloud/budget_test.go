package vpcfake_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

func TestBudgetRefusalOnTheWire(t *testing.T) {
	clk := &conformance.Clock{}
	b := vpcfake.NewBudget(clk.Now)
	e := newEnv(t)
	srv := httptest.NewServer(vpcfake.NewServer(e.cloud, vpcfake.WithAPIKey(apiKey), vpcfake.WithBudget(b)))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	status, body := e.iam(map[string][]string{"grant_type": {"urn:ibm:params:oauth:grant-type:apikey"}, "apikey": {apiKey}})
	require.Equal(t, http.StatusOK, status, "%v", body)
	e.token = body["access_token"].(string)

	for i := range 100 {
		status, body, _ := e.call(http.MethodGet, "/v1/instances"+version, nil)
		require.Equal(t, http.StatusOK, status, "read %d is within the 100: %v", i+1, body)
	}
	status, body, h := e.call(http.MethodGet, "/v1/instances"+version, nil)
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.Equal(t, "rate_limit_exceeded", code(body))
	assert.NotEmpty(t, body["trace"])
	assert.Equal(t, "1", h.Get("Retry-After"))

	status, _, _ = e.call(http.MethodDelete, "/v1/instances/0717_000000000001"+version, nil)
	assert.Equal(t, http.StatusNotFound, status, "deletes have a bucket of their own")
	clk.Advance(50 * time.Millisecond)
	status, _, _ = e.call(http.MethodGet, "/v1/instances"+version, nil)
	assert.Equal(t, http.StatusOK, status, "one token back after 1/20 s")
	assert.Equal(t, cloud.ClassCount{Calls: 102, Throttled: 1}, b.Counts()[cloud.OpList])
	assert.Equal(t, int64(1), b.Throttled())
	assert.Equal(t, int64(1), e.cloud.Counters()["throttled"], "the core's counter holds the refusal too")
}

// TestProviderReadsBudgetRefusalAsThrottled drives caa's IBM Cloud
// provider, through the official VPC SDK, into each bucket.
func TestProviderReadsBudgetRefusalAsThrottled(t *testing.T) {
	clk := &conformance.Clock{}
	b := vpcfake.NewBudget(clk.Now)
	c := cloud.New(conformance.Options(&conformance.Clock{}))
	fake := vpcfake.NewServer(c, vpcfake.WithAPIKey(apiKey), vpcfake.WithBudget(b)).(*vpcfake.Server)
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	t.Setenv(ibmcloud.EnvAPIKey, apiKey)
	p, err := ibmcloud.New(context.Background(), ibmcloud.Config{
		Zone: "us-south-1", VPCID: vpcfake.DefaultVPC, SubnetID: vpcfake.DefaultSubnet,
		SecurityGroupIDs: []string{"r006-sg-1"}, ResourceGroupID: vpcfake.DefaultResourceGroup,
		BootVolumeProfile: "general-purpose", Endpoint: srv.URL + "/v1", IAMEndpoint: srv.URL,
		SearchEndpoint: srv.URL,
	})
	require.NoError(t, err)
	ctx := context.Background()
	vm, err := p.Create(ctx, conformance.Spec(1, "node-a"))
	require.NoError(t, err)

	throttled := func(t *testing.T, err error) {
		t.Helper()
		require.ErrorIs(t, err, provider.ErrThrottled)
		d, ok := provider.RetryAfter(err)
		assert.True(t, ok, "the refusal carries Retry-After: %v", err)
		assert.Equal(t, time.Second, d)
		var pe *provider.Error
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, http.StatusTooManyRequests, pe.Status)
		assert.Equal(t, "rate_limit_exceeded", pe.Code)
	}

	b.Drain(vpcfake.ClassRead)
	_, err = p.Get(ctx, vm.ID)
	throttled(t, err)
	_, err = p.List(ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	require.NoError(t, err, "the index shows the VM alive: the listing reads nothing")
	fake.PinIndexStatus(vm.ID, "stopped")
	_, err = p.List(ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	throttled(t, err)
	fake.PinIndexStatus(vm.ID, "")

	clk.Advance(10 * time.Second) // reads refilled, for any lookup a write makes first
	b.Drain(vpcfake.ClassSearch)
	_, err = p.List(ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	throttled(t, err)
	clk.Advance(10 * time.Second)
	b.Drain(vpcfake.ClassCreate)
	_, err = p.Create(ctx, conformance.Spec(2, "node-a"))
	throttled(t, err)
	b.Drain(vpcfake.ClassDelete)
	throttled(t, p.Delete(ctx, vm.ID))

	n := b.Counts()
	// Get's refusal is not retried by the SDK (1). List searches (a bucket
	// of its own) and reads by id only what the index shows dead: with
	// reads drained, that instance read is refused, and tried again after
	// its Retry-After up to 5 times in all (the bucket's clock stands
	// still here, so every try is refused); with searches drained, the
	// search is refused, and nothing is read.
	assert.EqualValues(t, 1+5, n[cloud.OpGet].Throttled)
	assert.Zero(t, n[vpcfake.OpVolumeGet].Calls)
	assert.EqualValues(t, 1, n[cloud.OpList].Throttled, "the search, not retried")
	assert.EqualValues(t, 3, n[cloud.OpList].Calls, "three searches, one per listing; a fresh key's create looks nothing up")
	assert.EqualValues(t, 1, n[cloud.OpCreate].Throttled)
	assert.EqualValues(t, 1, n[cloud.OpDelete].Throttled)
	assert.Len(t, c.Live(), 1, "the refused calls changed nothing")
}
