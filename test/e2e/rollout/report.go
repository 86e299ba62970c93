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
	// OldStopAt is when the old pod's deletion began (the node's caa
	// stopped counting as ready), OldGoneAt when its object was gone,
	// NewReadyAt when the new pod turned Ready.
	OldStopAt, OldGoneAt, NewReadyAt time.Time
	// PeerPods on the node; Adopted kept their VM; Recreated got a new VM
	// from the new caa (the VMs killed during the rollout).
	PeerPods, Adopted, Recreated int
	// CaaTimeToReady is the new caa's own start-to-ready time (/status).
	CaaTimeToReady time.Duration
	// Reported: the new caa answered /status and /metrics at its first
	// readiness. Converged: what it answered showed a startup pass that
	// ran to its end, a converged pass counted, and PendingAtReady pods
	// pending (which must be none).
	Reported, Converged bool
	PendingAtReady      int
}

// WithoutReadyCaa is how long the node had no ready caa.
func (r NodeRow) WithoutReadyCaa() time.Duration {
	if r.OldStopAt.IsZero() || r.NewReadyAt.IsZero() {
		return 0
	}
	return r.NewReadyAt.Sub(r.OldStopAt)
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
	b.WriteString("Times are seconds after the image change (T0); nodes in the order their old caa was told to stop.\n\n")
	b.WriteString("| node | old caa pod | stop requested | old pod gone | new caa pod | new pod ready | node without a ready caa | peer pods | VMs adopted | VMs recreated | caa time to ready |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %d | %d | %d | %s |\n",
			row.Node, row.OldPod, r.at(row.OldStopAt), r.at(row.OldGoneAt), row.NewPod, r.at(row.NewReadyAt),
			seconds(row.WithoutReadyCaa()), row.PeerPods, row.Adopted, row.Recreated, seconds(row.CaaTimeToReady))
	}
	if len(r.Facts) > 0 {
		b.WriteString("\nWhat the recording shows:\n\n")
		for _, f := range r.Facts {
			fmt.Fprintf(&b, "- %s\n", f)
		}
	}
	if r.Picture != "" {
		fmt.Fprintf(&b, "\n![caa readiness and running VMs per node over the rollout](%s)\n", r.Picture)
	}
	return b.String()
}

// at is t as seconds after the report's start.
func (r Report) at(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return fmt.Sprintf("%+.1fs", t.Sub(r.Start).Seconds())
}

func seconds(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}
