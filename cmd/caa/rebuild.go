package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

// newLedgerRebuildCommand is `caa ledger rebuild`: records rebuilt from the
// cloud's tags and the node's pods (invariant I6), with no cloud write. It
// takes the daemon's flags, since it needs the same cloud and cluster.
func newLedgerRebuildCommand() *cobra.Command {
	f := &runFlags{clouds: compiledClouds()}
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "rebuild",
		Short: "Rebuild the ledger's records from the cloud's VM tags and this node's pods (run with the daemon stopped)",
		Long: "Rebuild the ledger from what the cloud and the cluster know: every VM tagged for this\n" +
			"cluster and node whose pod still exists gets a Running record. Nothing is created or\n" +
			"deleted in the cloud; VMs whose pod is gone are listed, for the daemon's orphan collection.\n" +
			"It needs the same flags (or environment) as `caa run`, and the ledger must not be held.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return rebuildLedger(cmd.Context(), f, dryRun, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	addRunFlags(cmd, f)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be recorded, write nothing")
	return cmd
}

func rebuildLedger(ctx context.Context, f *runFlags, dryRun bool, stdout, stderr io.Writer) error {
	if err := f.check(); err != nil {
		return usageError{err}
	}
	log, _ := newLogger(stderr, f.logFormat, f.logLevel)
	client, clusterID, err := f.cluster(ctx)
	if err != nil {
		return err
	}
	prov, _, err := f.newProvider(ctx, log)
	if err != nil {
		return fmt.Errorf("provider %s: %w", f.providerName, err)
	}
	vms, err := prov.List(ctx, provider.Selector{Cluster: clusterID, Node: f.node})
	if err != nil {
		return fmt.Errorf("list VMs of node %s: %w", f.node, err)
	}
	podList, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", f.node).String(),
	})
	if err != nil {
		return fmt.Errorf("list pods of node %s: %w", f.node, err)
	}
	pods := map[string]*reconcile.Pod{}
	for i := range podList.Items {
		p := reconcile.PodFromKube(&podList.Items[i])
		if slices.Contains(f.runtimeClasses, p.RuntimeClass) && !p.Terminal {
			pods[p.UID] = p
		}
	}

	var led *ledger.Ledger
	if !dryRun {
		led, err = ledger.Open(ledger.Options{Path: f.ledgerPath, Node: f.node, Cluster: clusterID, Logger: log})
		if err != nil {
			return err
		}
		defer led.Close()
	}
	exec := &reconcile.Executor{Ledger: led, Provider: prov, Cluster: clusterID, Node: f.node, Log: log}
	// Every VM of a pod, terminated ones too, says which attempts' keys
	// were used: the rebuilt record starts above all of them, so no key
	// whose VM may have existed is used again (EC2 keeps a token longer
	// than it lists the instance, and answers its reuse with an error).
	highest := map[string]int{}
	for _, vm := range vms {
		if uid := vm.Owner().PodUID; uid != "" {
			highest[uid] = max(highest[uid], reconcile.AttemptOf(vm.Owner().Key))
		}
	}
	var adopted, kept, orphaned int
	for _, vm := range vms {
		owner := vm.Owner()
		pod := pods[owner.PodUID]
		switch {
		case vm.State.Gone():
			continue
		case vm.State.Dead():
			// Never recorded as the pod's VM: the daemon replaces it (or,
			// beside a live one, collects it) and deletes it.
			fmt.Fprintf(stdout, "dead     %s  pod %s (%s): %s; the daemon replaces and deletes it\n", vm.ID, owner.Pod, owner.PodUID, vm.State)
			continue
		case pod == nil:
			orphaned++
			fmt.Fprintf(stdout, "orphan   %s  pod %s (%s) is gone; the daemon collects it after its grace period\n", vm.ID, owner.Pod, owner.PodUID)
			continue
		}
		if led != nil {
			if _, err := led.Get(pod.UID); err == nil {
				kept++
				continue
			} else if !errors.Is(err, ledger.ErrNotFound) {
				return err
			}
			in := reconcile.Input{Pod: pod, VM: &vm, HighestAttempt: highest[pod.UID]}
			if _, err := exec.Apply(ctx, in, reconcile.Action{Kind: reconcile.KindAdopt, Reason: reconcile.ReasonRebuilt}); err != nil {
				return err
			}
		}
		adopted++
		fmt.Fprintf(stdout, "recorded %s  pod %s/%s (%s)\n", vm.ID, pod.Namespace, pod.Name, pod.UID)
	}
	verb := "recorded"
	if dryRun {
		verb = "would record"
	} else if err := reconcile.RecordNodeLedger(ctx, client, f.node, led.Meta().ID); err != nil {
		// The Node must name the rebuilt ledger, or the daemon refuses it.
		return err
	}
	fmt.Fprintf(stdout, "%s %d VMs; %d already recorded; %d orphans left for the daemon\n", verb, adopted, kept, orphaned)
	return nil
}
