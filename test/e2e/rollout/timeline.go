// Package rollout holds the end-to-end test of caa's rolling update under
// the real DaemonSet controller, and the timeline it records: caa pods'
// readiness per node and running VMs per node over time, from which the
// test asserts availability and writes a report and an SVG picture.
package rollout

import (
	"slices"
	"sort"
	"time"
)

// PodSample is one observed state of a caa pod, as a watch saw it.
type PodSample struct {
	At   time.Time
	Pod  string
	UID  string
	Node string
	Tag  string
	// Ready is the pod's Ready condition; Deleting that its
	// deletionTimestamp is set; Gone that the object was deleted.
	Ready    bool
	Deleting bool
	Gone     bool
}

// serves reports whether the pod counts as the node's ready caa: a pod
// being deleted does not, even while its process still answers.
func (s PodSample) serves() bool { return s.Ready && !s.Deleting && !s.Gone }

// ProcSample is what one caa process answered on /status, recorded when
// it changed: whether it was ready, why not, its last hand-over, and from
// those whether it reconciled its node. Sent and At bracket the moment the
// process answered. A process that cannot be reached (starting, or gone)
// counts as neither; Gone marks the end of the process.
type ProcSample struct {
	Sent, At time.Time
	Pod      string
	UID      string
	Node     string
	Tag      string
	PID      int
	Ready    bool
	// Reconciling: ready, and not handing its ledger over. An old caa
	// stays ready while a new one takes its ledger over (so that its pod
	// stays Ready for the DaemonSet controller), but it has stopped work.
	Reconciling bool
	Reason      string
	Gone        bool
	// Handover is the process's last hand-over, as /status showed it.
	Handover *HandoverView
}

// HandoverView is the part of /status's hand-over block the report uses.
type HandoverView struct {
	Role, Peer, Outcome, Reason string
	StartedAt                   time.Time
	Took, Gap                   time.Duration
}

// VMSample is the number of running VMs per node at one moment.
type VMSample struct {
	At      time.Time
	Running map[string]int
}

// Mark is a moment worth a line in the picture (the image change, VMs
// killed).
type Mark struct {
	At    time.Time
	Label string
}

// Timeline is what a rollout test recorded.
type Timeline struct {
	Nodes []string
	Pods  []PodSample // in the order seen
	// Procs are the caa processes' answers, in the order recorded.
	Procs []ProcSample
	VMs   []VMSample // in time order
	Marks []Mark
}

// Step is one value of a step function from At until the next step.
type Step struct {
	At    time.Time
	Value int
}

// NodeReady returns, per node, when it had a serving caa (1) and when not
// (0), starting not ready; only changes are listed.
func (tl Timeline) NodeReady() map[string][]Step {
	out := map[string][]Step{}
	state := map[string]PodSample{} // by UID
	for _, n := range tl.Nodes {
		out[n] = []Step{{Value: 0}}
	}
	for _, s := range tl.sortedPods() {
		state[s.UID] = s
		v := 0
		for _, p := range state {
			if p.Node == s.Node && p.serves() {
				v = 1
			}
		}
		steps := out[s.Node]
		if len(steps) == 0 || steps[len(steps)-1].Value != v {
			out[s.Node] = append(steps, Step{At: s.At, Value: v})
		}
	}
	return out
}

// NodeReconciling returns, per node, when one of its caa processes
// reconciled (answered ready on /status, and was not handing its ledger
// over) (1) and when none did (0), starting at 0 and listing changes only.
// Unlike NodeReady it looks at the processes, not at the pods' Ready
// condition: it shows the hand-over's gap.
func (tl Timeline) NodeReconciling() map[string][]Step {
	out := map[string][]Step{}
	for _, n := range tl.Nodes {
		out[n] = []Step{{Value: 0}}
	}
	procs := slices.Clone(tl.Procs)
	sort.SliceStable(procs, func(i, j int) bool { return procs[i].At.Before(procs[j].At) })
	state := map[string]ProcSample{} // by pod UID
	for _, s := range procs {
		state[s.UID] = s
		v := 0
		for _, p := range state {
			if p.Node == s.Node && p.Reconciling && !p.Gone {
				v = 1
			}
		}
		steps := out[s.Node]
		if steps[len(steps)-1].Value != v {
			out[s.Node] = append(steps, Step{At: s.At, Value: v})
		}
	}
	return out
}

// Window is a time span; Open: it had not ended when the recording did.
type Window struct {
	From, To time.Time
	Open     bool
}

// Len is the window's length.
func (w Window) Len() time.Duration { return w.To.Sub(w.From) }

// windows returns the spans of steps with value 0 that overlap [from, to],
// clipped to it.
func windows(steps []Step, from, to time.Time) []Window {
	var out []Window
	for i, st := range steps {
		if st.Value != 0 {
			continue
		}
		w := Window{From: st.At}
		if i+1 < len(steps) {
			w.To = steps[i+1].At
		}
		if i+1 == len(steps) || w.To.After(to) {
			w.To, w.Open = to, true
		}
		if w.From.Before(from) {
			w.From = from
		}
		if w.To.After(w.From) {
			out = append(out, w)
		}
	}
	return out
}

// NoReconciler returns, per node, the windows within [from, to] in which
// none of its caa processes reconciled.
func (tl Timeline) NoReconciler(from, to time.Time) map[string][]Window {
	out := map[string][]Window{}
	for node, steps := range tl.NodeReconciling() {
		if ws := windows(steps, from, to); len(ws) > 0 {
			out[node] = ws
		}
	}
	return out
}

// NodeVMs returns, per node, its running VM count over time, changes only.
func (tl Timeline) NodeVMs() map[string][]Step {
	out := map[string][]Step{}
	for _, s := range tl.VMs {
		for _, n := range tl.Nodes {
			v := s.Running[n]
			steps := out[n]
			if len(steps) == 0 || steps[len(steps)-1].Value != v {
				out[n] = append(steps, Step{At: s.At, Value: v})
			}
		}
	}
	return out
}

// Unavailability is the worst moment of a window.
type Unavailability struct {
	// Max is the most nodes without a serving caa at once; At is the
	// first moment it was reached, Nodes which nodes they were.
	Max   int
	At    time.Time
	Nodes []string
}

// MaxUnavailable returns the most nodes without a serving caa at once
// during [from, to], counting the state at from that earlier samples left.
func (tl Timeline) MaxUnavailable(from, to time.Time) Unavailability {
	state := map[string]PodSample{}
	var worst Unavailability
	check := func(at time.Time) {
		var down []string
		for _, n := range tl.Nodes {
			up := false
			for _, p := range state {
				if p.Node == n && p.serves() {
					up = true
				}
			}
			if !up {
				down = append(down, n)
			}
		}
		if len(down) > worst.Max {
			worst = Unavailability{Max: len(down), At: at, Nodes: down}
		}
	}
	checked := false
	for _, s := range tl.sortedPods() {
		if s.At.After(to) {
			break
		}
		if !s.At.Before(from) && !checked {
			check(from)
			checked = true
		}
		state[s.UID] = s
		if !s.At.Before(from) {
			check(s.At)
		}
	}
	if !checked {
		check(from)
	}
	return worst
}

// sortedPods is Pods in time order; samples of one moment keep the order
// they were seen in.
func (tl Timeline) sortedPods() []PodSample {
	out := slices.Clone(tl.Pods)
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// FirstPod returns the first sample matching match, and whether any did.
func (tl Timeline) FirstPod(match func(PodSample) bool) (PodSample, bool) {
	for _, s := range tl.sortedPods() {
		if match(s) {
			return s, true
		}
	}
	return PodSample{}, false
}

// Span is the first and last moment the timeline knows of.
func (tl Timeline) Span() (time.Time, time.Time) {
	var first, last time.Time
	see := func(t time.Time) {
		if t.IsZero() {
			return
		}
		if first.IsZero() || t.Before(first) {
			first = t
		}
		if t.After(last) {
			last = t
		}
	}
	for _, s := range tl.Pods {
		see(s.At)
	}
	for _, s := range tl.VMs {
		see(s.At)
	}
	for _, m := range tl.Marks {
		see(m.At)
	}
	for _, s := range tl.Procs {
		see(s.At)
	}
	return first, last
}
