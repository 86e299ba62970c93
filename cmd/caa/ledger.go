package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/ledger/ledgerapi"
)

// ledgerFlags are shared by every `caa ledger` subcommand.
type ledgerFlags struct {
	path    string
	output  string
	timeout time.Duration
}

func newLedgerCommand() *cobra.Command {
	f := &ledgerFlags{}
	cmd := &cobra.Command{
		Use:   "ledger",
		Short: "Inspect the on-node ledger of peer pods and their VMs",
		Long: "Inspect the on-node ledger. When a caa daemon holds the ledger, the commands ask it\n" +
			"over its unix socket (<ledger>.sock); otherwise they open the file read-only.",
		Args: unknownSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cli.UsageError{Err: fmt.Errorf("%s needs a subcommand: ls, sandboxes, get, history, export, verify, stats or rebuild (see `%s --help`)",
				cmd.CommandPath(), cmd.CommandPath())}
		},
	}
	defPath := ledger.DefaultPath
	if env := os.Getenv("CAA_LEDGER"); env != "" {
		defPath = env
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.path, "ledger", defPath, "ledger file (env CAA_LEDGER)")
	pf.StringVarP(&f.output, "output", "o", "table", "output format: table, json or yaml")
	pf.DurationVar(&f.timeout, "timeout", 5*time.Second, "how long to wait for the daemon's socket or the file lock")
	cmd.AddCommand(
		newLedgerLsCommand(f),
		newLedgerSandboxesCommand(f),
		newLedgerGetCommand(f),
		newLedgerHistoryCommand(f),
		newLedgerExportCommand(f),
		newLedgerVerifyCommand(f),
		newLedgerStatsCommand(f),
		newLedgerRebuildCommand(),
	)
	return cmd
}

// open validates the shared flags and finds the reader.
func (f *ledgerFlags) open(cmd *cobra.Command) (ledgerapi.Reader, error) {
	if _, err := parseFormat(f.output); err != nil {
		return nil, err
	}
	if f.timeout <= 0 {
		return nil, cli.UsageError{Err: fmt.Errorf("--timeout must be positive, got %s", f.timeout)}
	}
	if f.path == "" {
		return nil, cli.UsageError{Err: errors.New("--ledger is empty; give the ledger file, e.g. " + ledger.DefaultPath)}
	}
	return ledgerapi.Open(cmd.Context(), f.path, f.timeout)
}

// withReader wraps a subcommand's body: it opens the reader the shared flags
// name, runs fn and closes the reader.
func (f *ledgerFlags) withReader(fn func(cmd *cobra.Command, r ledgerapi.Reader, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		r, err := f.open(cmd)
		if err != nil {
			return err
		}
		defer r.Close()
		return fn(cmd, r, args)
	}
}

func newLedgerLsCommand(f *ledgerFlags) *cobra.Command {
	var phases []string
	var filter ledger.Filter
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the records: one line per peer pod",
		Args:  noArgs,
		// Flags are checked before the ledger is opened.
		PreRunE: func(*cobra.Command, []string) error {
			for _, s := range phases {
				p, err := ledger.ParsePhase(s)
				if err != nil {
					return cli.UsageError{Err: fmt.Errorf("--phase: %w", err)}
				}
				filter.Phases = append(filter.Phases, p)
			}
			return nil
		},
		RunE: f.withReader(func(cmd *cobra.Command, r ledgerapi.Reader, _ []string) error {
			recs, partial, err := listRecords(cmd, r, filter)
			if err != nil {
				return err
			}
			if err := writeRecords(cmd.OutOrStdout(), f.output, recs, time.Now()); err != nil {
				return err
			}
			// The table goes on with the kata sandboxes, if any (remote
			// hypervisor mode); -o json and yaml keep their list of
			// records: `caa ledger sandboxes -o json` gives the sandboxes.
			if fm, _ := parseFormat(f.output); fm == formatTable && len(filter.Phases) == 0 {
				ss, sbErr := readSandboxes(cmd, r)
				if len(ss) > 0 {
					fmt.Fprintln(cmd.OutOrStdout())
					if err := writeSandboxTable(cmd.OutOrStdout(), ss, time.Now()); err != nil {
						return err
					}
				}
				if partial == nil && !errors.Is(sbErr, ledgerapi.ErrNotServed) {
					partial = sbErr
				}
			}
			return partial
		}),
	}
	cmd.Flags().StringSliceVar(&phases, "phase", nil, "only records in these phases (Creating, Running, Deleting, Failed)")
	return cmd
}

func newLedgerGetCommand(f *ledgerFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "get <pod-uid|namespace/name|sandbox-id>",
		Short: "Show one record and its history (with the pod's sandboxes), or one sandbox and its history",
		Args:  exactArgs(1, "one pod UID, namespace/name or sandbox id"),
		RunE: f.withReader(func(cmd *cobra.Command, r ledgerapi.Reader, args []string) error {
			uid, err := resolvePod(cmd, r, args[0])
			if errors.Is(err, ledger.ErrNotFound) {
				// No pod record or history: a sandbox id, or a pod of the
				// remote hypervisor mode, which has sandboxes only.
				if done, sbErr := getSandboxes(cmd, r, f.output, args[0]); done || sbErr != nil {
					return sbErr
				}
			}
			if err != nil {
				return err
			}
			rec, recErr := r.Get(cmd.Context(), uid)
			if recErr != nil && !errors.Is(recErr, ledger.ErrNotFound) {
				return recErr
			}
			hist, err := r.History(cmd.Context(), uid)
			if err != nil && !errors.Is(err, ledger.ErrNotFound) {
				return err
			}
			if recErr != nil && len(hist) == 0 {
				if done, sbErr := getSandboxes(cmd, r, f.output, args[0]); done || sbErr != nil {
					return sbErr
				}
				return fmt.Errorf("pod or sandbox %s: %w in %s", args[0], ledger.ErrNotFound, r.Source())
			}
			var recPtr *ledger.Record
			if recErr == nil {
				recPtr = &rec
			}
			ss, _ := readSandboxes(cmd, r)
			ss = slices.DeleteFunc(ss, func(s ledger.Sandbox) bool { return s.PodUID != uid })
			return writeRecordDetail(cmd.OutOrStdout(), f.output, recPtr, hist, ss, time.Now())
		}),
	}
}

func newLedgerSandboxesCommand(f *ledgerFlags) *cobra.Command {
	var phases []string
	var want []ledger.SandboxPhase
	cmd := &cobra.Command{
		Use:     "sandboxes",
		Aliases: []string{"sb"},
		Short:   "List the kata sandboxes (remote hypervisor mode): one line per sandbox",
		Long: "List the sandbox records of the remote hypervisor mode: sandbox id, pod, phase, VM and its\n" +
			"IP, VXLAN id; -o json or yaml adds the tunnel, the agent socket, the forwarder and the\n" +
			"serials of the certificates issued for the VM (never a key: the ledger holds none).",
		Args: noArgs,
		PreRunE: func(*cobra.Command, []string) error {
			for _, s := range phases {
				p, err := ledger.ParseSandboxPhase(s)
				if err != nil {
					return cli.UsageError{Err: fmt.Errorf("--phase: %w", err)}
				}
				want = append(want, p)
			}
			return nil
		},
		RunE: f.withReader(func(cmd *cobra.Command, r ledgerapi.Reader, _ []string) error {
			ss, err := readSandboxes(cmd, r)
			if errors.Is(err, ledgerapi.ErrNotServed) {
				return err
			}
			if len(want) > 0 {
				ss = slices.DeleteFunc(ss, func(s ledger.Sandbox) bool { return !slices.Contains(want, s.Phase) })
			}
			if werr := writeSandboxes(cmd.OutOrStdout(), f.output, ss, time.Now()); werr != nil {
				return werr
			}
			return err
		}),
	}
	cmd.Flags().StringSliceVar(&phases, "phase", nil, "only sandboxes in these phases (Created, Creating, Running, Lost, Deleting, Failed)")
	return cmd
}

// readSandboxes returns the sandboxes sorted by pod and id. Undecodable
// ones come back as an error beside the rest, as for records; a daemon
// older than the sandboxes answers ErrNotServed and no sandbox.
func readSandboxes(cmd *cobra.Command, r ledgerapi.Reader) ([]ledger.Sandbox, error) {
	ss, err := r.Sandboxes(cmd.Context())
	slices.SortFunc(ss, func(a, b ledger.Sandbox) int {
		return strings.Compare(a.PodRef()+"/"+a.CreatedAt.Format(time.RFC3339Nano)+"/"+a.ID, b.PodRef()+"/"+b.CreatedAt.Format(time.RFC3339Nano)+"/"+b.ID)
	})
	return ss, err
}

// getSandboxes answers `caa ledger get` for an argument that names no pod
// record: a sandbox id (its record and history), or namespace/name of a
// pod that has sandboxes only. done is false when nothing matched.
func getSandboxes(cmd *cobra.Command, r ledgerapi.Reader, output, arg string) (done bool, err error) {
	if ns, name, isName := strings.Cut(arg, "/"); isName {
		ss, err := readSandboxes(cmd, r)
		ss = slices.DeleteFunc(ss, func(s ledger.Sandbox) bool { return s.Namespace != ns || s.Name != name })
		if len(ss) == 0 {
			return false, nil
		}
		if err := writeRecordDetail(cmd.OutOrStdout(), output, nil, nil, ss, time.Now()); err != nil {
			return true, err
		}
		return true, err
	}
	s, sErr := r.Sandbox(cmd.Context(), arg)
	hist, hErr := r.SandboxHistory(cmd.Context(), arg)
	switch {
	case sErr != nil && !errors.Is(sErr, ledger.ErrNotFound):
		return true, sErr
	case hErr != nil && !errors.Is(hErr, ledger.ErrNotFound):
		return true, hErr
	case sErr != nil && len(hist) == 0:
		return false, nil
	}
	var sp *ledger.Sandbox
	if sErr == nil {
		sp = &s
	}
	return true, writeSandboxDetail(cmd.OutOrStdout(), output, sp, hist, time.Now())
}

func newLedgerHistoryCommand(f *ledgerFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "history [pod-uid|namespace/name]",
		Short: "Show the history of one pod, or of every pod by time",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return cli.UsageError{Err: fmt.Errorf("%s takes at most one pod (got %d arguments)", cmd.CommandPath(), len(args))}
			}
			return nil
		},
		RunE: f.withReader(func(cmd *cobra.Command, r ledgerapi.Reader, args []string) error {
			var hist []ledger.Event
			var err error
			if len(args) == 0 {
				hist, err = r.AllHistory(cmd.Context())
			} else {
				var uid string
				if uid, err = resolvePod(cmd, r, args[0]); err == nil {
					hist, err = r.History(cmd.Context(), uid)
				}
			}
			if err != nil {
				return err
			}
			return writeEvents(cmd.OutOrStdout(), f.output, hist, len(args) == 0)
		}),
	}
}

func newLedgerExportCommand(f *ledgerFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "export",
		Short: "Print every record as JSON lines (stable field names)",
		Args:  noArgs,
		RunE: f.withReader(func(cmd *cobra.Command, r ledgerapi.Reader, _ []string) error {
			recs, partial, err := listRecords(cmd, r, ledger.Filter{})
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			for _, rec := range recs {
				if err := enc.Encode(rec); err != nil {
					return err
				}
			}
			return partial
		}),
	}
}

func newLedgerVerifyCommand(f *ledgerFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "verify",
		Short: "Check the file, the index and every record; exit 1 on any problem",
		Args:  noArgs,
		RunE: f.withReader(func(cmd *cobra.Command, r ledgerapi.Reader, _ []string) error {
			probs, err := r.Verify(cmd.Context())
			if err != nil {
				return err
			}
			if err := writeProblems(cmd.OutOrStdout(), f.output, probs); err != nil {
				return err
			}
			if len(probs) > 0 {
				return exitError{msg: fmt.Sprintf("verify: %d problem(s) in %s", len(probs), r.Source()), code: exitFailure}
			}
			return nil
		}),
	}
}

func newLedgerStatsCommand(f *ledgerFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Summarise the ledger: owner, schema, records by phase, history, size",
		Args:  noArgs,
		RunE: f.withReader(func(cmd *cobra.Command, r ledgerapi.Reader, _ []string) error {
			s, err := r.Stats(cmd.Context())
			if err != nil {
				return err
			}
			return writeStats(cmd.OutOrStdout(), f.output, s, r.Source())
		}),
	}
}

// resolvePod turns a pod UID or namespace/name into a pod UID. A name is
// looked up among the records first, then among the histories (a deleted
// pod keeps its history); two matches are an error that lists them.
func resolvePod(cmd *cobra.Command, r ledgerapi.Reader, arg string) (string, error) {
	ns, name, isName := strings.Cut(arg, "/")
	if !isName {
		return arg, nil
	}
	if ns == "" || name == "" {
		return "", cli.UsageError{Err: fmt.Errorf("pod %q: want a pod UID or namespace/name", arg)}
	}
	recs, err := r.List(cmd.Context(), ledger.Filter{})
	if err != nil && recs == nil {
		return "", err
	}
	var uids []string
	for _, rec := range recs {
		if rec.Namespace == ns && rec.Name == name {
			uids = append(uids, rec.PodUID)
		}
	}
	if len(uids) == 0 {
		events, err := r.AllHistory(cmd.Context())
		if err != nil {
			return "", err
		}
		for _, e := range events {
			if e.Record.Namespace == ns && e.Record.Name == name && !slices.Contains(uids, e.Record.PodUID) {
				uids = append(uids, e.Record.PodUID)
			}
		}
	}
	switch len(uids) {
	case 0:
		return "", fmt.Errorf("pod %s: %w in %s", arg, ledger.ErrNotFound, r.Source())
	case 1:
		return uids[0], nil
	}
	return "", fmt.Errorf("pod %s matches %d pod UIDs (%s); name one of them", arg, len(uids), strings.Join(uids, ", "))
}

// listRecords returns the matching records sorted by namespace, name and
// UID. When some records do not decode, the rest come back with partial
// set, to be reported after they are printed.
func listRecords(cmd *cobra.Command, r ledgerapi.Reader, f ledger.Filter) (recs []ledger.Record, partial, err error) {
	recs, err = r.List(cmd.Context(), f)
	if err != nil && recs == nil {
		return nil, nil, err
	}
	slices.SortFunc(recs, func(a, b ledger.Record) int {
		return strings.Compare(a.Namespace+"/"+a.Name+"/"+a.PodUID, b.Namespace+"/"+b.Name+"/"+b.PodUID)
	})
	return recs, err, nil
}
