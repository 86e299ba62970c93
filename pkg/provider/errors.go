package provider

import (
	"errors"
	"fmt"
	"time"
)

// Error kinds. Each carries the decision the caller must make; a provider
// error that wraps none of them is transient (retry with backoff).
var (
	// ErrNotFound: the VM does not exist (or is not visible yet).
	ErrNotFound = errors.New("not found")
	// ErrThrottled: the cloud refused the call for rate; wait (RetryAfter).
	ErrThrottled = errors.New("throttled")
	// ErrQuota: an account limit was reached; retrying soon will not help.
	ErrQuota = errors.New("quota exceeded")
	// ErrCapacity: the cloud has no capacity for this type/zone right now.
	ErrCapacity = errors.New("insufficient capacity")
	// ErrInvalidSpec: the cloud refused what the VM was asked to be (its
	// instance type or image; Error.Refused says which when the cloud named
	// it). Terminal for the pod when the pod chose what was refused; when
	// the node's defaults chose it, the node's configuration is at fault.
	ErrInvalidSpec = errors.New("invalid VM spec")
	// ErrNodeConfig: the cloud refused a create for something of the node's
	// configuration, not of the pod (a subnet or security group it does not
	// know, an image still being prepared, the node's tags). No pod can fix
	// it; the operator can, so it is retried with backoff and reported on
	// the node, never recorded as a pod's terminal failure.
	ErrNodeConfig = errors.New("refused for the node's configuration")
	// ErrKeySpent: the idempotency key belongs to an earlier VM that the
	// cloud has already terminated (EC2's IdempotentInstanceTerminated).
	// That key can never make a VM again: create with the next attempt's.
	ErrKeySpent = errors.New("idempotency key already spent")
	// ErrAuth: terminal for the daemon (bad credentials or permissions).
	ErrAuth = errors.New("not authorized")
	// ErrConflict: the request clashes with the cloud's state (a name taken,
	// an idempotency key reused with other parameters).
	ErrConflict = errors.New("conflict")
)

// Error is a cloud failure, classified. It matches its Kind with errors.Is
// and exposes the cloud's own code for logs; it never holds request bodies,
// credentials or user data.
type Error struct {
	Kind       error         // one of the kinds above, or nil for transient
	Provider   string        // "aws", "azure", ...
	Op         string        // "create", "get", "list", "delete"
	Code       string        // the cloud's error code, e.g. "RequestLimitExceeded"
	Message    string        // the cloud's message
	Status     int           // HTTP status, when known
	RetryAfter time.Duration // from the cloud, when it said
	Err        error         // the SDK error underneath
	// Refused names what of the spec the cloud refused, when it said so
	// (RefusedInstanceType, RefusedImage); "" when it did not.
	Refused string
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s %s: %s", e.Provider, e.Op, e.Code)
	if e.Kind != nil {
		msg = fmt.Sprintf("%s %s: %v: %s", e.Provider, e.Op, e.Kind, e.Code)
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry after %s)", e.RetryAfter)
	}
	return msg
}

// Unwrap exposes the kind and the SDK error to errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// What a refusal of the spec names (Error.Refused).
const (
	RefusedInstanceType = "instanceType"
	RefusedImage        = "image"
)

// RefusedPart returns what of the spec the cloud refused, if err carries it.
func RefusedPart(err error) string {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Refused
	}
	return ""
}

// RetryAfter returns the wait the cloud asked for, if any error in err's
// chain carries one.
func RetryAfter(err error) (time.Duration, bool) {
	var pe *Error
	if errors.As(err, &pe) && pe.RetryAfter > 0 {
		return pe.RetryAfter, true
	}
	return 0, false
}

// Terminal reports whether retrying err can never succeed without a change
// of spec or credentials. ErrNodeConfig is not terminal: the node's
// configuration can change under a running caa (a subnet created late, an
// image that finishes copying), so it is retried with backoff.
func Terminal(err error) bool {
	return errors.Is(err, ErrInvalidSpec) || errors.Is(err, ErrAuth)
}
