package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/health"
)

func newStatusCommand() *cobra.Command {
	var addr, output string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Ask the running daemon how it is: readiness and why, records by phase, last pass",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := parseFormat(output); err != nil {
				return err
			}
			snap, err := fetchStatus(cmd.Context(), addr, timeout)
			if err != nil {
				return err
			}
			if err := writeStatus(cmd.OutOrStdout(), output, snap); err != nil {
				return err
			}
			if !snap.Ready {
				return exitError{msg: "not ready: " + snap.Reason, code: exitFailure}
			}
			return nil
		},
	}
	// In the daemon's container CAA_HEALTH_ADDR names where /status is
	// served (a unix socket in the remote hypervisor mode, where the
	// node's port serves /metrics only), so `kubectl exec ... caa status`
	// finds it.
	cmd.Flags().StringVar(&addr, "addr", cli.EnvOr("CAA_STATUS_ADDR", cli.EnvOr("CAA_HEALTH_ADDR", "http://127.0.0.1:8000")),
		"the daemon's health address: host:port, a URL or unix:PATH (env CAA_STATUS_ADDR, else CAA_HEALTH_ADDR as the daemon reads it)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for the daemon")
	return cmd
}

func fetchStatus(ctx context.Context, addr string, timeout time.Duration) (health.Snapshot, error) {
	var snap health.Snapshot
	code, body, err := healthGet(ctx, addr, "/status", timeout)
	if err != nil {
		return snap, err
	}
	if code != http.StatusOK {
		return snap, fmt.Errorf("%s/status answered HTTP %d", addr, code)
	}
	if err := json.Unmarshal([]byte(body), &snap); err != nil {
		return snap, fmt.Errorf("%s/status: %w", addr, err)
	}
	return snap, nil
}

func writeStatus(w io.Writer, output string, s health.Snapshot) error {
	if done, err := writeData(w, output, s); done || err != nil {
		return err
	}
	now := time.Now()
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	ready := "yes"
	if !s.Ready {
		ready = "no: " + s.Reason
	}
	fmt.Fprintf(tw, "Ready:\t%s\n", ready)
	if s.Blocked != "" {
		fmt.Fprintf(tw, "Blocked:\t%s\n", s.Blocked)
	}
	fmt.Fprintf(tw, "Started:\t%s\n", stamp(s.StartedAt, now))
	if !s.ReadyAt.IsZero() {
		fmt.Fprintf(tw, "Time to ready:\t%s\n", time.Duration(s.TimeToReady))
	}
	if h := s.Handover; h != nil {
		fmt.Fprintf(tw, "Hand-over:\t%s\n", handoverLine(*h, now))
	}
	fmt.Fprintf(tw, "Passes:\t%d\n", s.Passes)
	if lp := s.LastPass; lp != nil {
		fmt.Fprintf(tw, "Last pass:\t%s, took %s, %d cloud writes, %d orphans deleted\n",
			stamp(lp.At, now), time.Duration(lp.Duration), lp.CloudWrites, lp.OrphansDeleted)
		if lp.Error != "" {
			fmt.Fprintf(tw, "Last pass error:\t%s\n", lp.Error)
		}
	}
	phases := make([]string, 0, len(s.Records))
	for p, n := range s.Records {
		phases = append(phases, fmt.Sprintf("%s %d", p, n))
	}
	sort.Strings(phases)
	fmt.Fprintf(tw, "Records:\t%s\n", dash(strings.Join(phases, ", ")))
	if s.Confidential != "" {
		fmt.Fprintf(tw, "Confidential:\t%s\n", s.Confidential)
	}
	byTEE := map[string]int{}
	for _, vm := range s.VMs {
		byTEE[vm.Confidential]++
	}
	kinds := make([]string, 0, len(byTEE))
	for k, n := range byTEE {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	fmt.Fprintf(tw, "VMs by TEE:\t%s\n", dash(strings.Join(kinds, ", ")))
	for _, n := range s.Pending {
		fmt.Fprintf(tw, "Pending:\t%s\n", n)
	}
	for _, n := range s.Failed {
		fmt.Fprintf(tw, "Failed:\t%s\n", n)
	}
	for _, l := range adaptorLines(s.AdaptorVMs) {
		fmt.Fprintln(tw, l)
	}
	return tw.Flush()
}

// handoverLine says in one line who handed the ledger to whom, when, how
// it ended and how long the node went without a reconciler.
func handoverLine(h health.Handover, now time.Time) string {
	dir := "to"
	if h.Role == health.RoleTookOver {
		dir = "from"
	}
	line := fmt.Sprintf("%s %s %s, %s, %s", strings.ReplaceAll(h.Role, "_", " "), dir, h.Peer, stamp(h.StartedAt, now), strings.ReplaceAll(h.Outcome, "_", " "))
	if h.Took > 0 {
		line += fmt.Sprintf(", took %s", time.Duration(h.Took))
	}
	if h.Gap > 0 {
		line += fmt.Sprintf(", no reconciler for %s", time.Duration(h.Gap))
	}
	if h.Reason != "" {
		line += ": " + h.Reason
	}
	return line
}

// adaptorLines are `caa status`'s lines for the adaptor's VMs.
func adaptorLines(a *health.AdaptorVMs) []string {
	if a == nil {
		return nil
	}
	head := fmt.Sprintf("Adaptor VMs:\t%d found, mode %s, %d sandbox records on this node", len(a.VMs), a.Mode, a.Sandboxes)
	if a.Error != "" {
		head += "; last scan failed: " + a.Error
	}
	if a.Skipped != "" {
		head = "Adaptor VMs:\tnot looked for: " + a.Skipped
	}
	lines := []string{head}
	for _, p := range a.Problems {
		lines = append(lines, "Adaptor problem:\t"+p)
	}
	for _, vm := range a.VMs {
		lines = append(lines, fmt.Sprintf("Adaptor VM:\t%s %s (%s): %s: %s", vm.ID, vm.Name, vm.State, vm.Action, vm.Why))
	}
	return lines
}
