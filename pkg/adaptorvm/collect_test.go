package adaptorvm

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

type fakeCloud struct {
	mu      sync.Mutex
	vms     []provider.VM
	deleted []string
	lists   int
}

func (f *fakeCloud) ListAdaptorVMs(context.Context) ([]provider.VM, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	var out []provider.VM
	for _, vm := range f.vms {
		if !vm.State.Gone() {
			out = append(out, vm)
		}
	}
	return out, nil
}

func (f *fakeCloud) Delete(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, id)
	for i := range f.vms {
		if f.vms[i].ID == id {
			f.vms[i].State = provider.StateTerminated
		}
	}
	return nil
}

// writeSandbox writes the adaptor's record of a sandbox as the adaptor
// does, with the TLS key beside the pod's name.
func writeSandbox(t *testing.T, dir, id, namespace, pod string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, id), 0o755))
	data, err := json.Marshal(map[string]any{
		"pod-namespace": namespace, "pod-name": pod, "tls-server-key": "-----BEGIN PRIVATE KEY-----SECRETKEY",
		"pod-network": map[string]any{"podip": "10.244.1.5/24"},
	})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, id, "apf.json"), data, 0o644))
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newCollector(t *testing.T, mode string, cloud *fakeCloud, pods map[string]Pod) (*Collector, *clock, string, string) {
	t.Helper()
	podsDir, kataDir := filepath.Join(t.TempDir(), "pods"), filepath.Join(t.TempDir(), "sbs")
	clk := &clock{t: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}
	c := &Collector{
		Mode: mode, Cloud: cloud, PodsDir: podsDir, KataDir: kataDir, Grace: 5 * time.Minute, Now: clk.now,
		Pod: func(_ context.Context, ns, name string) Pod {
			if p, ok := pods[ns+"/"+name]; ok {
				return p
			}
			return Pod{Kind: PodGone}
		},
	}
	return c, clk, podsDir, kataDir
}

func byID(rep Report) map[string]Item {
	out := map[string]Item{}
	for _, it := range rep.Items {
		out[it.ID] = it
	}
	return out
}

// TestCollectDeletesOnlyTheDeadAfterASecondSighting: of a dead tied VM, a
// live tied one, an untied one and one with a forged record, only the dead
// one is deleted, and only by a scan a grace after the first that judged
// it dead.
func TestCollectDeletesOnlyTheDeadAfterASecondSighting(t *testing.T) {
	made := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	const sidLive = "b0b0b0b0cafe"
	cloud := &fakeCloud{vms: []provider.VM{
		{ID: "i-dead", Name: Name("web", sidA), State: provider.StateRunning, CreatedAt: made},
		{ID: "i-live", Name: Name("db", sidLive), State: provider.StateRunning, CreatedAt: made},
		{ID: "i-untied", Name: Name("api", "c0c0c0c0dddd"), State: provider.StateRunning, CreatedAt: made},
		{ID: "i-forged", Name: Name("cache", "d0d0d0d0eeee"), State: provider.StateRunning, CreatedAt: made},
	}}
	c, clk, podsDir, _ := newCollector(t, ModeCollect, cloud, map[string]Pod{
		"team/db": {Kind: PodExists, Created: made.Add(-time.Minute), Phase: "Running"},
	})
	writeSandbox(t, podsDir, sidA, "team", "web")
	writeSandbox(t, podsDir, sidLive, "team", "db")
	writeSandbox(t, podsDir, "d0d0d0d0ffff", "team", "gone-pod") // a record of the forged VM's prefix for another pod

	rep := c.Scan(context.Background())
	require.Empty(t, rep.Error)
	items := byID(rep)
	assert.Equal(t, ActionWait, items["i-dead"].Action, items["i-dead"].Why)
	assert.Equal(t, ActionKeep, items["i-live"].Action)
	assert.Equal(t, ActionReport, items["i-untied"].Action)
	assert.Equal(t, ActionKeep, items["i-forged"].Action)
	assert.Contains(t, items["i-forged"].Why, "forged or colliding")
	assert.Empty(t, cloud.deleted, "the first sighting deletes nothing")
	assert.True(t, rep.Tied())

	clk.t = clk.t.Add(4 * time.Minute)
	assert.Equal(t, ActionWait, byID(c.Scan(context.Background()))["i-dead"].Action, "still inside the grace")
	assert.Empty(t, cloud.deleted)

	clk.t = clk.t.Add(time.Minute)
	rep = c.Scan(context.Background())
	assert.Equal(t, ActionDeleted, byID(rep)["i-dead"].Action)
	assert.Equal(t, []string{"i-dead"}, cloud.deleted)

	raw, err := json.Marshal(rep)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "SECRETKEY", "the adaptor's TLS key is never read into a report")
}

// TestReportModeDeletesNothing: the default mode says what collect would
// delete and deletes nothing.
func TestReportModeDeletesNothing(t *testing.T) {
	made := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	cloud := &fakeCloud{vms: []provider.VM{{ID: "i-dead", Name: Name("web", sidA), State: provider.StateRunning, CreatedAt: made}}}
	c, clk, podsDir, _ := newCollector(t, ModeReport, cloud, nil)
	writeSandbox(t, podsDir, sidA, "team", "web")
	c.Scan(context.Background())
	clk.t = clk.t.Add(time.Hour)
	rep := c.Scan(context.Background())
	assert.Equal(t, ActionWouldDelete, byID(rep)["i-dead"].Action)
	assert.Contains(t, byID(rep)["i-dead"].Why, "--adaptor-vms=collect")
	assert.Empty(t, cloud.deleted)
}

// TestAVMThatComesBackToLifeRestartsItsGrace: a VM judged dead, then kept
// (kata has its sandbox again), starts its grace again.
func TestAVMThatComesBackToLifeRestartsItsGrace(t *testing.T) {
	made := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	cloud := &fakeCloud{vms: []provider.VM{{ID: "i-1", Name: Name("web", sidA), State: provider.StateRunning, CreatedAt: made}}}
	c, clk, podsDir, kataDir := newCollector(t, ModeCollect, cloud, nil)
	writeSandbox(t, podsDir, sidA, "team", "web")
	assert.Equal(t, ActionWait, byID(c.Scan(context.Background()))["i-1"].Action)
	require.NoError(t, os.MkdirAll(filepath.Join(kataDir, sidA), 0o755))
	clk.t = clk.t.Add(10 * time.Minute)
	assert.Equal(t, ActionKeep, byID(c.Scan(context.Background()))["i-1"].Action)
	require.NoError(t, os.RemoveAll(filepath.Join(kataDir, sidA)))
	clk.t = clk.t.Add(10 * time.Minute)
	assert.Equal(t, ActionWait, byID(c.Scan(context.Background()))["i-1"].Action, "the grace starts again")
	assert.Empty(t, cloud.deleted)
}

// TestUnreadableNodeStateJudgesNothing: when kata's directory cannot be
// read, the scan fails and nothing is judged, let alone deleted.
func TestUnreadableNodeStateJudgesNothing(t *testing.T) {
	made := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	cloud := &fakeCloud{vms: []provider.VM{{ID: "i-1", Name: Name("web", sidA), State: provider.StateRunning, CreatedAt: made}}}
	c, clk, podsDir, kataDir := newCollector(t, ModeCollect, cloud, nil)
	writeSandbox(t, podsDir, sidA, "team", "web")
	require.NoError(t, os.WriteFile(kataDir, []byte("not a directory"), 0o644))
	for range 3 {
		rep := c.Scan(context.Background())
		assert.Contains(t, rep.Error, "kata's sandbox directory")
		assert.Empty(t, rep.Items)
		clk.t = clk.t.Add(time.Hour)
	}
	assert.Empty(t, cloud.deleted)
}

// TestBadRecordsAreProblemsNotTies: an unreadable or pod-less apf.json
// ties nothing and is reported by path.
func TestBadRecordsAreProblemsNotTies(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "s1"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "s1", "apf.json"), []byte("{not json"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "s2"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "s2", "apf.json"), []byte(`{"pod-name":"x"}`), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "s3"), 0o755))             // no apf.json: caa's own sandbox, not a problem
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "s5", "apf.json"), 0o755)) // unreadable as a file
	writeSandbox(t, dir, "s4", "team", "ok")
	got, problems, err := ReadSandboxes(dir)
	require.NoError(t, err)
	assert.Equal(t, []Sandbox{{ID: "s4", Namespace: "team", Pod: "ok"}}, got)
	require.Len(t, problems, 3)
	joined := ""
	for _, p := range problems {
		joined += p.Error() + "\n"
	}
	assert.True(t, strings.Contains(joined, filepath.Join(dir, "s1", "apf.json")) && strings.Contains(joined, "names no pod"), joined)

	none, problems, err := ReadSandboxes(filepath.Join(dir, "missing"))
	assert.NoError(t, err)
	assert.Empty(t, none)
	assert.Empty(t, problems)
}

// TestRunStopsWhenNothingTiedRemains: the scan repeats while a tied VM is
// left, and stops once it is deleted: the untied VM alone is not scanned
// for again.
func TestRunStopsWhenNothingTiedRemains(t *testing.T) {
	made := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	cloud := &fakeCloud{vms: []provider.VM{
		{ID: "i-1", Name: Name("web", sidA), State: provider.StateRunning, CreatedAt: made},
		{ID: "i-untied", Name: Name("api", "c0c0c0c0dddd"), State: provider.StateRunning, CreatedAt: made},
	}}
	c, clk, podsDir, _ := newCollector(t, ModeCollect, cloud, nil)
	writeSandbox(t, podsDir, sidA, "team", "web")
	var reports []Report
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.Run(ctx, time.Millisecond, func(r Report) {
		reports = append(reports, r)
		clk.t = clk.t.Add(3 * time.Minute)
	})
	require.NoError(t, ctx.Err(), "Run returned by itself")
	require.Len(t, reports, 3, "wait, wait, deleted; then nothing tied is left to scan for")
	assert.Equal(t, ActionDeleted, byID(reports[2])["i-1"].Action)
	assert.Equal(t, ActionReport, byID(reports[2])["i-untied"].Action)
	assert.Equal(t, []string{"i-1"}, cloud.deleted)
}

// TestANodeWithoutAdaptorRecordsListsNothing: with no sandbox record of
// the adaptor's on the node, no VM could be tied, so the cloud is not
// listed at all, and Run ends after the one look.
func TestANodeWithoutAdaptorRecordsListsNothing(t *testing.T) {
	made := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	cloud := &fakeCloud{vms: []provider.VM{{ID: "i-1", Name: Name("web", sidA), State: provider.StateRunning, CreatedAt: made}}}
	c, _, _, _ := newCollector(t, ModeCollect, cloud, nil)
	var reports []Report
	c.Run(context.Background(), time.Millisecond, func(r Report) { reports = append(reports, r) })
	require.Len(t, reports, 1)
	assert.Contains(t, reports[0].Skipped, "has not run on this node")
	assert.Zero(t, cloud.lists)
	assert.Empty(t, cloud.deleted)
}
