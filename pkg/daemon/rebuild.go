package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/pkg/sandbox"
)

// Rebuild is `caa ledger rebuild`: records rebuilt from the cloud's tags
// and the node's pods (invariant I6), with no cloud write. It takes the
// daemon's settings (AddFlags), since it needs the same cloud and cluster.
// dryRun prints what would be recorded and writes nothing.
func Rebuild(ctx context.Context, f *Options, dryRun bool, stdout, stderr io.Writer) error {
	if err := f.check(); err != nil {
		return cli.UsageError{Err: err}
	}
	log, _ := cli.NewLogger(stderr, f.logFormat, f.logLevel)
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
	n, err := rebuildRecords(ctx, stdout, led, exec, prov.Name(), vms, pods, f.confidential)
	if err != nil {
		return err
	}
	adopted, kept, orphaned := n.adopted, n.kept, n.orphaned
	verb := "recorded"
	if dryRun {
		verb = "would record"
	} else if err := reconcile.RecordNodeLedger(ctx, client, f.node, led.Meta().ID); err != nil {
		// The Node must name the rebuilt ledger, or the daemon refuses it.
		return err
	}
	fmt.Fprintf(stdout, "%s %d VMs; %d already recorded; %d orphans left for the daemon\n", verb, adopted, kept, orphaned)
	if n.sandboxes > 0 {
		fmt.Fprintf(stdout, "%d of them as kata sandboxes in phase Lost: their tunnels and agent sockets are not in the tags, so caa cannot serve them again; "+
			"each VM is kept until its pod goes or a newer sandbox of its pod runs\n", n.sandboxes)
	}
	if n.ordinary > 0 {
		fmt.Fprintf(stdout, "%d VMs not recorded: the cloud reports them as not confidential and --confidential is on; the daemon replaces "+
			"and deletes them (--confidential=false records them)\n", n.ordinary)
	}
	return nil
}

type rebuildCounts struct{ adopted, kept, orphaned, sandboxes, ordinary int }

// rebuildRecords records the listed VMs of the node's live peer pods (led
// nil: a dry run). A VM tagged with a kata sandbox id (the remote
// hypervisor mode) becomes a sandbox record, in phase Lost: the tags give
// its pod, VM and key but not its network namespace, tunnel or agent
// socket, so it cannot be served again (with stock kata the shim's
// connection broke at the restart anyway); the record keeps the VM from
// being taken for an orphan until its pod goes or a newer sandbox of the
// pod runs, which retire it by the usual rules. Any other VM becomes the
// pod's record, as in the informer mode, with the TEE the cloud reports;
// with confidential on (--confidential) a VM the cloud reports as ordinary
// is not recorded: the daemon, finding it unrecorded and not confidential,
// replaces and deletes it.
func rebuildRecords(ctx context.Context, stdout io.Writer, led *ledger.Ledger, exec *reconcile.Executor, provName string,
	vms []provider.VM, pods map[string]*reconcile.Pod, confidential bool) (rebuildCounts, error) {
	var n rebuildCounts
	// Every VM of a pod, terminated ones too, says which attempts' keys
	// were used: the rebuilt record starts above all of them, so no key
	// whose VM may have existed is used again (EC2 keeps a token longer
	// than it lists the instance, and answers its reuse with an error).
	highest := map[string]int{}
	for _, vm := range vms {
		if uid := vm.Owner().PodUID; uid != "" && vm.Tags[sandbox.TagSandbox] == "" {
			highest[uid] = max(highest[uid], reconcile.AttemptOf(vm.Owner().Key))
		}
	}
	for _, vm := range vms {
		owner := vm.Owner()
		pod := pods[owner.PodUID]
		sb := vm.Tags[sandbox.TagSandbox]
		switch {
		case vm.State.Gone():
			continue
		case sb != "" && pod != nil:
			s, ok := sandbox.Rebuilt(vm, pod, provName)
			if !ok {
				fmt.Fprintf(stdout, "skipped  %s  sandbox tag %q is not a sandbox id; the daemon collects it after its grace period\n", vm.ID, sb)
				continue
			}
			if led != nil {
				if _, err := led.GetSandbox(sb); err == nil {
					n.kept++
					continue
				} else if !errors.Is(err, ledger.ErrNotFound) {
					return n, err
				}
				if _, err := led.PutSandbox(s); err != nil {
					return n, fmt.Errorf("record sandbox %s of VM %s: %w", sb, vm.ID, err)
				}
			}
			n.adopted++
			n.sandboxes++
			fmt.Fprintf(stdout, "recorded %s  pod %s/%s (%s), sandbox %s, as Lost\n", vm.ID, pod.Namespace, pod.Name, pod.UID, sb)
			continue
		case vm.State.Dead() && sb == "":
			// Never recorded as the pod's VM: the daemon replaces it (or,
			// beside a live one, collects it) and deletes it.
			fmt.Fprintf(stdout, "dead     %s  pod %s (%s): %s; the daemon replaces and deletes it\n", vm.ID, owner.Pod, owner.PodUID, vm.State)
			continue
		case pod == nil:
			n.orphaned++
			fmt.Fprintf(stdout, "orphan   %s  pod %s (%s) is gone; the daemon collects it after its grace period\n", vm.ID, owner.Pod, owner.PodUID)
			continue
		case confidential && !vm.TEE.Confidential() && sb == "":
			n.ordinary++
			fmt.Fprintf(stdout, "ordinary %s  pod %s/%s (%s): the cloud reports it as not confidential and --confidential is on; "+
				"not recorded: the daemon replaces and deletes it\n", vm.ID, pod.Namespace, pod.Name, pod.UID)
			continue
		}
		if led != nil {
			if _, err := led.Get(pod.UID); err == nil {
				n.kept++
				continue
			} else if !errors.Is(err, ledger.ErrNotFound) {
				return n, err
			}
			in := reconcile.Input{Pod: pod, VM: &vm, HighestAttempt: highest[pod.UID]}
			if _, err := exec.Apply(ctx, in, reconcile.Action{Kind: reconcile.KindAdopt, Reason: reconcile.ReasonRebuilt}); err != nil {
				return n, err
			}
		}
		n.adopted++
		fmt.Fprintf(stdout, "recorded %s  pod %s/%s (%s)\n", vm.ID, pod.Namespace, pod.Name, pod.UID)
	}
	return n, nil
}
