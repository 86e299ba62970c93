package e2e

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/podvm"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/sandbox"
	"github.com/caa-project/caa/test/e2e/cluster"
	katafake "github.com/caa-project/caa/test/mocks/kata"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// TestHypervisorKataPodEndToEnd drives the caa binary as kata would, on
// the real apiserver: a kata-remote pod, then the shim's CreateVM and
// StartVM; the pod VM boots from caa's user data (the fake EC2 behind the
// real SDK provider, the fake pod VM reading the instance's user data); the
// shim's one connection to caa's agent socket reaches the fake agent (relay
// and mutual TLS real) for a health check and a long wait; a packet for the
// pod crosses caa's VXLAN tunnel to the VM, and one from the VM (as the pod)
// comes back to the pod's gateway on the node; StopVM answers fast and the
// VM is deleted.
func TestHypervisorKataPodEndToEnd(t *testing.T) {
	serial(t, "it asserts StopVM answers within kata's one second, a latency other tests' load would stretch")
	ctx, e := newHVEnv(t, 3*time.Minute)
	pod := e.newPod(ctx, t, "shop", "web-0", nil)
	d := e.startReady(t)
	v, err := e.shim.Version(ctx)
	require.NoError(t, err)
	assert.NotEmpty(t, v)

	id := sandboxID(1)
	cfg := e.serveOnePod(ctx, t, pod, id)
	// The VM's secrets went to the VM only (I7): not in caa's logs.
	keyBody := pemBody(t, cfg.TLSServerKeyPEM)
	assert.NotContains(t, d.logs.String(), keyBody, "the VM's private key is in caa's logs")
	assert.NotContains(t, d.logs.String(), "PRIVATE KEY")
	assert.NotContains(t, d.logs.String(), "e2e-initdata-7f3a", "the initdata is in caa's logs")
	d.stop(t)
	_, hist, err := e.readLedger(t, id)
	require.Error(t, err, "the record goes with the VM")
	assert.NotEmpty(t, hist, "the story stays in history")
	raw, err := os.ReadFile(e.ledger)
	require.NoError(t, err)
	assert.False(t, bytes.Contains(raw, []byte(keyBody)), "the VM's private key is in the ledger (I7)")
	assert.False(t, bytes.Contains(raw, []byte("e2e-initdata-7f3a")), "the initdata is in the ledger (I7)")
	ca, err := os.Stat(filepath.Join(filepath.Dir(e.ledger), pki.CurrentFile))
	require.NoError(t, err, "the agent CA's key file lives beside the ledger")
	assert.Equal(t, os.FileMode(0o600), ca.Mode().Perm())
}

// serveOnePod is kata's life of one sandbox of pod through the running caa:
// CreateVM (no cloud call), StartVM (one VM, booted from caa's user data as
// the cloud's stock image reads it), the shim's one connection to the agent
// socket for a health check and a wait answered through caa's relay and the
// VM's mutual TLS, a packet each way through the tunnel, StopVM answered
// fast and the VM deleted after. It returns the configuration the VM read.
func (e *hvEnv) serveOnePod(ctx context.Context, t *testing.T, pod *peerPod, id string) podvm.Config {
	t.Helper()
	const initData = "algorithm = \"sha384\"\nversion = \"0.1.0\"\n[data]\n\"policy.rego\" = \"e2e-initdata-7f3a\"\n"
	sock, err := e.shim.CreateVM(ctx, id, pod.annotations(map[string]string{sandbox.AnnotationInitData: initData}), pod.net.NSPath)
	require.NoError(t, err)
	assert.Empty(t, instanceIDs(e.core.Instances()), "no VM before StartVM: CreateVM makes no cloud call, and the pod informer creates none in this mode")
	t0 := time.Now()
	require.NoError(t, e.shim.StartVM(ctx, id), "failed boots: %v", e.fleet.Failed())
	t.Logf("StartVM through the binary took %s", time.Since(t0).Round(time.Millisecond))

	vms := e.liveSandboxVMs(id)
	require.Len(t, instanceIDs(vms), 1, "one VM for the sandbox")
	vm := e.fleet.VM(vms[0].ID)
	require.NotNil(t, vm, "the pod VM booted from the instance's user data")
	cfg := vm.Files.Config
	assert.Equal(t, pod.name, cfg.PodName)
	assert.Equal(t, pod.ns, cfg.PodNamespace)
	assert.Equal(t, pod.net.IP, cfg.Network.PodIP, "the VM plays the pod's own address")
	assert.Equal(t, e.cn.NodeIP.Addr(), cfg.Network.WorkerIP.Addr(), "the tunnel's far end is --node-ip")
	assert.Equal(t, initData, cfg.InitData, "the shim's initdata reached the VM")
	if vm.RunDir != "" {
		// Upstream's process-user-data took the document and unpacked the
		// initdata's files where the image's services read them.
		for _, f := range []string{"apf.json", "initdata", "initdata.digest"} {
			assert.FileExists(t, filepath.Join(vm.RunDir, f))
		}
		policy, err := os.ReadFile(filepath.Join(vm.RunDir, "policy.rego"))
		require.NoError(t, err, "upstream's process-user-data unpacked the initdata")
		assert.Equal(t, "e2e-initdata-7f3a", string(policy))
		if e.cloudName == "aws" {
			assert.Equal(t, []string{"PUT /latest/api/token", "GET /latest/user-data"}, vm.MetadataRequests(),
				"upstream's process-user-data fetched the user data from EC2's metadata service itself")
		}
	}

	// The shim's one long-lived connection to the agent: a health check and
	// a wait that outlives it.
	conn, err := net.Dial("unix", sock)
	require.NoError(t, err)
	agent := ttrpc.NewClient(conn)
	defer agent.Close()
	st, err := agentproto.Check(ctx, agent)
	require.NoError(t, err)
	require.EqualValues(t, agentproto.Serving, st)
	waited := make(chan int32, 1)
	go func() {
		st, err := agentproto.WaitProcess(ctx, agent, "c1", "")
		if err != nil {
			st = -1
		}
		waited <- st
	}()
	require.NoError(t, vm.Agent.AwaitWaiting(ctx, "c1"))
	require.True(t, vm.Agent.Release("c1", 7))
	assert.EqualValues(t, 7, <-waited, "the wait's answer came back through caa's relay")
	assert.Positive(t, vm.Stats().Relayed)
	assert.Empty(t, vm.Stats().Rejected, "every connection passed mutual TLS")

	// The pod network: a packet for the pod, entering the pod's namespace
	// from the node, comes out in the VM.
	var rx *net.UDPConn
	require.NoError(t, podvmfake.InNetNS(vm.PodNamespace(), func() error {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: pod.net.IP.Addr().AsSlice(), Port: 7777})
		return err
	}))
	defer rx.Close()
	sent, err := podvmfake.SendUntilReceived(e.cn.NodeNS, pod.net.IP.Addr().String()+":7777", rx)
	require.NoError(t, err)
	require.True(t, sent, "no packet crossed caa's tunnel")
	// And back: the VM, as the pod, reaches the pod's gateway on the node.
	var back *net.UDPConn
	require.NoError(t, podvmfake.InNetNS(e.cn.NodeNS, func() error {
		back, err = net.ListenUDP("udp4", &net.UDPAddr{IP: pod.net.GatewayIP.AsSlice(), Port: 7778})
		return err
	}))
	defer back.Close()
	sent, err = podvmfake.SendUntilReceived(vm.PodNamespace(), pod.net.GatewayIP.String()+":7778", back)
	require.NoError(t, err)
	require.True(t, sent, "no packet from the VM crossed caa's tunnel")

	// StopVM: answered within kata's second; the VM is deleted after.
	t1 := time.Now()
	require.NoError(t, e.shim.StopVM(ctx, id))
	stopTook := time.Since(t1)
	t.Logf("StopVM answered in %s", stopTook.Round(time.Millisecond))
	assert.Less(t, stopTook, time.Second, "runtime-rs gives StopVM about a second")
	// The socket closes after StopVM's answer, in the background.
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "the stopped sandbox's agent socket is closed")
	require.Eventually(t, func() bool {
		return !slices.Contains(instanceIDs(e.core.Live()), vms[0].ID)
	}, 30*time.Second, 20*time.Millisecond, "the sandbox's VM is deleted")
	if in, err := e.core.Get(vms[0].ID); err == nil {
		assert.Equal(t, provider.StateTerminated, in.State)
	}
	return cfg
}

// pemBody is the first base64 line of a PEM block's body: enough to find
// the block in a log or a file, whatever its framing.
func pemBody(t *testing.T, b []byte) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Greater(t, len(lines), 2, "a PEM block")
	return lines[1]
}

// TestHypervisorHostileInput: the shim (or a pod's author) asks for what
// caa must refuse: an image outside the node's allow-list, an oversized
// initdata (in the shim's annotations, or on the pod itself), a sandbox id
// that is a path, StartVM and StopVM of a sandbox never created, a sandbox
// that names no pod, the node's own network namespace as the pod's. Each gets a status code and a message naming the field
// and the fix; nothing reaches the cloud; the running sandbox stays served
// (its shim's connection too) and the ledger verifies clean.
func TestHypervisorHostileInput(t *testing.T) {
	t.Parallel()
	ctx, e := newHVEnv(t, 3*time.Minute)
	good := e.newPod(ctx, t, "shop", "good", nil)
	big := strings.Repeat("x", sandbox.MaxInitData+1)
	hostile := e.newPod(ctx, t, "shop", "bad", map[string]string{sandbox.AnnotationInitData: big})
	d := e.startReady(t)
	ok := sandboxID(5)
	sock, err := e.shim.CreateVM(ctx, ok, good.annotations(nil), good.net.NSPath)
	require.NoError(t, err)
	require.NoError(t, e.shim.StartVM(ctx, ok), "failed boots: %v", e.fleet.Failed())
	conn, err := net.Dial("unix", sock)
	require.NoError(t, err)
	agent := ttrpc.NewClient(conn)
	defer agent.Close()
	e.door.reset()

	refused := func(err error, code codes.Code, says ...string) {
		t.Helper()
		require.Error(t, err)
		assert.Equal(t, code, status.Code(err), "%v", err)
		for _, s := range says {
			assert.Contains(t, err.Error(), s)
		}
		t.Logf("refused (%s): %s", status.Code(err), status.Convert(err).Message())
	}
	id := sandboxID(6)
	_, err = e.shim.CreateVM(ctx, id, hostile.annotations(map[string]string{provider.AnnotationImage: "ami-0badc0ffee0badc0f"}), hostile.net.NSPath)
	refused(err, codes.InvalidArgument, provider.AnnotationImage, "ami-0badc0ffee0badc0f", "not allowed", "--allowed-images")
	_, err = e.shim.CreateVM(ctx, id, hostile.annotations(map[string]string{sandbox.AnnotationInitData: big}), hostile.net.NSPath)
	refused(err, codes.InvalidArgument, sandbox.AnnotationInitData, "limit")
	_, err = e.shim.CreateVM(ctx, "../../etc", hostile.annotations(nil), hostile.net.NSPath)
	refused(err, codes.InvalidArgument, "sandbox id")
	_, err = e.shim.CreateVM(ctx, id, map[string]string{}, hostile.net.NSPath)
	refused(err, codes.InvalidArgument, sandbox.AnnotationSandboxName)
	never := sandboxID(7)
	refused(e.shim.StartVM(ctx, never), codes.NotFound, never, "CreateVM first")
	refused(e.shim.StopVM(ctx, never), codes.NotFound, never)
	// The pod itself carries the oversized initdata (the shim sent none):
	// recorded, but its StartVM fails before any cloud call.
	_, err = e.shim.CreateVM(ctx, id, hostile.annotations(nil), hostile.net.NSPath)
	require.NoError(t, err)
	refused(e.shim.StartVM(ctx, id), codes.FailedPrecondition, sandbox.AnnotationInitData)
	require.Eventually(t, func() bool { return hasEventIn(ctx, t, e.c, "shop", "bad", "Warning", "VMCreateFailed") },
		30*time.Second, 100*time.Millisecond, "the refusal is reported on the pod")
	// kata hands over the node's own network namespace (caa's: a wrong
	// path, a hostNetwork pod). A real node's has a default route, so the
	// node namespace gets one. A tunnel there would redirect the node's
	// interface into the VXLAN and cut every relay off; caa refuses before
	// any cloud call.
	e.nodeDefaultRoute(t)
	_, err = e.c.CreatePeerPod(ctx, "shop", "hostnet", e.node, nil)
	require.NoError(t, err)
	hostnet := sandboxID(8)
	_, err = e.shim.CreateVM(ctx, hostnet, map[string]string{sandbox.AnnotationSandboxName: "hostnet", sandbox.AnnotationSandboxNamespace: "shop"}, e.cn.NodeNS)
	require.NoError(t, err)
	refused(e.shim.StartVM(ctx, hostnet), codes.FailedPrecondition, "networkNamespacePath "+e.cn.NodeNS, "worker's own")

	// Nothing lost, nothing made.
	assert.Empty(t, e.door.counts()["RunInstances"], "no create for any hostile request")
	assert.Empty(t, e.door.counts()["TerminateInstances"], "no delete either")
	assert.Len(t, instanceIDs(e.core.Live()), 1)
	st, err := agentproto.Check(ctx, agent)
	require.NoError(t, err, "the running sandbox's shim connection still works")
	assert.EqualValues(t, agentproto.Serving, st)
	require.NoError(t, katafake.CheckAgent(ctx, sock))
	out := runCaa(t, "ledger", "verify", "--ledger", e.ledger)
	t.Logf("caa ledger verify (through the daemon): %s", strings.TrimSpace(out))
	d.stop(t)
	runCaa(t, "ledger", "verify", "--ledger", e.ledger)
	rec, _, err := e.readLedger(t, ok)
	require.NoError(t, err)
	assert.Equal(t, ledger.SandboxRunning, rec.Phase)
	rec, _, err = e.readLedger(t, id)
	require.NoError(t, err)
	assert.Equal(t, ledger.SandboxFailed, rec.Phase, "the sandbox whose pod carries the oversized initdata failed for good")
	assert.Empty(t, rec.VMID)
	_, _, err = e.readLedger(t, never)
	assert.ErrorIs(t, err, ledger.ErrNotFound, "nothing recorded for an unknown sandbox")
	rec, _, err = e.readLedger(t, hostnet)
	require.NoError(t, err)
	assert.Equal(t, ledger.SandboxFailed, rec.Phase, "the sandbox handed the node's namespace failed for good")
}

// hasEventIn is hasEvent for any namespace.
func hasEventIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, typ, reason string) bool {
	t.Helper()
	events, err := c.Client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	require.NoError(t, err)
	for _, ev := range events.Items {
		if ev.Type == typ && ev.Reason == reason && ev.Source.Component == "caa" {
			return true
		}
	}
	return false
}
