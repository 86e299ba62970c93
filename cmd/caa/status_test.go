package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/health"
)

func TestStatusShowsTheHandover(t *testing.T) {
	at := time.Now().Add(-time.Minute)
	var buf bytes.Buffer
	require.NoError(t, writeStatus(&buf, "table", health.Snapshot{
		Ready: false, Reason: "handed over to caa-v2", StartedAt: at,
		Handover: &health.Handover{Role: health.RoleHandedOver, Peer: "caa-v2 (pid 7, version v2)", Outcome: health.HandoverDone,
			StartedAt: at, Took: health.Duration(180 * time.Millisecond), Gap: health.Duration(12 * time.Millisecond)},
	}))
	out := buf.String()
	assert.Contains(t, out, "Hand-over:")
	assert.Contains(t, out, "handed over to caa-v2 (pid 7, version v2)")
	assert.Contains(t, out, "done, took 180ms, no reconciler for 12ms")

	buf.Reset()
	require.NoError(t, writeStatus(&buf, "table", health.Snapshot{
		Handover: &health.Handover{Role: health.RoleTookOver, Peer: "caa-v1", Outcome: health.HandoverAborted,
			StartedAt: at, Reason: "not ready within 3m"},
	}))
	assert.Contains(t, buf.String(), "took over from caa-v1")
	assert.Contains(t, buf.String(), "aborted: not ready within 3m")
}

func TestStatusShowsTheConfidentialSettingAndEachVMsTEE(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, writeStatus(&buf, "table", health.Snapshot{Confidential: "on", VMs: []health.VMNote{
		{Pod: "a/x", ID: "i-1", Confidential: "sev-snp"}, {Pod: "a/y", ID: "i-2", Confidential: "sev-snp"}, {Pod: "a/z", ID: "i-3", Confidential: "none"},
	}}))
	assert.Regexp(t, `Confidential:\s+on\n`, buf.String())
	assert.Regexp(t, `VMs by TEE:\s+none 1, sev-snp 2\n`, buf.String())
	buf.Reset()
	require.NoError(t, writeStatus(&buf, "json", health.Snapshot{Confidential: "off (--confidential=false)",
		VMs: []health.VMNote{{Pod: "a/x", ID: "i-1", Confidential: "off (--confidential=false)"}}}))
	assert.Contains(t, buf.String(), `"confidential": "off (--confidential=false)"`)
	assert.Contains(t, buf.String(), `"id": "i-1"`)
}

func TestStatusShowsTheAdaptorVMs(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, writeStatus(&buf, "table", health.Snapshot{
		AdaptorVMs: &health.AdaptorVMs{Mode: "report", Sandboxes: 2, Problems: []string{"kata's sandbox directory /run/vc/sbs is not there"},
			VMs: []health.AdaptorVM{
				{ID: "i-1", Name: "podvm-web-a1b2c3d4", State: "Running", Tie: "tied", Action: "would-delete", Why: "pod team/web is gone from the apiserver"},
				{ID: "i-2", Name: "podvm-db-b1b2c3d4", State: "Running", Tie: "untied", Action: "report", Why: "nothing on this node ties it"},
			}},
	}))
	out := buf.String()
	assert.Contains(t, out, "2 found, mode report, 2 sandbox records on this node")
	assert.Contains(t, out, "i-1 podvm-web-a1b2c3d4 (Running): would-delete: pod team/web is gone from the apiserver")
	assert.Contains(t, out, "i-2 podvm-db-b1b2c3d4 (Running): report: nothing on this node ties it")
	assert.Contains(t, out, "Adaptor problem:")
}
