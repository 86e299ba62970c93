package hypervisor

import (
	"context"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/provider"
	awsprov "github.com/caa-project/caa/pkg/provider/aws"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/pkg/sandbox"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
	katafake "github.com/caa-project/caa/test/mocks/kata"
	"github.com/caa-project/caa/test/mocks/memory"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

type onePodCache struct {
	mu   sync.Mutex
	pods []*reconcile.Pod
}

func (c *onePodCache) Pods() []*reconcile.Pod {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*reconcile.Pod(nil), c.pods...)
}

func (c *onePodCache) Pod(uid string) *reconcile.Pod {
	for _, p := range c.Pods() {
		if p.UID == uid {
			return p
		}
	}
	return nil
}

func (c *onePodCache) Synced() bool { return true }

// TestKataDrivesARealPodVM is the whole path with real parts in network
// namespaces: a fake shim's CreateVM and StartVM over ttrpc; the VM boots
// (a fake pod VM) from the user data caa made; the shim reaches the fake
// agent through caa's agent socket (relay and mutual TLS real); a packet
// for the pod crosses caa's VXLAN tunnel to the VM; a VM killed behind
// caa's back closes its sandbox's socket; StopVM deletes the VM. The cloud
// is the fake EC2 behind the real SDK provider.
func TestKataDrivesARealPodVM(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	pod := cn.NewPod(t, netip.MustParsePrefix("10.244.1.5/24"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The real EC2 SDK provider against the fake EC2.
	c := cloud.New(ec2fake.CloudOptions(cloud.Options{}))
	srv := httptest.NewServer(ec2fake.NewServer(c, ec2fake.WithCredentials("AKIACAATESTKEY4D1F00", "caa-test-secret/hypervisor")))
	defer srv.Close()
	sdkDir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "AKIACAATESTKEY4D1F00", "AWS_SECRET_ACCESS_KEY": "caa-test-secret/hypervisor", "AWS_SESSION_TOKEN": "",
		"AWS_PROFILE": "", "AWS_CONFIG_FILE": filepath.Join(sdkDir, "config"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(sdkDir, "credentials"),
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_EC2": "", "AWS_ROLE_ARN": "", "AWS_WEB_IDENTITY_TOKEN_FILE": "",
	} {
		t.Setenv(k, v)
	}
	ec2, err := awsprov.New(ctx, awsprov.Config{Region: "us-east-1", SubnetID: "subnet-0a1b2c3d4e5f60718",
		SecurityGroupIDs: []string{"sg-0a1b2c3d4e5f60718"}, Endpoint: srv.URL, MaxBackoff: 20 * time.Millisecond})
	require.NoError(t, err)
	fleet := podvmfake.NewFleet(cn, c, nil)
	defer fleet.Close()
	go fleet.Run(ctx, 20*time.Millisecond)

	dir, err := os.MkdirTemp("", "hvi")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	led, err := ledger.Open(ledger.Options{Path: filepath.Join(dir, "ledger.db"), Node: "node-1", Cluster: "c1", Timeout: time.Second})
	require.NoError(t, err)
	defer led.Close()
	ca, err := pki.LoadOrCreateCA(dir)
	require.NoError(t, err)
	pods := &onePodCache{pods: []*reconcile.Pod{{UID: "uid-web", Namespace: "shop", Name: "web-0", RuntimeClass: "kata-remote"}}}
	stop, halt := context.WithCancel(ctx)
	defer halt()
	m := sandbox.New(sandbox.Config{
		Ledger: led, Provider: ec2, Pods: pods,
		Side:    &sandbox.PodVMSide{CA: ca, HostNetNS: cn.NodeNS, Dial: podvmfake.DialIn(cn.NodeNS)},
		Spec:    provider.SpecConfig{DefaultType: "t3.small", DefaultImage: "ami-0123456789abcdef0"},
		Cluster: "c1", Node: "node-1", NodeIP: cn.NodeIP.Addr().AsSlice(), SocketDir: filepath.Join(dir, "pods"),
		Poll: 20 * time.Millisecond, StartTimeout: 30 * time.Second, Stop: stop,
	})
	defer func() { halt(); m.Close(); m.Wait() }()
	sh := katafake.Shim{Socket: serve(t, m)}
	id := "e2e0000000000000000000000000000000000000000000000000000000000001"

	agentSocket, err := sh.CreateVM(ctx, id, map[string]string{
		sandbox.AnnotationSandboxName: "web-0", sandbox.AnnotationSandboxNamespace: "shop", provider.AnnotationMachineType: "",
	}, pod.NSPath)
	require.NoError(t, err)
	t0 := time.Now()
	require.NoError(t, sh.StartVM(ctx, id), "failed boots: %v", fleet.Failed())
	t.Logf("StartVM took %s", time.Since(t0))
	rec, err := led.GetSandbox(id)
	require.NoError(t, err)
	require.Equal(t, ledger.SandboxRunning, rec.Phase)
	vm := fleet.VM(rec.VMID)
	require.NotNil(t, vm)
	assert.Equal(t, "web-0", vm.Files.Config.PodName)
	assert.Equal(t, pod.IP, vm.Files.Config.Network.PodIP, "the VM plays the pod's own address")

	// The shim's one long-lived connection to the agent.
	conn, err := net.Dial("unix", agentSocket)
	require.NoError(t, err)
	agent := ttrpc.NewClient(conn)
	defer agent.Close()
	st, err := agentproto.Check(ctx, agent)
	require.NoError(t, err)
	require.EqualValues(t, agentproto.Serving, st)

	// The pod network: a packet for the pod reaches the VM's side.
	var rx *net.UDPConn
	require.NoError(t, podvmfake.InNetNS(vm.Host.NS, func() error {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: pod.IP.Addr().AsSlice(), Port: 7777})
		return err
	}))
	defer rx.Close()
	sent, err := podvmfake.SendUntilReceived(cn.NodeNS, pod.IP.Addr().String()+":7777", rx)
	require.NoError(t, err)
	require.True(t, sent, "no packet crossed caa's tunnel")

	// The VM is killed behind caa's back: the sandbox is lost, its socket
	// closes, and a StartVM cannot give it another VM.
	require.NoError(t, c.Kill(rec.VMID))
	rep, err := m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.Equal(t, []string{id}, rep.Lost)
	_, err = net.Dial("unix", agentSocket)
	require.Error(t, err, "the lost sandbox's agent socket is closed")
	assert.Equal(t, codes.FailedPrecondition, status.Code(sh.StartVM(ctx, id)))

	// StopVM: answered fast; the record goes once the VM is deleted.
	t1 := time.Now()
	require.NoError(t, sh.StopVM(ctx, id))
	assert.Less(t, time.Since(t1), time.Second)
	require.Eventually(t, func() bool { _, err := led.GetSandbox(id); return err != nil }, 10*time.Second, 10*time.Millisecond)
}

// TestRestartServesEveryAgentAgainBeforeReady: a caa process ends with
// sandboxes running (their VMs keep running); the next process, over the
// same ledger, serves every agent socket again (tunnel and relay rebuilt,
// the forwarder reached over mutual TLS) with no cloud write.
func TestRestartServesEveryAgentAgainBeforeReady(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := cloud.New(cloud.Options{IDPrefix: "i-", KeepTerminated: time.Hour})
	fleet := podvmfake.NewFleet(cn, c, nil)
	defer fleet.Close()
	go fleet.Run(ctx, 20*time.Millisecond)
	dir, err := os.MkdirTemp("", "hvr")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	cache := &onePodCache{}
	process := func() (*sandbox.Manager, func()) {
		led, err := ledger.Open(ledger.Options{Path: filepath.Join(dir, "ledger.db"), Node: "node-1", Cluster: "c1", Timeout: time.Second})
		require.NoError(t, err)
		ca, err := pki.LoadOrCreateCA(dir) // the same CA after the restart
		require.NoError(t, err)
		stop, halt := context.WithCancel(ctx)
		m := sandbox.New(sandbox.Config{
			Ledger: led, Provider: memory.New(c), Pods: cache,
			Side:    &sandbox.PodVMSide{CA: ca, HostNetNS: cn.NodeNS, Dial: podvmfake.DialIn(cn.NodeNS)},
			Spec:    provider.SpecConfig{DefaultType: "small", DefaultImage: "podvm"},
			Cluster: "c1", Node: "node-1", NodeIP: cn.NodeIP.Addr().AsSlice(), SocketDir: filepath.Join(dir, "pods"),
			Poll: 20 * time.Millisecond, StartTimeout: 30 * time.Second, Stop: stop,
		})
		return m, func() { halt(); m.Close(); m.Wait(); _ = led.Close() }
	}
	const n = 20
	m, end := process()
	var socks []string
	for i := range n {
		pod := cn.NewPod(t, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(10 + i), 5}), 24))
		name := "web-" + string(rune('a'+i))
		cache.mu.Lock()
		cache.pods = append(cache.pods, &reconcile.Pod{UID: "uid-" + name, Namespace: "shop", Name: name})
		cache.mu.Unlock()
		id := "r" + string(rune('a'+i)) + "00000000000000000000000000000000000000000000000000000000000000"
		sock, err := m.CreateVM(ctx, id, map[string]string{sandbox.AnnotationSandboxName: name, sandbox.AnnotationSandboxNamespace: "shop"}, pod.NSPath)
		require.NoError(t, err)
		require.NoError(t, m.StartVM(ctx, id), "failed boots: %v", fleet.Failed())
		socks = append(socks, sock)
	}
	end() // the process goes; its sockets with it
	for _, s := range socks {
		_, err := net.Dial("unix", s)
		require.Error(t, err, "no socket is served between the processes")
	}
	before := c.Counters()

	m, end = process()
	defer end()
	t0 := time.Now()
	rep, err := m.Sync(ctx, 20*time.Second)
	require.NoError(t, err)
	t.Logf("%d sandboxes served again in %s", len(rep.Served), time.Since(t0))
	require.True(t, rep.Ready(), "pending: %v", rep.Pending)
	assert.Len(t, rep.Served, n)
	after := c.Counters()
	assert.Equal(t, before[cloud.OpCreate], after[cloud.OpCreate], "no create at restart")
	assert.Equal(t, before[cloud.OpDelete], after[cloud.OpDelete], "no delete at restart")
	for _, s := range socks {
		conn, err := net.Dial("unix", s)
		require.NoError(t, err)
		cl := ttrpc.NewClient(conn)
		st, err := agentproto.Check(ctx, cl)
		_ = cl.Close()
		require.NoError(t, err)
		assert.EqualValues(t, agentproto.Serving, st)
	}
}
