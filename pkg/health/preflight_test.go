package health

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSetPreflightHoldsReadinessApartFromSetBlocked: a failed re-check
// after ready holds /readyz at 503 with its reason, and the startup's own
// SetBlocked("") does not clear it; clearing it restores readiness.
func TestSetPreflightHoldsReadinessApartFromSetBlocked(t *testing.T) {
	r := newRig(t, Config{})
	r.status.PassDone(converged(r.clock.Now(), 3))
	select {
	case <-r.status.Readied():
	default:
		t.Fatal("Readied is closed at the first 200")
	}

	r.status.SetPreflight("cloud preflight failed: AuthFailure")
	code, _, body := r.get(t, "/readyz", "")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "cloud preflight failed: AuthFailure")

	r.status.SetBlocked("")
	code, _, _ = r.get(t, "/readyz", "")
	assert.Equal(t, http.StatusServiceUnavailable, code, "SetBlocked(\"\") is not the preflight's to clear")

	r.status.SetBlocked("stopping")
	assert.Equal(t, "stopping", r.status.Readiness().Reason, "a reason set by the caller comes first")
	r.status.SetBlocked("")

	r.status.SetPreflight("")
	code, _, _ = r.get(t, "/readyz", "")
	assert.Equal(t, http.StatusOK, code)
}

// TestReadiedIsOpenUntilReady: nothing before the first converged pass
// closes it, a preflight reason set before it keeps it open.
func TestReadiedIsOpenUntilReady(t *testing.T) {
	r := newRig(t, Config{})
	r.status.SetPreflight("cloud preflight failed: x")
	r.status.PassDone(converged(r.clock.Now(), 1))
	select {
	case <-r.status.Readied():
		t.Fatal("not ready while the preflight reason is set")
	default:
	}
	r.status.SetPreflight("")
	select {
	case <-r.status.Readied():
	default:
		t.Fatal("ready once the reason is cleared")
	}
}

// TestKeepAliveBeatsUntilStopped: while kept alive, /healthz passes long
// after the stale bound; once stopped, it fails again past the bound.
func TestKeepAliveBeatsUntilStopped(t *testing.T) {
	r := newRig(t, Config{Stale: 10 * time.Second})
	r.status.Beat(r.clock.Now())
	stop := r.status.KeepAlive(t.Context(), time.Millisecond)
	for range 5 {
		r.clock.Add(8 * time.Second)
		require.Eventually(t, func() bool { ok, _ := r.status.Live(); return ok }, 5*time.Second, time.Millisecond,
			"a beat within the bound after the clock moved")
	}
	stop()
	stop() // a second stop is harmless
	r.clock.Add(11 * time.Second)
	ok, msg := r.status.Live()
	assert.False(t, ok, "no beats after stop: %s", msg)
}
