package ec2fake

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// A well-formed, unverified SigV4 header: enough for a server built without
// WithCredentials.
const unverifiedAuth = "AWS4-HMAC-SHA256 Credential=AKIDRAW/20260102/us-east-1/ec2/aws4_request, SignedHeaders=host;x-amz-date, Signature=00"

const (
	goodImage = "ami-0a1b2c3d4e5f60718"
	goodType  = "t3.micro"
)

func newRawServer(t *testing.T, opts cloud.Options) (*cloud.Cloud, string) {
	t.Helper()
	c := cloud.New(CloudOptions(opts))
	srv := httptest.NewServer(NewServer(c))
	t.Cleanup(srv.Close)
	return c, srv.URL
}

type reply struct {
	status int
	header http.Header
	body   string
	doc    errorDoc
}

// post sends form as EC2 Query, with Version and a header-only signature
// unless the form or auth say otherwise.
func post(t *testing.T, base string, form url.Values, auth string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := reply{status: resp.StatusCode, header: resp.Header, body: string(body)}
	if resp.StatusCode != http.StatusOK {
		require.NoError(t, xml.Unmarshal(body, &r.doc), "error body: %s", body)
	}
	return r
}

func form(action string, kv ...string) url.Values {
	v := url.Values{"Action": {action}, "Version": {APIVersion}}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

func runForm(kv ...string) url.Values {
	base := []string{"ImageId", goodImage, "InstanceType", goodType, "MinCount", "1", "MaxCount", "1"}
	return form("RunInstances", append(base, kv...)...)
}

func TestMalformedRequestsGetEC2ValidationErrors(t *testing.T) {
	c, base := newRawServer(t, cloud.Options{})
	noVersion := form("DescribeInstances")
	noVersion.Del("Version")
	noAction := form("")
	noAction.Del("Action")
	noImage := runForm()
	noImage.Del("ImageId")
	noMax := runForm()
	noMax.Del("MaxCount")

	tests := []struct {
		name   string
		form   url.Values
		status int
		code   string
	}{
		{"no action", noAction, 400, "MissingAction"},
		{"unknown action", form("RebootInstances"), 400, "InvalidAction"},
		{"no version", noVersion, 400, "MissingParameter"},
		{"other version", form("DescribeInstances", "Version", "2014-01-01"), 400, "NoSuchVersion"},
		{"unknown parameter", runForm("Colour", "blue"), 400, "UnknownParameter"},
		{"misplaced index", runForm("SecurityGroupId.01", "sg-0a1b2c3d"), 400, "UnknownParameter"},
		{"no image", noImage, 400, "MissingParameter"},
		{"malformed image", runForm("ImageId", "ubuntu"), 400, "InvalidAMIID.Malformed"},
		{"no MaxCount", noMax, 400, "MissingParameter"},
		{"two instances", runForm("MaxCount", "2"), 400, "InvalidParameterValue"},
		{"user data not base64", runForm("UserData", "not base64!"), 400, "InvalidParameterValue"},
		{"user data too large", runForm("UserData", strings.Repeat("QUFB", maxUserData/3+1)), 400, "InvalidParameterValue"},
		{"client token too long", runForm("ClientToken", strings.Repeat("t", 65)), 400, "InvalidParameterValue"},
		{"malformed subnet", runForm("SubnetId", "subnet-XYZ"), 400, "InvalidSubnetID.Malformed"},
		{"malformed group", runForm("SecurityGroupId.1", "default"), 400, "InvalidGroupId.Malformed"},
		{"hop limit zero", runForm("MetadataOptions.HttpPutResponseHopLimit", "0"), 400, "InvalidParameterValue"},
		{"http tokens", runForm("MetadataOptions.HttpTokens", "always"), 400, "InvalidParameterValue"},
		{"tag on a snapshot", runForm("TagSpecification.1.ResourceType", "snapshot"), 400, "InvalidParameterValue"},
		{"tag without resource type", runForm("TagSpecification.1.Tag.1.Key", "a"), 400, "MissingParameter"},
		{"reserved tag key", runForm("TagSpecification.1.ResourceType", "instance", "TagSpecification.1.Tag.1.Key", "aws:x"), 400, "InvalidParameterValue"},
		{"tag value too long", runForm("TagSpecification.1.ResourceType", "instance", "TagSpecification.1.Tag.1.Key", "k",
			"TagSpecification.1.Tag.1.Value", strings.Repeat("v", 257)), 400, "InvalidParameterValue"},
		{"page too small", form("DescribeInstances", "MaxResults", "4"), 400, "InvalidParameterValue"},
		{"page with ids", form("DescribeInstances", "MaxResults", "5", "InstanceId.1", "i-0123456789abcdef0"), 400, "InvalidParameterCombination"},
		{"unknown filter", form("DescribeInstances", "Filter.1.Name", "colour", "Filter.1.Value.1", "blue"), 400, "InvalidParameterValue"},
		{"filter without values", form("DescribeInstances", "Filter.1.Name", "tag:a"), 400, "InvalidParameterValue"},
		{"malformed instance id", form("DescribeInstances", "InstanceId.1", "vm-1"), 400, "InvalidInstanceID.Malformed"},
		{"garbage page token", form("DescribeInstances", "NextToken", "%%%"), 400, "InvalidPaginationToken"},
		{"terminate nothing", form("TerminateInstances"), 400, "MissingParameter"},
		{"terminate malformed", form("TerminateInstances", "InstanceId.1", "i-xyz"), 400, "InvalidInstanceID.Malformed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, base, tc.form, unverifiedAuth)
			assert.Equal(t, tc.status, r.status, r.body)
			assert.Equal(t, tc.code, r.doc.Code, r.body)
			assert.NotEmpty(t, r.doc.Message)
			assert.NotEmpty(t, r.doc.RequestID)
			assert.Equal(t, "text/xml;charset=UTF-8", r.header.Get("Content-Type"))
		})
	}
	assert.Empty(t, c.Instances(), "no bad request launched anything")
	assert.Empty(t, c.Resources(""), "no bad request left a volume")
}

func TestRequestsMustBeSignedPostsOfFormData(t *testing.T) {
	_, base := newRawServer(t, cloud.Options{})
	r := post(t, base, form("DescribeInstances"), "")
	assert.Equal(t, 401, r.status)
	assert.Equal(t, "AuthFailure", r.doc.Code)

	r = post(t, base, form("DescribeInstances"), strings.Replace(unverifiedAuth, "/ec2/", "/s3/", 1))
	assert.Equal(t, "AuthFailure", r.doc.Code, "signed for another service")

	resp, err := http.Get(base + "/?Action=DescribeInstances&Version=" + APIVersion)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 400, resp.StatusCode)

	resp, err = http.Post(base+"/", "application/json", strings.NewReader(`{"Action":"DescribeInstances"}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 400, resp.StatusCode)
}

func TestFaultsBecomeEC2Replies(t *testing.T) {
	c, base := newRawServer(t, cloud.Options{})
	tests := []struct {
		faults     cloud.Faults
		status     int
		code       string
		retryAfter string
	}{
		// EC2 never says when to come back, whatever the fault asks for.
		{cloud.Faults{ThrottleEvery: 1, RetryAfter: 7 * time.Second}, 503, "RequestLimitExceeded", ""},
		{cloud.Faults{ThrottleEvery: 1, RetryAfter: 1200 * time.Millisecond}, 503, "RequestLimitExceeded", ""},
		{cloud.Faults{ThrottleEvery: 1}, 503, "RequestLimitExceeded", ""},
		{cloud.Faults{ServerErrorRate: 1}, 500, "InternalError", ""},
		{cloud.Faults{DenyAuth: true}, 403, "UnauthorizedOperation", ""},
	}
	for i, tc := range tests {
		t.Run(fmt.Sprintf("%d/%s", i, tc.code), func(t *testing.T) {
			c.SetFaults(tc.faults)
			r := post(t, base, runForm(), unverifiedAuth)
			assert.Equal(t, tc.status, r.status)
			assert.Equal(t, tc.code, r.doc.Code)
			assert.Equal(t, tc.retryAfter, r.header.Get("Retry-After"))
		})
	}
	c.SetFaults(cloud.Faults{})
	assert.Empty(t, c.Instances(), "a refused call launched nothing")
	assert.Empty(t, c.Resources(""))
}

func TestEveryRequestIsCountedUnderItsOperation(t *testing.T) {
	c, base := newRawServer(t, cloud.Options{})
	post(t, base, runForm(), unverifiedAuth)
	id := c.Instances()[0].ID
	post(t, base, form("DescribeInstances", "InstanceId.1", id), unverifiedAuth)
	post(t, base, form("DescribeInstances"), unverifiedAuth)
	post(t, base, form("DescribeInstances", "Filter.1.Name", "tag:a", "Filter.1.Value.1", "b"), unverifiedAuth)
	post(t, base, form("TerminateInstances", "InstanceId.1", id), unverifiedAuth)
	post(t, base, form("RebootInstances"), unverifiedAuth)
	post(t, base, form("DescribeInstances"), "") // refused, but counted
	assert.Equal(t, map[string]int64{
		cloud.OpCreate: 1, cloud.OpGet: 1, cloud.OpList: 3, cloud.OpDelete: 1, OpOther: 1,
		"total": 7, "created": 1, "deleted": 1,
	}, c.Counters())
}

func TestControlsAreMounted(t *testing.T) {
	c, base := newRawServer(t, cloud.Options{})
	post(t, base, runForm(), unverifiedAuth)
	resp, err := http.Get(base + cloud.ControlPrefix + "counters")
	require.NoError(t, err)
	defer resp.Body.Close()
	var counters map[string]int64
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&counters))
	assert.Equal(t, c.Counters(), counters)
}

func TestCoreErrorsMapToEC2Codes(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{cloud.ErrNotFound, 400, "InvalidInstanceID.NotFound"},
		{cloud.ErrQuota, 400, "VcpuLimitExceeded"},
		{cloud.ErrCapacity, 500, "InsufficientInstanceCapacity"},
		{cloud.ErrBadImage, 400, "InvalidAMIID.NotFound"},
		{cloud.ErrBadType, 400, "InvalidParameterValue"},
		{cloud.ErrIdempotencyMismatch, 400, "IdempotentParameterMismatch"},
		{cloud.ErrNameConflict, 400, "IncorrectState"},
		{cloud.ErrResourceNotFound, 400, "InvalidVolume.NotFound"},
		{cloud.ErrResourceInUse, 400, "VolumeInUse"},
		{errors.New("something else"), 500, "InternalError"},
	}
	for _, tc := range tests {
		t.Run(tc.code, func(t *testing.T) {
			e := coreError(fmt.Errorf("wrapped: %w", tc.err), "subject")
			assert.Equal(t, tc.status, e.status)
			assert.Equal(t, tc.code, e.code)
			assert.NotEmpty(t, e.message)
		})
	}
}

func TestParseSigV4(t *testing.T) {
	sig, ok := parseSigV4("AWS4-HMAC-SHA256 Credential=AKID/20260102/eu-west-1/ec2/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc")
	require.True(t, ok)
	assert.Equal(t, sigV4{accessKeyID: "AKID", region: "eu-west-1", service: "ec2", signedHeaders: []string{"host", "x-amz-date"}, signature: "abc"}, sig)
	for _, bad := range []string{
		"",
		"Bearer token",
		"AWS4-HMAC-SHA256 Credential=AKID/20260102/eu-west-1/ec2, SignedHeaders=host, Signature=abc",
		"AWS4-HMAC-SHA256 Credential=AKID/20260102/eu-west-1/ec2/aws4_request, Signature=abc",
		"AWS4-HMAC-SHA256 Credential=AKID/20260102/eu-west-1/ec2/aws4_request, SignedHeaders=host",
		"AWS4-HMAC-SHA256 garbage",
	} {
		_, ok := parseSigV4(bad)
		assert.False(t, ok, "%q", bad)
	}
}
