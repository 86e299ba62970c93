package main

import (
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/caa-project/caa/internal/cli"

	"github.com/caa-project/caa/pkg/cluster"
	"github.com/caa-project/caa/pkg/daemon"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/relayd"
)

// The commands that run a daemon: their settings and work live in the
// package each one drives; here they only meet the command line.

func newRunCommand() *cobra.Command {
	o := daemon.NewOptions(version)
	o.KlogTo = cli.RouteKlog
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: keep this node's peer-pod VMs alive and recorded",
		Long: "Run the per-node daemon. On start it opens the ledger, lists this node's peer pods and\n" +
			"the cloud's VMs, adopts the live ones, recreates the missing, and only then reports\n" +
			"ready on /readyz. Every flag also reads the environment variable named in its help.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return daemon.Run(cmd.Context(), o, cmd.ErrOrStderr()) },
	}
	o.AddFlags(cmd.Flags())
	o.AddDaemonFlags(cmd.Flags())
	return cmd
}

// newLedgerRebuildCommand is `caa ledger rebuild`: it takes the daemon's
// flags, since it needs the same cloud and cluster.
func newLedgerRebuildCommand() *cobra.Command {
	o := daemon.NewOptions(version)
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "rebuild",
		Short: "Rebuild the ledger's records from the cloud's VM tags and this node's pods (run with the daemon stopped)",
		Long: "Rebuild the ledger from what the cloud and the cluster know: every VM tagged for this\n" +
			"cluster and node whose pod still exists gets a Running record; a VM of a kata sandbox (remote\n" +
			"hypervisor mode) gets a sandbox record in phase Lost (its tunnel and agent socket are not in\n" +
			"the tags), kept until its pod goes or a newer sandbox runs. Nothing is created or deleted in\n" +
			"the cloud; VMs whose pod is gone are listed, for the daemon's orphan collection.\n" +
			"It needs the same flags (or environment) as `caa run`, and the ledger must not be held.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return daemon.Rebuild(cmd.Context(), o, dryRun, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	o.AddFlags(cmd.Flags())
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be recorded, write nothing")
	return cmd
}

func newClusterCommand() *cobra.Command {
	o := cluster.NewOptions(version)
	o.KlogTo = cli.RouteKlog
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Run the cluster scope: collect the VMs of departed nodes, publish one audit for every node",
		Long: "Run the cluster-scope caa (a Deployment of two replicas). The replica holding the Lease lists\n" +
			"every VM tagged for this cluster once per --interval, deletes the VMs of nodes gone from the\n" +
			"cluster (absent in two listings --node-gone-grace apart, and confirmed absent by the apiserver),\n" +
			"and writes on each Node what the cloud showed for it, which that node's caa audits against.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cluster.Run(cmd.Context(), o, cmd.ErrOrStderr()) },
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// newUninstallCommand is `caa uninstall`: the last step of removing caa
// from a cluster (README, "Uninstalling").
func newUninstallCommand() *cobra.Command {
	o := cluster.NewUninstallOptions(version)
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "After caa is removed: delete every VM left for this cluster and caa's capacity and annotations on the Nodes",
		Long: "Run once caa's DaemonSet and cluster Deployment are removed and no peer pod is left (it refuses\n" +
			"otherwise, naming them). It lists every VM tagged for this cluster and deletes those whose pod\n" +
			"no longer exists, waits until the cloud shows them terminated, and removes kata.peerpods.io/vm\n" +
			"and caa's annotations from every Node. It needs the cloud's settings and credentials as\n" +
			"`caa cluster` reads them (flags, CAA_* variables, or --adaptor-config-dir) and a kubeconfig that\n" +
			"lists pods and patches Nodes. Each step is idempotent: run it again after a failure.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cluster.RunUninstall(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	o.AddFlags(cmd.Flags())
	cmd.AddCommand(newUninstallNodeCommand())
	return cmd
}

// newUninstallNodeCommand is `caa uninstall node`: run on each node (the
// DaemonSet deploy/uninstall) after `caa uninstall`, it empties caa's host
// directory.
func newUninstallNodeCommand() *cobra.Command {
	var dir string
	var hold bool
	cmd := &cobra.Command{
		Use:   "node",
		Short: "On a node, after caa uninstall: remove caa's host directory's contents (ledger, agent CA, relay files)",
		Long: "Empty caa's host directory on this node: the ledger and its lease, the agent CA, the relay's\n" +
			"directory. It refuses while a caa holds the ledger or a caa relay serves its socket there, and a\n" +
			"directory that holds none of caa's files. Run it after `caa uninstall` (the ledger's records go\n" +
			"with it). --hold then waits for SIGTERM, so a DaemonSet's pod stays up once done.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cluster.RemoveNodeData(dir, cmd.OutOrStdout()); err != nil {
				return err
			}
			if hold {
				<-cmd.Context().Done()
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", cli.EnvOr("CAA_DATA_DIR", filepath.Dir(ledger.DefaultPath)),
		"caa's host directory, as mounted here (env CAA_DATA_DIR)")
	cmd.Flags().BoolVar(&hold, "hold", false, "once done, wait for SIGTERM instead of exiting (a DaemonSet's container)")
	return cmd
}

// newRelayCommand is `caa relay`: the agent relay daemon (package relayd).
func newRelayCommand() *cobra.Command {
	o := relayd.NewOptions(version)
	o.KlogTo = cli.RouteKlog
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Serve the sandboxes' agent sockets for caa, outliving caa's upgrades",
		Long: "caa relay owns the kata shims' agent sockets and connections and relays them to the pod VMs\n" +
			"over mutual TLS, so that caa's restarts and upgrades never cut a shim's connection. caa\n" +
			"(run with --relay-socket) tells it what to serve. It keeps no state of its own: after its\n" +
			"own restart caa registers every live sandbox again (connections open at that moment are lost).",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return relayd.Run(cmd.Context(), o, cmd.ErrOrStderr()) },
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
