package holder

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestGate(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := &Gate{Cooldown: time.Hour}
	ok, why := g.Admit("pod-a", t0)
	assert.False(t, ok, "closed until the caa holds the ledger")
	assert.Empty(t, why)

	g.Close("this caa is still taking the ledger over")
	_, why = g.Admit("pod-a", t0)
	assert.Equal(t, "this caa is still taking the ledger over", why)

	g.Open()
	ok, _ = g.Admit("pod-a", t0)
	assert.True(t, ok)

	g.Failed("pod-a", "not ready within 12m0s", t0)
	ok, why = g.Admit("pod-a", t0.Add(59*time.Minute))
	assert.False(t, ok, "a restarted container of the failed pod is refused")
	assert.Contains(t, why, "failed a hand-over (not ready within 12m0s)")
	assert.Contains(t, why, "2026-01-01T01:00:00Z")
	assert.Contains(t, why, "delete the pod")
	ok, _ = g.Admit("pod-b", t0)
	assert.True(t, ok, "another pod is not")
	ok, _ = g.Admit("pod-a", t0.Add(time.Hour))
	assert.True(t, ok, "after the cooldown it may try again")

	g.Failed("", "anonymous", t0)
	ok, _ = g.Admit("", t0)
	assert.True(t, ok, "an asker without a name is not remembered")
}
