package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

// getter is a provider that only answers Get, and counts the calls.
type getter struct {
	provider.Provider
	vms  map[string]provider.VM
	gets []string
}

func (g *getter) Get(_ context.Context, id string) (provider.VM, error) {
	g.gets = append(g.gets, id)
	if vm, ok := g.vms[id]; ok {
		return vm, nil
	}
	return provider.VM{}, provider.ErrNotFound
}

func nodeWithView(t *testing.T, v *View) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	if v != nil {
		s, err := v.Encode()
		require.NoError(t, err)
		n.Annotations = map[string]string{ViewAnnotation: s}
	}
	return n
}

func TestNodeAudit(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC)
	sel := provider.Selector{Cluster: "c1", Node: "n1"}
	records := []ledger.Record{{PodUID: "a-uid", VMID: "a"}, {PodUID: "b-uid", VMID: "b"}, {PodUID: "new-uid"}}
	fresh := func(vms ...ViewVM) *View {
		return &View{At: now.Add(-3 * time.Minute), Every: Duration(5 * time.Minute), VMs: vms}
	}
	running := func(id string) ViewVM {
		return ViewVM{ID: id, State: provider.StateRunning, PodUID: id + "-uid", Key: id + "-k"}
	}
	elsewhere := vmOf("x", "n2", provider.StateRunning)
	ours := vmOf("y", "n1", provider.StateRunning)

	cases := map[string]struct {
		view     *View
		ok       bool
		listed   []string
		gets     []string
		matched  int64
		withRead int64
	}{
		"no cluster caa":                  {view: nil, ok: false},
		"the leader gone two intervals":   {view: &View{At: now.Add(-11 * time.Minute), Every: Duration(5 * time.Minute)}, ok: false},
		"the view agrees with the ledger": {view: fresh(running("a"), running("b")), ok: true, listed: []string{"a", "b"}, matched: 1},
		"a recorded VM shown gone: left for a read by id": {
			view: fresh(running("a"), ViewVM{ID: "b", State: provider.StateTerminated}), ok: true, listed: []string{"a"}, withRead: 1,
		},
		"a recorded VM not shown: left for a read by id": {view: fresh(running("a")), ok: true, listed: []string{"a"}, withRead: 1},
		"unknown VMs: read by id, kept only if the cloud tags them for this node": {
			view: fresh(running("a"), running("b"), running("x"), running("y"), running("z")), ok: true,
			listed: []string{"a", "b", "y"}, gets: []string{"x", "y", "z"}, withRead: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := &getter{vms: map[string]provider.VM{"x": elsewhere, "y": ours}}
			a := &NodeAudit{Client: fake.NewClientset(nodeWithView(t, tc.view)), Provider: g, Now: func() time.Time { return now }}
			vms, ok := a.AuditVMs(context.Background(), sel, records)
			require.Equal(t, tc.ok, ok)
			var listed []string
			for _, vm := range vms {
				listed = append(listed, vm.ID)
				assert.True(t, sel.Matches(vm.Tags), "every VM listed carries this node's tags")
			}
			assert.ElementsMatch(t, tc.listed, listed)
			assert.ElementsMatch(t, tc.gets, g.gets)
			assert.Equal(t, tc.matched, a.Matched.Load())
			assert.Equal(t, tc.withRead, a.WithRead.Load())
			if !tc.ok {
				assert.Equal(t, int64(1), a.Alone.Load())
			}
		})
	}
}
