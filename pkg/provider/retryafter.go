package provider

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxRetryAfter bounds the wait a reply can ask for, so that a wild header
// cannot stall a node for longer than a day or overflow a Duration.
const MaxRetryAfter = 24 * time.Hour

// ParseRetryAfter reads how long a throttled reply asks the caller to wait.
// The millisecond headers some clouds send (retry-after-ms, and Azure's
// x-ms-retry-after-ms) come first, being the more precise; then
// Retry-After, as whole seconds or as an HTTP date measured from now. It
// returns 0 when no header says anything usable (absent, malformed, zero or
// in the past), and never more than MaxRetryAfter.
func ParseRetryAfter(h http.Header, now time.Time) time.Duration {
	for _, k := range []string{"Retry-After-Ms", "X-Ms-Retry-After-Ms"} {
		if d, ok := wholeUnits(h.Get(k), time.Millisecond); ok {
			return d
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if d, ok := wholeUnits(v, time.Second); ok {
		return d
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return min(at.Sub(now), MaxRetryAfter)
	}
	return 0
}

// wholeUnits reads a positive whole number of units, capped at
// MaxRetryAfter; ok is false for anything else.
func wholeUnits(v string, unit time.Duration) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || strings.Trim(v, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	switch {
	case err != nil: // only overflow is left
		return MaxRetryAfter, true
	case n == 0:
		return 0, false
	case n >= uint64(MaxRetryAfter/unit):
		return MaxRetryAfter, true
	}
	return time.Duration(n) * unit, true
}
