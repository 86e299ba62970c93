package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/provider"
)

// ViewAnnotation on a Node holds what the cluster caa's last listing showed
// of that node's VMs (a View, as JSON). The node's caa reads its own Node
// at each audit; the apiserver, not the cloud, carries it, and the annotation
// goes with the Node when the Node is deleted.
const ViewAnnotation = "caa.dev/cloud-view"

// View is one node's part of a cluster listing: each VM's id, state and
// identity tags, when the listing started, and how often the leader lists
// (so a reader can tell a live leader from a gone one).
type View struct {
	At    time.Time `json:"at"`
	Every Duration  `json:"every"`
	VMs   []ViewVM  `json:"vms"`
}

// ViewVM is one VM in a View.
type ViewVM struct {
	ID     string         `json:"id"`
	State  provider.State `json:"state"`
	PodUID string         `json:"pod,omitempty"`
	Key    string         `json:"key,omitempty"`
}

// Duration is a time.Duration written as "10m0s".
type Duration time.Duration

// MarshalJSON writes the duration as Go prints it.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads what MarshalJSON wrote.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Views splits a cluster listing by node tag, for the nodes named: a node
// with no VM gets an empty View (the cloud showed it none), which is news
// to its caa too.
func Views(at time.Time, every time.Duration, vms []provider.VM, nodes []string) map[string]View {
	out := make(map[string]View, len(nodes))
	for _, n := range nodes {
		out[n] = View{At: at.UTC(), Every: Duration(every), VMs: []ViewVM{}}
	}
	for _, vm := range vms {
		o := vm.Owner()
		v, ok := out[o.Node]
		if !ok {
			continue
		}
		v.VMs = append(v.VMs, ViewVM{ID: vm.ID, State: vm.State, PodUID: o.PodUID, Key: o.Key})
		out[o.Node] = v
	}
	for n, v := range out {
		slices.SortFunc(v.VMs, func(a, b ViewVM) int { return strings.Compare(a.ID, b.ID) })
		out[n] = v
	}
	return out
}

// Encode is the annotation's value.
func (v View) Encode() (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode the cloud view: %w", err)
	}
	return string(b), nil
}

// SameVMs reports whether two views show the same VMs in the same states.
func (v View) SameVMs(o View) bool { return slices.Equal(v.VMs, o.VMs) }

// ParseView reads the annotation's value.
func ParseView(s string) (View, error) {
	var v View
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return View{}, fmt.Errorf("annotation %s: %w", ViewAnnotation, err)
	}
	if v.At.IsZero() || v.Every <= 0 {
		return View{}, errors.New("annotation " + ViewAnnotation + ": no listing time or interval")
	}
	return v, nil
}

// Fresh reports whether the view is recent enough to audit against: its
// listing is at most two of the leader's intervals old. Past that the
// leader is taken for gone and the node audits alone.
func (v View) Fresh(now time.Time) bool {
	return now.Sub(v.At) <= 2*time.Duration(v.Every) && !v.At.After(now.Add(time.Duration(v.Every)))
}
