package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/test/e2e/cluster"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// The warm restart (issue 22) and liveness during the waits before the
// reconcile loop (issue 17, item 7), through the binary.

const (
	startupKeyID  = "AKIDSTARTUPA"
	startupSecret = "startup-secret-a"
)

// strictEC2 is a fake EC2 that checks signatures against one key pair,
// knows two subnets and two images, and authorizes against a policy the
// test can change while caa runs (nil: allow all).
type strictEC2 struct {
	core   *cloud.Cloud
	url    string
	policy atomic.Pointer[ec2fake.Policy]
}

func newStrictEC2(t *testing.T) *strictEC2 {
	t.Helper()
	s := &strictEC2{core: cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{"ami-0000000000000000a", "ami-0000000000000000b"}}))}
	srv := httptest.NewServer(ec2fake.NewServer(s.core,
		ec2fake.WithCredentials(startupKeyID, startupSecret),
		ec2fake.WithNetwork([]string{"subnet-0000000000000000a", "subnet-0000000000000000b"}, nil),
		ec2fake.WithPolicyFunc(s.policy.Load)))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// settings are the cloud settings the preflight's fingerprint covers.
type settings struct {
	image, subnet, keyID, secret string
}

var goodSettings = settings{"ami-0000000000000000a", "subnet-0000000000000000a", startupKeyID, startupSecret}

func (s *strictEC2) start(t *testing.T, c *cluster.Cluster, node, ledgerPath string, st settings, extra ...string) *daemon {
	t.Helper()
	args := append([]string{"--provider", "aws", "--aws-endpoint", s.url, "--aws-region", "us-east-1",
		"--aws-security-group-ids", "sg-0123456789abcdef0", "--aws-subnet-id", st.subnet, "--aws-image", st.image, "--aws-instance-type", ec2Type}, extra...)
	env := append(os.Environ(), "AWS_ACCESS_KEY_ID="+st.keyID, "AWS_SECRET_ACCESS_KEY="+st.secret,
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	return launchCaa(t, c, node, ledgerPath, "startup", args, env)
}

// readyzBody returns /readyz's code and body.
func (d *daemon) readyzBody() (int, string) {
	code, body, err := d.fetch("/readyz")
	if err != nil {
		return 0, err.Error()
	}
	return code, body
}

// ledgerEpoch is the number of writable opens the ledger has seen.
func ledgerEpoch(t *testing.T, path string) uint64 {
	t.Helper()
	l, err := ledger.Open(ledger.Options{Path: path, ReadOnly: true, Timeout: 5 * time.Second})
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	return l.Meta().OpenEpoch
}

// TestPreflightFingerprintGatesWritesNotReadiness: a start whose cloud
// settings passed the preflight before turns ready without waiting for it,
// and reports a failure it finds after ready; a start with another image,
// subnet or identity runs the preflight before it even asks for the
// ledger, so a failing preflight leaves a pod that needs a VM without one
// and makes no cloud write.
func TestPreflightFingerprintGatesWritesNotReadiness(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	const node = "worker-warm"
	c := startWithNode(ctx, t, node)
	ec2 := newStrictEC2(t)
	for i := range 2 {
		_, err := c.CreatePeerPod(ctx, "team", fmt.Sprintf("warm-%d", i), node, nil)
		require.NoError(t, err)
	}
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")

	// A first start: no fingerprint recorded, the preflight runs first.
	d := ec2.start(t, c, node, ledgerPath, goodSettings)
	d.waitReady(t, func() {})
	assert.Positive(t, ec2.core.Counters()[ec2fake.OpDryRun], "the first start ran the preflight")
	require.Len(t, liveVMs(ec2.core), 2)
	d.stop(t)

	// Unchanged settings, and a preflight that cannot pass (the launch is
	// no longer allowed; a warm restart needs none): ready all the same,
	// then not ready with the preflight's reason, and a Node event.
	describeOnly, err := ec2fake.ParsePolicy([]byte(`{"Version":"2012-10-17","Statement":[` +
		`{"Effect":"Allow","Action":["ec2:DescribeInstances"],"Resource":"*"}]}`))
	require.NoError(t, err)
	ec2.policy.Store(describeOnly)
	ec2.core.ResetCounters()
	d = ec2.start(t, c, node, ledgerPath, goodSettings)
	// /readyz may be 200 only for the milliseconds before the background
	// preflight fails, too briefly to poll; the time to ready is latched.
	require.Eventually(t, func() bool {
		code, page, err := d.fetch("/metrics")
		if err != nil || code != http.StatusOK {
			return false
		}
		v, ok := metricValue(page, "caa_time_to_ready_seconds")
		return ok && v > 0
	}, time.Minute, 20*time.Millisecond, "the warm restart turned ready before its preflight ran")
	require.Eventually(t, func() bool {
		code, body := d.readyzBody()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "cloud preflight failed")
	}, time.Minute, 50*time.Millisecond, "the failure found after ready is the readiness reason")
	require.Eventually(t, func() bool {
		evs, err := c.Client().CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "CaaPreflightFailed" && e.InvolvedObject.Name == node {
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "and an event on the Node")
	assert.Zero(t, ec2.core.Counters()[cloud.OpCreate]+ec2.core.Counters()[cloud.OpDelete], "a warm restart writes nothing")
	d.stop(t)
	ec2.policy.Store(nil)

	// A pod that needs a VM, and each changed setting the cloud refuses:
	// the preflight runs before the ledger is asked for and blocks; no
	// write, no writable open of the ledger.
	_, err = c.CreatePeerPod(ctx, "team", "warm-new", node, nil)
	require.NoError(t, err)
	for name, st := range map[string]settings{
		"another image":    {"ami-00000000000000009", goodSettings.subnet, goodSettings.keyID, goodSettings.secret},
		"another subnet":   {goodSettings.image, "subnet-00000000000000009", goodSettings.keyID, goodSettings.secret},
		"another identity": {goodSettings.image, goodSettings.subnet, "AKIDSTARTUPB", "startup-secret-b"},
	} {
		t.Run(name, func(t *testing.T) {
			epoch := ledgerEpoch(t, ledgerPath)
			ec2.core.ResetCounters()
			d := ec2.start(t, c, node, ledgerPath, st)
			require.Eventually(t, func() bool {
				code, body := d.readyzBody()
				return code == http.StatusServiceUnavailable && strings.Contains(body, "cloud preflight failed")
			}, time.Minute, 50*time.Millisecond, "blocked by the preflight")
			assert.Zero(t, ec2.core.Counters()[cloud.OpCreate], "no create before the preflight passed")
			assert.Zero(t, ec2.core.Counters()[cloud.OpDelete])
			assert.Len(t, liveVMs(ec2.core), 2)
			d.stop(t)
			assert.Equal(t, epoch, ledgerEpoch(t, ledgerPath), "the ledger was not opened for writing")
		})
	}

	// The settings that passed: the new pod gets its VM.
	d = ec2.start(t, c, node, ledgerPath, goodSettings)
	d.waitReady(t, func() { assert.Len(t, liveVMs(ec2.core), 3) })
	d.stop(t)
}

// livenessWindow is how long the shipped liveness probe takes to restart
// caa once /healthz fails: periodSeconds x failureThreshold, read from
// deploy/base.
func livenessWindow(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "base", "daemonset.yaml"))
	require.NoError(t, err)
	var ds appsv1.DaemonSet
	require.NoError(t, yaml.Unmarshal(b, &ds))
	for _, c := range ds.Spec.Template.Spec.Containers {
		if p := c.LivenessProbe; c.Name == "caa" && p != nil {
			return time.Duration(p.PeriodSeconds*p.FailureThreshold) * time.Second
		}
	}
	t.Fatal("deploy/base/daemonset.yaml has no liveness probe on the caa container")
	return 0
}

// assertLiveThrough polls /healthz for window (plus the heartbeat bound of
// the test's --resync 2s) and fails at the first answer that is not 200,
// while blocked stays true: the wait under test is still under way.
func assertLiveThrough(t *testing.T, d *daemon, window time.Duration, blocked func() (bool, string)) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get(d.health + "/healthz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return true
	}, 30*time.Second, 20*time.Millisecond, "caa serves /healthz")
	end := time.Now().Add(window + 3*2*time.Second)
	polls := 0
	for time.Now().Before(end) {
		select {
		case err := <-d.done:
			t.Fatalf("caa exited during the wait: %v", err)
		default:
		}
		resp, err := http.Get(d.health + "/healthz")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "after %d polls: /healthz %s", polls, body)
		ok, why := blocked()
		require.True(t, ok, "the wait ended early: %s", why)
		polls++
		time.Sleep(time.Second) // the probe's own cadence is 20 s; this is finer
	}
}

// TestLiveWhileThePreflightRetries: credentials EC2 refuses keep the
// preflight retrying; /healthz stays 200 for longer than the shipped
// liveness probe takes to restart the container.
func TestLiveWhileThePreflightRetries(t *testing.T) {
	t.Parallel()
	window := livenessWindow(t)
	ctx := testContext(t, window+3*time.Minute)
	const node = "worker-refused"
	c := startWithNode(ctx, t, node)
	ec2 := newStrictEC2(t)
	d := ec2.start(t, c, node, filepath.Join(t.TempDir(), "caa", "ledger.db"),
		settings{goodSettings.image, goodSettings.subnet, "AKIDREFUSED", "refused-secret"})
	require.Eventually(t, func() bool {
		_, body := d.readyzBody()
		return strings.Contains(body, "cloud preflight failed")
	}, time.Minute, 50*time.Millisecond)
	assertLiveThrough(t, d, window, func() (bool, string) {
		code, body := d.readyzBody()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "cloud preflight failed"), body
	})
	d.stop(t)
}

// TestLiveWhileTheApiserverIsAway: an apiserver that refuses connections
// keeps caa retrying before it reads anything; /healthz stays 200 for
// longer than the shipped liveness probe takes to restart the container.
func TestLiveWhileTheApiserverIsAway(t *testing.T) {
	t.Parallel()
	window := livenessWindow(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().String()
	require.NoError(t, l.Close())
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://%s"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`, dead)), 0o600))
	ec2 := newStrictEC2(t)
	d := ec2.start(t, &cluster.Cluster{}, "worker-away", filepath.Join(dir, "caa", "ledger.db"), goodSettings,
		"--kubeconfig", kubeconfig)
	assertLiveThrough(t, d, window, func() (bool, string) {
		code, body := d.readyzBody()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "Kubernetes API"), body
	})
	d.stop(t)
}
