package rollout

import (
	"fmt"
	"strings"
	"time"
)

// NodeRow is one node's rollout, a row of the report's table.
type NodeRow struct {
	Node           string
	OldPod, NewPod string
	// OldStopAt is when the old caa was told to stop reconciling: the
	// hand-over request (Handover, from the old caa's /status) or the
	// start of its pod's deletion. OldDeletedAt is when its pod's deletion
	// began, OldGoneAt when its object was gone, NewReadyAt when the new
	// pod turned Ready, CaaReadyAt when the new caa itself turned ready
	// (its /status).
	OldStopAt, OldDeletedAt, OldGoneAt, NewReadyAt, CaaReadyAt time.Time
	Handover                                                   bool
	// NoReconciler is the node's window without a caa process answering
	// ready; CaaGap the hand-over gap the new caa reported (from the old
	// one stopping work to its own readiness); PodGap how long the node
	// had no Ready caa pod.
	NoReconciler   Window
	CaaGap, PodGap time.Duration
	// PeerPods on the node; Adopted kept their VM; Recreated got a new VM
	// from the new caa (the VMs killed during the rollout); Added are the
	// VMs of the pods created during the rollout.
	PeerPods, Adopted, Recreated, Added int
	// CaaTimeToReady is the new caa's own start-to-ready time (/status).
	CaaTimeToReady time.Duration
	// Reported: the new caa answered /status and /metrics at its first
	// readiness. Converged: what it answered showed a startup pass that
	// ran to its end, a converged pass counted, and PendingAtReady pods
	// pending (which must be none).
	Reported, Converged bool
	PendingAtReady      int
}

// Report is what the rollout report says.
type Report struct {
	Title    string
	Scenario string // a paragraph of markdown
	// Start is time zero of the report (the image change).
	Start time.Time
	Rows  []NodeRow
	// Facts are the checked results, one line each, as Facts computes
	// them from the timeline and the outcome.
	Facts []string
	// Picture is the SVG's file name, linked from the report.
	Picture string
}

// Markdown renders the report.
func (r Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", r.Title)
	if r.Scenario != "" {
		fmt.Fprintf(&b, "%s\n\n", strings.TrimSpace(r.Scenario))
	}
	if len(r.Rows) > 0 {
		r.table(&b)
		b.WriteString("\n")
	}
	if len(r.Facts) > 0 {
		b.WriteString("What the recording shows:\n\n")
		for _, f := range r.Facts {
			fmt.Fprintf(&b, "- %s\n", f)
		}
	}
	if r.Picture != "" {
		fmt.Fprintf(&b, "\n![caa readiness and running VMs per node over the rollout](%s)\n", r.Picture)
	}
	return b.String()
}

// table renders the rows.
func (r Report) table(b *strings.Builder) {
	b.WriteString("Times are seconds after the image change (T0); nodes in the order their old caa was told to stop " +
		"(asked to hand over, or its pod's deletion). \"No reconciling caa\" is the window in which no caa process of the node " +
		"answered ready on /status without handing its ledger over, as polled; \"hand-over gap\" is what caa reported itself, from the old caa " +
		"stopping work to the new caa's reconciler starting on the ledger (before its startup pass).\n\n")
	b.WriteString("| node | old caa pod | old caa told to stop | new caa pod | new caa ready | no reconciling caa | hand-over gap | " +
		"node without a Ready caa pod | new pod Ready | old pod gone | peer pods | VMs adopted | VMs recreated | VMs of added pods | caa time to ready |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %d | %d | %d | %s |\n",
			row.Node, row.OldPod, r.at(row.OldStopAt), row.NewPod, r.at(row.CaaReadyAt), r.window(row.NoReconciler),
			millis(row.CaaGap), seconds(row.PodGap), r.at(row.NewReadyAt), r.at(row.OldGoneAt),
			row.PeerPods, row.Adopted, row.Recreated, row.Added, seconds(row.CaaTimeToReady))
	}
}

// window is w's length and span, "—" for none.
func (r Report) window(w Window) string {
	if w.From.IsZero() {
		return "—"
	}
	open := ""
	if w.Open {
		open = ", still open"
	}
	return fmt.Sprintf("%s (%s to %s%s)", seconds(w.Len()), r.at(w.From), r.at(w.To), open)
}

// at is t as seconds after the report's start.
func (r Report) at(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return fmt.Sprintf("%+.1fs", t.Sub(r.Start).Seconds())
}

// millis is d to the millisecond, for the hand-over gap caa reports,
// which is often a few milliseconds.
func millis(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return d.Round(time.Millisecond).String()
}

func seconds(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}
