package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// The scenarios below drive the caa binary the way daemon_test.go does, with
// flags of their own. Every wait is a poll on a condition with a generous
// deadline; nothing asserts that caa is faster than some bound.

const (
	ec2Image = "ami-0123456789abcdef0"
	// ec2Type runs AMD SEV-SNP: caa's default, --confidential, needs a
	// type that can.
	ec2Type = "m6a.large"
	// condPoll is the interval of the condition polls, not a synchronisation.
	condPoll = 50 * time.Millisecond
)

// startCaa is startDaemon with a label for the failure log.
func startCaa(t *testing.T, c *cluster.Cluster, aws *awsCloud, node, ledgerPath, label string, extra ...string) *daemon {
	t.Helper()
	return launchCaa(t, c, node, ledgerPath, label, append(aws.awsArgs(), extra...), awsEnv())
}

// startWithNode starts a cluster with the node.
func startWithNode(ctx context.Context, t *testing.T, node string) *cluster.Cluster {
	t.Helper()
	c := cluster.Start(ctx, t)
	_, err := c.CreateNode(ctx, node)
	require.NoError(t, err)
	return c
}

// testContext is a test's context: it ends at the timeout, or with the
// test, before the test's cleanups run.
func testContext(t *testing.T, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return ctx
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// kill sends SIGKILL and waits for the process to be gone. It fails t if
// caa had already exited on its own.
func (d *daemon) kill(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("SIGKILL caa: %v", err)
	}
	select {
	case err := <-d.done:
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "caa ended by SIGKILL")
		ws, ok := exit.Sys().(syscall.WaitStatus)
		require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "caa exited on its own before the kill: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("caa still running 30s after SIGKILL")
	}
}

// requireRunning fails t if caa has exited; it never blocks.
func (d *daemon) requireRunning(t *testing.T) {
	t.Helper()
	select {
	case err := <-d.done:
		t.Fatalf("caa exited on its own: %v", err)
	default:
	}
}

// fetch returns the status and body of GET path on the health address.
func (d *daemon) fetch(path string) (int, string, error) {
	resp, err := http.Get(d.health + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// get returns the body of GET path on the health address; it fails t on
// anything but a 200.
func (d *daemon) get(t *testing.T, path string) string {
	t.Helper()
	code, body, err := d.fetch(path)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "GET %s: %s", path, body)
	return body
}

// passes is how many passes the daemon has reported (0 when it does not
// answer).
func (d *daemon) passes() int {
	snap, _ := d.snapshot()
	return snap.Passes
}

// waitPasses waits until the daemon has reported n more passes than now.
func (d *daemon) waitPasses(t *testing.T, n int) {
	t.Helper()
	from := d.passes()
	require.Eventually(t, func() bool { return d.passes() >= from+n }, time.Minute, condPoll,
		"caa reports %d more passes after %d", n, from)
}

// metricValue reads one sample of a metric from a Prometheus text page:
// the first line that starts with series (a name, or a name and labels).
func metricValue(page, series string) (float64, bool) {
	for _, line := range strings.Split(page, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// byPod groups the cloud's instances by their pod UID tag; live drops the
// terminated ones.
func byPod(core *cloud.Cloud, live bool) map[string][]cloud.Instance {
	all := core.Instances()
	if live {
		all = core.Live()
	}
	out := map[string][]cloud.Instance{}
	for _, in := range all {
		uid := in.Tags[provider.TagPodUID]
		out[uid] = append(out[uid], in)
	}
	return out
}

// oneEach reports whether the live VMs are exactly one per pod in uids and
// nothing else; why says what differs.
func oneEach(core *cloud.Cloud, uids map[string]string) (ok bool, why string) {
	live := byPod(core, true)
	var problems []string
	for uid, name := range uids {
		if n := len(live[uid]); n != 1 {
			problems = append(problems, fmt.Sprintf("%s has %d live VMs", name, n))
		}
	}
	for uid, vms := range live {
		if _, ok := uids[uid]; !ok {
			problems = append(problems, fmt.Sprintf("%d live VMs of pod UID %q that no pod has", len(vms), uid))
		}
	}
	slices.Sort(problems)
	if len(problems) > 5 {
		problems = append(problems[:5], fmt.Sprintf("and %d more", len(problems)-5))
	}
	return len(problems) == 0, strings.Join(problems, "; ")
}

// requireOneEach waits until every pod in uids has exactly one live VM and
// no other live VM remains (orphans are collected after their grace).
func requireOneEach(t *testing.T, core *cloud.Cloud, uids map[string]string, within time.Duration) {
	t.Helper()
	var why string
	deadline := time.Now().Add(within)
	for {
		var ok bool
		if ok, why = oneEach(core, uids); ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the live VMs are not one per pod: %s", within, why)
		}
		time.Sleep(condPoll)
	}
}

// createPods creates n peer pods ns/<prefix>-NNN on node and returns their
// names by UID.
func createPods(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, prefix, node string, n int) map[string]string {
	t.Helper()
	uids := map[string]string{}
	for i := range n {
		p, err := c.CreatePeerPod(ctx, ns, fmt.Sprintf("%s-%03d", prefix, i), node, nil)
		require.NoError(t, err)
		uids[string(p.UID)] = p.Namespace + "/" + p.Name
	}
	return uids
}

// exportLedger reads every record from a ledger no daemon holds.
func exportLedger(t *testing.T, ledgerPath string) map[string]ledger.Record {
	t.Helper()
	out := map[string]ledger.Record{}
	for _, line := range strings.Split(strings.TrimSpace(runCaa(t, "ledger", "export", "--ledger", ledgerPath)), "\n") {
		if line == "" {
			continue
		}
		var r ledger.Record
		require.NoError(t, json.Unmarshal([]byte(line), &r), "export line %q", line)
		out[r.PodUID] = r
	}
	return out
}

// TestOrphanVMCollectedAfterGrace is scenario (e): a VM tagged for this
// cluster and node whose pod does not exist is deleted, but only once caa
// has known it as an orphan for the grace period (I3), and only it.
func TestOrphanVMCollectedAfterGrace(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	c := cluster.Start(ctx, t)
	aws := newAWSCloud(t)
	const node, grace = "worker-1", 6 * time.Second

	ns, err := c.Client().CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	require.NoError(t, err)
	clusterID := string(ns.UID)
	require.NotEmpty(t, clusterID)
	vm := func(clusterUID, nodeName, uid, name string) cloud.Instance {
		spec := provider.Spec{Key: uid + "-a1", Cluster: clusterUID, Node: nodeName, PodUID: uid, PodNamespace: "team", PodName: name}
		in, err := aws.core.Create(cloud.CreateRequest{Name: "caa-team-" + name, Tags: spec.Tags(), InstanceType: ec2Type, Image: ec2Image})
		require.NoError(t, err)
		return in
	}
	// No pod has these UIDs. Only the first is this node's orphan; the
	// others belong to another node and another cluster.
	orphan := vm(clusterID, node, "0bad0000-0000-4000-8000-000000000001", "ghost")
	otherNode := vm(clusterID, "worker-2", "0bad0000-0000-4000-8000-000000000002", "elsewhere")
	otherCluster := vm("another-cluster", node, "0bad0000-0000-4000-8000-000000000003", "foreign")

	_, err = c.CreateNode(ctx, node)
	require.NoError(t, err)
	uids := createPods(ctx, t, c, "team", "keep", node, 2)

	// The orphan is older than the grace before caa starts, so what holds
	// it back is only the two sightings a grace apart.
	for time.Since(orphan.CreatedAt) < grace {
		time.Sleep(100 * time.Millisecond) // waiting out the VM's age
	}
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	started := time.Now() // caa cannot see the orphan before this
	d := startCaa(t, c, aws, node, ledgerPath, "orphan", "--gc-grace", grace.String(), "--resync", "1s", "--audit-interval", "1s")
	d.waitReady(t, func() {})

	isLive := func(id string) bool {
		in, err := aws.core.Get(id)
		return err == nil && in.State != provider.StateTerminated
	}
	// Still there while caa has known it for less than the grace.
	for time.Since(started) < grace/2 {
		require.True(t, isLive(orphan.ID), "orphan deleted %s after caa started, before the %s grace", time.Since(started), grace)
		d.requireRunning(t)
		time.Sleep(condPoll)
	}
	// Gone after it.
	require.Eventually(t, func() bool { return !isLive(orphan.ID) }, time.Minute, condPoll, "the orphan is collected after its grace")
	gone := time.Since(started)
	t.Logf("orphan deleted %s after caa started (grace %s)", gone.Round(time.Millisecond), grace)
	assert.GreaterOrEqual(t, gone, grace, "the orphan outlived the grace since caa could first see it")
	assert.True(t, isLive(otherNode.ID), "another node's VM is not this caa's")
	assert.True(t, isLive(otherCluster.ID), "another cluster's VM is not this caa's")
	live := byPod(aws.core, true)
	for uid, name := range uids {
		assert.Len(t, live[uid], 1, "pod %s keeps its one VM", name)
	}
	assert.Len(t, aws.core.Live(), len(uids)+2, "the pods' VMs and the two foreign ones are all that is left")
	assert.EqualValues(t, 1, aws.core.Counters()["deleted"], "one delete: the orphan")
	require.Eventually(t, func() bool {
		_, page, err := d.fetch("/metrics")
		v, ok := metricValue(page, "caa_orphans_deleted_total")
		return err == nil && ok && v == 1
	}, time.Minute, condPoll, "the metrics count the orphan once its pass ends")
	d.stop(t)
}

// TestCrashSafetyUnderRandomKills is scenario (h): SIGKILL caa again and
// again while it creates the VMs of 100 pods, restarting it each time on the
// same ledger. At the end every pod has exactly one VM, none was ever
// duplicated (I1), nothing is left over, and the ledger verifies.
// CAA_E2E_SEED replays a run's kill schedule.
func TestCrashSafetyUnderRandomKills(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CAA_E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "CAA_E2E_SEED")
		seed = v
	}
	t.Logf("kill schedule seed %d (replay with CAA_E2E_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1|1))

	c := cluster.Start(ctx, t)
	aws := newAWSCloud(t)
	const node, n, kills = "worker-1", 100, 24
	_, err := c.CreateNode(ctx, node)
	require.NoError(t, err)
	uids := createPods(ctx, t, c, "crash", "pod", node, n)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	aws.core.SetFaults(cloud.Faults{Latency: 15 * time.Millisecond})
	// A slow write budget keeps creates going across many lives: each start
	// may spend a burst of 2, then 5 a second.
	flags := []string{"--gc-grace", "3s", "--resync", "1s", "--audit-interval", "1s", "--create-rate", "5", "--create-burst", "2"}

	begin := time.Now()
	whileCreating := 0
	for i := range kills {
		before := len(aws.core.Live())
		d := startCaa(t, c, aws, node, ledgerPath, fmt.Sprintf("life %d", i+1), flags...)
		started := time.Now()
		var how string
		if rng.IntN(2) == 0 {
			delay := time.Duration(rng.IntN(1501)) * time.Millisecond
			how = "after " + delay.String()
			select {
			case err := <-d.done:
				t.Fatalf("caa exited on its own: %v", err)
			case <-time.After(delay): // the kill moment itself, not a synchronisation
			}
		} else {
			k := 1 + rng.IntN(5)
			target := min(before+k, n)
			how = fmt.Sprintf("once %d VMs exist", target)
			deadline := time.Now().Add(30 * time.Second)
			for len(aws.core.Live()) < target && time.Now().Before(deadline) {
				d.requireRunning(t)
				time.Sleep(5 * time.Millisecond)
			}
		}
		d.kill(t)
		live := len(aws.core.Live())
		if live < n {
			whileCreating++
		}
		t.Logf("kill %2d %-22s: %3d ms after start, %3d -> %3d live VMs", i+1, how, time.Since(started).Milliseconds(), before, live)
	}
	t.Logf("%d kills in %s, %d of them with VMs still to create", kills, time.Since(begin).Round(time.Millisecond), whileCreating)

	// The last life converges and collects whatever is left over.
	d := startCaa(t, c, aws, node, ledgerPath, "final", flags...)
	d.waitReady(t, func() {})
	requireOneEach(t, aws.core, uids, 2*time.Minute)
	d.waitPasses(t, 2)
	ok, why := oneEach(aws.core, uids)
	require.True(t, ok, "still one VM per pod two passes later: %s", why)
	t.Logf("converged %s after the first start", time.Since(begin).Round(time.Millisecond))

	// Attempt 1's key is reused on every resume, so no pod ever needed a
	// second VM: more than one means a duplicate, however short-lived.
	for uid, vms := range byPod(aws.core, false) {
		if len(vms) != 1 {
			var desc []string
			for _, v := range vms {
				desc = append(desc, fmt.Sprintf("%s %s key %s created %s", v.ID, v.State, v.Tags[provider.TagKey], v.CreatedAt.Format(time.StampMilli)))
			}
			t.Errorf("pod %s (%s) had %d VMs: %s", uids[uid], uid, len(vms), strings.Join(desc, "; "))
		}
	}
	live := byPod(aws.core, true)
	d.stop(t)

	runCaa(t, "ledger", "verify", "--ledger", ledgerPath)
	recs := exportLedger(t, ledgerPath)
	assert.Len(t, recs, n, "one record per pod")
	for uid, name := range uids {
		r, ok := recs[uid]
		if !assert.True(t, ok, "pod %s has a record", name) || len(live[uid]) != 1 {
			continue
		}
		assert.Equal(t, ledger.PhaseRunning, r.Phase, "pod %s", name)
		assert.Equal(t, live[uid][0].ID, r.VMID, "pod %s's record names its live VM", name)
	}
}

// TestConvergesThroughCloudFaults is scenario (i): with throttling, server
// errors and eventual consistency on, caa still gives each of 20 pods one
// VM, and deletes nothing on a NotFound (I3).
func TestConvergesThroughCloudFaults(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	const node, n = "worker-1", 20
	c := startWithNode(ctx, t, node)
	aws := newAWSCloud(t)
	uids := createPods(ctx, t, c, "faulty", "pod", node, n)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	// Every 7th call throttled, not every 4th: once one pod is left, a
	// pass that tries it makes 3 calls in a row (the listing, the lookup of
	// its idempotency key, the create), so every 4th call failed 3 tries in
	// 4 whatever caa did, and the last pod could stay throttled for the
	// whole deadline (CI saw it). A real cloud's bucket does not lock onto
	// a call pattern like that.
	aws.core.SetFaults(cloud.Faults{
		Latency:       10 * time.Millisecond,
		ThrottleEvery: 7, RetryAfter: time.Second,
		ServerErrorRate: 0.1,
		InvisibleFor:    2 * time.Second,
	})

	d := startCaa(t, c, aws, node, ledgerPath, "faults",
		"--confirm-missing", "10s", "--resync", "1s", "--audit-interval", "1s", "--create-rate", "50", "--create-burst", "20")
	d.waitReady(t, func() {})
	requireOneEach(t, aws.core, uids, time.Minute)
	// More passes with the faults still on: a VM a listing or a Get misses
	// now and then is never deleted or replaced.
	d.waitPasses(t, 5)

	counters := aws.core.Counters()
	notFound, _ := metricValue(d.get(t, "/metrics"), `caa_cloud_calls_total{op="get",result="not_found"}`)
	t.Logf("cloud counters: %v; NotFound answers to caa's Gets: %v", counters, notFound)
	ok, why := oneEach(aws.core, uids)
	assert.True(t, ok, "one live VM per pod: %s", why)
	assert.Zero(t, counters["deleted"], "no delete")
	assert.EqualValues(t, n, counters["created"], "one create per pod, no duplicate")
	for _, in := range aws.core.Instances() {
		assert.NotEqual(t, provider.StateTerminated, in.State, "VM %s of %s was terminated", in.ID, in.Tags[provider.TagPod])
	}
	assert.Positive(t, counters["throttled"], "throttling happened")
	assert.Positive(t, counters["serverErrors"], "server errors happened")
	d.stop(t)
}

// TestRecreateUnderEventualConsistency: a VM killed behind caa's back is
// replaced exactly once even though the replacement stays invisible for a
// while. Neither the replacement's NotFound nor the dead VM, still listed as
// terminated, may start a third VM (I1, I3).
func TestRecreateUnderEventualConsistency(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	c := cluster.Start(ctx, t)
	aws := newAWSCloud(t)
	const node, n, invisible = "worker-1", 3, 3 * time.Second
	_, err := c.CreateNode(ctx, node)
	require.NoError(t, err)
	uids := createPods(ctx, t, c, "team", "pod", node, n)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	aws.core.SetFaults(cloud.Faults{Latency: 10 * time.Millisecond, InvisibleFor: invisible})

	d := startCaa(t, c, aws, node, ledgerPath, "recreate", "--confirm-missing", "10s", "--resync", "1s", "--audit-interval", "1s")
	d.waitReady(t, func() {})
	requireOneEach(t, aws.core, uids, time.Minute)

	var uid string
	for u := range uids {
		uid = u
		break
	}
	dead := byPod(aws.core, true)[uid][0]
	require.NoError(t, aws.core.Kill(dead.ID))
	// The replacement appears, then outlives its invisibility by a few passes.
	var repl cloud.Instance
	require.Eventually(t, func() bool {
		live := byPod(aws.core, true)[uid]
		if len(live) == 0 {
			return false
		}
		repl = live[0]
		return true
	}, time.Minute, condPoll, "caa replaces the killed VM")
	for time.Since(repl.CreatedAt) < invisible {
		d.requireRunning(t)
		time.Sleep(condPoll) // the replacement is still invisible
	}
	d.waitPasses(t, 3)

	all := byPod(aws.core, false)[uid]
	var desc []string
	for _, v := range all {
		desc = append(desc, fmt.Sprintf("%s %s key %s", v.ID, v.State, v.Tags[provider.TagKey]))
	}
	assert.Len(t, all, 2, "the killed VM and one replacement, no more: %s", strings.Join(desc, "; "))
	ok, why := oneEach(aws.core, uids)
	assert.True(t, ok, "one live VM per pod: %s", why)
	assert.Zero(t, aws.core.Counters()["deleted"], "nothing for caa to delete")
	d.stop(t)
}

// TestAPIServerRestartAndTheCLI is scenario (j): the kube-apiserver
// restarts under a ready caa, which deletes nothing meanwhile and afterwards
// still follows pod deletions. Before that, with caa running, the CLI reads
// the ledger through the daemon's socket and the status and metrics answer.
func TestAPIServerRestartAndTheCLI(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	const node, n = "worker-1", 10
	c := startWithNode(ctx, t, node)
	aws := newAWSCloud(t)
	uids := createPods(ctx, t, c, "team", "pod", node, n)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	aws.core.SetFaults(cloud.Faults{Latency: 10 * time.Millisecond})

	d := startDaemon(t, c, aws, node, ledgerPath)
	d.waitReady(t, func() {})
	requireOneEach(t, aws.core, uids, time.Minute)

	// The daemon holds the file; the CLI goes through its socket.
	out := runCaa(t, "ledger", "ls", "--ledger", ledgerPath)
	for _, name := range uids {
		assert.Contains(t, out, strings.TrimPrefix(name, "team/"), "ledger ls lists %s", name)
	}
	assert.Contains(t, runCaa(t, "ledger", "stats", "--ledger", ledgerPath), "daemon on", "the CLI read through the daemon")
	status := runCaa(t, "status", "--addr", d.health)
	assert.Regexp(t, `(?m)^Ready:\s+yes$`, status)
	metrics := d.get(t, "/metrics")
	assert.Contains(t, metrics, "caa_reconcile_passes_total")
	assert.Contains(t, metrics, "caa_cloud_calls_total")
	took, ok := metricValue(metrics, "caa_reconcile_pass_duration_seconds_sum")
	assert.True(t, ok && took > 0, "passes that call the cloud take some time: caa_reconcile_pass_duration_seconds_sum %v", took)

	before := liveVMs(aws.core)
	require.Len(t, before, n)
	aws.core.ResetCounters()
	require.NoError(t, c.RestartAPIServer(ctx))
	assert.Zero(t, aws.core.Counters()["deleted"], "nothing deleted while the apiserver was down")
	require.Eventually(t, func() bool { return d.readyz() == http.StatusOK }, time.Minute, condPoll, "caa ready after the restart")
	d.waitPasses(t, 3)
	d.requireRunning(t)
	assert.Zero(t, aws.core.Counters()["deleted"], "nothing deleted after the apiserver came back")
	assert.Equal(t, before, liveVMs(aws.core), "every VM still live")

	// The informer is back: a pod deleted now loses its VM.
	var gone string
	for uid, name := range uids {
		if name == "team/pod-000" {
			gone = uid
		}
	}
	require.NoError(t, c.DeletePod(ctx, "team", "pod-000"))
	delete(uids, gone)
	requireOneEach(t, aws.core, uids, 2*time.Minute)
	in, err := aws.core.Get(before[gone])
	require.NoError(t, err, "EC2 shows a terminated instance for an hour")
	assert.Equal(t, provider.StateTerminated, in.State, "the deleted pod's VM is terminated")
	assert.EqualValues(t, 1, aws.core.Counters()["deleted"], "one delete: the deleted pod's VM")
	d.stop(t)
}
