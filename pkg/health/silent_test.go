package health

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSilentSandboxIsListedCountedAndNotBlocking: a sandbox whose agent
// stayed silent past the bound is on /status and in caa_sandboxes_silent,
// and readiness does not wait for it.
func TestSilentSandboxIsListedCountedAndNotBlocking(t *testing.T) {
	r := newRig(t, Config{})
	note := PodNote{UID: "u1", Pod: "team/web", Reason: "AgentSilent", Message: "sandbox 1234: no answer for 5m0s"}
	r.status.PassDone(Pass{At: r.clock.Now(), Silent: []PodNote{note}})
	snap := r.status.Snapshot()
	assert.True(t, snap.Ready, "a silent sandbox does not hold readiness")
	require.Len(t, snap.Silent, 1)
	assert.Equal(t, note, snap.Silent[0])
	assert.Equal(t, 1.0, testutil.ToFloat64(r.m.agentsSilent))

	r.status.PassDone(Pass{At: r.clock.Now()})
	assert.Empty(t, r.status.Snapshot().Silent, "it answered again")
	assert.Zero(t, testutil.ToFloat64(r.m.agentsSilent))
}
