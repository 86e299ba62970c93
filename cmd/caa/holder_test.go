package main

import (
	"testing"
)

// TestRunRefusesTimeLimitsThatCannotWorkTogether (issue 17, item 5): the
// binary exits at start, on one line naming the settings and the fix,
// before it touches the apiserver, the cloud or the ledger.
func TestRunRefusesTimeLimitsThatCannotWorkTogether(t *testing.T) {
	// The old shipped pair: a new caa waiting for a booting VM was aborted.
	r := caa(t, "run", "--node-name", "n", "--provider", "aws", "--handover-ready-timeout", "3m", "--boot-timeout", "10m")
	oneLineError(t, r, exitUsage, "--handover-ready-timeout (3m0s) must exceed --boot-timeout (10m0s)", "CAA_HANDOVER_READY_TIMEOUT")

	r = caa(t, "run", "--node-name", "n", "--provider", "aws", "--handover-failed-cooldown", "5m")
	oneLineError(t, r, exitUsage, "--handover-failed-cooldown (5m0s) must exceed --handover-ready-timeout (12m0s)")

}
