package cluster

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

func TestViewsSplitByNodeAndRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	vms := []provider.VM{vmOf("b", "n1", provider.StateRunning), vmOf("a", "n1", provider.StateStopped), vmOf("c", "gone", provider.StateRunning)}
	views := Views(at, time.Minute, vms, []string{"n1", "n2"})
	require.Len(t, views, 2, "only nodes that exist get a view")
	assert.Equal(t, []ViewVM{{ID: "a", State: provider.StateStopped, PodUID: "a-uid", Key: "a-k"}, {ID: "b", State: provider.StateRunning, PodUID: "b-uid", Key: "b-k"}}, views["n1"].VMs)
	assert.Empty(t, views["n2"].VMs)
	assert.NotNil(t, views["n2"].VMs, "an empty view says: no VM")

	s, err := views["n1"].Encode()
	require.NoError(t, err)
	back, err := ParseView(s)
	require.NoError(t, err)
	assert.Equal(t, views["n1"], back)

	assert.True(t, back.Fresh(at.Add(2*time.Minute)))
	assert.False(t, back.Fresh(at.Add(2*time.Minute+time.Second)), "no listing for more than two intervals: stale")
	assert.False(t, back.Fresh(at.Add(-2*time.Minute)), "a listing from the future is not trusted")

	for _, bad := range []string{"", "{", `{"at":"2026-01-01T00:00:00Z"}`, `{"every":"1m"}`, `{"at":"2026-01-01T00:00:00Z","every":"soon"}`} {
		_, err := ParseView(bad)
		assert.Error(t, err, "%q", bad)
	}
}
