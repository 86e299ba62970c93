package azure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"

	"github.com/caa-project/caa/pkg/provider"
)

// Operation names in errors, as the provider interface names them.
const (
	opCreate = "create"
	opGet    = "get"
	opList   = "list"
	opDelete = "delete"
)

// codeKinds maps ARM error codes (lower case; ARM's casing varies) to the
// caller's decision. A code mapped to nil is transient on purpose.
var codeKinds = map[string]error{
	"toomanyrequests": provider.ErrThrottled,

	"authorizationfailed":              provider.ErrAuth,
	"linkedauthorizationfailed":        provider.ErrAuth,
	"authenticationfailed":             provider.ErrAuth,
	"invalidauthenticationtoken":       provider.ErrAuth,
	"invalidauthenticationtokentenant": provider.ErrAuth,
	"expiredauthenticationtoken":       provider.ErrAuth,
	// A subscription the credential cannot see reads as missing.
	"subscriptionnotfound": provider.ErrAuth,

	"quotaexceeded": provider.ErrQuota,

	"allocationfailed":                      provider.ErrCapacity,
	"zonalallocationfailed":                 provider.ErrCapacity,
	"overconstrainedallocationrequest":      provider.ErrCapacity,
	"overconstrainedzonalallocationrequest": provider.ErrCapacity,
	// SkuNotAvailable says the size is restricted in this region or zone
	// "for capacity" right now. Azure lifts such restrictions, and the
	// operator can change the default size, so it is capacity (back off,
	// try again) rather than a spec that can never work; a size that does
	// not exist at all is InvalidParameter on vmSize.
	"skunotavailable": provider.ErrCapacity,

	// Whatever parameter ARM refuses, sending it again cannot work; whose
	// fault it is (the pod's size or image, or the node's configuration)
	// depends on the parameter ARM names: see refusal.
	"invalidparameter": provider.ErrInvalidSpec,
	// BadRequest is how the compute provider refuses a confidential VM
	// its size or image cannot be ("The VM size '...' is not supported for
	// creation of VMs ... with 'ConfidentialVM' security type", an image
	// not marked ConfidentialVMSupported): refusal reads whose it is.
	"badrequest":            provider.ErrInvalidSpec,
	"imagenotfound":         provider.ErrInvalidSpec,
	"platformimagenotfound": provider.ErrInvalidSpec,

	"resourcenotfound": provider.ErrNotFound,
	"notfound":         provider.ErrNotFound,
	// The group holds every VM: its absence is a configuration fault, never
	// evidence that one VM is gone (invariant I3).
	"resourcegroupnotfound": nil,

	"conflict":                 provider.ErrConflict,
	"operationnotallowed":      provider.ErrConflict, // unless it is about quota, see kindOf
	"propertychangenotallowed": provider.ErrConflict,
	"preconditionfailed":       provider.ErrConflict,
	"nicinuse":                 provider.ErrConflict,
}

// kindOf decides the kind of an ARM error from its status, code and
// message: throttling by status whatever the code (compute throttles with
// 429 OperationNotAllowed), then the code, then the status alone.
func kindOf(op string, status int, code, message string) error {
	if status == http.StatusTooManyRequests {
		return provider.ErrThrottled
	}
	lower := strings.ToLower(code)
	kind, known := codeKinds[lower]
	switch {
	case lower == "operationnotallowed" && strings.Contains(strings.ToLower(message), "quota"):
		kind = provider.ErrQuota
	case known:
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		kind = provider.ErrAuth
	case status == http.StatusConflict || status == http.StatusPreconditionFailed:
		kind = provider.ErrConflict
	case status == http.StatusNotFound && code == "":
		kind = provider.ErrNotFound
	}
	if kind == provider.ErrNotFound && op == opCreate {
		// Create's own absence checks happen before classification; any
		// other NotFound there is a reference gone missing, and transient.
		kind = nil
	}
	return kind
}

// classify turns an SDK error into a *provider.Error. Errors that are not
// the cloud's answer (network, context) are returned wrapped, transient.
func classify(op string, err error) error {
	var cred *credentialError
	if errors.As(err, &cred) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return &provider.Error{Kind: provider.ErrAuth, Provider: ProviderName, Op: op, Code: "CredentialUnavailable", Message: cred.Error(), Err: err}
	}
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return fmt.Errorf("%s %s: %w", ProviderName, op, err)
	}
	body := errorBody(re.RawResponse)
	code := re.ErrorCode
	if code == "" {
		code = body.Code
	}
	e := &provider.Error{Provider: ProviderName, Op: op, Code: code, Message: body.Message, Status: re.StatusCode, Err: err}
	if body.Target != "" {
		e.Message += " (target " + body.Target + ")"
	}
	e.Kind = kindOf(op, re.StatusCode, code, body.Message)
	if e.Kind == provider.ErrInvalidSpec || strings.EqualFold(code, "InvalidResourceReference") && op == opCreate {
		e.Refused, e.Kind = refusal(code, body.Target, body.Message)
	}
	if c := strings.ToLower(code); c == "authorizationfailed" || c == "linkedauthorizationfailed" {
		// ARM's message names the action and the scope; say where the
		// actions caa needs are listed.
		e.Message += " (the actions caa needs: " + RoleFile + ")"
	}
	if e.Kind == provider.ErrThrottled && re.RawResponse != nil {
		e.RetryAfter = provider.ParseRetryAfter(re.RawResponse.Header, time.Now())
	}
	return e
}

// refusal splits a refused create by what ARM names: the VM size or the
// image are what a pod may choose (ErrInvalidSpec, with the part refused);
// any other parameter (the NIC's subnet, the OS profile, the network
// profile, tags), or a reference to a resource that is not there, comes
// from the node's configuration (ErrNodeConfig). ARM puts the parameter in
// the error's target (e.g. "vmSize", "imageReference"); without a target
// the message is read for the size or the image.
func refusal(code, target, message string) (string, error) {
	code, target, message = strings.ToLower(code), strings.ToLower(target), strings.ToLower(message)
	switch {
	case code == "imagenotfound" || code == "platformimagenotfound":
		return provider.RefusedImage, provider.ErrInvalidSpec
	case code == "invalidresourcereference":
		return "", provider.ErrNodeConfig
	case strings.Contains(target, "vmsize"):
		return provider.RefusedInstanceType, provider.ErrInvalidSpec
	case strings.Contains(target, "imagereference"):
		return provider.RefusedImage, provider.ErrInvalidSpec
	case target == "" && (strings.Contains(message, "vm size") || strings.Contains(message, "vmsize")):
		return provider.RefusedInstanceType, provider.ErrInvalidSpec
	case target == "" && strings.Contains(message, "image"):
		return provider.RefusedImage, provider.ErrInvalidSpec
	}
	return "", provider.ErrNodeConfig
}

// armError is ARM's error object.
type armError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Target  string `json:"target"`
}

// errorBody reads {"error": {...}} from a response the SDK kept (azcore
// buffers error bodies, so reading it again is safe). A failed
// long-running operation's status body has the same member.
func errorBody(resp *http.Response) armError {
	if resp == nil {
		return armError{}
	}
	raw, err := runtime.Payload(resp)
	if err != nil {
		return armError{}
	}
	var body struct {
		Error armError `json:"error"`
	}
	_ = json.Unmarshal(raw, &body)
	return body.Error
}

// missing reports whether err is ARM's answer for a resource that is not
// there.
func missing(err error) bool {
	var re *azcore.ResponseError
	if !errors.As(err, &re) || re.StatusCode != http.StatusNotFound {
		return false
	}
	code := strings.ToLower(re.ErrorCode)
	if code == "" {
		code = strings.ToLower(errorBody(re.RawResponse).Code)
	}
	return code == "" || code == "resourcenotfound" || code == "notfound"
}

// credential marks the errors of the credential it wraps, so that a
// failure to get a token classifies as ErrAuth. Tokens pass through; they
// are never stored or printed here.
type credential struct {
	azcore.TokenCredential
}

func (c credential) GetToken(ctx context.Context, opts policy.TokenRequestOptions) (azcore.AccessToken, error) {
	tok, err := c.TokenCredential.GetToken(ctx, opts)
	if err != nil {
		return azcore.AccessToken{}, &credentialError{err}
	}
	return tok, nil
}

// credentialError is a failure to get a token.
type credentialError struct{ err error }

func (e *credentialError) Error() string { return "get token: " + e.err.Error() }
func (e *credentialError) Unwrap() error { return e.err }
