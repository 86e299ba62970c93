package rollout

import (
	"fmt"
	"strings"
	"time"
)

// windowSlack is how far a node's recorded window without a reconciling
// caa may reach past the new caa's own readiness: the /status poller sees
// a change at most one poll interval and one request late, on a loaded
// machine a little more.
const windowSlack = 1500 * time.Millisecond

// Outcome is what a rollout run observed besides the caa pods' timeline:
// the window of the rollout, what the DaemonSet allowed, each peer pod's VM
// before and after, the cloud's write counters, and caa processes that
// failed. Facts turns it and the timeline into the report's sentences, so
// the report says what happened, also when the test's asserts failed.
type Outcome struct {
	// Start is the image change, End when the rollout was seen complete.
	Start, End time.Time
	// Allowed is how many nodes the update strategy updates at once
	// (maxUnavailable plus maxSurge, scaled to the node count): the most
	// that may be without a Ready caa pod at once.
	Allowed int
	// Surge: the new caa pods started beside the old ones and took the
	// ledger over (a hand-over per node).
	Surge bool
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
	// Added: the pod was created during the rollout (no VM before).
	Added bool
	// NewVMs are the creation times of the VMs made for it after Start.
	NewVMs []time.Time
}

// Facts computes the report's findings, one sentence each; a sentence
// whose expectation the recording does not meet says so and how.
func Facts(tl Timeline, o Outcome, rows []NodeRow) []string {
	return []string{
		availabilityFact(tl, o),
		gapsFact(tl, o),
		reconcilerFact(tl, o, rows),
		writesFact(o),
		vmsFact(o, rows),
		readinessFact(tl, rows),
		troubleFact(o),
	}
}

// reconcilerFact says, per node, how long no caa process of it answered
// ready (as the /status poller saw it), whether that happened once and
// only between the old caa being told to stop and the new one's
// readiness, and what caa itself reported as the hand-over's gap.
func reconcilerFact(tl Timeline, o Outcome, rows []NodeRow) string {
	if len(tl.Procs) == 0 {
		return "no caa process's /status was recorded"
	}
	ws := tl.NoReconciler(o.Start, o.End)
	byNode := map[string]NodeRow{}
	for _, r := range rows {
		byNode[r.Node] = r
	}
	var each, bad []string
	var longest time.Duration
	for _, n := range tl.Nodes {
		w, r := ws[n], byNode[n]
		switch {
		case len(w) == 0:
			each = append(each, n+" never")
			continue
		case len(w) > 1:
			bad = append(bad, fmt.Sprintf("%s had %d such windows", n, len(w)))
		}
		for _, x := range w {
			longest = max(longest, x.Len())
			if x.Open {
				bad = append(bad, fmt.Sprintf("%s still had none at the end", n))
			}
		}
		text := fmt.Sprintf("%s %s (%s to %s)", n, seconds(w[0].Len()), since(o.Start, w[0].From), since(o.Start, w[0].To))
		if r.CaaGap > 0 {
			text += fmt.Sprintf(", of which the hand-over gap caa reported: %s", millis(r.CaaGap))
		}
		each = append(each, text)
		switch {
		case r.OldStopAt.IsZero() || r.CaaReadyAt.IsZero():
			bad = append(bad, n+": no stop of its old caa or no readiness of its new one to compare with")
		case w[0].From.Add(time.Second).Before(r.OldStopAt):
			bad = append(bad, fmt.Sprintf("%s: from %s, before its old caa was told to stop (%s)", n, since(o.Start, w[0].From), since(o.Start, r.OldStopAt)))
		case w[0].To.After(r.CaaReadyAt.Add(windowSlack)):
			bad = append(bad, fmt.Sprintf("%s: until %s, after its new caa was ready (%s)", n, since(o.Start, w[0].To), since(o.Start, r.CaaReadyAt)))
		}
	}
	what := "the old caa's pod deletion"
	if o.Surge {
		what = "the hand-over request"
	}
	text := fmt.Sprintf("time without a reconciling caa (no caa process answering ready on /status and not handing its ledger over), per node: %s; "+
		"each window ran from %s to the new caa's readiness", strings.Join(each, "; "), what)
	if len(bad) > 0 {
		text = "VIOLATED: " + text + "; but: " + list(bad)
	}
	return text
}

// availabilityFact compares the most nodes without a ready caa at once
// with what the update strategy allows.
func availabilityFact(tl Timeline, o Outcome) string {
	worst := tl.MaxUnavailable(o.Start, o.End)
	switch {
	case worst.Max == 0:
		return "no node was without a Ready caa pod at any moment of the rollout"
	case worst.Max <= o.Allowed:
		return fmt.Sprintf("at most %d %s without a Ready caa pod at any moment of the rollout (the update strategy updates %d at a time)",
			worst.Max, nodes(worst.Max), o.Allowed)
	}
	return fmt.Sprintf("VIOLATED: %d nodes were without a Ready caa pod at once (%s, first at %s), more than the %d the update strategy updates at a time",
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
		parts = append(parts, "no node was ever without a Ready caa pod during the rollout")
	} else {
		parts = append(parts, fmt.Sprintf("the longest a node went without a Ready caa pod: %s (%s)", seconds(longest), longestNode))
	}
	if len(never) > 0 && longestNode != "" {
		parts = append(parts, fmt.Sprintf("never without one: %s", strings.Join(never, ", ")))
	}
	if len(twice) > 0 {
		parts = append(parts, "UNEXPECTED: without one more than once: "+strings.Join(twice, ", "))
	}
	if len(open) > 0 {
		parts = append(parts, "VIOLATED: still without a Ready caa pod when the rollout was seen complete: "+strings.Join(open, ", "))
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
	// VMs created, not create calls: caa's preflight makes a dry-run
	// launch, which creates nothing.
	var parts []string
	if o.Deletes == 0 {
		parts = append(parts, "VMs deleted: 0")
	} else {
		parts = append(parts, fmt.Sprintf("VIOLATED: VMs deleted: %d (caa must not delete a VM here)", o.Deletes))
	}
	switch {
	case o.Creates == want:
		parts = append(parts, fmt.Sprintf("VMs created: %d, as many as peer pods (%d, of which %d added during the rollout) plus killed VMs (%d)",
			o.Creates, len(o.PeerPods), added(o), killed))
	default:
		parts = append(parts, fmt.Sprintf("VIOLATED: VMs created: %d, not one per peer pod (%d) plus one per killed VM (%d) = %d",
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
	var kept, notKilled, killed, newOK int
	var lost, badKilled, badAdded []string
	for _, p := range o.PeerPods {
		if p.Added {
			switch {
			case len(p.NewVMs) != 1:
				badAdded = append(badAdded, fmt.Sprintf("%s got %d VMs", p.Name, len(p.NewVMs)))
			case p.VMAfter == "":
				badAdded = append(badAdded, p.Name+" has no live VM")
			default:
				newOK++
			}
			continue
		}
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
		parts = append(parts, fmt.Sprintf("%d of the %d peer pods there before the rollout kept the same VM (every one whose VM was not killed)",
			kept, len(o.PeerPods)-added(o)))
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
	switch {
	case added(o) == 0:
	case len(badAdded) == 0:
		parts = append(parts, fmt.Sprintf("the %d created during the rollout each got exactly one VM", newOK))
	default:
		parts = append(parts, fmt.Sprintf("VIOLATED: of the %d created during the rollout, %s", added(o), list(badAdded)))
	}
	return strings.Join(parts, "; ")
}

// added counts the peer pods created during the rollout.
func added(o Outcome) int {
	n := 0
	for _, p := range o.PeerPods {
		if p.Added {
			n++
		}
	}
	return n
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
