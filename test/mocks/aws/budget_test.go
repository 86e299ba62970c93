package ec2fake_test

import (
	"context"
	"encoding/xml"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	awsprovider "github.com/caa-project/caa/pkg/provider/aws"
	"github.com/caa-project/caa/test/conformance"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// budgetFake starts a fake EC2 with the published budget on a frozen clock.
func budgetFake(t *testing.T) (*cloud.Cloud, *cloud.Budget, *conformance.Clock, string) {
	t.Helper()
	clk := &conformance.Clock{}
	c := cloud.New(ec2fake.CloudOptions(conformance.Options(&conformance.Clock{})))
	b := ec2fake.NewBudget(clk.Now)
	srv := httptest.NewServer(ec2fake.NewServer(c, ec2fake.WithBudget(b)))
	t.Cleanup(srv.Close)
	return c, b, clk, srv.URL
}

func TestBudgetRefusalOnTheWire(t *testing.T) {
	c, b, clk, base := budgetFake(t)
	describe := url.Values{"Action": {"DescribeInstances"}, "Version": {ec2fake.APIVersion}, "Filter.1.Name": {"tag:a"}, "Filter.1.Value.1": {"b"}}
	post := func() (*http.Response, string) {
		req, err := http.NewRequest(http.MethodPost, base, strings.NewReader(describe.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDTEST/20260506/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=00")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(body)
	}
	for i := range 100 {
		resp, body := post()
		require.Equal(t, http.StatusOK, resp.StatusCode, "call %d is within the bucket of 100: %s", i+1, body)
	}
	resp, body := post()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("Retry-After"), "EC2 throttles with no Retry-After")
	var doc struct {
		Code      string `xml:"Errors>Error>Code"`
		Message   string `xml:"Errors>Error>Message"`
		RequestID string `xml:"RequestID"`
	}
	require.NoError(t, xml.Unmarshal([]byte(body), &doc), body)
	assert.Equal(t, "RequestLimitExceeded", doc.Code)
	assert.NotEmpty(t, doc.RequestID)

	clk.Advance(50 * time.Millisecond)
	resp, _ = post()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a token back after 1/20 s")
	assert.Equal(t, cloud.ClassCount{Calls: 102, Throttled: 1}, b.Counts()[cloud.OpList])
	assert.Equal(t, int64(1), b.Throttled())
	assert.Equal(t, int64(1), c.Counters()["throttled"], "the core's counter holds the refusal too")
}

func TestBudgetIsOffByDefault(t *testing.T) {
	c := cloud.New(ec2fake.CloudOptions(cloud.Options{}))
	srv := httptest.NewServer(ec2fake.NewServer(c))
	t.Cleanup(srv.Close)
	form := url.Values{"Action": {"DescribeInstances"}, "Version": {ec2fake.APIVersion}}.Encode()
	for i := range 120 {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(form))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDTEST/20260506/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=00")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "call %d", i+1)
	}
}

// TestProviderReadsBudgetRefusalAsThrottled drives caa's AWS provider,
// through the official SDK, into each bucket of the budget in turn.
func TestProviderReadsBudgetRefusalAsThrottled(t *testing.T) {
	isolate(t)
	_, b, clk, base := budgetFake(t)
	p, err := awsprovider.New(context.Background(), awsprovider.Config{
		Region: "us-east-1", SubnetID: "subnet-0a1b2c3d4e5f60718", SecurityGroupIDs: []string{"sg-0a1b2c3d4e5f60718"},
		Endpoint: base, MaxBackoff: 10 * time.Millisecond,
	})
	require.NoError(t, err)
	ctx := context.Background()
	vm, err := p.Create(ctx, conformance.Spec(1, "node-a"))
	require.NoError(t, err)

	throttled := func(t *testing.T, err error) {
		t.Helper()
		require.ErrorIs(t, err, provider.ErrThrottled)
		_, ok := provider.RetryAfter(err)
		assert.False(t, ok, "EC2 says nothing of when to retry; caa's own backoff decides: %v", err)
		var pe *provider.Error
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "RequestLimitExceeded", pe.Code)
		assert.Equal(t, http.StatusServiceUnavailable, pe.Status)
	}

	b.Drain(ec2fake.ClassDescribe)
	_, err = p.Get(ctx, vm.ID)
	throttled(t, err)
	_, err = p.List(ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	throttled(t, err)

	clk.Advance(10 * time.Second) // DescribeInstances full again: a resumed Create's token lookup passes
	b.Drain(ec2fake.ClassRunInstances)
	_, err = p.Create(ctx, conformance.Spec(2, "node-a"))
	throttled(t, err)
	resumed := conformance.Spec(3, "node-a")
	resumed.MaybeSent = true
	_, err = p.Create(ctx, resumed)
	throttled(t, err)

	b.Drain(ec2fake.ClassTerminate)
	throttled(t, p.Delete(ctx, vm.ID))

	n := b.Counts()
	assert.Equal(t, cloud.ClassCount{Calls: 1, Throttled: 1}, n[cloud.OpGet], "the SDK does not retry a refusal")
	assert.Equal(t, cloud.ClassCount{Calls: 1, Throttled: 1}, n[cloud.OpList])
	assert.Equal(t, cloud.ClassCount{Calls: 1}, n[ec2fake.OpLookup], "only the resumed Create looks its token up first")
	assert.Equal(t, cloud.ClassCount{Calls: 3, Throttled: 2}, n[cloud.OpCreate])
	assert.Equal(t, cloud.ClassCount{Calls: 1, Throttled: 1}, n[cloud.OpDelete])
}

// isolate points the SDK's default credential chain at test keys only.
func isolate(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "AKIABUDGETTEST00001", "AWS_SECRET_ACCESS_KEY": "budget-test-secret",
		"AWS_SESSION_TOKEN": "", "AWS_PROFILE": "", "AWS_EC2_METADATA_DISABLED": "true",
		"AWS_CONFIG_FILE": filepath.Join(dir, "config"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_EC2": "", "AWS_MAX_ATTEMPTS": "", "AWS_RETRY_MODE": "",
		"AWS_ROLE_ARN": "", "AWS_WEB_IDENTITY_TOKEN_FILE": "",
	} {
		t.Setenv(k, v)
	}
}
