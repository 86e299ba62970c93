package provider

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStateClassesPartitionEveryState(t *testing.T) {
	tests := []struct {
		state             State
		alive, dead, gone bool
	}{
		{StatePending, true, false, false},
		{StateRunning, true, false, false},
		// Going away, or unreadable: no class, the caller waits.
		{StateStopping, false, false, false},
		{StateUnknown, false, false, false},
		// Present but useless: replace it, and delete the old one.
		{StateStopped, false, true, false},
		{StateFailed, false, true, false},
		// Not there any more: nothing to delete.
		{StateTerminated, false, false, true},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.alive, tc.state.Alive(), "%s.Alive()", tc.state)
		assert.Equal(t, tc.dead, tc.state.Dead(), "%s.Dead()", tc.state)
		assert.Equal(t, tc.gone, tc.state.Gone(), "%s.Gone()", tc.state)
		n := 0
		for _, b := range []bool{tc.state.Alive(), tc.state.Dead(), tc.state.Gone()} {
			if b {
				n++
			}
		}
		assert.LessOrEqual(t, n, 1, "%s is in at most one class", tc.state)
	}
}
