package adaptorvm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/caa-project/caa/pkg/provider"
)

const (
	sidA = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
	sidB = "a1b2c3d4ffff0718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90" // same first eight
)

func TestTieOf(t *testing.T) {
	web := Sandbox{ID: sidA, Namespace: "team", Pod: "web"}
	db := Sandbox{ID: sidB, Namespace: "team", Pod: "db"}
	other := Sandbox{ID: "0000000011112222", Namespace: "team", Pod: "web"}
	for _, tc := range []struct {
		desc      string
		name      string
		sandboxes []Sandbox
		want      TieKind
		sandbox   string
	}{
		{"the record gives the exact name", Name("web", sidA), []Sandbox{web, other}, Tied, sidA},
		{"no record on this node", Name("web", sidA), []Sandbox{other}, Untied, ""},
		{"no record at all", Name("web", sidA), nil, Untied, ""},
		{"a record of the sandbox prefix for another pod", Name("web", sidA), []Sandbox{db}, Mismatch, sidB},
		{"two records give the name", Name("web", sidA), []Sandbox{web, {ID: sidA + "x", Namespace: "other", Pod: "web"}}, Ambiguous, sidA},
		{"not an adaptor name", "caa-team-web", []Sandbox{web}, Untied, ""},
	} {
		got := TieOf(tc.name, tc.sandboxes)
		assert.Equal(t, tc.want, got.Kind, tc.desc)
		assert.Equal(t, tc.sandbox, got.Sandbox.ID, tc.desc)
	}
}

// TestDecide covers each combination of the evidence: only a tied VM,
// whose sandbox kata no longer has, whose pod the apiserver says is gone
// (or terminal, or a later pod of the name), made a grace ago and alive
// or dead, is judged dead.
func TestDecide(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	grace := 5 * time.Minute
	made := now.Add(-time.Hour)
	sb := Sandbox{ID: sidA, Namespace: "team", Pod: "web"}
	vm := func(state provider.State, created time.Time, tags map[string]string) provider.VM {
		return provider.VM{ID: "i-1", Name: Name("web", sidA), State: state, CreatedAt: created, Tags: tags}
	}
	alive := vm(provider.StateRunning, made, map[string]string{"Name": Name("web", sidA)})
	tied := Tie{Kind: Tied, Sandbox: sb}
	gone := Pod{Kind: PodGone}
	for _, tc := range []struct {
		desc string
		e    Evidence
		want Judgement
		why  string
	}{
		{"tied, pod gone, old, running: dead", Evidence{VM: alive, Tie: tied, Pod: gone}, Dead, "gone from the apiserver"},
		{"tied, pod gone, old, stopped: dead", Evidence{VM: vm(provider.StateStopped, made, nil), Tie: tied, Pod: gone}, Dead, "gone"},
		{"tied, pod terminal: dead", Evidence{VM: alive, Tie: tied, Pod: Pod{Kind: PodExists, Created: made.Add(-time.Minute), Phase: "Succeeded"}}, Dead, "terminal"},
		{"tied, a later pod of the name: dead", Evidence{VM: alive, Tie: tied, Pod: Pod{Kind: PodExists, Created: made.Add(grace + time.Second), Phase: "Running"}}, Dead, "later pod"},
		{"tied, the pod exists from before the VM: keep", Evidence{VM: alive, Tie: tied, Pod: Pod{Kind: PodExists, Created: made.Add(-time.Minute), Phase: "Running"}}, Keep, "may still use it"},
		{"tied, a pod created after the VM but within the grace (clock skew): keep", Evidence{VM: alive, Tie: tied, Pod: Pod{Kind: PodExists, Created: made.Add(grace), Phase: "Running"}}, Keep, "may still use it"},
		{"tied, pod read failed: keep", Evidence{VM: alive, Tie: tied, Pod: Pod{Kind: PodError, Err: "connection refused"}}, Keep, "connection refused"},
		{"tied, pod not read: keep", Evidence{VM: alive, Tie: tied}, Keep, "not read"},
		{"tied, kata still has the sandbox: keep", Evidence{VM: alive, Tie: tied, Pod: gone, KataHas: true}, Keep, "kata still has"},
		{"tied, pod gone, VM younger than the grace: keep", Evidence{VM: vm(provider.StateRunning, now.Add(-time.Minute), nil), Tie: tied, Pod: gone}, Keep, "less than"},
		{"tied, pod gone, VM dated in the future: keep", Evidence{VM: vm(provider.StateRunning, now.Add(time.Hour), nil), Tie: tied, Pod: gone}, Keep, "less than"},
		{"tied, pod gone, no creation time: keep", Evidence{VM: vm(provider.StateRunning, time.Time{}, nil), Tie: tied, Pod: gone}, Keep, "no creation time"},
		{"tied, pod gone, VM stopping: keep", Evidence{VM: vm(provider.StateStopping, made, nil), Tie: tied, Pod: gone}, Keep, "in flight"},
		{"tied, pod gone, VM state unknown: keep", Evidence{VM: vm(provider.StateUnknown, made, nil), Tie: tied, Pod: gone}, Keep, "in flight"},
		{"terminated: gone", Evidence{VM: vm(provider.StateTerminated, made, nil), Tie: tied, Pod: gone}, Gone, "terminated"},
		{"untied, pod unknown: report", Evidence{VM: alive, Tie: Tie{Kind: Untied}}, ReportOnly, "never deleted"},
		{"untied even with every other sign of death: report", Evidence{VM: alive, Tie: Tie{Kind: Untied}, Pod: gone}, ReportOnly, "never deleted"},
		{"a forged record for another pod: keep", Evidence{VM: alive, Tie: Tie{Kind: Mismatch, Sandbox: Sandbox{ID: sidB, Namespace: "team", Pod: "db"}}, Pod: gone}, Keep, "forged or colliding"},
		{"two records: keep", Evidence{VM: alive, Tie: Tie{Kind: Ambiguous, Sandbox: sb}, Pod: gone}, Keep, "ambiguous"},
		{"caa's own tags: keep", Evidence{VM: vm(provider.StateRunning, made, map[string]string{provider.TagManagedBy: provider.ManagedByValue}), Tie: tied, Pod: gone}, Keep, "caa's own"},
		{"a pod UID tag: keep", Evidence{VM: vm(provider.StateRunning, made, map[string]string{provider.TagPodUID: "u"}), Tie: tied, Pod: gone}, Keep, "caa's own"},
		{"not the adaptor's name: report", Evidence{VM: provider.VM{ID: "i-2", Name: "web-server", State: provider.StateRunning, CreatedAt: made}, Tie: tied, Pod: gone}, ReportOnly, "not one the adaptor makes"},
	} {
		tc.e.Now, tc.e.Grace = now, grace
		got := Decide(tc.e)
		assert.Equal(t, tc.want, got.Judgement, "%s: %s", tc.desc, got.Why)
		assert.Contains(t, got.Why, tc.why, tc.desc)
	}
}
