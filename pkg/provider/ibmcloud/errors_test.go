package ibmcloud

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

func TestKindOf(t *testing.T) {
	tests := []struct {
		op     string
		status int
		code   string
		iam    bool
		want   error
	}{
		// Throttling, whatever the operation or service.
		{opGet, 429, "rate_limit_exceeded", false, provider.ErrThrottled},
		{opCreate, 429, "", false, provider.ErrThrottled},
		{opList, 400, "too_many_requests", false, provider.ErrThrottled},
		{opCreate, 429, "BXNIM0436E", true, provider.ErrThrottled},
		// Credentials: VPC's 401/403, IAM refusing the key.
		{opList, 401, "not_authorized", false, provider.ErrAuth},
		{opDelete, 403, "forbidden", false, provider.ErrAuth},
		{opCreate, 400, "account_disabled", false, provider.ErrAuth},
		{opGet, 400, "BXNIM0415E", true, provider.ErrAuth},
		{opGet, 401, "BXNIM0407E", true, provider.ErrAuth},
		{opGet, 500, "BXNIM0400E", true, nil},
		// Account limits and capacity.
		{opCreate, 400, "over_quota", false, provider.ErrQuota},
		{opCreate, 403, "over_quota", false, provider.ErrQuota},
		{opCreate, 403, "", false, provider.ErrAuth},
		{opCreate, 400, "instance_quota_exceeded", false, provider.ErrQuota},
		{opCreate, 409, "insufficient_capacity", false, provider.ErrCapacity},
		{opCreate, 400, "instance_profile_not_available", false, provider.ErrCapacity},
		// Clashes with the cloud's state.
		{opCreate, 400, "validation_unique_failed", false, provider.ErrConflict},
		{opCreate, 409, "instance_name_exists", false, provider.ErrConflict},
		{opDelete, 409, "invalid_state", false, provider.ErrConflict},
		{opDelete, 409, "something_new", false, provider.ErrConflict},
		// What the prototype names does not exist or is refused: the pod's
		// image or profile, or else the node's configuration (see
		// TestCreateRefusalsSplitByWhatTheyName).
		{opCreate, 404, "not_found", false, provider.ErrNodeConfig},
		{opCreate, 400, "image_not_found", false, provider.ErrInvalidSpec},
		{opCreate, 400, "instance_profile_not_found", false, provider.ErrInvalidSpec},
		{opCreate, 400, "bad_field", false, provider.ErrNodeConfig},
		{opCreate, 400, "", false, provider.ErrNodeConfig},
		// The instance is gone.
		{opGet, 404, "not_found", false, provider.ErrNotFound},
		{opDelete, 404, "not_found", false, provider.ErrNotFound},
		{opGet, 404, "", false, provider.ErrNotFound},
		// Anything else is transient.
		{opGet, 500, "internal_error", false, nil},
		{opCreate, 503, "backend_service_unavailable", false, nil},
		{opList, 400, "bad_field", false, nil},
		{opGet, 0, "", false, nil},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s %d %s iam=%v", tc.op, tc.status, tc.code, tc.iam), func(t *testing.T) {
			assert.Equal(t, tc.want, kindOf(tc.op, failure{status: tc.status, code: tc.code, iam: tc.iam}))
		})
	}
}

// TestCreateRefusalsSplitByWhatTheyName: VPC answers 400 or 404 to a
// create for several causes; the image and the instance profile are the
// pod's choice (ErrInvalidSpec, saying which), anything else the prototype
// names (subnet, VPC, security groups, the boot volume's profile) is the
// node's configuration (ErrNodeConfig), retried, never a pod's failure.
func TestCreateRefusalsSplitByWhatTheyName(t *testing.T) {
	for _, tc := range []struct {
		status                int
		code, message, target string
		kind                  error
		refused               string
	}{
		{404, "not_found", "Image not found", "image.id", provider.ErrInvalidSpec, provider.RefusedImage},
		{404, "not_found", "Instance profile not found", "profile.name", provider.ErrInvalidSpec, provider.RefusedInstanceType},
		{404, "not_found", "Subnet not found", "primary_network_attachment.virtual_network_interface.subnet.id", provider.ErrNodeConfig, ""},
		{404, "not_found", "Security group not found", "primary_network_interface.security_groups[0].id", provider.ErrNodeConfig, ""},
		{400, "bad_field", "The profile is not valid.", "boot_volume_attachment.volume.profile.name", provider.ErrNodeConfig, ""},
		{404, "not_found", "Image not found", "", provider.ErrInvalidSpec, provider.RefusedImage},
		{404, "not_found", "Subnet not found", "", provider.ErrNodeConfig, ""},
	} {
		t.Run(tc.message+" "+tc.target, func(t *testing.T) {
			f := failure{status: tc.status, code: tc.code, message: tc.message, target: tc.target}
			assert.Equal(t, tc.kind, kindOf(opCreate, f))
			if tc.kind == provider.ErrInvalidSpec {
				assert.Equal(t, tc.refused, refused(f))
			}
		})
	}
}

func TestReadFailure(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	vpcBody := map[string]any{"errors": []any{map[string]any{"code": "not_found", "message": "Instance not found"}}, "trace": "t"}
	iamBody := map[string]any{"errorCode": "BXNIM0415E", "errorMessage": "Provided API key could not be found."}
	tests := []struct {
		name string
		resp *core.DetailedResponse
		want failure
	}{
		{"no answer", nil, failure{}},
		{"vpc", &core.DetailedResponse{StatusCode: 404, Result: vpcBody}, failure{status: 404, code: "not_found", message: "Instance not found"}},
		{"iam", &core.DetailedResponse{StatusCode: 400, Result: iamBody},
			failure{status: 400, code: "BXNIM0415E", message: "Provided API key could not be found.", iam: true}},
		{"no body", &core.DetailedResponse{StatusCode: 502}, failure{status: 502, message: "Bad Gateway"}},
		{"empty errors", &core.DetailedResponse{StatusCode: 500, Result: map[string]any{"errors": []any{}}}, failure{status: 500, message: "Internal Server Error"}},
		{"retry after seconds", &core.DetailedResponse{StatusCode: 429, Headers: http.Header{"Retry-After": {"7"}}},
			failure{status: 429, message: "Too Many Requests", retryAfter: 7 * time.Second}},
		{"retry after date", &core.DetailedResponse{StatusCode: 429, Headers: http.Header{"Retry-After": {now.Add(90 * time.Second).Format(http.TimeFormat)}}},
			failure{status: 429, message: "Too Many Requests", retryAfter: 90 * time.Second}},
		{"retry after garbage", &core.DetailedResponse{StatusCode: 429, Headers: http.Header{"Retry-After": {"soon"}}},
			failure{status: 429, message: "Too Many Requests"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, readFailure(tc.resp, now))
		})
	}
}

func TestClassify(t *testing.T) {
	assert.NoError(t, classify(opGet, nil, nil))

	sdkErr := errors.New("sdk says no")
	resp := &core.DetailedResponse{StatusCode: 429, Headers: http.Header{"Retry-After": {"3"}},
		Result: map[string]any{"errors": []any{map[string]any{"code": "rate_limit_exceeded", "message": "Too many requests"}}}}
	err := classify(opCreate, resp, sdkErr)
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, provider.Error{Kind: provider.ErrThrottled, Provider: "ibmcloud", Op: opCreate, Code: "rate_limit_exceeded",
		Message: "Too many requests", Status: 429, RetryAfter: 3 * time.Second, Err: sdkErr}, *pe)
	assert.ErrorIs(t, err, sdkErr)
	d, ok := provider.RetryAfter(err)
	assert.True(t, ok)
	assert.Equal(t, 3*time.Second, d)

	// A Retry-After on anything but throttling is not passed on.
	resp = &core.DetailedResponse{StatusCode: 503, Headers: http.Header{"Retry-After": {"3"}}}
	require.ErrorAs(t, classify(opGet, resp, sdkErr), &pe)
	assert.Zero(t, pe.RetryAfter)
	assert.Equal(t, "503", pe.Code, "the status stands in for a missing code")
	assert.Nil(t, pe.Kind)

	netErr := &url.Error{Op: "Get", URL: "https://us-south.iaas.cloud.ibm.com/v1/instances", Err: errors.New("connection refused")}
	require.ErrorAs(t, classify(opList, nil, netErr), &pe)
	assert.Equal(t, "request_failed", pe.Code)
	assert.Contains(t, pe.Message, "connection refused")
	assert.Nil(t, pe.Kind, "no answer is transient")
	assert.Zero(t, pe.Status)
}

func TestRetry(t *testing.T) {
	answer := func(status int) *core.DetailedResponse { return &core.DetailedResponse{StatusCode: status} }
	netErr := &url.Error{Op: "Get", URL: "https://x", Err: errors.New("reset")}
	tests := []struct {
		name  string
		resp  *core.DetailedResponse
		err   error
		calls int
	}{
		{"server error is retried, three attempts in all", answer(500), errors.New("5xx"), maxAttempts},
		{"unavailable too", answer(503), errors.New("5xx"), maxAttempts},
		{"not implemented is not", answer(501), errors.New("501"), 1},
		{"no answer is retried", nil, netErr, maxAttempts},
		{"an SDK error without an answer is not", nil, errors.New("bad options"), 1},
		{"throttling is never retried", answer(429), errors.New("429"), 1},
		{"not found is not retried", answer(404), errors.New("404"), 1},
		{"success", answer(200), nil, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			_, resp, err := retry(context.Background(), func() (int, *core.DetailedResponse, error) {
				calls++
				return 0, tc.resp, tc.err
			})
			assert.Equal(t, tc.calls, calls)
			assert.Equal(t, tc.resp, resp)
			assert.Equal(t, tc.err, err)
		})
	}

	calls := 0
	v, _, err := retry(context.Background(), func() (string, *core.DetailedResponse, error) {
		calls++
		if calls < 2 {
			return "", answer(502), errors.New("5xx")
		}
		return "ok", answer(200), nil
	})
	require.NoError(t, err)
	assert.Equal(t, "ok", v)
	assert.Equal(t, 2, calls, "a transient failure then success")

	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	_, _, err = retry(ctx, func() (int, *core.DetailedResponse, error) {
		calls++
		cancel()
		return 0, answer(500), errors.New("5xx")
	})
	assert.Error(t, err)
	assert.Equal(t, 1, calls, "a cancelled context stops the retries")
}
