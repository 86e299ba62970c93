package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHypervisorFlagsCheck(t *testing.T) {
	off := hypervisorFlags{}
	require.NoError(t, off.check(), "the informer mode (no socket) needs nothing more")
	on := hypervisorFlags{socket: "/run/peerpod/hypervisor.sock", nodeIP: "10.0.0.4", startLimit: time.Minute}
	require.NoError(t, on.check())

	noIP := on
	noIP.nodeIP = ""
	assert.ErrorContains(t, noIP.check(), "--node-ip")
	badIP := on
	badIP.nodeIP = "node-4"
	assert.ErrorContains(t, badIP.check(), `--node-ip "node-4"`)
	noLimit := on
	noLimit.startLimit = 0
	assert.ErrorContains(t, noLimit.check(), "--start-vm-timeout")
}

func TestSandboxSyncPeriodHonoursTheAuditInterval(t *testing.T) {
	assert.Equal(t, 2*time.Second, sandboxSyncPeriod(2*time.Second), "the operator's interval, even a short one")
	assert.Equal(t, 10*time.Minute, sandboxSyncPeriod(10*time.Minute))
	assert.Equal(t, 30*time.Second, sandboxSyncPeriod(0), "0 (startup only) still syncs: lost VMs are found by the sync")
}
