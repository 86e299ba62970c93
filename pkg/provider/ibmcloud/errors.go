package ibmcloud

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"

	"github.com/caa-project/caa/pkg/provider"
)

// Provider operations, as they appear in errors.
const (
	opCreate = "create"
	opGet    = "get"
	opList   = "list"
	opDelete = "delete"
)

// The retry policy for transient failures (5xx but 501, and requests that
// got no answer): three attempts in all, waiting about 100ms then 200ms.
// Throttling is never retried here: it goes back to the caller at once as
// ErrThrottled with the cloud's Retry-After, for the reconciler's token
// bucket and backoff. The SDK's own retryer (EnableRetries) stays off,
// since it would retry 429 too.
const (
	maxAttempts = 3
	baseBackoff = 100 * time.Millisecond
)

// Error codes by kind, from the VPC API's documented error messages and,
// where the documentation is silent (capacity), the codes the VPC API is
// known to use in instance status reasons. Codes are matched before
// statuses because VPC reuses 400 and 404 for several meanings.
var (
	throttleCodes = set("rate_limit_exceeded", "too_many_requests")
	authCodes     = set("not_authorized", "unauthorized", "forbidden", "account_disabled", "account_missing")
	conflictCodes = set("validation_unique_failed", "instance_name_exists", "duplicate_error", "conflict", "invalid_state",
		"instance_delete_conflict")
	quotaCodes    = set("over_quota", "quota_exceeded", "instance_quota_exceeded", "instance_sec_volume_over_quota")
	capacityCodes = set("insufficient_capacity", "cannot_start_capacity", "instance_profile_not_available",
		"cannot_start_reservation_capacity")
	specCodes = set("image_not_found", "instance_profile_not_found", "profile_not_found", "image_not_available",
		"validation_required_field", "bad_field", "invalid_request_field", "instance_invalid_hostname")
)

func set(codes ...string) map[string]bool {
	m := make(map[string]bool, len(codes))
	for _, c := range codes {
		m[c] = true
	}
	return m
}

// failure is what the cloud said about a failed call.
type failure struct {
	status     int
	code       string
	message    string
	retryAfter time.Duration
	// target names the field or parameter the error is about, when VPC
	// said (errors[0].target.name, e.g. "image.id", "profile.name").
	target string
	// iam marks an answer from the IAM token service rather than VPC.
	iam bool
}

// readFailure reads status, code, message and Retry-After from the
// response the SDK returned with its error; resp is nil when no answer came.
func readFailure(resp *core.DetailedResponse, now time.Time) failure {
	if resp == nil {
		return failure{}
	}
	f := failure{status: resp.StatusCode, retryAfter: provider.ParseRetryAfter(resp.Headers, now)}
	body, _ := resp.Result.(map[string]any)
	if errs, ok := body["errors"].([]any); ok && len(errs) > 0 {
		first, _ := errs[0].(map[string]any)
		f.code, _ = first["code"].(string)
		f.message, _ = first["message"].(string)
		if t, ok := first["target"].(map[string]any); ok {
			f.target, _ = t["name"].(string)
		}
	} else if code, ok := body["errorCode"].(string); ok {
		f.iam = true
		f.code = code
		f.message, _ = body["errorMessage"].(string)
	}
	if f.message == "" {
		f.message = http.StatusText(f.status)
	}
	return f
}

// kindOf decides the caller's kind of error for a failure of op; nil is
// transient.
func kindOf(op string, f failure) error {
	switch {
	case f.status == 0:
		return nil
	case f.status == http.StatusTooManyRequests || throttleCodes[f.code]:
		return provider.ErrThrottled
	case f.iam:
		// The token service refuses a bad or unknown API key with 400.
		if f.status == http.StatusBadRequest || f.status == http.StatusUnauthorized || f.status == http.StatusForbidden {
			return provider.ErrAuth
		}
		return nil
	case authCodes[f.code]:
		return provider.ErrAuth
	case quotaCodes[f.code]:
		return provider.ErrQuota
	case capacityCodes[f.code]:
		return provider.ErrCapacity
	case conflictCodes[f.code]:
		return provider.ErrConflict
	case f.status == http.StatusUnauthorized || f.status == http.StatusForbidden:
		return provider.ErrAuth
	case op == opCreate && (specCodes[f.code] || f.status == http.StatusBadRequest || f.status == http.StatusNotFound):
		// On create, "not_found" names the image, profile or subnet the
		// prototype refers to, and a 400 is a prototype VPC refused: the
		// pod's spec when it names the image or the profile, the node's
		// configuration otherwise (see refused).
		if refused(f) == "" {
			return provider.ErrNodeConfig
		}
		return provider.ErrInvalidSpec
	case f.status == http.StatusNotFound || f.code == "not_found":
		return provider.ErrNotFound
	case f.status == http.StatusConflict:
		return provider.ErrConflict
	}
	return nil
}

// refused says what of the spec a refused create names: the image or the
// profile (what a pod may choose), from the error's target, else its code,
// else its message; "" when it names neither (the subnet, the VPC, the
// security groups, the resource group, the keys: the node's configuration).
func refused(f failure) string {
	if f.target != "" {
		return refusedIn(f.target)
	}
	if r := refusedIn(f.code); r != "" {
		return r
	}
	return refusedIn(f.message)
}

// refusedIn reads a target, code or message for the image or the
// instance profile (not the boot volume's profile, nor a trusted profile).
func refusedIn(s string) string {
	s = strings.ToLower(s)
	switch {
	case strings.Contains(s, "image"):
		return provider.RefusedImage
	case strings.Contains(s, "profile") && !strings.Contains(s, "volume") && !strings.Contains(s, "trusted"):
		return provider.RefusedInstanceType
	}
	return ""
}

// responseOf is the cloud's reply that err carries, if any: the SDK keeps
// it in the HTTPProblem of its error chain (the pagers return no response
// of their own).
func responseOf(err error) *core.DetailedResponse {
	var hp *core.HTTPProblem
	if errors.As(err, &hp) {
		return hp.Response
	}
	return nil
}

// classify turns an SDK error into a *provider.Error. It never reads the
// request, so user data and credentials cannot reach the error. resp is the
// reply the call returned, or nil to look for one in err.
func classify(op string, resp *core.DetailedResponse, err error) error {
	if err == nil {
		return nil
	}
	if resp == nil {
		resp = responseOf(err)
	}
	f := readFailure(resp, time.Now())
	e := &provider.Error{
		Kind: kindOf(op, f), Provider: providerName, Op: op, Code: f.code, Message: f.message,
		Status: f.status, Err: err,
	}
	if e.Kind == provider.ErrInvalidSpec {
		e.Refused = refused(f)
	}
	if f.target != "" && (e.Kind == provider.ErrInvalidSpec || e.Kind == provider.ErrNodeConfig) {
		e.Message += " (target " + f.target + ")"
	}
	if e.Kind == provider.ErrThrottled {
		e.RetryAfter = f.retryAfter
	}
	if e.Kind == provider.ErrAuth && f.status == http.StatusForbidden && !f.iam {
		// VPC's message names the action it refused, or not: say where
		// the permissions caa needs are written down.
		e.Message += " (the IAM access policies caa needs: " + policyFile + ")"
	}
	if f.status == 0 {
		// No answer: the SDK's error says why (a refused connection, a
		// timeout, a cancelled context); it names URLs, never bodies.
		e.Code, e.Message = "request_failed", err.Error()
	} else if e.Code == "" {
		e.Code = strconv.Itoa(f.status)
	}
	return e
}

// retryable reports whether another attempt may succeed: the server
// failed (5xx but 501) or the request got no answer, and ctx still allows.
func retryable(ctx context.Context, resp *core.DetailedResponse, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if resp != nil {
		return resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented
	}
	var ue *url.Error
	var ne net.Error
	return errors.As(err, &ue) || errors.As(err, &ne)
}

// retry calls fn until it succeeds, fails for good, or maxAttempts ran,
// waiting with jittered exponential backoff between attempts.
func retry[T any](ctx context.Context, fn func() (T, *core.DetailedResponse, error)) (T, *core.DetailedResponse, error) {
	for attempt := 1; ; attempt++ {
		v, resp, err := fn()
		if err == nil || attempt == maxAttempts || !retryable(ctx, resp, err) {
			return v, resp, err
		}
		d := baseBackoff << (attempt - 1)
		d = d/2 + rand.N(d/2+1)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, resp, err
		case <-t.C:
		}
	}
}
