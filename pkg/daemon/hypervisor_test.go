package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/relayd"
	"github.com/caa-project/caa/pkg/sandbox"
)

func TestHypervisorFlagsCheck(t *testing.T) {
	off := hypervisorFlags{}
	require.NoError(t, off.check(), "the informer mode (no socket) needs nothing more")
	on := hypervisorFlags{socket: "/run/peerpod/hypervisor.sock", nodeIP: "10.0.0.4", startLimit: time.Minute,
		readyBound: defaultSandboxReady, clientTTL: pki.DefaultClientTTL}
	require.NoError(t, on.check())

	noIP := on
	noIP.nodeIP = ""
	assert.ErrorContains(t, noIP.check(), "--node-ip")
	badIP := on
	badIP.nodeIP = "node-4"
	assert.ErrorContains(t, badIP.check(), `--node-ip "node-4"`)
	noLimit := on
	noLimit.startLimit = 0
	assert.ErrorContains(t, noLimit.check(), "--start-vm-timeout")
	noBound := on
	noBound.readyBound = 0
	assert.ErrorContains(t, noBound.check(), "--sandbox-ready-timeout")
	shortTTL := on
	shortTTL.clientTTL = time.Minute
	assert.ErrorContains(t, shortTTL.check(), "--agent-client-cert-ttl 1m0s")
	relative := on
	relative.relay = "relay.sock"
	assert.ErrorContains(t, relative.check(), `--relay-socket "relay.sock"`)
	relative.relay = relayd.DefaultSocket
	assert.NoError(t, relative.check())
}

// The relay's default control socket is in a directory of its own below
// the ledger's.
func TestRelaySocketIsBesideTheLedger(t *testing.T) {
	assert.Equal(t, filepath.Join(filepath.Dir(ledger.DefaultPath), "relay", "relay.sock"), relayd.DefaultSocket)
}

// ledgerOf opens a new ledger holding one running sandbox, or none.
func ledgerOf(t *testing.T, sandboxes int) *ledger.Ledger {
	t.Helper()
	l, err := ledger.Open(ledger.Options{Path: filepath.Join(t.TempDir(), "ledger.db"), Node: "worker-1", Cluster: "cluster-x", Timeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	for i := range sandboxes {
		s, err := l.PutSandbox(ledger.Sandbox{ID: fmt.Sprintf("%064d", i), PodUID: "uid-web", Namespace: "shop", Name: "web",
			Provider: "aws", Phase: ledger.SandboxCreated})
		require.NoError(t, err)
		s.Phase, s.Attempt, s.Key = ledger.SandboxCreating, 1, "sb-a1"
		s, err = l.PutSandbox(s)
		require.NoError(t, err)
		s.VMID, s.Phase = "i-0sb", ledger.SandboxRunning
		_, err = l.PutSandbox(s)
		require.NoError(t, err)
	}
	return l
}

func TestSandboxSyncPeriodHonoursTheAuditInterval(t *testing.T) {
	assert.Equal(t, 2*time.Second, sandboxSyncPeriod(2*time.Second), "the operator's interval, even a short one")
	assert.Equal(t, 10*time.Minute, sandboxSyncPeriod(10*time.Minute))
	assert.Equal(t, 30*time.Second, sandboxSyncPeriod(0), "0 (startup only) still syncs: lost VMs are found by the sync")
}

// TestSilentAgentNoLongerHoldsReadiness: a sandbox whose agent never
// answers (a hung guest) keeps caa unready only until the bound; then it
// is reported once, listed as silent, and caa turns ready. Before, caa
// synced every few seconds for ever and a rollout aborted it.
func TestSilentAgentNoLongerHoldsReadiness(t *testing.T) {
	const bound = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	silentRep := func() sandbox.Report {
		return sandbox.Report{Pending: map[string]string{"sb-hung": "the agent does not answer: i/o timeout"}, Served: []string{"sb-ok"}}
	}
	var told []string
	w := &agentWatch{bound: bound, silent: func(id, why string, d time.Duration) {
		assert.GreaterOrEqual(t, d, bound)
		told = append(told, id)
	}}
	var last health.Pass
	syncs := 0
	report := func(at time.Time, rep sandbox.Report, err error) bool {
		last = w.pass(at, time.Now(), rep, err)
		return last.Converged()
	}
	start := time.Now()
	ready := untilReady(ctx, start, silentRep(), nil, func(context.Context) (sandbox.Report, error) { syncs++; return silentRep(), nil }, report, 20*time.Millisecond)
	require.True(t, ready, "caa turns ready although one agent never answers")
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, bound, "the silent agent held readiness up to the bound")
	assert.Less(t, took, 10*bound, "and not much longer")
	assert.Empty(t, last.Pending)
	require.Len(t, last.Silent, 1)
	assert.Equal(t, "AgentSilent", last.Silent[0].Reason)
	assert.Contains(t, last.Silent[0].Message, "i/o timeout")
	assert.Equal(t, []string{"sb-hung"}, told)

	// Later syncs keep it listed, tell no second time; once it answers it
	// leaves the list, and a new silence starts a new count.
	p := w.pass(time.Now(), time.Now(), silentRep(), nil)
	assert.Len(t, p.Silent, 1)
	assert.Len(t, told, 1, "reported once")
	p = w.pass(time.Now(), time.Now(), sandbox.Report{Served: []string{"sb-ok", "sb-hung"}}, nil)
	assert.Empty(t, p.Silent)
	p = w.pass(time.Now(), time.Now(), silentRep(), nil)
	assert.Empty(t, p.Silent)
	assert.Len(t, p.Pending, 1, "silent again: pending until the bound again")
}

// TestPassCountsSandboxesByPhase: each sync's pass carries the ledger's
// sandboxes by phase, which caa_sandboxes shows.
func TestPassCountsSandboxesByPhase(t *testing.T) {
	led := ledgerOf(t, 1)
	w := &agentWatch{bound: time.Minute, led: led}
	p := w.pass(time.Now(), time.Now(), sandbox.Report{}, nil)
	assert.Equal(t, map[ledger.SandboxPhase]int{ledger.SandboxRunning: 1}, p.Sandboxes)
	_, err := led.PutSandbox(ledger.Sandbox{ID: "sb-new", PodUID: "uid-db", Namespace: "shop", Name: "db", Provider: "aws", Phase: ledger.SandboxCreated})
	require.NoError(t, err)
	p = w.pass(time.Now(), time.Now(), sandbox.Report{}, nil)
	assert.Equal(t, map[ledger.SandboxPhase]int{ledger.SandboxRunning: 1, ledger.SandboxCreated: 1}, p.Sandboxes)
}

// TestSandboxPendingWithinTheBoundHoldsReadiness: within the bound a
// silent agent holds readiness as before (a restart must not turn ready
// past an agent that is merely slow).
func TestSandboxPendingWithinTheBoundHoldsReadiness(t *testing.T) {
	w := &agentWatch{bound: time.Minute}
	at := time.Now()
	p := w.pass(at, at.Add(59*time.Second), sandbox.Report{Pending: map[string]string{"sb": "dialing"}}, nil)
	assert.False(t, p.Converged())
	p = w.pass(at.Add(61*time.Second), at.Add(61*time.Second), sandbox.Report{Pending: map[string]string{"sb": "dialing"}}, nil)
	assert.True(t, p.Converged(), "a minute after the first sync that found it silent")
}

// TestLostAgentCAWithRecordedSandboxRefusesToStart: agent-ca.pem deleted
// while the ledger records a running sandbox: caa does not make a new CA
// (every such VM would refuse caa); the error names the file and the fix.
func TestLostAgentCAWithRecordedSandboxRefusesToStart(t *testing.T) {
	led := ledgerOf(t, 1)
	dir := t.TempDir()
	h := &hypervisorFlags{clientTTL: pki.DefaultClientTTL}
	_, err := loadAgentCA(led, dir, h)
	file := filepath.Join(dir, pki.CurrentFile)
	require.ErrorContains(t, err, file)
	assert.ErrorContains(t, err, "1 sandboxes")
	assert.ErrorContains(t, err, "restore")
	assert.NoFileExists(t, file)

	h.replaceLost = true
	_, err = loadAgentCA(led, dir, h)
	require.NoError(t, err, "--agent-ca-replace-lost: the operator's explicit choice")
	assert.FileExists(t, file)
}

func TestNoSandboxesMakesTheFirstCA(t *testing.T) {
	led := ledgerOf(t, 0)
	dir := t.TempDir()
	_, err := loadAgentCA(led, dir, &hypervisorFlags{clientTTL: pki.DefaultClientTTL})
	require.NoError(t, err)
	assert.FileExists(t, filepath.Join(dir, pki.CurrentFile))
}
