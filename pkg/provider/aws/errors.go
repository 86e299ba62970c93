package aws

import (
	"errors"
	"fmt"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"

	"github.com/caa-project/caa/pkg/provider"
)

// codeNotInResponse is caa's own code for a DescribeInstances by id that
// succeeded without the instance in it.
const codeNotInResponse = "InstanceNotInResponse"

// codeKinds classifies EC2's error codes. A code missing here is transient:
// the SDK may retry it (5xx, network) and the caller retries with backoff.
var codeKinds = map[string]error{
	"RequestLimitExceeded": provider.ErrThrottled,
	"Throttling":           provider.ErrThrottled,
	"ThrottlingException":  provider.ErrThrottled,

	"InsufficientInstanceCapacity": provider.ErrCapacity,
	"InsufficientHostCapacity":     provider.ErrCapacity,

	"InstanceLimitExceeded": provider.ErrQuota,
	"VcpuLimitExceeded":     provider.ErrQuota,

	"InvalidAMIID.NotFound":    provider.ErrInvalidSpec,
	"InvalidAMIID.Malformed":   provider.ErrInvalidSpec,
	"InvalidAMIID.Unavailable": provider.ErrInvalidSpec,
	"InvalidParameterValue":    provider.ErrInvalidSpec, // e.g. an instance type EC2 does not offer
	"TagLimitExceeded":         provider.ErrInvalidSpec,
	// A bad subnet or security group in the configuration fails every
	// launch alike; retrying cannot help until the operator fixes it.
	"InvalidSubnetID.NotFound":  provider.ErrInvalidSpec,
	"InvalidSubnetID.Malformed": provider.ErrInvalidSpec,
	"InvalidGroup.NotFound":     provider.ErrInvalidSpec,
	"InvalidGroupId.Malformed":  provider.ErrInvalidSpec,

	"InvalidInstanceID.NotFound":  provider.ErrNotFound,
	"InvalidInstanceID.Malformed": provider.ErrNotFound,

	"IdempotentParameterMismatch": provider.ErrConflict,
	"IncorrectState":              provider.ErrConflict,

	"UnauthorizedOperation": provider.ErrAuth,
	"AuthFailure":           provider.ErrAuth,
}

// kindOf is the provider error kind of an EC2 error code; nil is transient.
func kindOf(code string) error { return codeKinds[code] }

// classify turns an SDK error into a *provider.Error carrying EC2's code,
// message and HTTP status, and the Retry-After the reply asked for. An
// error with no reply from EC2 behind it (network, cancelled context) is
// wrapped as it is: transient.
func classify(op string, err error) error {
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		return fmt.Errorf("%s %s: %w", Name, op, err)
	}
	e := &provider.Error{
		Kind: kindOf(apiErr.ErrorCode()), Provider: Name, Op: op,
		Code: apiErr.ErrorCode(), Message: apiErr.ErrorMessage(), Err: err,
	}
	var respErr *awshttp.ResponseError
	if errors.As(err, &respErr) && respErr.Response != nil && respErr.Response.Response != nil {
		e.Status = respErr.HTTPStatusCode()
		e.RetryAfter = provider.ParseRetryAfter(respErr.Response.Header, time.Now())
	}
	return e
}
