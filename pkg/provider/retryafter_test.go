package provider

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
	}{
		{"absent", h(), 0},
		{"nil header", nil, 0},
		{"seconds", h("Retry-After", "12"), 12 * time.Second},
		{"seconds with spaces", h("Retry-After", " 7 "), 7 * time.Second},
		{"zero seconds", h("Retry-After", "0"), 0},
		{"negative seconds", h("Retry-After", "-5"), 0},
		{"seconds past the cap", h("Retry-After", "99999999999999"), MaxRetryAfter},
		{"seconds past int64", h("Retry-After", "999999999999999999999999"), MaxRetryAfter},
		{"date ahead", h("Retry-After", now.Add(90*time.Second).Format(http.TimeFormat)), 90 * time.Second},
		{"date now", h("Retry-After", now.Format(http.TimeFormat)), 0},
		{"date behind", h("Retry-After", now.Add(-time.Minute).Format(http.TimeFormat)), 0},
		{"date past the cap", h("Retry-After", now.Add(30*24*time.Hour).Format(http.TimeFormat)), MaxRetryAfter},
		{"garbage", h("Retry-After", "soon"), 0},
		{"fraction", h("Retry-After", "1.5"), 0},
		{"milliseconds win", h("Retry-After-Ms", "250", "Retry-After", "7"), 250 * time.Millisecond},
		{"azure milliseconds", h("X-Ms-Retry-After-Ms", "1200"), 1200 * time.Millisecond},
		{"bad milliseconds fall back", h("Retry-After-Ms", "x", "Retry-After", "3"), 3 * time.Second},
		{"zero milliseconds fall back", h("Retry-After-Ms", "0", "Retry-After", "3"), 3 * time.Second},
		{"milliseconds past the cap", h("Retry-After-Ms", "999999999999"), MaxRetryAfter},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, ParseRetryAfter(tc.header, now))
		})
	}
}
