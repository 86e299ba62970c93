package armfake_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/azure"
	"github.com/caa-project/caa/test/conformance"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

type fixedToken string

func (s fixedToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: string(s), ExpiresOn: time.Now().Add(time.Hour)}, nil
}

func newBudgetFake(t *testing.T) (*fake, *cloud.Budget, *conformance.Clock) {
	t.Helper()
	clk := &conformance.Clock{}
	b := armfake.NewBudget(clk.Now)
	c := cloud.New(cloud.Options{PageSize: 2, Images: []string{image, platform}, Types: []string{size, "Standard_B1s"}})
	srv := httptest.NewServer(armfake.NewServer(c, armfake.WithBearerToken(token), armfake.WithBudget(b)))
	t.Cleanup(srv.Close)
	return &fake{t: t, cloud: c, url: srv.URL}, b, clk
}

func TestBudgetPerVMGetsOnTheWire(t *testing.T) {
	f, b, clk := newBudgetFake(t)
	f.cloud.Create(cloud.CreateRequest{Name: "vm-a", Image: image, InstanceType: size})
	f.cloud.Create(cloud.CreateRequest{Name: "vm-b", Image: image, InstanceType: size})
	for i := range 36 {
		r := f.do(http.MethodGet, vms+"/vm-a", nil)
		require.Equal(t, http.StatusOK, r.status, "GET %d is within vm-a's 36: %s", i+1, r.raw)
		if i == 0 {
			assert.Equal(t, "Microsoft.Compute/GetVMSubscription;23999,Microsoft.Compute/GetVMResource;35",
				r.header.Get("x-ms-ratelimit-remaining-resource"))
		}
	}
	r := f.do(http.MethodGet, vms+"/VM-A", nil)
	assert.Equal(t, http.StatusTooManyRequests, r.status, "the per-VM bucket is by name, case-insensitive")
	assert.Equal(t, "TooManyRequests", r.code())
	assert.Equal(t, "5", r.header.Get("Retry-After"), "12 a minute: one GET every 5s")
	assert.Equal(t, "Microsoft.Compute/GetVMSubscription;23964,Microsoft.Compute/GetVMResource;0",
		r.header.Get("x-ms-ratelimit-remaining-resource"), "the refused call took nothing")
	assert.Equal(t, http.StatusOK, f.do(http.MethodGet, vms+"/vm-b", nil).status, "vm-b has its own bucket")

	clk.Advance(5 * time.Second)
	assert.Equal(t, http.StatusOK, f.do(http.MethodGet, vms+"/vm-a", nil).status)
	assert.Equal(t, cloud.ClassCount{Calls: 39, Throttled: 1}, b.Counts()[cloud.OpGet])
	assert.Equal(t, int64(1), f.cloud.Counters()["throttled"], "the core's counter holds the refusal too")

	// The listing has a bucket of its own.
	r = f.do(http.MethodGet, vms, nil)
	assert.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "Microsoft.Compute/ListVMs;899", r.header.Get("x-ms-ratelimit-remaining-resource"))
}

// TestProviderReadsBudgetRefusalAsThrottled drives caa's Azure provider,
// through the official SDK, into the buckets of the budget.
func TestProviderReadsBudgetRefusalAsThrottled(t *testing.T) {
	f, b, clk := newBudgetFake(t)
	p, err := azure.New(context.Background(), azure.Config{
		SubscriptionID: armfake.DefaultSubscription, ResourceGroup: armfake.DefaultResourceGroup, Location: armfake.DefaultLocation,
		SubnetID: subnet, AdminUsername: "caa",
		SSHPublicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhYS10ZXN0LWtleQ caa@test",
		Endpoint:     f.url, PollInterval: time.Millisecond, RetryDelay: time.Millisecond,
	}, azure.WithCredential(fixedToken(token)))
	require.NoError(t, err)
	ctx := context.Background()
	spec := conformance.Spec(1, "node-a")
	spec.Image, spec.InstanceType = image, size
	vm, err := p.Create(ctx, spec)
	require.NoError(t, err)

	throttledAs := func(t *testing.T, err error, wait time.Duration, code string) {
		t.Helper()
		require.ErrorIs(t, err, provider.ErrThrottled)
		d, ok := provider.RetryAfter(err)
		assert.True(t, ok, "the refusal carries Retry-After: %v", err)
		assert.Equal(t, wait, d)
		var pe *provider.Error
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, http.StatusTooManyRequests, pe.Status)
		assert.True(t, strings.EqualFold(pe.Code, code), "code %q", pe.Code)
	}
	throttled := func(t *testing.T, err error, wait time.Duration) {
		t.Helper()
		throttledAs(t, err, wait, "TooManyRequests")
	}

	// Reads of one VM run into its own bucket of 36.
	for i := 0; ; i++ {
		require.Less(t, i, 40, "the per-VM bucket holds 36")
		if _, err = p.Get(ctx, vm.ID); err != nil {
			break
		}
	}
	throttled(t, err, 5*time.Second)
	gets := b.Counts()[cloud.OpGet]
	assert.EqualValues(t, 1, gets.Throttled, "the SDK does not retry a refusal")

	// List is one Resource Graph query, charged to the caller's bucket.
	clk.Advance(time.Minute)
	user := armfake.GraphUser(token)
	tokens, _ := b.Tokens(armfake.ClassGraphUser, user)
	b.Take("drain", cloud.Charge{Class: armfake.ClassGraphUser, Key: user, Tokens: tokens})
	_, err = p.List(ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	throttledAs(t, err, time.Second, "RateLimiting")

	tokens, _ = b.Tokens(armfake.ClassWrite, "")
	b.Take("drain", cloud.Charge{Class: armfake.ClassWrite, Tokens: tokens})
	throttled(t, p.Delete(ctx, vm.ID), time.Second)
	spec2 := conformance.Spec(2, "node-a")
	spec2.Image, spec2.InstanceType = image, size
	_, err = p.Create(ctx, spec2)
	throttled(t, err, time.Second)
	n := b.Counts()
	assert.EqualValues(t, 1, n[armfake.ClassGraphUser].Throttled)
	assert.EqualValues(t, 1, n[cloud.OpDelete].Throttled)
	assert.EqualValues(t, 1, n[cloud.OpCreate].Throttled)
	assert.Len(t, f.cloud.Live(), 1, "the refused calls changed nothing")
}
