package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/caa-project/caa/pkg/sandbox"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// A Compare scenario sets caa's median against upstream's, with the ratio
// and the reason, and judges nothing.
func TestCompareTableSetsCaaAgainstUpstream(t *testing.T) {
	sc := Scenario{ID: "S12", Title: "side by side", Compare: true, Rows: []Row{
		{Case: "one", Metric: "StartVM", Unit: "ms", Runs: []float64{300, 200, 250.5}, Upstream: []float64{100, 125.25, 150}, Why: "three calls, not one"},
		{Case: "restart", Metric: "VMs leaked", Unit: "VMs", Runs: []float64{0}, Upstream: []float64{20}, Why: "no ledger"},
		{Case: "idle", Metric: "calls", Unit: "calls", Runs: []float64{6}, Upstream: []float64{0}, Why: "an audit"},
		{Case: "burst", Metric: "throttled", Unit: "replies", Runs: []float64{0}, Upstream: []float64{0}, Why: "-"},
	}}
	var b bytes.Buffer
	sc.WriteMarkdown(&b, "##", true)
	out := b.String()
	assert.Contains(t, out, "| case | metric | caa | upstream | caa/upstream | why |")
	assert.Contains(t, out, "| one | StartVM | 250 ms (median of 3) | 125 ms (median of 3) | 2.00x | three calls, not one |")
	assert.Contains(t, out, "| restart | VMs leaked | 0 VMs | 20 VMs | 0.00x | no ledger |")
	assert.Contains(t, out, "| idle | calls | 6 calls | 0 calls | - | an audit |", "no ratio over zero")
	assert.Contains(t, out, "| burst | throttled | 0 replies | 0 replies | equal | - |")
	assert.NotContains(t, out, "lower bound", "no bound columns")
	assert.Zero(t, sc.Misses(), "a comparison judges nothing")
}

// Upstream names an instance podvm-<pod>-<first 8 hex digits of the
// sandbox>, caa tags it with the whole id: both map to their sandbox.
func TestS12FindsEachProgramsVMs(t *testing.T) {
	ids := []string{s12ID(3, 0), s12ID(3, 1)}
	assert.NotEqual(t, ids[0][:8], ids[1][:8], "the ids differ in what upstream keeps")
	assert.Len(t, ids[0], 64)
	up := cloud.Instance{Tags: map[string]string{"Name": "podvm-s12-upstream-00001-" + ids[1][:8]}}
	ca := cloud.Instance{Tags: map[string]string{sandbox.TagSandbox: ids[0], "Name": "caa-s12-x"}}
	other := cloud.Instance{Tags: map[string]string{"Name": "podvm-x-" + strings.Repeat("f", 8)}}
	assert.Equal(t, ids[1], s12SandboxOf(up, ids))
	assert.Equal(t, ids[0], s12SandboxOf(ca, ids))
	assert.Empty(t, s12SandboxOf(other, ids))
}
