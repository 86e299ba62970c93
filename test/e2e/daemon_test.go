package e2e

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/e2e/cluster"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// caaBin is the daemon under test, built once by TestMain.
var caaBin string

func TestMain(m *testing.M) {
	flag.Parse()
	defaultParallel()
	dir, err := os.MkdirTemp("", "caa-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	caaBin = filepath.Join(dir, "caa")
	if err := cluster.BuildCaa(context.Background(), caaBin, ""); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// awsCloud is a fake EC2 on a local port.
type awsCloud struct {
	core *cloud.Cloud
	url  string
}

func newAWSCloud(t *testing.T) *awsCloud {
	t.Helper()
	core := cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{"ami-0123456789abcdef0"}}))
	srv := httptest.NewServer(ec2fake.NewServer(core))
	t.Cleanup(srv.Close)
	return &awsCloud{core: core, url: srv.URL}
}

// daemon is one caa process.
type daemon struct {
	cmd    *exec.Cmd
	health string
	logs   *cluster.SyncBuffer
	done   chan error
}

// awsArgs point caa at the fake EC2; awsEnv gives it test credentials.
func (a *awsCloud) awsArgs() []string { return ec2Args(a.url) }

// ec2Args point caa at the fake EC2 served at url.
func ec2Args(url string) []string {
	return []string{"--provider", "aws", "--aws-endpoint", url, "--aws-region", "us-east-1",
		"--aws-security-group-ids", "sg-0123456789abcdef0", "--aws-subnet-id", "subnet-0123456789abcdef0", "--aws-image", ec2Image, "--aws-instance-type", ec2Type}
}

func awsEnv() []string {
	return append(os.Environ(), "AWS_ACCESS_KEY_ID=AKIDE2ETEST", "AWS_SECRET_ACCESS_KEY=e2e-secret-key",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
}

// startDaemon starts `caa run` against the fake EC2; extra flags come last,
// so they override (a flag given twice keeps its last value).
func startDaemon(t *testing.T, c *cluster.Cluster, aws *awsCloud, node, ledgerPath string, extra ...string) *daemon {
	t.Helper()
	return launchCaa(t, c, node, ledgerPath, "aws", append(aws.awsArgs(), extra...), awsEnv())
}

// launchCaa starts `caa run` on node with the flags every test shares, then
// args, in env. On failure it logs the tail of the output, labelled.
func launchCaa(t *testing.T, c *cluster.Cluster, node, ledgerPath, label string, args, env []string) *daemon {
	t.Helper()
	return launchCaaBin(t, caaBin, c, node, ledgerPath, label, args, env)
}

// launchCaaBin is launchCaa with another caa build.
func launchCaaBin(t *testing.T, bin string, c *cluster.Cluster, node, ledgerPath, label string, args, env []string) *daemon {
	t.Helper()
	health := freeHealthAddr(t)
	common := []string{"run", "--node-name", node, "--kubeconfig", c.Kubeconfig(), "--ledger", ledgerPath,
		"--health-addr", health, "--resync", "2s", "--audit-interval", "2s", "--confirm-missing", "2s", "--log-format", "json"}
	cmd := exec.Command(bin, append(common, args...)...)
	// These caa processes run outside pods: nothing can verify a hand-over
	// asker, so the hand-over is opted into explicitly (fail closed otherwise).
	cmd.Env = append(slices.Clone(env), "CAA_HANDOVER_ALLOW_UNVERIFIED=true")
	return spawn(t, cmd, cmd.Start, "http://"+health, "caa "+label)
}

// freeHealthAddr is a free loopback address for a caa's --health-addr.
func freeHealthAddr(t *testing.T) string {
	t.Helper()
	port, err := cluster.FreePort()
	require.NoError(t, err)
	return "127.0.0.1:" + strconv.Itoa(port)
}

// spawn starts cmd through start (cmd.Start, or a start that forks it
// elsewhere) as a daemon whose health endpoint is the URL health, keeping
// its output. At the test's end it is killed if still running, and on a
// failure the test's log gets the last 80 lines of its output, labelled.
func spawn(t *testing.T, cmd *exec.Cmd, start func() error, health, label string) *daemon {
	t.Helper()
	logs := &cluster.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, start())
	d := &daemon{cmd: cmd, health: health, logs: logs, done: make(chan error, 1)}
	go func() { d.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("%s output (last 80 lines):\n%s", label, tailLines(logs.String(), 80))
		}
	})
	return d
}

// readyz returns /readyz's status code (0 when nothing answers).
func (d *daemon) readyz() int {
	resp, err := http.Get(d.health + "/readyz")
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-d.done:
		require.NoError(t, err, "caa exits 0 on SIGTERM")
	case <-time.After(60 * time.Second):
		t.Fatal("caa did not stop within 60s of SIGTERM")
	}
}

// waitReady polls /readyz and checks, at the first 200, that check holds.
func (d *daemon) waitReady(t *testing.T, check func()) {
	t.Helper()
	d.waitReadyPolling(t, 50*time.Millisecond, check)
}

// waitReadyPolling is waitReady polling every poll.
func (d *daemon) waitReadyPolling(t *testing.T, poll time.Duration, check func()) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-d.done:
			t.Fatalf("caa exited before ready: %v", err)
		default:
		}
		if d.readyz() == http.StatusOK {
			check()
			return
		}
		time.Sleep(poll) // a poll interval, not a synchronisation
	}
	t.Fatal("caa never became ready")
}

func liveVMs(core *cloud.Cloud) map[string]string {
	out := map[string]string{}
	for _, in := range core.Live() {
		out[in.Tags[provider.TagPodUID]] = in.ID
	}
	return out
}

// TestStartRestartAndRecreate covers the scenarios (a), (b) and (c)
// on AWS: first start, restart with every VM alive, restart after VMs were
// killed behind caa's back.
func TestStartRestartAndRecreate(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	const node, n = "worker-1", 12
	c := startWithNode(ctx, t, node)
	aws := newAWSCloud(t)
	for i := range n {
		_, err := c.CreatePeerPod(ctx, "team", fmt.Sprintf("pod-%02d", i), node, nil)
		require.NoError(t, err)
	}
	// Another node's pod: never touched by this node's caa.
	_, err := c.CreateNode(ctx, "worker-2")
	require.NoError(t, err)
	_, err = c.CreatePeerPod(ctx, "team", "elsewhere", "worker-2", nil)
	require.NoError(t, err)

	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	aws.core.SetFaults(cloud.Faults{Latency: 20 * time.Millisecond})

	// (a) first start: one VM per pod, ready only once all are recorded.
	d := startDaemon(t, c, aws, node, ledgerPath)
	d.waitReady(t, func() {
		assert.Len(t, liveVMs(aws.core), n, "at the first 200 every pod has its VM")
	})
	first := liveVMs(aws.core)
	require.Len(t, first, n)
	d.stop(t)
	assert.Equal(t, first, liveVMs(aws.core), "SIGTERM deleted nothing (I4)")

	// (b) restart with every VM alive: adopted, zero cloud writes.
	aws.core.ResetCounters()
	d = startDaemon(t, c, aws, node, ledgerPath)
	d.waitReady(t, func() {})
	counters := aws.core.Counters()
	assert.Zero(t, counters[cloud.OpCreate], "no create on a warm restart")
	assert.Zero(t, counters[cloud.OpDelete], "no delete on a warm restart")
	assert.Equal(t, first, liveVMs(aws.core))
	d.stop(t)

	// (c) restart after k VMs were killed behind caa's back.
	killed := 0
	for uid, id := range first {
		if killed == 3 {
			break
		}
		require.NoError(t, aws.core.Kill(id), "kill %s", uid)
		killed++
	}
	d = startDaemon(t, c, aws, node, ledgerPath)
	d.waitReady(t, func() {
		assert.Len(t, liveVMs(aws.core), n, "ready only after the killed VMs were recreated")
	})
	after := liveVMs(aws.core)
	same := 0
	for uid, id := range first {
		if after[uid] == id {
			same++
		}
	}
	assert.Equal(t, n-killed, same, "only the killed VMs were replaced")
	d.stop(t)
}

// runCaa runs a one-shot caa command and returns its output.
func runCaa(t *testing.T, args ...string) string {
	t.Helper()
	return runBin(t, caaBin, args...)
}

// runBin runs a caa build's command and returns its output.
func runBin(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = awsEnv()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "caa %v:\n%s", args, out)
	return string(out)
}

// TestGonePodsBadSpecsAndALostLedger covers (d) pods deleted while caa was
// down, (f) terminal pods, (g) a bad annotation, and I6: a lost ledger
// refused by the Node guard, then rebuilt from the cloud's tags.
func TestGonePodsBadSpecsAndALostLedger(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	const node = "worker-1"
	c := startWithNode(ctx, t, node)
	aws := newAWSCloud(t)
	for i := range 6 {
		_, err := c.CreatePeerPod(ctx, "team", fmt.Sprintf("pod-%d", i), node, nil)
		require.NoError(t, err)
	}
	_, err := c.CreatePeerPod(ctx, "team", "bad", node, map[string]string{provider.AnnotationMachineType: "x99.colossal"})
	require.NoError(t, err)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")

	d := startDaemon(t, c, aws, node, ledgerPath)
	d.waitReady(t, func() {
		assert.Len(t, liveVMs(aws.core), 6, "the bad pod gets no VM and does not block readiness")
	})
	// Events on the pods, as kubectl describe shows them. They are sent
	// asynchronously, so they are awaited while caa still runs.
	require.Eventually(t, func() bool {
		return hasEvent(ctx, t, c, "bad", "Warning", "VMCreateFailed") && hasEvent(ctx, t, c, "pod-0", "Normal", "VMCreated")
	}, time.Minute, 100*time.Millisecond, "caa raised events on the pods")
	d.stop(t)
	out := runCaa(t, "ledger", "get", "team/bad", "--ledger", ledgerPath)
	assert.Contains(t, out, "Failed")
	assert.Contains(t, out, provider.AnnotationMachineType)

	// (d) and (f) while caa is down: two pods deleted, one completed.
	require.NoError(t, c.DeletePod(ctx, "team", "pod-0"))
	require.NoError(t, c.DeletePod(ctx, "team", "pod-1"))
	_, err = c.SetPodPhase(ctx, "team", "pod-2", "Succeeded")
	require.NoError(t, err)
	d = startDaemon(t, c, aws, node, ledgerPath)
	d.waitReady(t, func() {})
	require.Eventually(t, func() bool { return len(liveVMs(aws.core)) == 3 }, time.Minute, 100*time.Millisecond,
		"the gone and completed pods' VMs are deleted")
	d.stop(t)

	// I6: the ledger file is lost. The Node remembers it had one, so caa refuses...
	require.NoError(t, os.Remove(ledgerPath))
	refused := startDaemon(t, c, aws, node, ledgerPath)
	select {
	case err := <-refused.done:
		require.Error(t, err, "caa refuses to start on a missing ledger the Node knew")
		assert.Contains(t, refused.logs.String(), "hostPath", "the refusal names the likely cause")
	case <-time.After(time.Minute):
		t.Fatal("caa started on a missing ledger")
	}
	// ...until the ledger is rebuilt from the cloud's tags.
	out = runCaa(t, "ledger", "rebuild", "--provider", "aws", "--node-name", node, "--kubeconfig", c.Kubeconfig(),
		"--ledger", ledgerPath, "--aws-endpoint", aws.url, "--aws-region", "us-east-1",
		"--aws-security-group-ids", "sg-0123456789abcdef0", "--aws-subnet-id", "subnet-0123456789abcdef0")
	assert.Contains(t, out, "recorded 3 VMs")
	before := liveVMs(aws.core)
	aws.core.ResetCounters()
	d = startDaemon(t, c, aws, node, ledgerPath)
	d.waitReady(t, func() {})
	assert.Zero(t, aws.core.Counters()[cloud.OpCreate], "nothing recreated after a rebuild")
	assert.Equal(t, before, liveVMs(aws.core))
	d.stop(t)
}

// hasEvent reports whether pod team/name has an event of that type and reason.
func hasEvent(ctx context.Context, t *testing.T, c *cluster.Cluster, name, typ, reason string) bool {
	t.Helper()
	events, err := c.Client().CoreV1().Events("team").List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + name,
	})
	require.NoError(t, err)
	for _, e := range events.Items {
		if e.Type == typ && e.Reason == reason && e.Source.Component == "caa" {
			return true
		}
	}
	return false
}
