package provider

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestCallContext(t *testing.T) {
	check := func(parent context.Context, timeout, def, want time.Duration) {
		t.Helper()
		ctx, cancel := CallContext(parent, timeout, def)
		defer cancel()
		deadline, ok := ctx.Deadline()
		assert.True(t, ok, "every call gets a deadline")
		assert.InDelta(t, float64(want), float64(time.Until(deadline)), float64(time.Second))
	}
	check(context.Background(), 5*time.Second, time.Minute, 5*time.Second)
	check(context.Background(), 0, time.Minute, time.Minute)
	short, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	check(short, time.Minute, time.Minute, 2*time.Second)
}
