package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/caa-project/caa/internal/clouds"
	"github.com/caa-project/caa/internal/logbuf"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
	"github.com/caa-project/caa/test/mocks/memory"
)

// node is one node of the in-process tests: a fake apiserver with the
// Node and a peer pod, an in-memory cloud, and the ledger's directory.
type node struct {
	client kubernetes.Interface
	cloud  *cloud.Cloud
	dir    string
}

func newNode(t *testing.T) *node {
	runtimeClass := "kata-remote"
	t.Helper()
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "node-uid"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web", UID: "uid-web"},
			Spec:   corev1.PodSpec{NodeName: "n1", RuntimeClassName: &runtimeClass},
			Status: corev1.PodStatus{Phase: corev1.PodPending}})
	// A socket path must stay under 108 bytes: t.TempDir() can be longer.
	dir, err := filepath.Abs(t.TempDir())
	require.NoError(t, err)
	return &node{client: client, cloud: cloud.New(cloud.Options{IDPrefix: "mem-"}), dir: dir}
}

// runningDaemon is one caa of the node, run in this process by Run.
type runningDaemon struct {
	name   string
	health string // the health socket
	logs   *logbuf.Buffer
	cancel context.CancelFunc
	done   chan error
}

// start runs a caa named name on the node's ledger with args added.
func (nd *node) start(t *testing.T, name string, args ...string) *runningDaemon {
	t.Helper()
	o := NewOptions("test-" + name)
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	o.AddFlags(fs)
	o.AddDaemonFlags(fs)
	sock := filepath.Join(nd.dir, name+".sock")
	require.NoError(t, fs.Parse(append([]string{"--node-name", "n1", "--provider", "memory", "--cluster-id", "c1",
		"--ledger", filepath.Join(nd.dir, "ledger.db"), "--health-addr", "unix:" + sock, "--pod-name", name,
		"--handover-allow-unverified", "--max-pod-vms", "-1", "--confidential=false", "--log-level", "debug",
		"--handover-inert-check", "100ms"}, args...)))
	o.client = nd.client
	mem := memory.New(nd.cloud)
	o.clouds = []*clouds.Cloud{{Name: "memory", AddFlags: func(*pflag.FlagSet) {},
		Open: func(context.Context, *slog.Logger) (provider.Provider, clouds.Defaults, error) {
			return mem, clouds.Defaults{InstanceType: "small", Image: "img"}, nil
		}}}
	ctx, cancel := context.WithCancel(context.Background())
	d := &runningDaemon{name: name, health: sock, logs: &logbuf.Buffer{}, cancel: cancel, done: make(chan error, 1)}
	go func() { d.done <- Run(ctx, o, d.logs) }()
	t.Cleanup(func() { d.stop(t) })
	return d
}

// stop is a SIGTERM: Run must return nil, in time.
func (d *runningDaemon) stop(t *testing.T) {
	t.Helper()
	d.cancel()
	select {
	case err, ok := <-d.done:
		if ok {
			assert.NoError(t, err, "%s stops cleanly; its log:\n%s", d.name, d.logs)
			close(d.done)
		}
	case <-time.After(time.Minute):
		t.Fatalf("%s did not stop; its log:\n%s", d.name, d.logs)
	}
}

// snapshot reads the daemon's /status, or reports why it cannot.
func (d *runningDaemon) snapshot() (health.Snapshot, int, error) {
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", d.health)
		}}}
	var s health.Snapshot
	resp, err := c.Get("http://caa/status")
	if err != nil {
		return s, 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	ready, err := c.Get("http://caa/readyz")
	if err != nil {
		return s, 0, err
	}
	_, _ = io.Copy(io.Discard, ready.Body)
	_ = ready.Body.Close()
	return s, ready.StatusCode, json.NewDecoder(resp.Body).Decode(&s)
}

// waitFor polls the daemon's status until cond holds.
func (d *runningDaemon) waitFor(t *testing.T, what string, cond func(s health.Snapshot, readyz int) bool) health.Snapshot {
	t.Helper()
	var last health.Snapshot
	var lastErr error
	require.Eventually(t, func() bool {
		s, code, err := d.snapshot()
		last, lastErr = s, err
		return err == nil && cond(s, code)
	}, time.Minute, 20*time.Millisecond, "%s: %s; last status %+v (err %v); its log:\n%s", d.name, what, last, lastErr, d.logs)
	return last
}

func ready(_ health.Snapshot, readyz int) bool { return readyz == http.StatusOK }

// TestHandOverInProcess: the hand-over carried out by two daemons built
// by Run in one process, on one ledger, without the binary: the first
// creates the pod's VM, the second asks for the ledger, takes it over and
// serves the same VM with no cloud write; the first, retired, answers 503.
// Then the second is stopped (SIGTERM) and the first, finding the lock
// free twice, takes the ledger back. No VM is created twice or deleted.
func TestHandOverInProcess(t *testing.T) {
	nd := newNode(t)
	a := nd.start(t, "caa-a")
	a.waitFor(t, "ready with the pod's VM", func(s health.Snapshot, code int) bool { return code == 200 && len(nd.cloud.Live()) == 1 })
	vm := nd.cloud.Live()[0].ID
	writes := func() int64 {
		c := nd.cloud.Counters()
		return c[cloud.OpCreate] + c[cloud.OpDelete]
	}
	before := writes()

	b := nd.start(t, "caa-b")
	got := b.waitFor(t, "ready, its hand-over done", func(s health.Snapshot, code int) bool {
		return code == http.StatusOK && s.Handover != nil && s.Handover.Outcome == health.HandoverDone
	})
	assert.Contains(t, got.Handover.Peer, "caa-a (pid")
	assert.Equal(t, health.RoleTookOver, got.Handover.Role)
	old := a.waitFor(t, "retired: not ready once the ledger is handed over", func(_ health.Snapshot, code int) bool { return code == http.StatusServiceUnavailable })
	require.NotNil(t, old.Handover)
	assert.Contains(t, old.Handover.Peer, "caa-b (pid")
	assert.Equal(t, before, writes(), "a hand-over writes nothing to the cloud")

	// The new caa goes away (a failed rollout's SIGTERM): the old one takes
	// the ledger back, with the same VM.
	b.stop(t)
	a.waitFor(t, "ready again after taking the ledger back", ready)
	assert.Equal(t, before, writes(), "neither the stop nor the handback writes to the cloud")
	live := nd.cloud.Live()
	require.Len(t, live, 1)
	assert.Equal(t, vm, live[0].ID, "the pod keeps its VM through both moves")

	a.stop(t)
	l, err := ledger.Open(ledger.Options{Path: filepath.Join(nd.dir, "ledger.db"), Node: "n1", Cluster: "c1", Timeout: time.Second})
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	rec, err := l.Get("uid-web")
	require.NoError(t, err)
	assert.Equal(t, vm, rec.VMID, "the ledger still maps the pod to its VM")
	assert.Equal(t, 1, len(nd.cloud.Instances()), "one VM was ever made")
}
