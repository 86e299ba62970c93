package podvmfake_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/podvm"
	"github.com/caa-project/caa/pkg/relay"
	"github.com/caa-project/caa/pkg/tunnel"
	"github.com/caa-project/caa/test/mocks/cloud"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// TestPodVMEndToEnd plays one sandbox's whole path with real parts: caa's user
// data -> the fake pod VM in its own network namespace, the forwarder on
// :15150 with mutual TLS from that user data -> the fake agent; caa's relay on
// the node dials it over the "cloud network" (a veth pair); the pod's network
// reaches the VM through caa's VXLAN tunnel; a client certificate from another
// CA is refused.
func TestPodVMEndToEnd(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	pod := cn.NewPod(t, netip.MustParsePrefix("10.244.1.5/24"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ca, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	vmIP := cn.VMIP.Addr()
	// As caa does: the user data is made before the VM has an IP, so the
	// certificate names the VM and the relay checks that name.
	const vmName = "podvm-web-0-sbe2e"
	certPEM, keyPEM, _, err := ca.IssueServer(nil, []string{vmName}, time.Hour)
	require.NoError(t, err)
	n, err := tunnel.Inspect(pod.NSPath)
	require.NoError(t, err)
	n.VXLANID, n.VXLANPort, n.WorkerIP = podvm.VXLANIDBase+3, podvm.DefaultVXLANPort, cn.NodeIP
	cfg := podvm.Config{
		PodName: "web-0", PodNamespace: "shop", SandboxID: "sb-e2e", Network: n,
		TLSServerCertPEM: certPEM, TLSServerKeyPEM: keyPEM, TLSClientCAPEM: ca.CertPEM(),
		InitData: "version = \"0.1.0\"\n",
	}
	ud, err := podvm.UserData(cfg)
	require.NoError(t, err)

	vm, err := podvmfake.Boot(ctx, podvmfake.Options{UserData: ud, NetNS: cn.VMNS})
	require.NoError(t, err)
	defer vm.Close()
	require.Empty(t, vm.Files.Skipped)
	require.Equal(t, "web-0", vm.Files.Config.PodName)
	require.Equal(t, cfg.InitData, vm.Files.Config.InitData)
	require.Equal(t, fmt.Sprintf("[::]:%d", podvm.ForwarderPort), vm.Addr().String())

	addr := net.JoinHostPort(vmIP.String(), fmt.Sprint(podvm.ForwarderPort))
	sock := filepath.Join(t.TempDir(), "pods", cfg.SandboxID, "agent.ttrpc")
	startRelay(ctx, t, cn, ca, sock, addr, vmName)

	// The shim's side: one long-lived connection, a health check, a wait.
	conn, err := net.Dial("unix", sock)
	require.NoError(t, err)
	shim := ttrpc.NewClient(conn)
	defer shim.Close()
	st, err := agentproto.Check(ctx, shim)
	require.NoError(t, err)
	require.EqualValues(t, agentproto.Serving, st)
	waited := make(chan int32, 1)
	go func() {
		st, err := agentproto.WaitProcess(ctx, shim, "ctr-1", "")
		if err != nil {
			st = -1
		}
		waited <- st
	}()
	require.NoError(t, vm.Agent.AwaitWaiting(ctx, "ctr-1"))
	require.True(t, vm.Agent.Release("ctr-1", 0))
	require.EqualValues(t, 0, <-waited)
	require.Equal(t, 2, vm.Agent.Checks())
	require.Equal(t, 1, vm.Agent.Waits())

	// The pod network: a packet for the pod, sent on the node, reaches the VM.
	tcfg := tunnel.Config{NetNSPath: pod.NSPath, VXLANID: n.VXLANID, Port: n.VXLANPort, RemoteIP: vmIP.AsSlice(), HostNetNSPath: cn.NodeNS}
	require.NoError(t, tunnel.Setup(tcfg))
	defer tunnel.Teardown(tcfg)
	var rx *net.UDPConn
	require.NoError(t, podvmfake.InNetNS(cn.VMNS, func() error {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: pod.IP.Addr().AsSlice(), Port: 7777})
		return err
	}))
	defer rx.Close()
	sent, err := podvmfake.SendUntilReceived(cn.NodeNS, pod.IP.Addr().String()+":7777", rx)
	require.NoError(t, err)
	require.True(t, sent, "no packet crossed caa's tunnel to the VM")

	// caa with another CA's client certificate gets nowhere.
	other, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	otc, err := other.ClientTLS()
	require.NoError(t, err)
	otc.RootCAs.AppendCertsFromPEM(ca.CertPEM())
	r2, err := relay.Start(ctx, relay.Config{SocketPath: filepath.Join(t.TempDir(), "x.ttrpc"), Addr: addr, TLS: otc, ServerName: vmName, Dial: podvmfake.DialIn(cn.NodeNS)})
	require.NoError(t, err)
	defer r2.Close()
	before := len(vm.Stats().Rejected)
	sctx, scancel := context.WithTimeout(ctx, time.Second)
	defer scancel()
	require.Error(t, r2.WaitReachable(sctx))
	require.Greater(t, len(vm.Stats().Rejected), before, "the forwarder must refuse another CA's client")
	require.Equal(t, 2, vm.Agent.Checks(), "nothing from another CA may reach the agent")

	// The VM goes: the shim's connection through the relay ends.
	vm.Close()
	_, err = agentproto.Check(ctx, shim)
	require.Error(t, err)
}

func TestBootRefusesUserDataThePodVMWouldNot(t *testing.T) {
	_, err := podvmfake.Boot(context.Background(), podvmfake.Options{UserData: []byte("#cloud-config\nruncmd: [x]\n")})
	require.Error(t, err)
	_, err = podvmfake.Boot(context.Background(), podvmfake.Options{UserData: []byte("#cloud-config\nwrite_files:\n- path: /run/peerpod/apf.json\n  content: '{}'\n")})
	require.ErrorContains(t, err, "pod-network")
}

// TestVMAtACloudsAddress boots a fake VM at an address a fake cloud would
// give (outside the cloud network's subnet), reaches it from the node, and
// loses it when the VM is removed behind caa's back.
func TestVMAtACloudsAddress(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	host := cn.AddVMAt(t, netip.MustParseAddr("10.0.0.7"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ca, ud := podVMUserData(t, cn, "x", "10.244.9.5/24", "02:00:00:00:09:05")
	vm, err := podvmfake.Boot(ctx, podvmfake.Options{UserData: ud, NetNS: host.NS})
	require.NoError(t, err)
	r := startRelay(ctx, t, cn, ca, filepath.Join(t.TempDir(), "a.ttrpc"), "10.0.0.7:15150", "podvm-x")

	vm.Close()
	require.NoError(t, cn.RemoveVM(host))
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	defer pcancel()
	require.Error(t, r.Probe(pctx), "a removed VM must not answer")
}

// TestChildProcessStartedInTheNodesNamespace checks what the hypervisor's e2e
// relies on to run caa "on the node": a process started inside InNetNS is born
// in that namespace.
func TestChildProcessStartedInTheNodesNamespace(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	cmd := exec.Command("cat", "/proc/self/net/dev")
	var out strings.Builder
	cmd.Stdout = &out
	require.NoError(t, podvmfake.InNetNS(cn.NodeNS, cmd.Start))
	require.NoError(t, cmd.Wait())
	require.Contains(t, out.String(), "cloud0:", "the child does not see the node's interfaces")
}

// TestFleetPlaysTheFakeCloudsInstances: an instance created in the fake
// cloud with caa's user data gets a pod VM at its IP, reachable through the
// relay; killed behind caa's back, the VM leaves the network; an instance
// whose user data the image would refuse is reported, not booted.
func TestFleetPlaysTheFakeCloudsInstances(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	c := cloud.New(cloud.Options{IDPrefix: "i-"})
	fleet := podvmfake.NewFleet(cn, c, nil)
	defer fleet.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ca, ud := podVMUserData(t, cn, "a", "10.244.7.5/24", "02:00:00:00:07:05")
	good, err := c.Create(cloud.CreateRequest{Name: "podvm-a", UserData: ud})
	require.NoError(t, err)
	bad, err := c.Create(cloud.CreateRequest{Name: "podvm-b", UserData: []byte("#cloud-config\nruncmd: [x]\n")})
	require.NoError(t, err)
	fleet.Sync(ctx)
	require.NotNil(t, fleet.VM(good.ID))
	require.Nil(t, fleet.VM(bad.ID))
	require.Contains(t, fleet.Failed(), bad.ID)

	r := startRelay(ctx, t, cn, ca, filepath.Join(t.TempDir(), "a.ttrpc"), net.JoinHostPort(good.IPs[0], "15150"), "podvm-a")
	require.Equal(t, 1, fleet.VM(good.ID).Agent.Checks())

	require.NoError(t, c.Kill(good.ID))
	fleet.Sync(ctx)
	require.Nil(t, fleet.VM(good.ID))
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	defer pcancel()
	require.Error(t, r.Probe(pctx), "a killed instance's VM must not answer")
}

// podVMUserData is caa's user data for the pod VM podvm-<name> (pod
// default/<name>, sandbox sb-<name>) on the pod address podIP and MAC,
// with a server certificate from a new CA; it returns the CA too.
func podVMUserData(t *testing.T, cn *podvmfake.CloudNetwork, name, podIP, mac string) (*pki.CA, []byte) {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	certPEM, keyPEM, _, err := ca.IssueServer(nil, []string{"podvm-" + name}, time.Hour)
	require.NoError(t, err)
	ud, err := podvm.UserData(podvm.Config{
		PodName: name, PodNamespace: "default", SandboxID: "sb-" + name,
		Network: podvm.Network{VXLANID: podvm.VXLANIDBase, VXLANPort: podvm.DefaultVXLANPort, WorkerIP: cn.NodeIP,
			Interface: "eth0", PodIP: netip.MustParsePrefix(podIP), PodMAC: mac, MTU: 1450},
		TLSServerCertPEM: certPEM, TLSServerKeyPEM: keyPEM, TLSClientCAPEM: ca.CertPEM(),
	})
	require.NoError(t, err)
	return ca, ud
}

// startRelay starts caa's relay from socket to the forwarder at addr,
// dialled from the node's namespace, with a client certificate of ca and
// the server name serverName; it is closed when the test ends, and the
// forwarder answers once it returns.
func startRelay(ctx context.Context, t *testing.T, cn *podvmfake.CloudNetwork, ca *pki.CA, socket, addr, serverName string) *relay.Relay {
	t.Helper()
	tc, err := ca.ClientTLS()
	require.NoError(t, err)
	r, err := relay.Start(ctx, relay.Config{SocketPath: socket, Addr: addr, TLS: tc, ServerName: serverName, Dial: podvmfake.DialIn(cn.NodeNS)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	require.NoError(t, r.WaitReachable(ctx))
	return r
}
