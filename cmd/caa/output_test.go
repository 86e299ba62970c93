package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
)

func TestShortUIDs(t *testing.T) {
	got := shortUIDs([]string{
		"5f1c2d3e-0000-4000-8000-000000000001",
		"5f1c2d3e-0000-4000-8000-000000000001", // repeated: one entry
		"5f1c2d3e-0001-4000-8000-000000000002", // shares 13 characters with the first
		"9e8d7c6b-0000-4000-8000-000000000003",
		"uid-a", // shorter than the minimum
		"uid-ab",
	})
	assert.Equal(t, map[string]string{
		"5f1c2d3e-0000-4000-8000-000000000001": "5f1c2d3e-0000",
		"5f1c2d3e-0001-4000-8000-000000000002": "5f1c2d3e-0001",
		"9e8d7c6b-0000-4000-8000-000000000003": "9e8d7c6b",
		"uid-a":                                "uid-a",
		"uid-ab":                               "uid-ab",
	}, got)
	assert.Empty(t, shortUIDs(nil))
}

// Two pods named team/web, the second created while the first is being
// deleted: the all-pods history tells their rows apart by UID, and a
// recreate's rows name the dead VM they replace.
func TestHistoryTableTellsPodsAndReplacementsApart(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	oldUID, newUID := "0a1b2c3d-1111-4000-8000-000000000001", "0a1b2c3d-2222-4000-8000-000000000002"
	rec := func(uid string, phase ledger.Phase, vm, replaces string, attempt int, rev uint64) ledger.Record {
		return ledger.Record{PodUID: uid, Namespace: "team", Name: "web", Phase: phase, VMID: vm, Provider: "aws",
			ReplacesVMID: replaces, Attempt: attempt, Revision: rev}
	}
	hist := []ledger.Event{
		{Time: t0, Action: ledger.ActionCreated, Record: rec(oldUID, ledger.PhaseRunning, "i-0old", "", 1, 1)},
		{Time: t0.Add(1 * time.Minute), Action: ledger.ActionUpdated, Record: rec(oldUID, ledger.PhaseCreating, "", "i-0old", 2, 2)},
		{Time: t0.Add(2 * time.Minute), Action: ledger.ActionUpdated, Record: rec(oldUID, ledger.PhaseRunning, "i-0new", "i-0old", 2, 3)},
		{Time: t0.Add(3 * time.Minute), Action: ledger.ActionCreated, Record: rec(newUID, ledger.PhaseCreating, "", "", 1, 1)},
		{Time: t0.Add(4 * time.Minute), Action: ledger.ActionDeleted, Record: rec(oldUID, ledger.PhaseDeleting, "i-0new", "", 2, 4)},
	}
	var out bytes.Buffer
	require.NoError(t, writeEvents(&out, "table", hist, true))
	t.Log("\n" + out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 6)
	assert.Regexp(t, `^TIME\s+POD\s+UID\s+ACTION\s+PHASE\s+VM\s+ATTEMPT\s+REV\s+REASON$`, lines[0])
	assert.Regexp(t, `team/web\s+0a1b2c3d-1\s+created\s+Running\s+i-0old\s+1\s+1\s+-$`, lines[1])
	assert.Regexp(t, `team/web\s+0a1b2c3d-1\s+updated\s+Creating\s+- \(replaces i-0old\)\s+2\s+2\s+-$`, lines[2])
	assert.Regexp(t, `team/web\s+0a1b2c3d-1\s+updated\s+Running\s+i-0new \(replaces i-0old\)\s+2\s+3\s+-$`, lines[3])
	assert.Regexp(t, `team/web\s+0a1b2c3d-2\s+created\s+Creating\s+-\s+1\s+1\s+-$`, lines[4])
	assert.Regexp(t, `team/web\s+0a1b2c3d-1\s+deleted\s+Deleting\s+i-0new\s+2\s+4\s+-$`, lines[5])

	// One pod's history has no pod columns, and still shows the replacement.
	out.Reset()
	require.NoError(t, writeEvents(&out, "table", hist[:3], false))
	assert.NotContains(t, out.String(), "UID")
	assert.Regexp(t, `updated\s+Running\s+i-0new \(replaces i-0old\)\s+2\s+3`, out.String())
}

func TestRecordDetailShowsTheReplacedVM(t *testing.T) {
	now := time.Now()
	r := ledger.Record{PodUID: "uid-1", Namespace: "team", Name: "web", Phase: ledger.PhaseRunning,
		Provider: "aws", VMID: "i-0new", ReplacesVMID: "i-0old", Attempt: 2, Revision: 3, CreatedAt: now}
	var out bytes.Buffer
	require.NoError(t, writeRecordDetail(&out, "table", &r, nil, nil, now))
	assert.Regexp(t, `Replaces VM:\s+i-0old \(dead; named here until the cloud has deleted it\)`, out.String())
	assert.Regexp(t, `Failed spec:\s+-`, out.String())

	r.ReplacesVMID, r.Phase, r.FailedSpec = "", ledger.PhaseFailed, "sha256:1f2e"
	out.Reset()
	require.NoError(t, writeRecordDetail(&out, "table", &r, nil, nil, now))
	assert.Regexp(t, `Replaces VM:\s+-\n`, out.String())
	assert.Regexp(t, `Failed spec:\s+sha256:1f2e`, out.String())

	out.Reset()
	r.ReplacesVMID = "i-0old"
	require.NoError(t, writeRecordDetail(&out, "json", &r, nil, nil, now))
	assert.Contains(t, out.String(), `"replacesVMID": "i-0old"`)
}
