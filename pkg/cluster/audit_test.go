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
	records := []ledger.Record{{PodUID: "a-uid", VMID: "a", Key: "a-k"}, {PodUID: "b-uid", VMID: "b", Key: "b-k"}, {PodUID: "new-uid"}}
	fresh := func(vms ...ViewVM) *View {
		return &View{At: now.Add(-3 * time.Minute), Every: Duration(5 * time.Minute), VMs: vms}
	}
	running := func(id string) ViewVM {
		return ViewVM{ID: id, State: provider.StateRunning, PodUID: id + "-uid", Key: id + "-k"}
	}
	run := provider.StateRunning

	cases := map[string]struct {
		view     *View
		maxAge   time.Duration
		ok       bool
		vouched  map[string]provider.State
		unknown  []string
		matched  int64
		withRead int64
	}{
		"no cluster caa":                {view: nil, ok: false},
		"the leader gone two intervals": {view: &View{At: now.Add(-11 * time.Minute), Every: Duration(5 * time.Minute)}, ok: false},
		"a view that claims a long interval is as old as this node allows": {
			view: &View{At: now.Add(-21 * time.Minute), Every: Duration(100 * time.Hour), VMs: []ViewVM{running("a")}}, ok: false,
		},
		"this node's own bound is shorter still": {
			view: fresh(running("a"), running("b")), maxAge: 2 * time.Minute, ok: false,
		},
		"a listing from the future": {
			view: &View{At: now.Add(30 * time.Minute), Every: Duration(time.Hour), VMs: []ViewVM{running("a")}}, ok: false,
		},
		"the view agrees with the ledger": {
			view: fresh(running("a"), running("b")), ok: true, vouched: map[string]provider.State{"a": run, "b": run}, matched: 1,
		},
		"a recorded VM shown gone: left for a read by id": {
			view: fresh(running("a"), ViewVM{ID: "b", State: provider.StateTerminated, PodUID: "b-uid", Key: "b-k"}), ok: true,
			vouched: map[string]provider.State{"a": run}, withRead: 1,
		},
		"a recorded VM not shown: left for a read by id": {
			view: fresh(running("a")), ok: true, vouched: map[string]provider.State{"a": run}, withRead: 1,
		},
		"a recorded VM shown under another pod or key: not vouched for": {
			view: fresh(running("a"), ViewVM{ID: "b", State: run, PodUID: "a-uid", Key: "a-k2"}), ok: true,
			vouched: map[string]provider.State{"a": run}, withRead: 1,
		},
		"unknown VMs: handed over as ids to read": {
			view: fresh(running("a"), running("b"), running("x"), running("y")), ok: true,
			vouched: map[string]provider.State{"a": run, "b": run}, unknown: []string{"x", "y"}, withRead: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a := &NodeAudit{Client: fake.NewClientset(nodeWithView(t, tc.view)), Now: func() time.Time { return now }, MaxAge: tc.maxAge}
			vouched, unknown, ok := a.AuditVMs(context.Background(), sel, records)
			require.Equal(t, tc.ok, ok)
			if tc.vouched == nil {
				tc.vouched = map[string]provider.State{}
			}
			if ok {
				assert.Equal(t, tc.vouched, vouched)
			}
			assert.ElementsMatch(t, tc.unknown, unknown)
			assert.Equal(t, tc.matched, a.Matched.Load())
			assert.Equal(t, tc.withRead, a.WithRead.Load())
			if !tc.ok {
				assert.Equal(t, int64(1), a.Alone.Load())
			}
		})
	}
}

// A fresh view is not taken for longer than ListEvery: the audit after it
// lists on its own (ok false), whatever the view says, and the count
// starts again, from a listing the view's absence made too.
func TestNodeAuditListsOnItsOwnWithinListEvery(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC)
	sel := provider.Selector{Cluster: "c1", Node: "n1"}
	records := []ledger.Record{{PodUID: "a-uid", VMID: "a", Key: "a-k"}}
	kube := fake.NewClientset(nodeWithView(t, nil))
	a := &NodeAudit{Client: kube, Now: func() time.Time { return now }, ListEvery: 25 * time.Minute}
	audit := func() bool {
		t.Helper()
		n, err := kube.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
		require.NoError(t, err)
		s, err := (&View{At: now, Every: Duration(10 * time.Minute), VMs: []ViewVM{{ID: "a", State: provider.StateRunning, PodUID: "a-uid", Key: "a-k"}}}).Encode()
		require.NoError(t, err)
		n.Annotations = map[string]string{ViewAnnotation: s}
		_, err = kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
		require.NoError(t, err)
		_, _, ok := a.AuditVMs(context.Background(), sel, records)
		return ok
	}
	var got []bool
	for range 8 {
		got = append(got, audit())
		now = now.Add(10 * time.Minute)
	}
	// t=0 (the startup listing was just before), 10, 20 from the view;
	// 30 lists; 40, 50 from the view; 60 lists; 70 from the view.
	assert.Equal(t, []bool{true, true, true, false, true, true, false, true}, got)
	assert.Equal(t, int64(2), a.Bounded.Load())
	assert.Equal(t, int64(2), a.Alone.Load())
}
