package cluster

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/caa-project/caa/pkg/provider"
)

// presence is a NodePresence of fixed answers.
type presence map[string]struct {
	present bool
	last    time.Time
}

func (p presence) Presence(name string) (bool, time.Time) {
	n := p[name]
	return n.present, n.last
}

func vmOf(id, node string, st provider.State) provider.VM {
	return provider.VM{ID: id, State: st, Tags: provider.Spec{
		Key: id + "-k", Cluster: "c1", Node: node, PodUID: id + "-uid", PodNamespace: "ns", PodName: id,
	}.Tags()}
}

func ids(cs []Candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.VM.ID)
	}
	return out
}

func TestDepartedNeedsTwoListingsAGraceApart(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	grace := 10 * time.Minute
	gone := t0.Add(-time.Minute) // the delete event, before the first listing
	nodes := presence{"gone": {false, gone}, "here": {true, t0}}
	vms := []provider.VM{vmOf("a", "gone", provider.StateRunning), vmOf("b", "gone", provider.StateStopped), vmOf("c", "here", provider.StateRunning)}
	d := &Departed{Cluster: "c1", Grace: grace}

	assert.Empty(t, d.Observe(t0, vms, nodes), "first sighting")
	assert.Equal(t, 2, d.Waiting())
	assert.Empty(t, d.Observe(t0.Add(grace-time.Second), vms, nodes), "second sighting, short of the grace")
	ready := d.Observe(t0.Add(grace), vms, nodes)
	assert.ElementsMatch(t, []string{"a", "b"}, ids(ready), "alive and dead VMs of the gone node; never the node that exists")
	for _, c := range ready {
		assert.Equal(t, t0, c.FirstSeen)
		assert.Equal(t, "gone", c.Node)
	}
}

func TestDepartedNeverTakes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	other := vmOf("other", "gone", provider.StateRunning)
	other.Tags[provider.TagCluster] = "c2"
	unmanaged := vmOf("unmanaged", "gone", provider.StateRunning)
	delete(unmanaged.Tags, provider.TagManagedBy)
	noNode := vmOf("nonode", "", provider.StateRunning)
	cases := map[string]struct {
		vm    provider.VM
		nodes presence
	}{
		"a VM of a node that exists, NotReady or cordoned alike": {vmOf("v", "n", provider.StateRunning), presence{"n": {true, t0}}},
		"a VM of another cluster":                                {other, presence{}},
		"a VM caa does not manage":                               {unmanaged, presence{}},
		"a VM without a node tag":                                {noNode, presence{}},
		"a VM already stopping":                                  {vmOf("v", "gone", provider.StateStopping), presence{}},
		"a VM already terminated":                                {vmOf("v", "gone", provider.StateTerminated), presence{}},
		"a VM in an unknown state":                               {vmOf("v", "gone", provider.StateUnknown), presence{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d := &Departed{Cluster: "c1", Grace: time.Minute}
			for i := range 5 {
				assert.Empty(t, d.Observe(t0.Add(time.Duration(i)*time.Hour), []provider.VM{tc.vm}, tc.nodes))
			}
		})
	}
}

func TestDepartedStartsOverWhenTheNodeCameBack(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	grace := 10 * time.Minute
	vms := []provider.VM{vmOf("a", "n", provider.StateRunning)}
	d := &Departed{Cluster: "c1", Grace: grace}
	assert.Empty(t, d.Observe(t0, vms, presence{"n": {false, t0.Add(-time.Second)}}))
	// Re-created and deleted again in between: seen existing after the
	// first sighting, so that sighting no longer counts.
	recreated := presence{"n": {false, t0.Add(5 * time.Minute)}}
	assert.Empty(t, d.Observe(t0.Add(grace), vms, recreated))
	assert.Empty(t, d.Observe(t0.Add(grace+grace/2), vms, recreated))
	assert.Equal(t, []string{"a"}, ids(d.Observe(t0.Add(2*grace), vms, recreated)))

	// Present at a listing: forgotten, and the wait starts afresh after.
	d = &Departed{Cluster: "c1", Grace: grace}
	assert.Empty(t, d.Observe(t0, vms, presence{"n": {false, t0.Add(-time.Second)}}))
	assert.Empty(t, d.Observe(t0.Add(grace/2), vms, presence{"n": {true, t0.Add(grace / 2)}}))
	assert.Empty(t, d.Observe(t0.Add(grace), vms, presence{"n": {false, t0.Add(grace / 2)}}))
	assert.Empty(t, d.Observe(t0.Add(grace+grace/2), vms, presence{"n": {false, t0.Add(grace / 2)}}))
	assert.Equal(t, []string{"a"}, ids(d.Observe(t0.Add(2*grace), vms, presence{"n": {false, t0.Add(grace / 2)}})))
}

func TestDepartedForgetsVMsNoLongerListed(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := &Departed{Cluster: "c1", Grace: time.Minute}
	nodes := presence{}
	d.Observe(t0, []provider.VM{vmOf("a", "n", provider.StateRunning)}, nodes)
	assert.Equal(t, 1, d.Waiting())
	d.Observe(t0.Add(time.Minute), nil, nodes)
	assert.Zero(t, d.Waiting(), "a VM gone from the listing is forgotten")
	assert.Empty(t, d.Observe(t0.Add(2*time.Minute), []provider.VM{vmOf("a", "n", provider.StateRunning)}, nodes),
		"seen again: a first sighting")
}
