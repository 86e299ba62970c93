// Command caa keeps peer-pod VMs alive across restarts and upgrades of the
// per-node agent. This package is its command line only: `caa run`, `caa
// cluster` and `caa relay` hand their flags to the package each one drives
// (pkg/daemon, pkg/cluster, pkg/relayd); `caa ledger …` inspects the
// on-node ledger, `caa status` and `caa probe` ask a running daemon, and
// `caa version` prints the build.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/caa-project/caa/internal/cli"
	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Exit codes: 1 for a failed command (or problems found), 2 for bad usage.
const (
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command line and returns the process exit code; every
// failure is one line on stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCommand(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var le cli.LoggedError
	if !errors.As(err, &le) { // the daemon logged it already, in its format
		fmt.Fprintf(stderr, "caa: %v\n", err)
	}
	var ue cli.UsageError
	var ee exitError
	switch {
	case errors.As(err, &ue):
		return exitUsage
	case errors.As(err, &ee):
		return ee.code
	}
	return exitFailure
}

// exitError carries a specific exit code (for example, verify found problems).
type exitError struct {
	msg  string
	code int
}

func (e exitError) Error() string { return e.msg }

func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "caa",
		Short: "caa keeps peer-pod VMs alive across restarts and upgrades of its node agent",
		Long: "caa is the per-node agent that owns the cloud VMs of the peer pods on its node and\n" +
			"remembers them in an on-node ledger, so restarts and upgrades never disrupt them.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          unknownSubcommand,
		RunE:          func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return cli.UsageError{Err: fmt.Errorf("%w (see `%s --help`)", err, cmd.CommandPath())}
	})
	root.AddCommand(newVersionCommand(), newLedgerCommand(), newRunCommand(), newStatusCommand(), newClusterCommand(), newRelayCommand(), newProbeCommand(), newUninstallCommand())
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the caa version",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "caa %s\n", version)
			return err
		},
	}
}

// unknownSubcommand rejects a word that names no subcommand.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return cli.UsageError{Err: fmt.Errorf("unknown command %q for %s (see `%s --help`)", args[0], cmd.CommandPath(), cmd.CommandPath())}
	}
	return nil
}

// noArgs is cobra.NoArgs with a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return cli.UsageError{Err: fmt.Errorf("%s takes no arguments, got %q", cmd.CommandPath(), args)}
	}
	return nil
}

func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return cli.UsageError{Err: fmt.Errorf("%s needs %s (got %d arguments)", cmd.CommandPath(), what, len(args))}
		}
		return nil
	}
}
