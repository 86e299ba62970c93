package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

type format string

const (
	formatTable format = "table"
	formatJSON  format = "json"
	formatYAML  format = "yaml"
)

func parseFormat(s string) (format, error) {
	switch f := format(strings.ToLower(s)); f {
	case formatTable, formatJSON, formatYAML:
		return f, nil
	}
	return "", cli.UsageError{Err: fmt.Errorf("-o %q: want table, json or yaml", s)}
}

// writeData prints v as JSON or YAML; it reports false for table output,
// which each caller draws itself.
func writeData(w io.Writer, output string, v any) (bool, error) {
	f, err := parseFormat(output)
	if err != nil {
		return false, err
	}
	switch f {
	case formatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return true, enc.Encode(v)
	case formatYAML:
		data, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = w.Write(data)
		return true, err
	}
	return false, nil
}

func writeRecords(w io.Writer, output string, recs []ledger.Record, now time.Time) error {
	if recs == nil {
		recs = []ledger.Record{}
	}
	if done, err := writeData(w, output, recs); done || err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tNAMESPACE\tPHASE\tVM\tTYPE\tTEE\tATTEMPT\tAGE")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n",
			r.Name, r.Namespace, r.Phase, dash(r.VMID), dash(r.InstanceType), teeCell(r.Confidential), r.Attempt, age(r.CreatedAt, now))
	}
	return tw.Flush()
}

type recordDetail struct {
	Record  *ledger.Record `json:"record"`
	History []ledger.Event `json:"history"`
	// Sandboxes are the pod's kata sandboxes (remote hypervisor mode).
	Sandboxes []ledger.Sandbox `json:"sandboxes,omitempty"`
}

// writeRecordDetail draws a pod: its record (nil: deleted, or a pod of the
// remote hypervisor mode, which has sandboxes only), its history and its
// sandboxes.
func writeRecordDetail(w io.Writer, output string, rec *ledger.Record, hist []ledger.Event, sandboxes []ledger.Sandbox, now time.Time) error {
	if done, err := writeData(w, output, recordDetail{Record: rec, History: nonNil(hist), Sandboxes: sandboxes}); done || err != nil {
		return err
	}
	if rec == nil && len(hist) == 0 {
		return writeSandboxTable(w, sandboxes, now)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if rec == nil {
		fmt.Fprintln(tw, "Record:\t(deleted; history below)")
	} else {
		rows := [][2]string{
			{"Pod", rec.PodRef()}, {"Pod UID", rec.PodUID}, {"Node", rec.Node},
			{"Runtime class", dash(rec.RuntimeClass)}, {"Phase", string(rec.Phase)},
			{"Reason", dash(rec.Reason)}, {"Message", dash(rec.Message)},
			{"Provider", dash(rec.Provider)}, {"VM", dash(rec.VMID)}, {"VM name", dash(rec.VMName)},
			{"Replaces VM", replacesCell(rec.ReplacesVMID)}, {"Failed spec", dash(rec.FailedSpec)},
			{"Idempotency key", dash(rec.Key)}, {"Instance type", dash(rec.InstanceType)},
			{"Confidential (TEE)", teeCell(rec.Confidential)}, {"Image", dash(rec.Image)}, {"Zone", dash(rec.Zone)}, {"IPs", dash(strings.Join(rec.IPs, ", "))},
			{"Attempt", fmt.Sprint(rec.Attempt)}, {"Revision", fmt.Sprint(rec.Revision)},
			{"Created", stamp(rec.CreatedAt, now)}, {"Updated", stamp(rec.UpdatedAt, now)},
			{"Last seen in cloud", stamp(rec.LastSeenAt, now)},
		}
		for _, row := range rows {
			fmt.Fprintf(tw, "%s:\t%s\n", row[0], row[1])
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nHistory:")
	if err := writeEventTable(w, hist, false); err != nil {
		return err
	}
	if len(sandboxes) > 0 {
		fmt.Fprintln(w, "\nSandboxes:")
		return writeSandboxTable(w, sandboxes, now)
	}
	return nil
}

func writeSandboxes(w io.Writer, output string, ss []ledger.Sandbox, now time.Time) error {
	if done, err := writeData(w, output, nonNil(ss)); done || err != nil {
		return err
	}
	return writeSandboxTable(w, ss, now)
}

// writeSandboxTable draws one line per sandbox; the id is cut to 12
// characters, as kata and crictl show it.
func writeSandboxTable(w io.Writer, ss []ledger.Sandbox, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tPOD\tNAMESPACE\tPHASE\tVM\tTEE\tIP\tVXLAN\tATTEMPT\tAGE")
	for _, s := range ss {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", shortID(s.ID), s.Name, s.Namespace, s.Phase, dash(s.VMID),
			teeCell(s.Confidential), dash(strings.Join(s.IPs, ",")), vxlanCell(s.Tunnel.VXLANID), s.Attempt, age(s.CreatedAt, now))
	}
	return tw.Flush()
}

type sandboxDetail struct {
	Sandbox *ledger.Sandbox       `json:"sandbox"`
	History []ledger.SandboxEvent `json:"history"`
}

// writeSandboxDetail draws one sandbox (nil: deleted) and its history.
func writeSandboxDetail(w io.Writer, output string, s *ledger.Sandbox, hist []ledger.SandboxEvent, now time.Time) error {
	if done, err := writeData(w, output, sandboxDetail{Sandbox: s, History: nonNil(hist)}); done || err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if s == nil {
		fmt.Fprintln(tw, "Sandbox:\t(deleted; history below)")
	} else {
		t := s.Tunnel
		tunnel := "-"
		if t.VXLANID != 0 {
			tunnel = fmt.Sprintf("VXLAN %d, UDP port %d, %s (node) to %s (VM)", t.VXLANID, t.Port, dash(t.LocalIP), dash(t.RemoteIP))
		}
		rows := [][2]string{
			{"Sandbox", s.ID}, {"Pod", s.PodRef()}, {"Pod UID", s.PodUID}, {"Node", s.Node},
			{"Phase", string(s.Phase)}, {"Reason", dash(s.Reason)}, {"Message", dash(s.Message)},
			{"Provider", dash(s.Provider)}, {"VM", dash(s.VMID)}, {"VM name", dash(s.VMName)},
			{"Idempotency key", dash(s.Key)}, {"Instance type", dash(s.InstanceType)},
			{"Confidential (TEE)", teeCell(s.Confidential)}, {"Image", dash(s.Image)},
			{"IPs", dash(strings.Join(s.IPs, ", "))}, {"Network namespace", dash(s.NetNS)}, {"Tunnel", tunnel},
			{"Agent socket", dash(s.AgentSocket)}, {"Forwarder", dash(s.RelayAddr)},
			{"Certificate serials", dash(strings.Join(s.CertSerials, ", "))},
			{"Attempt", fmt.Sprint(s.Attempt)}, {"Revision", fmt.Sprint(s.Revision)},
			{"Created", stamp(s.CreatedAt, now)}, {"Updated", stamp(s.UpdatedAt, now)},
		}
		for _, row := range rows {
			fmt.Fprintf(tw, "%s:\t%s\n", row[0], row[1])
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nHistory:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tACTION\tPHASE\tVM\tATTEMPT\tREV\tREASON")
	for _, e := range hist {
		r := e.Sandbox
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", e.Time.Format(time.RFC3339), e.Action, r.Phase, dash(r.VMID), r.Attempt, r.Revision, dash(r.Reason))
	}
	return tw.Flush()
}

// teeCell names the TEE a record's VM was asked to be (or, adopted, was
// reported to be): "sev-snp", "tdx", "sgx" (an older record; not confidential), or "none" for an ordinary VM
// and for a record written before caa recorded it.
func teeCell(tee string) string { return provider.TEE(tee).String() }

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func vxlanCell(id int) string {
	if id == 0 {
		return "-"
	}
	return fmt.Sprint(id)
}

func writeEvents(w io.Writer, output string, hist []ledger.Event, withPod bool) error {
	if done, err := writeData(w, output, nonNil(hist)); done || err != nil {
		return err
	}
	return writeEventTable(w, hist, withPod)
}

// writeEventTable draws history rows. With withPod (every pod's history)
// each row names its pod and a short form of its UID, so a pod deleted and
// created again under the same name is told apart from its predecessor.
func writeEventTable(w io.Writer, hist []ledger.Event, withPod bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "TIME\tACTION\tPHASE\tVM\tATTEMPT\tREV\tREASON"
	var short map[string]string
	if withPod {
		header = "TIME\tPOD\tUID\tACTION\tPHASE\tVM\tATTEMPT\tREV\tREASON"
		uids := make([]string, 0, len(hist))
		for _, e := range hist {
			uids = append(uids, e.Record.PodUID)
		}
		short = shortUIDs(uids)
	}
	fmt.Fprintln(tw, header)
	for _, e := range hist {
		r := e.Record
		pod := ""
		if withPod {
			pod = r.PodRef() + "\t" + short[r.PodUID] + "\t"
		}
		fmt.Fprintf(tw, "%s\t%s%s\t%s\t%s\t%d\t%d\t%s\n", e.Time.Format(time.RFC3339), pod, e.Action, r.Phase,
			vmCell(r), r.Attempt, r.Revision, dash(r.Reason))
	}
	return tw.Flush()
}

// vmCell is a history row's VM: the record's VM, and the dead VM its
// attempt replaces while that one is not deleted yet.
func vmCell(r ledger.Record) string {
	if r.ReplacesVMID == "" {
		return dash(r.VMID)
	}
	return dash(r.VMID) + " (replaces " + r.ReplacesVMID + ")"
}

func replacesCell(vmID string) string {
	if vmID == "" {
		return "-"
	}
	return vmID + " (dead; named here until the cloud has deleted it)"
}

// minShortUID is the shortest UID prefix shown: 8 characters of a UUID.
const minShortUID = 8

// shortUIDs maps each UID to its shortest prefix, of at least minShortUID
// characters, that no other UID in uids starts with (the whole UID when it
// is short or a prefix of another).
func shortUIDs(uids []string) map[string]string {
	sorted := slices.Clone(uids)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	common := func(a, b string) int {
		n := 0
		for n < len(a) && n < len(b) && a[n] == b[n] {
			n++
		}
		return n
	}
	out := make(map[string]string, len(sorted))
	for i, u := range sorted {
		n := minShortUID
		if i > 0 {
			n = max(n, common(u, sorted[i-1])+1)
		}
		if i+1 < len(sorted) {
			n = max(n, common(u, sorted[i+1])+1)
		}
		out[u] = u[:min(n, len(u))]
	}
	return out
}

func writeProblems(w io.Writer, output string, probs []ledger.Problem) error {
	if done, err := writeData(w, output, map[string]any{"problems": nonNil(probs), "ok": len(probs) == 0}); done || err != nil {
		return err
	}
	if len(probs) == 0 {
		_, err := fmt.Fprintln(w, "ok: no problems found")
		return err
	}
	for _, p := range probs {
		if _, err := fmt.Fprintf(w, "problem: %s\n", p); err != nil {
			return err
		}
	}
	return nil
}

func writeStats(w io.Writer, output string, s ledger.Stats, source string) error {
	if done, err := writeData(w, output, s); done || err != nil {
		return err
	}
	now := time.Now()
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	rows := [][2]string{
		{"Source", source},
		{"Ledger id", s.Meta.ID},
		{"Node", s.Meta.Node},
		{"Cluster", s.Meta.Cluster},
		{"Schema", fmt.Sprint(s.Meta.SchemaVersion)},
		{"Created", stamp(s.Meta.CreatedAt, now)},
		{"Open epoch", fmt.Sprint(s.Meta.OpenEpoch)},
		{"Last writable open", fmt.Sprintf("%s by pid %d", stamp(s.Meta.OpenedAt, now), s.Meta.HolderPID)},
		{"File size", fmt.Sprintf("%d bytes", s.FileBytes)},
		{"Records", fmt.Sprint(s.Records)},
	}
	for _, p := range ledger.Phases {
		rows = append(rows, [2]string{"  " + string(p), fmt.Sprint(s.ByPhase[p])})
	}
	if s.Sandboxes > 0 {
		rows = append(rows, [2]string{"Sandboxes", fmt.Sprint(s.Sandboxes)})
		for _, p := range ledger.SandboxPhases {
			if n := s.SandboxesByPhase[p]; n > 0 {
				rows = append(rows, [2]string{"  " + string(p), fmt.Sprint(n)})
			}
		}
	}
	rows = append(rows,
		[2]string{"Undecodable records", fmt.Sprint(s.Undecodable)},
		[2]string{"Indexed VMs", fmt.Sprint(s.IndexedVMs)},
		[2]string{"History", fmt.Sprintf("%d entries for %d pods (limit %d per pod)", s.HistoryEntries, s.HistoryPods, s.HistoryLimit)},
	)
	for _, row := range rows {
		fmt.Fprintf(tw, "%s:\t%s\n", row[0], row[1])
	}
	return tw.Flush()
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func stamp(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%s (%s ago)", t.Format(time.RFC3339), age(t, now))
}

// age prints a duration the way kubectl does: the two largest units.
func age(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}
