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
	// ErrInvalidSpec: terminal for the pod (bad instance type or image).
	ErrInvalidSpec = errors.New("invalid VM spec")
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
// of spec or credentials.
func Terminal(err error) bool {
	return errors.Is(err, ErrInvalidSpec) || errors.Is(err, ErrAuth)
}
