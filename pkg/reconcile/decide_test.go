package reconcile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

var (
	t0  = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	cfg = Config{
		Spec:           provider.SpecConfig{DefaultType: "small", DefaultImage: "img", Types: []provider.InstanceType{{Name: "small", VCPUs: 2, MemoryMiB: 4096}}},
		ConfirmMissing: 30 * time.Second,
	}
	pod    = &Pod{UID: "uid-1", Namespace: "ns", Name: "web", RuntimeClass: "kata-remote"}
	badPod = &Pod{UID: "uid-1", Namespace: "ns", Name: "web", Annotations: map[string]string{provider.AnnotationMachineType: "huge"}}
)

func rec(phase ledger.Phase, vmID string, attempt int) *ledger.Record {
	return &ledger.Record{PodUID: "uid-1", Namespace: "ns", Name: "web", Phase: phase, VMID: vmID, Attempt: attempt,
		Key: Key("uid-1", attempt), Provider: "memory"}
}

func vm(id string, s provider.State) *provider.VM { return &provider.VM{ID: id, State: s} }

func keyed(id string, s provider.State, attempt int) *provider.VM {
	return &provider.VM{ID: id, State: s, Tags: map[string]string{provider.TagPodUID: "uid-1", provider.TagKey: Key("uid-1", attempt)}}
}

func withOpen(r *ledger.Record, keys ...string) *ledger.Record {
	r.OpenKeys = keys
	return r
}

func withNodeConfig(nc string) Config {
	c := cfg
	c.NodeConfig = nc
	return c
}

func replacing(phase ledger.Phase, vmID string, attempt int, old string) *ledger.Record {
	r := rec(phase, vmID, attempt)
	r.ReplacesVMID = old
	return r
}

func TestDecide(t *testing.T) {
	terminal := *pod
	terminal.Terminal = true
	notPeer := &Pod{UID: "uid-1", Namespace: "ns", Name: "web", RuntimeClass: "kata-renamed", NotPeer: true}
	notPeerDone := *notPeer
	notPeerDone.Terminal = true
	tests := []struct {
		name string
		in   Input
		want Action // compared on the fields set in want (see match)
	}{
		// DESIGN row 1: no record -> durable intent, then create with key (uid, 1).
		{"new pod", Input{Pod: pod},
			Action{Kind: KindCreate, Reason: ReasonNewPod, Attempt: 1, Key: "uid-1-a1", Selection: provider.Selection{InstanceType: "small", Image: "img"}}},
		{"new pod with a bad annotation fails alone", Input{Pod: badPod},
			Action{Kind: KindFail, Reason: ReasonInvalidSpec}},
		// I6: the ledger lost the record, the cloud still has the tagged VM.
		{"no record, tagged VM alive: adopt", Input{Pod: pod, VM: vm("i-1", provider.StateRunning)},
			Action{Kind: KindAdopt, Reason: ReasonRebuilt}},
		{"no record, tagged VM terminated: create above its attempt", Input{Pod: pod, VM: keyed("i-1", provider.StateTerminated, 1), HighestAttempt: 1},
			Action{Kind: KindCreate, Attempt: 2}},
		// 18.4: a key whose VM may have existed is never used again.
		{"no record, the cloud shows attempts up to 3: create attempt 4", Input{Pod: pod, HighestAttempt: 3},
			Action{Kind: KindCreate, Reason: ReasonVMGone, Attempt: 4}},
		{"no record, dead VM of attempt 1 beside a terminated one of attempt 3: attempt 4", Input{Pod: pod, VM: keyed("i-1", provider.StateStopped, 1), HighestAttempt: 3},
			Action{Kind: KindCreate, Reason: ReasonVMDead, Attempt: 4, Recreate: true, OldVMID: "i-1"}},
		{"recorded attempt 1, the cloud shows attempt 2: recreate as 3", Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 1), VM: vm("i-1", provider.StateTerminated), HighestAttempt: 2},
			Action{Kind: KindCreate, Reason: ReasonVMGone, Attempt: 3, Recreate: true}},

		// 17.3: the record names its other attempts; their VMs beside the kept one go.
		{"creating a2, a1's VM shows: adopt it, a2's VM beside it is a duplicate", Input{Pod: pod, Record: rec(ledger.PhaseCreating, "", 2),
			VM: keyed("i-1", provider.StateRunning, 1), Siblings: []*provider.VM{keyed("i-2", provider.StateRunning, 2)}},
			Action{Kind: KindAdopt, Reason: ReasonAdopted, Duplicates: []string{"i-2"}}},
		{"in sync, an open key's VM shows: delete it", Input{Pod: pod, Record: withOpen(rec(ledger.PhaseRunning, "i-1", 1), Key("uid-1", 2)),
			VM: keyed("i-1", provider.StateRunning, 1), Siblings: []*provider.VM{keyed("i-2", provider.StateRunning, 2)}},
			Action{Kind: KindAdopt, Reason: ReasonDuplicates, Duplicates: []string{"i-2"}}},
		{"in sync, a VM of a key the record does not name: left to the orphan rules", Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 1),
			VM: keyed("i-1", provider.StateRunning, 1), Siblings: []*provider.VM{keyed("i-7", provider.StateRunning, 7)}},
			Action{Kind: KindNone, Reason: ReasonInSync}},

		// DESIGN row 2: record and VM alive -> adopt, no cloud write.
		{"running and recorded", Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 1), VM: vm("i-1", provider.StateRunning)},
			Action{Kind: KindNone, Reason: ReasonInSync}},
		{"booting VM of a creating record: adopt", Input{Pod: pod, Record: rec(ledger.PhaseCreating, "", 1), VM: vm("i-1", provider.StatePending)},
			Action{Kind: KindAdopt, Reason: ReasonAdopted}},

		// DESIGN row 3: crash mid-create -> same key again.
		{"creating, VM not found: resume with the same key", Input{Pod: pod, Record: rec(ledger.PhaseCreating, "", 3)},
			Action{Kind: KindCreate, Reason: ReasonResumeCreate, Attempt: 3, Key: "uid-1-a3"}},

		// DESIGN row 4: confirmed gone or dead -> recreate with attempt+1.
		{"VM terminated: recreate", Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 1), VM: vm("i-1", provider.StateTerminated)},
			Action{Kind: KindCreate, Reason: ReasonVMGone, Attempt: 2, Key: "uid-1-a2", Recreate: true}},
		{"VM failed but still there: recreate and delete the failed one", Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 2), VM: vm("i-1", provider.StateFailed)},
			Action{Kind: KindCreate, Reason: ReasonVMDead, Attempt: 3, Recreate: true, OldVMID: "i-1"}},
		{"VM stopped behind our back: recreate and delete the old one", Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 1), VM: vm("i-1", provider.StateStopped)},
			Action{Kind: KindCreate, Reason: ReasonVMDead, Attempt: 2, Recreate: true, OldVMID: "i-1"}},
		// I3: one NotFound proves nothing.
		{"first NotFound: wait the full confirmation", Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 1), Now: t0},
			Action{Kind: KindWait, Reason: ReasonVMMissing, RequeueAfter: 30 * time.Second}},
		{"NotFound not yet confirmed: wait the rest", Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 1), MissingSince: t0, Now: t0.Add(10 * time.Second)},
			Action{Kind: KindWait, Reason: ReasonVMMissing, RequeueAfter: 20 * time.Second}},
		{"NotFound confirmed: recreate", Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 1), MissingSince: t0, Now: t0.Add(30 * time.Second)},
			Action{Kind: KindCreate, Reason: ReasonVMGone, Attempt: 2, Recreate: true}},
		{"recreate with a spec gone bad: fail", Input{Pod: badPod, Record: rec(ledger.PhaseRunning, "i-1", 1), VM: vm("i-1", provider.StateTerminated)},
			Action{Kind: KindFail, Reason: ReasonInvalidSpec}},
		{"VM stopping: wait", Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 1), VM: vm("i-1", provider.StateStopping)},
			Action{Kind: KindWait, Reason: ReasonVMTransitional}},
		{"VM state unknown: wait, reported as unknown", Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 1), VM: vm("i-1", provider.StateUnknown)},
			Action{Kind: KindWait, Reason: ReasonVMUnknown}},
		{"no record, tagged VM stopped: next attempt, and delete the stopped one",
			Input{Pod: pod, VM: &provider.VM{ID: "i-1", State: provider.StateStopped, Tags: map[string]string{provider.TagKey: "uid-1-a2"}}},
			Action{Kind: KindCreate, Reason: ReasonVMDead, Attempt: 3, Recreate: true, OldVMID: "i-1"}},
		{"no record, tagged VM stopping: wait", Input{Pod: pod, VM: vm("i-1", provider.StateStopping)},
			Action{Kind: KindWait, Reason: ReasonVMTransitional}},

		// A replacement whose old VM is not deleted yet keeps it in the record.
		{"resume a recreate: the replaced VM is still to delete", Input{Pod: pod, Record: replacing(ledger.PhaseCreating, "", 2, "i-old")},
			Action{Kind: KindCreate, Reason: ReasonResumeCreate, Attempt: 2, Recreate: true, OldVMID: "i-old"}},
		{"retry (not a restart) is named so", Input{Pod: pod, Record: rec(ledger.PhaseCreating, "", 1), Retries: 2},
			Action{Kind: KindCreate, Reason: ReasonRetryCreate, Attempt: 1}},
		{"replacement live, replaced VM still recorded: adopt and delete it", Input{Pod: pod, Record: replacing(ledger.PhaseCreating, "", 2, "i-old"), VM: vm("i-2", provider.StateRunning)},
			Action{Kind: KindAdopt, Reason: ReasonAdopted, OldVMID: "i-old"}},

		// Failed records: terminal while the spec stays bad, retried once fixed.
		{"failed and still bad: nothing", Input{Pod: badPod, Record: &ledger.Record{PodUID: "uid-1", Phase: ledger.PhaseFailed, Reason: ReasonInvalidSpec, Attempt: 1}},
			Action{Kind: KindNone, Reason: ReasonInvalidSpec}},
		{"failed but fixed: next attempt", Input{Pod: pod, Record: &ledger.Record{PodUID: "uid-1", Phase: ledger.PhaseFailed, Attempt: 1}},
			Action{Kind: KindCreate, Reason: ReasonSpecFixed, Attempt: 2, Key: "uid-1-a2"}},
		{"cloud refused this very selection: stays failed", Input{Pod: pod, Record: &ledger.Record{PodUID: "uid-1", Phase: ledger.PhaseFailed,
			Reason: ReasonCloudRefused, Attempt: 4, FailedSpec: Fingerprint(provider.Selection{InstanceType: "small", Image: "img"}, cfg)}},
			Action{Kind: KindNone, Reason: ReasonCloudRefused}},
		{"cloud refused this selection under another node configuration: next attempt", Input{Pod: pod, Record: &ledger.Record{PodUID: "uid-1", Phase: ledger.PhaseFailed,
			Reason: ReasonCloudRefused, Attempt: 4, FailedSpec: Fingerprint(provider.Selection{InstanceType: "small", Image: "img"}, withNodeConfig("subnet=old"))}},
			Action{Kind: KindCreate, Reason: ReasonSpecFixed, Attempt: 5}},
		{"a record refused before the node configuration was fingerprinted: one more attempt", Input{Pod: pod, Record: &ledger.Record{PodUID: "uid-1", Phase: ledger.PhaseFailed,
			Reason: ReasonCloudRefused, Attempt: 4, FailedSpec: "0011223344556677"}},
			Action{Kind: KindCreate, Reason: ReasonSpecFixed, Attempt: 5}},
		{"cloud refused another selection: next attempt", Input{Pod: pod, Record: &ledger.Record{PodUID: "uid-1", Phase: ledger.PhaseFailed,
			Reason: ReasonCloudRefused, Attempt: 4, FailedSpec: Fingerprint(provider.Selection{InstanceType: "small", Image: "img-missing"}, cfg)}},
			Action{Kind: KindCreate, Reason: ReasonSpecFixed, Attempt: 5}},

		// Configuration selects which pods get VMs, never which are deleted (I3).
		{"record of a pod now outside the runtime classes: kept, reported", Input{Pod: notPeer, Record: rec(ledger.PhaseRunning, "i-1", 1), VM: vm("i-1", provider.StateRunning), CacheSynced: true},
			Action{Kind: KindNone, Reason: ReasonNotPeer}},
		{"record of a pod outside the runtime classes, VM gone: still nothing", Input{Pod: notPeer, Record: rec(ledger.PhaseRunning, "i-1", 1), CacheSynced: true},
			Action{Kind: KindNone, Reason: ReasonNotPeer}},
		{"pod outside the runtime classes without a record: nothing", Input{Pod: notPeer, CacheSynced: true},
			Action{Kind: KindNone}},
		{"pod outside the runtime classes, terminal: delete", Input{Pod: &notPeerDone, Record: rec(ledger.PhaseRunning, "i-1", 1), CacheSynced: true},
			Action{Kind: KindDelete, Reason: ReasonPodTerminal}},

		// Records whose pod is gone or terminal, from a synced cache only (I3).
		{"pod gone: delete", Input{Record: rec(ledger.PhaseRunning, "i-1", 1), VM: vm("i-1", provider.StateRunning), CacheSynced: true},
			Action{Kind: KindDelete, Reason: ReasonPodGone}},
		{"pod terminal: delete", Input{Pod: &terminal, Record: rec(ledger.PhaseRunning, "i-1", 1), CacheSynced: true},
			Action{Kind: KindDelete, Reason: ReasonPodTerminal}},
		{"pod gone but cache unsynced: never delete", Input{Record: rec(ledger.PhaseRunning, "i-1", 1), VM: vm("i-1", provider.StateRunning)},
			Action{Kind: KindWait, Reason: ReasonCacheNotSynced}},
		{"deleting continues even before the cache syncs", Input{Record: rec(ledger.PhaseDeleting, "i-1", 1)},
			Action{Kind: KindDelete}},
		{"failed record of a gone pod with no VM: forget", Input{Record: &ledger.Record{PodUID: "uid-1", Phase: ledger.PhaseFailed}, CacheSynced: true},
			Action{Kind: KindForget}},
		{"creating record of a gone pod, VM found by tag: delete it", Input{Record: rec(ledger.PhaseCreating, "", 1), VM: vm("i-9", provider.StatePending), CacheSynced: true},
			Action{Kind: KindDelete}},
		{"no record, no pod: nothing", Input{CacheSynced: true}, Action{Kind: KindNone}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.in.Now.IsZero() {
				tc.in.Now = t0
			}
			got := Decide(tc.in, cfg)
			match(t, tc.want, got)
		})
	}
}

// match compares the fields the table sets; Kind always.
func match(t *testing.T, want, got Action) {
	t.Helper()
	assert.Equal(t, want.Kind, got.Kind, "kind (%s: %s)", got.Reason, got.Message)
	if want.Reason != "" {
		assert.Equal(t, want.Reason, got.Reason)
	}
	if want.Attempt != 0 {
		assert.Equal(t, want.Attempt, got.Attempt)
		assert.Equal(t, Key("uid-1", want.Attempt), got.Key, "the key follows the attempt")
	}
	if want.Key != "" {
		assert.Equal(t, want.Key, got.Key)
	}
	if want.Selection != (provider.Selection{}) {
		assert.Equal(t, want.Selection, got.Selection)
	}
	assert.Equal(t, want.Recreate, got.Recreate, "recreate")
	assert.Equal(t, want.OldVMID, got.OldVMID, "old VM to delete")
	assert.Equal(t, want.Duplicates, got.Duplicates, "duplicates to delete")
	if want.RequeueAfter != 0 {
		assert.Equal(t, want.RequeueAfter, got.RequeueAfter)
	}
	if got.Kind == KindFail {
		assert.Contains(t, got.Message, provider.AnnotationMachineType, "a failure names the annotation")
	}
}

// TestDecideNeverDeletesOrRecreatesOnOneNotFound sweeps the clock through the
// confirmation window: before it ends, no create, no delete.
func TestDecideNeverDeletesOrRecreatesOnOneNotFound(t *testing.T) {
	in := Input{Pod: pod, Record: rec(ledger.PhaseRunning, "i-1", 1), MissingSince: t0, CacheSynced: true}
	for d := time.Duration(0); d < cfg.ConfirmMissing; d += time.Second {
		in.Now = t0.Add(d)
		a := Decide(in, cfg)
		assert.Equal(t, KindWait, a.Kind, "at %s", d)
		assert.Positive(t, a.RequeueAfter)
	}
}

func TestKeyIsStablePerAttempt(t *testing.T) {
	assert.Equal(t, Key("u", 1), Key("u", 1))
	assert.NotEqual(t, Key("u", 1), Key("u", 2))
	assert.NotEqual(t, Key("u", 1), Key("v", 1))
}
