package aws

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

func TestErrorCodesMapToKinds(t *testing.T) {
	tests := []struct {
		code   string
		status int
		kind   error // nil: transient
	}{
		{"RequestLimitExceeded", 503, provider.ErrThrottled},
		{"Throttling", 400, provider.ErrThrottled},
		{"ThrottlingException", 400, provider.ErrThrottled},
		{"InsufficientInstanceCapacity", 500, provider.ErrCapacity},
		{"InsufficientHostCapacity", 500, provider.ErrCapacity},
		{"InstanceLimitExceeded", 400, provider.ErrQuota},
		{"VcpuLimitExceeded", 400, provider.ErrQuota},
		{"InvalidAMIID.NotFound", 400, provider.ErrInvalidSpec},
		{"InvalidAMIID.Malformed", 400, provider.ErrInvalidSpec},
		{"InvalidAMIID.Unavailable", 400, provider.ErrNodeConfig},
		{"InvalidParameterValue", 400, provider.ErrInvalidSpec},
		{"Unsupported", 400, provider.ErrInvalidSpec},
		{"TagLimitExceeded", 400, provider.ErrNodeConfig},
		{"InvalidSubnetID.NotFound", 400, provider.ErrNodeConfig},
		{"InvalidSubnetID.Malformed", 400, provider.ErrNodeConfig},
		{"InvalidGroup.NotFound", 400, provider.ErrNodeConfig},
		{"InvalidGroupId.Malformed", 400, provider.ErrNodeConfig},
		{"IdempotentInstanceTerminated", 400, provider.ErrKeySpent},
		{"InvalidInstanceID.NotFound", 400, provider.ErrNotFound},
		{"InvalidInstanceID.Malformed", 400, provider.ErrNotFound},
		{"IdempotentParameterMismatch", 400, provider.ErrConflict},
		{"IncorrectState", 400, provider.ErrConflict},
		{"UnauthorizedOperation", 403, provider.ErrAuth},
		{"AuthFailure", 401, provider.ErrAuth},
		{"InternalError", 500, nil},
		{"Unavailable", 503, nil},
		{"MissingParameter", 400, nil},
		{"SomethingNew", 400, nil},
	}
	kinds := []error{provider.ErrNotFound, provider.ErrThrottled, provider.ErrQuota, provider.ErrCapacity,
		provider.ErrInvalidSpec, provider.ErrAuth, provider.ErrConflict, provider.ErrNodeConfig, provider.ErrKeySpent}
	for _, tc := range tests {
		t.Run(tc.code, func(t *testing.T) {
			sdkErr := sdkError(tc.code, tc.status, http.Header{})
			err := classify(opGet, sdkErr)
			var pe *provider.Error
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, &provider.Error{
				Kind: tc.kind, Provider: "aws", Op: "get", Code: tc.code, Message: authHint("Op", tc.code, "message for "+tc.code),
				Status: tc.status, Err: sdkErr, Refused: pe.Refused,
			}, pe)
			for _, k := range kinds {
				assert.Equal(t, k == tc.kind, errors.Is(err, k), "kind %v", k)
			}
			var apiErr smithy.APIError
			assert.ErrorAs(t, err, &apiErr, "the SDK error stays reachable")

			// The retryer leaves every classified code to the caller.
			want := awssdk.UnknownTernary
			if tc.kind != nil {
				want = awssdk.FalseTernary
			}
			assert.Equal(t, want, vetoClassified(sdkErr))
		})
	}
}

func TestErrorsWithoutAReplyAreTransientAndWrapped(t *testing.T) {
	netErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	err := classify(opList, &smithy.OperationError{ServiceID: "EC2", OperationName: "DescribeInstances", Err: netErr})
	var pe *provider.Error
	assert.False(t, errors.As(err, &pe), "no cloud reply, no cloud code")
	assert.ErrorIs(t, err, netErr)
	assert.Contains(t, err.Error(), "aws list")
	assert.False(t, provider.Terminal(err))

	err = classify(opGet, &smithy.OperationError{ServiceID: "EC2", OperationName: "DescribeInstances", Err: context.Canceled})
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, awssdk.UnknownTernary, vetoClassified(netErr), "the SDK decides on network errors")
}

func TestRetryAfterReachesTheError(t *testing.T) {
	err := classify(opCreate, sdkError("RequestLimitExceeded", 503, http.Header{"Retry-After": {"7"}}))
	d, ok := provider.RetryAfter(err)
	assert.True(t, ok)
	assert.Equal(t, 7*time.Second, d)
	assert.Contains(t, err.Error(), "retry after 7s")
}

func TestRetryerRetriesOnlyTransientErrors(t *testing.T) {
	r := newRetryer(3, time.Second)
	assert.Equal(t, 3, r.MaxAttempts())
	assert.True(t, r.IsErrorRetryable(sdkError("InternalError", 500, nil)))
	assert.True(t, r.IsErrorRetryable(sdkError("Unavailable", 503, nil)))
	assert.False(t, r.IsErrorRetryable(sdkError("RequestLimitExceeded", 503, nil)), "throttling is the caller's")
	assert.False(t, r.IsErrorRetryable(sdkError("Throttling", 400, nil)))
	assert.False(t, r.IsErrorRetryable(sdkError("InsufficientInstanceCapacity", 500, nil)), "a 500 with a kind is the caller's")
	assert.False(t, r.IsErrorRetryable(sdkError("InvalidParameterValue", 400, nil)))
	for attempt := 1; attempt <= 5; attempt++ {
		d, err := r.RetryDelay(attempt, sdkError("InternalError", 500, nil))
		require.NoError(t, err)
		assert.LessOrEqual(t, d, time.Second, "backoff is capped")
	}
}

// TestAuthFailuresNameTheAction: a refusal says which EC2 action the
// credentials may not call and where the permissions are written down,
// even when EC2's message names no action; other messages are left alone.
func TestAuthFailuresNameTheAction(t *testing.T) {
	err := classify(opDelete, &smithy.OperationError{ServiceID: "EC2", OperationName: "TerminateInstances",
		Err: &smithy.GenericAPIError{Code: "UnauthorizedOperation", Message: "You are not authorized to perform this operation. Encoded authorization failure message: abc"}})
	assert.ErrorIs(t, err, provider.ErrAuth)
	assert.Contains(t, err.Error(), "ec2:TerminateInstances")
	assert.Contains(t, err.Error(), PolicyFile)
	assert.Contains(t, err.Error(), "Encoded authorization failure message: abc", "EC2's message stays whole")

	err = classify(opGet, &smithy.OperationError{ServiceID: "EC2", OperationName: "DescribeInstances",
		Err: &smithy.GenericAPIError{Code: "AuthFailure", Message: "AWS was not able to validate the provided access credentials."}})
	assert.Contains(t, err.Error(), "ec2:DescribeInstances")

	err = classify(opGet, &smithy.OperationError{ServiceID: "EC2", OperationName: "DescribeInstances",
		Err: &smithy.GenericAPIError{Code: "InternalError", Message: "boom"}})
	assert.NotContains(t, err.Error(), "ec2:DescribeInstances")
}
