package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// s12Upstream finds upstream's adaptor and pod VM programs.
// TEMPORARY: replaced by test/e2e/upstream.Build once merged.
func (b *bench) s12Upstream(ctx context.Context) (adaptor, podvm string, err error) {
	adaptor = os.Getenv("CAA_UPSTREAM_ADAPTOR_BIN")
	podvm = os.Getenv(podvmfake.UpstreamBinEnv)
	if err := podvmfake.CheckUpstream(podvm); err != nil {
		return "", "", err
	}
	if _, err := os.Stat(adaptor); err != nil {
		return "", "", err
	}
	return filepath.Clean(adaptor), podvm, nil
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

// Why each row differs, from the two programs' code.
const (
	whyStartVM      = "TODO"
	whyBurstTime    = "TODO"
	whyBurstOK      = "TODO"
	whySurfaced     = "TODO"
	whyThrottled    = "TODO"
	whyNoOne        = "TODO"
	whyBurstLeak    = "TODO"
	whyCallsCreated = "TODO"
	whyCallsDeleted = "TODO"
	whyServed       = "TODO"
	whyLeaked       = "TODO"
	whyDuplicated   = "TODO"
	whyWrites       = "TODO"
	whyMisses       = "TODO"
	whyMemory       = "TODO"
	whyGrowth       = "TODO"
	whyIdle         = "TODO"
)
