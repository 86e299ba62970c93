package rollout

import (
	"fmt"
	"strings"
	"time"
)

// Outcome is what a rollout run observed besides the caa pods' timeline:
// the window of the rollout, what the DaemonSet allowed, each peer pod's VM
// before and after, the cloud's write counters, and caa processes that
// failed. Facts turns it and the timeline into the report's sentences, so
// the report says what happened, also when the test's asserts failed.
type Outcome struct {
	// Start is the image change, End when the rollout was seen complete.
	Start, End time.Time
	// Allowed is how many nodes the update strategy lets be without a
	// ready caa at once (maxUnavailable, scaled to the node count).
	Allowed int
	// PeerPods are every peer pod of the run.
	PeerPods []PeerPod
	// Creates and Deletes are the cloud's counters over the whole run.
	Creates, Deletes int64
	// Trouble lists caa processes that exited, restarted or failed to
	// start, one line each.
	Trouble []string
}

// PeerPod is one peer pod's VM history over the rollout.
type PeerPod struct {
	Name, Node string
	// VMBefore is its live VM just before the image change, VMAfter just
	// after the rollout ("": none).
	VMBefore, VMAfter string
	// Killed: its VM was killed behind caa's back during the rollout.
	Killed bool
	// NewVMs are the creation times of the VMs made for it after Start.
	NewVMs []time.Time
}

// Facts computes the report's findings, one sentence each; a sentence
// whose expectation the recording does not meet says so and how.
func Facts(tl Timeline, o Outcome, rows []NodeRow) []string {
	return []string{
		availabilityFact(tl, o),
		gapsFact(tl, o),
		writesFact(o),
		vmsFact(o, rows),
		readinessFact(tl, rows),
		troubleFact(o),
	}
}

// availabilityFact compares the most nodes without a ready caa at once
// with what the update strategy allows.
func availabilityFact(tl Timeline, o Outcome) string {
	worst := tl.MaxUnavailable(o.Start, o.End)
	switch {
	case worst.Max == 0:
		return "no node was without a ready caa at any moment of the rollout"
	case worst.Max <= o.Allowed:
		return fmt.Sprintf("at most %d %s without a ready caa at any moment of the rollout (the update strategy allows %d)",
			worst.Max, nodes(worst.Max), o.Allowed)
	}
	return fmt.Sprintf("VIOLATED: %d nodes were without a ready caa at once (%s, first at %s), more than the %d the update strategy allows",
		worst.Max, strings.Join(worst.Nodes, ", "), since(o.Start, worst.At), o.Allowed)
}

// gap is a time a node had no serving caa; open: it lasted past the end.
type gap struct {
	from, to time.Time
	open     bool
}

// gaps returns each node's times without a serving caa within [from, to].
func (tl Timeline) gaps(from, to time.Time) map[string][]gap {
	out := map[string][]gap{}
	for node, steps := range tl.NodeReady() {
		for i, st := range steps {
			if st.Value != 0 {
				continue
			}
			g := gap{from: st.At}
			if i+1 < len(steps) {
				g.to = steps[i+1].At
			}
			if i+1 == len(steps) || g.to.After(to) {
				g.to, g.open = to, true
			}
			if g.from.Before(from) {
				g.from = from
			}
			if g.to.After(g.from) {
				out[node] = append(out[node], g)
			}
		}
	}
	return out
}

// gapsFact says which nodes were without a ready caa, how often and for
// how long, and whether one still was at the end.
func gapsFact(tl Timeline, o Outcome) string {
	gaps := tl.gaps(o.Start, o.End)
	var longest time.Duration
	var longestNode string
	var never, twice, open []string
	for _, n := range tl.Nodes {
		gs := gaps[n]
		switch {
		case len(gs) == 0:
			never = append(never, n)
		case len(gs) > 1:
			twice = append(twice, fmt.Sprintf("%s %d times", n, len(gs)))
		}
		for _, g := range gs {
			if d := g.to.Sub(g.from); d > longest || longestNode == "" {
				longest, longestNode = d, n
			}
			if g.open {
				open = append(open, n)
			}
		}
	}
	var parts []string
	if longestNode == "" {
		parts = append(parts, "no node was ever without a ready caa during the rollout")
	} else {
		parts = append(parts, fmt.Sprintf("the longest a node went without a ready caa: %s (%s)", seconds(longest), longestNode))
	}
	if len(never) > 0 && longestNode != "" {
		parts = append(parts, fmt.Sprintf("never without one: %s", strings.Join(never, ", ")))
	}
	if len(twice) > 0 {
		parts = append(parts, "UNEXPECTED: without one more than once: "+strings.Join(twice, ", "))
	}
	if len(open) > 0 {
		parts = append(parts, "VIOLATED: still without a ready caa when the rollout was seen complete: "+strings.Join(open, ", "))
	}
	return strings.Join(parts, "; ")
}

// writesFact compares the cloud's writes with one create per peer pod (the
// v1 deploy) plus one per killed VM, and no delete.
func writesFact(o Outcome) string {
	killed := 0
	for _, p := range o.PeerPods {
		if p.Killed {
			killed++
		}
	}
	want := int64(len(o.PeerPods) + killed)
	var parts []string
	if o.Deletes == 0 {
		parts = append(parts, "cloud deletes: 0")
	} else {
		parts = append(parts, fmt.Sprintf("VIOLATED: cloud deletes: %d (caa must not delete a VM here)", o.Deletes))
	}
	switch {
	case o.Creates == want:
		parts = append(parts, fmt.Sprintf("cloud creates: %d, as many as peer pods (%d) plus killed VMs (%d)",
			o.Creates, len(o.PeerPods), killed))
	default:
		parts = append(parts, fmt.Sprintf("VIOLATED: cloud creates: %d, not one per peer pod (%d) plus one per killed VM (%d) = %d",
			o.Creates, len(o.PeerPods), killed, want))
	}
	return strings.Join(parts, "; ")
}

// vmsFact says which peer pods kept their VM and whether each killed one
// got exactly one new VM before its node's new caa turned ready.
func vmsFact(o Outcome, rows []NodeRow) string {
	readyAt := map[string]time.Time{}
	for _, r := range rows {
		readyAt[r.Node] = r.NewReadyAt
	}
	var kept, notKilled, killed int
	var lost, badKilled []string
	for _, p := range o.PeerPods {
		if !p.Killed {
			notKilled++
			switch {
			case p.VMBefore == "":
				lost = append(lost, p.Name+" (no VM before the rollout)")
			case p.VMAfter != p.VMBefore:
				lost = append(lost, fmt.Sprintf("%s (VM %s, then %s)", p.Name, p.VMBefore, orNone(p.VMAfter)))
			case len(p.NewVMs) > 0:
				lost = append(lost, fmt.Sprintf("%s (%d VMs created for it)", p.Name, len(p.NewVMs)))
			default:
				kept++
			}
			continue
		}
		killed++
		ready := readyAt[p.Node]
		switch {
		case len(p.NewVMs) != 1:
			badKilled = append(badKilled, fmt.Sprintf("%s got %d new VMs", p.Name, len(p.NewVMs)))
		case p.VMAfter == "" || p.VMAfter == p.VMBefore:
			badKilled = append(badKilled, fmt.Sprintf("%s has no live replacement (VM after: %s)", p.Name, orNone(p.VMAfter)))
		case ready.IsZero():
			badKilled = append(badKilled, fmt.Sprintf("%s: its node %s never had a new caa turn ready", p.Name, p.Node))
		case !p.NewVMs[0].Before(ready):
			badKilled = append(badKilled, fmt.Sprintf("%s got its new VM %s after %s's new caa turned ready",
				p.Name, p.NewVMs[0].Sub(ready).Round(time.Millisecond), p.Node))
		}
	}
	var parts []string
	if len(lost) == 0 {
		parts = append(parts, fmt.Sprintf("%d of %d peer pods kept the same VM (every one whose VM was not killed)", kept, len(o.PeerPods)))
	} else {
		parts = append(parts, fmt.Sprintf("VIOLATED: %d of the %d peer pods whose VM was not killed kept it; not: %s",
			kept, notKilled, list(lost)))
	}
	switch {
	case killed == 0:
		parts = append(parts, "no VM was killed")
	case len(badKilled) == 0:
		parts = append(parts, fmt.Sprintf("the %d whose VM was killed each got exactly one new VM before their node's new caa turned ready", killed))
	default:
		parts = append(parts, fmt.Sprintf("VIOLATED: of the %d whose VM was killed, %s", killed, list(badKilled)))
	}
	return strings.Join(parts, "; ")
}

// readinessFact says whether each node's new caa turned ready, and ready
// after a converged startup pass.
func readinessFact(tl Timeline, rows []NodeRow) string {
	var missing, notConverged []string
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.Node] = true
		switch {
		case r.NewReadyAt.IsZero():
			missing = append(missing, r.Node+" (no new caa turned ready)")
		case !r.Reported:
			missing = append(missing, r.Node+" (its new caa did not answer /status and /metrics at its first readiness)")
		case !r.Converged || r.PendingAtReady > 0:
			notConverged = append(notConverged, fmt.Sprintf("%s (%d pods pending)", r.Node, r.PendingAtReady))
		}
	}
	for _, n := range tl.Nodes {
		if !seen[n] {
			missing = append(missing, n+" (not updated)")
		}
	}
	var parts []string
	if len(missing) > 0 {
		parts = append(parts, "VIOLATED: no report of a ready new caa from "+list(missing))
	}
	if len(notConverged) > 0 {
		parts = append(parts, "VIOLATED: ready before a converged startup pass: "+list(notConverged))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("each of the %d new caa processes reported a converged startup pass with nothing pending (/status, /metrics) at its first readiness", len(rows))
	}
	return strings.Join(parts, "; ")
}

func troubleFact(o Outcome) string {
	if len(o.Trouble) == 0 {
		return "no caa process exited, restarted or failed to start"
	}
	return fmt.Sprintf("VIOLATED: %d caa process event(s) of trouble: %s", len(o.Trouble), list(o.Trouble))
}

// list joins at most five items and says how many more there were.
func list(items []string) string {
	const shown = 5
	if len(items) <= shown {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:shown], ", ") + fmt.Sprintf(" and %d more", len(items)-shown)
}

func nodes(n int) string {
	if n == 1 {
		return "node"
	}
	return "nodes"
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// since is t as seconds after start, as the table prints times.
func since(start, t time.Time) string { return fmt.Sprintf("%+.1fs", t.Sub(start).Seconds()) }
