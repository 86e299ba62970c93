package aws

import (
	"errors"
	"fmt"
	"strings"
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

	// What the pod may choose: its image and its instance type.
	"InvalidAMIID.NotFound":  provider.ErrInvalidSpec,
	"InvalidAMIID.Malformed": provider.ErrInvalidSpec,
	// e.g. an instance type EC2 does not know at all; refusedOf reads the
	// message for what was refused.
	"InvalidParameterValue": provider.ErrInvalidSpec,
	// An instance type EC2 knows but does not offer in the subnet's zone,
	// also answered to a dry run ("Your requested instance type (...) is
	// not supported in your requested Availability Zone (...)").
	"Unsupported": provider.ErrInvalidSpec,
	// A combination of launch parameters EC2 refuses, such as AMD SEV-SNP
	// from an AMI that does not boot on UEFI (the AMI must have boot mode
	// uefi or uefi-preferred).
	"InvalidParameterCombination": provider.ErrInvalidSpec,
	// What only the node's configuration names: its subnet and security
	// groups, its extra tags. No pod can fix these; the operator can, and
	// caa retries them with backoff. An image still being prepared
	// (InvalidAMIID.Unavailable: a copy or registration that has not
	// finished) passes by itself.
	"InvalidAMIID.Unavailable":  provider.ErrNodeConfig,
	"TagLimitExceeded":          provider.ErrNodeConfig,
	"InvalidSubnetID.NotFound":  provider.ErrNodeConfig,
	"InvalidSubnetID.Malformed": provider.ErrNodeConfig,
	"InvalidGroup.NotFound":     provider.ErrNodeConfig,
	"InvalidGroupId.Malformed":  provider.ErrNodeConfig,

	// The client token was used by an instance that is terminated now:
	// EC2 remembers tokens for longer than it lists terminated instances,
	// and the token can never launch again.
	"IdempotentInstanceTerminated": provider.ErrKeySpent,

	"InvalidInstanceID.NotFound":  provider.ErrNotFound,
	"InvalidInstanceID.Malformed": provider.ErrNotFound,

	"IdempotentParameterMismatch": provider.ErrConflict,
	"IncorrectState":              provider.ErrConflict,

	"UnauthorizedOperation": provider.ErrAuth,
	"AuthFailure":           provider.ErrAuth,

	// The credential route refused caa's token, so there are no keys for
	// any EC2 call: STS for IRSA's web identity, the EKS Pod Identity
	// agent for container credentials.
	"InvalidIdentityToken":  provider.ErrAuth,
	"ExpiredTokenException": provider.ErrAuth,
	"AccessDenied":          provider.ErrAuth,
	"AccessDeniedException": provider.ErrAuth,
	"IDPRejectedClaim":      provider.ErrAuth,
}

// kindOf is the provider error kind of an EC2 error code; nil is transient.
func kindOf(code string) error { return codeKinds[code] }

// PolicyFile is where the exact permissions caa needs are written down,
// for error messages.
const PolicyFile = "deploy/overlays/aws/iam-policy.json"

// authHint puts the EC2 action in front of an authorization failure's
// message, so that the log line, the event and the readiness reason say
// which permission is missing even when EC2's own message does not (its
// classic form names no action, only an encoded authorization message).
func authHint(operation, code, message string) string {
	switch code {
	case "UnauthorizedOperation":
		return fmt.Sprintf("caa's credentials may not call ec2:%s (every permission caa needs: %s): %s", operation, PolicyFile, message)
	case "AuthFailure":
		return fmt.Sprintf("EC2 did not accept caa's credentials for ec2:%s (unknown, expired or wrongly signed keys: check the credential route, see deploy/overlays/aws/README.md): %s", operation, message)
	case "InvalidIdentityToken", "ExpiredTokenException", "AccessDenied", "AccessDeniedException", "IDPRejectedClaim":
		return fmt.Sprintf("caa got no AWS keys for ec2:%s: its credential route refused its token (IRSA: the role's trust policy, the OIDC provider and the projected token; EKS Pod Identity: the association; see deploy/overlays/aws/README.md): %s", operation, message)
	}
	return message
}

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
	if e.Kind == provider.ErrInvalidSpec {
		e.Refused = refusedOf(e.Code, e.Message)
	}
	var opErr *smithy.OperationError
	if errors.As(err, &opErr) && opErr.OperationName != "" {
		e.Message = authHint(opErr.OperationName, apiErr.ErrorCode(), e.Message)
	}
	var respErr *awshttp.ResponseError
	if errors.As(err, &respErr) && respErr.Response != nil && respErr.Response.Response != nil {
		e.Status = respErr.HTTPStatusCode()
		e.RetryAfter = provider.ParseRetryAfter(respErr.Response.Header, time.Now())
	}
	return e
}

// refusedOf reads what of the spec a refusal names: the image codes name
// the image; Unsupported and InvalidParameterValue name the instance type
// in their message when it is the type EC2 refused.
func refusedOf(code, message string) string {
	lower := strings.ToLower(message)
	switch {
	case strings.HasPrefix(code, "InvalidAMIID."):
		return provider.RefusedImage
	case strings.Contains(lower, "boot mode") || strings.Contains(lower, "uefi"):
		return provider.RefusedImage
	case strings.Contains(lower, "instance type") || strings.Contains(lower, "instancetype"):
		return provider.RefusedInstanceType
	case strings.Contains(lower, "image"):
		return provider.RefusedImage
	}
	return ""
}
