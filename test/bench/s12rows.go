package main

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/caa-project/caa/test/e2e/upstream"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// s12Upstream builds (or finds in the e2e cache) upstream's
// cloud-api-adaptor and pod VM programs from $UPSTREAM_SRC.
func (b *bench) s12Upstream(ctx context.Context) (adaptor, podvm string, err error) {
	for _, k := range []upstream.Kind{upstream.Adaptor, upstream.PodVM} {
		if err := upstream.Check(k); err != nil {
			return "", "", fmt.Errorf("S12 runs upstream's programs: %w", err)
		}
	}
	b.logf("S12: building upstream's cloud-api-adaptor and pod VM programs (cached after the first time)")
	dir, err := upstream.Build(ctx, upstream.Adaptor)
	if err != nil {
		return "", "", err
	}
	if podvm, err = upstream.Build(ctx, upstream.PodVM); err != nil {
		return "", "", err
	}
	if err := podvmfake.CheckUpstream(podvm); err != nil {
		return "", "", err
	}
	return filepath.Join(dir, upstream.AdaptorBin), podvm, nil
}

// s12Rows sets caa's figures (Runs) against upstream's (Upstream).
func s12Rows(n, count int, c, u s12Figures) []Row {
	one := func(v float64) []float64 { return []float64{v} }
	burst := fmt.Sprintf("burst of %d", n)
	restart := fmt.Sprintf("SIGKILL and restart, %d sandboxes", s12Restart)
	rolling := fmt.Sprintf("rolling update, %d sandboxes", s12Rolling)
	mem := fmt.Sprintf("%d sandboxes, %d rounds of StopVM/StartVM", s12Rolling, s12Rounds)
	row := func(cs, metric, unit string, a, b []float64, why string) Row {
		return Row{Case: cs, Metric: metric, Unit: unit, Runs: a, Upstream: b, Why: why}
	}
	return []Row{
		row("one sandbox", "StartVM at the shim", "ms", c.startVM, u.startVM, whyStartVM),
		row(burst, "every StartVM answered", "ms", one(c.burstAll), one(u.burstAll), whyBurstTime),
		row(burst, "StartVMs that succeeded", "StartVMs", one(c.burstOK), one(u.burstOK), whyBurstOK),
		row(burst, "StartVM failures", "StartVMs", one(c.burstFailed), one(u.burstFailed), whyBurstOK),
		row(burst, "throttling errors surfaced to kata", "StartVMs", one(c.burstSurfaced), one(u.burstSurfaced), whySurfaced),
		row(burst, "throttling replies from EC2", "replies", one(c.throttled), one(u.throttled), whyThrottled),
		row(burst, "sandboxes without exactly one VM", "sandboxes", one(c.burstNoOne), one(u.burstNoOne), whyNoOne),
		row(burst, "VMs still running after every StopVM", "VMs", one(c.burstLeaked), one(u.burstLeaked), whyBurstLeak),
		row(burst, "tunnel devices left in the node's namespace", "devices", one(c.strays), one(u.strays), whyStrays),
		row(burst, "cloud calls per sandbox created", "calls", one(c.callsCreated), one(u.callsCreated), whyCallsCreated),
		row(burst, "cloud calls per sandbox deleted", "calls", one(c.callsDeleted), one(u.callsDeleted), whyCallsDeleted),
		row(restart, "sandboxes served again", "sandboxes", one(c.served), one(u.served), whyServed),
		row(restart, "VMs leaked after the shim's StopVMs", "VMs", one(c.leaked), one(u.leaked), whyLeaked),
		row(restart, "VMs duplicated", "VMs", one(c.duplicated), one(u.duplicated), whyDuplicated),
		row(restart, "cloud writes across the restart", "calls", one(c.writes), one(u.writes), whyWrites),
		row(rolling, "health checks missed", "checks", one(c.misses), one(u.misses), whyMisses),
		row(rolling, "sandboxes lost", "sandboxes", one(c.lost), one(u.lost), whyMisses),
		row(mem, "resident memory per sandbox", "KiB", one(c.perSandbox), one(u.perSandbox), whyMemory),
		row(mem, "resident memory growth over the rounds", "KiB", one(c.growth), one(u.growth), whyGrowth),
		row("idle, sandboxes running", "cloud calls per node-hour", "calls", one(c.idleHour), one(u.idleHour), whyIdle),
	}
}

// Why each row differs, from the two programs' code (upstream:
// pkg/adaptor/cloud/cloud.go, pkg/adaptor/proxy/proxy.go and
// cloud-providers/aws/provider.go at the pinned commit).
const (
	whyStartVM = "Upstream makes one cloud call (RunInstances, taking the address from its answer) and then redials the " +
		"forwarder with retry-go's back-off (100 ms, doubling) until the VM answers, so it waits past the boot; caa " +
		"makes two calls (RunInstances, a read that shows the VM running; a retry after a crash looks its client token " +
		"up first) and records each step in its ledger, but its relay probes the booting VM every 10 ms at first."
	whyBurstTime = "Upstream is faster by failing: it sends every RunInstances at once and its SDK retries what EC2 throttles, 3 " +
		"attempts, then gives up; caa's create budget (5 a second after a burst of 10) paces the launches under EC2's " +
		"RunInstances bucket so that none is refused, and the last StartVM waits its turn: a deliberate trade of time " +
		"for no failed sandbox."
	whyBurstOK = "Upstream's StartVM fails when RunInstances is still throttled after the SDK's 3 attempts, or when its tunnel " +
		"setup loses a race for a device name (see the tunnel row); caa's budget keeps the launches within EC2's refill " +
		"and its tunnel names are per sandbox."
	whySurfaced = "A throttled RunInstances reaches kata as upstream's StartVM error (RequestLimitExceeded); caa waits in its own " +
		"budget and retries a throttled call itself, within StartVM's deadline."
	whyThrottled = "Upstream's burst spends EC2's RunInstances bucket (50) at once and then meets its refill (5 a second) with " +
		"retries; caa's budget stays under it."
	whyNoOne = "Upstream's are its failed StartVMs: throttled out before any VM (none) or failed after it (deleted); caa's " +
		"ClientToken makes a retried launch find the first VM (by a lookup after a crash), and no StartVM failed."
	whyBurstLeak = "Upstream's StopVM logs a failed TerminateInstances (throttled after the SDK's retries) and answers kata " +
		"success, so the VM stays with nothing left to delete it; caa records the delete in its ledger and retries it, " +
		"paced by its write budget, until EC2 confirms it."
	whyStrays = "Both build a tunnel in the node's namespace and move it into the pod's; upstream names it ppvxlan1 to 5, the " +
		"first free, so concurrent StartVMs race for the names, and a setup that fails part way leaves its device behind (with 5 " +
		"left no StartVM on the node can build a tunnel; the bench removes them after counting); caa names it after the sandbox's " +
		"tunnel, removes its own leftover of that name first and the device when the move fails, and runs at most 4 at once."
	whyCallsCreated = "Upstream: RunInstances and the SDK's retries of it, and the delete of a VM whose tunnel failed; caa: " +
		"RunInstances and the read that sees the VM running (the client-token lookup only for a key that may have been " +
		"sent before a crash), and no call that EC2 throttles. Upstream takes the address from RunInstances' answer " +
		"and never reads the VM; caa's read is how it knows the VM runs before it serves the sandbox."
	whyCallsDeleted = "caa sends one TerminateInstances per VM, paced by its write budget; upstream sends them all at once, the SDK " +
		"retries the throttled ones, and each StopVM first asks DescribeAddresses for an Elastic IP to release."
	whyServed = "Upstream keeps its sandboxes only in memory: a new process knows none of them and serves no agent socket; caa " +
		"reads them from its ledger, and its relay (a process of its own) kept every shim's connection open throughout."
	whyLeaked = "Upstream's restarted process answers the shim's StopVM with \"sandbox does not exist\" and deletes nothing (its " +
		"separate peerpod-ctrl, not run here, deletes the VM of a PeerPod object once its pod is gone); caa deletes each VM its " +
		"ledger holds."
	whyDuplicated = "Neither program launches again on restart: upstream has nothing to launch from, caa adopts the VMs its " +
		"ledger names."
	whyWrites = "Neither writes to the cloud to come back: caa's startup reads (one listing of the node's VMs) and adopts."
	whyMisses = "Upstream's agent proxies live in its process: SIGTERM closes every shim's connection and the new process " +
		"serves none, so each check after it fails; caa's shims are connected to caa relay, which the update leaves alone."
	whyMemory = "Upstream holds one proxied ttrpc connection and a TLS client per sandbox; caa holds its sandbox records and, in " +
		"caa relay, the relayed connections (both processes counted)."
	whyGrowth = "Resident memory after the rounds against before them: what a program keeps of sandboxes that are gone (the Go " +
		"heap's high-water mark included)."
	whyIdle = "Upstream makes no idle call: it never looks at the cloud after StartVM, so it never sees a VM lost or leaked; caa " +
		"lists the node's VMs once per audit interval (10 min by default) to find both: a deliberate trade of 6 reads an hour."
)
