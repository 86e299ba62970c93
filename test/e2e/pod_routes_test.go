package e2e

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/caa-project/caa/pkg/podvm"
	katafake "github.com/caa-project/caa/test/mocks/kata"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// TestHypervisorPodWithRoutesTheVMCannotInstall: a pod whose network
// namespace holds blackhole, unreachable and prohibit routes and a route of a
// routing daemon's protocol starts a working sandbox: the VM's network config
// carries only the routes the image installs (the fake VM installs each as the
// image's forwarder does, and fails to boot on a route with no device and no
// gateway), the agent answers through caa, and the tunnel carries the pod's
// traffic.
func TestHypervisorPodWithRoutesTheVMCannotInstall(t *testing.T) {
	t.Parallel()
	ctx, e := newHVEnv(t, 3*time.Minute)
	pod := e.newPod(ctx, t, "routes", "web-0", nil)
	gw := pod.net.GatewayIP
	withPodNetlink(t, pod.net.NSPath, func(h *netlink.Handle) {
		eth0, err := h.LinkByName("eth0")
		require.NoError(t, err)
		for _, r := range []netlink.Route{
			{Dst: cidr(t, "192.0.2.0/24"), Type: unix.RTN_BLACKHOLE},
			{Dst: cidr(t, "198.51.100.0/24"), Type: unix.RTN_UNREACHABLE},
			{Dst: cidr(t, "203.0.113.0/24"), Type: unix.RTN_PROHIBIT},
			{Dst: cidr(t, "172.16.0.0/16"), Gw: gw.AsSlice(), LinkIndex: eth0.Attrs().Index, Protocol: 186}, // bgp
			{Dst: cidr(t, "10.96.0.0/12"), Gw: gw.AsSlice(), LinkIndex: eth0.Attrs().Index, Protocol: unix.RTPROT_STATIC},
		} {
			require.NoError(t, h.RouteAdd(&r), "%v", r)
		}
	})
	d := e.startReady(t, "--start-vm-timeout", "20s")

	id := sandboxID(1)
	sock, err := e.shim.CreateVM(ctx, id, pod.annotations(nil), pod.net.NSPath)
	require.NoError(t, err)
	require.NoError(t, e.shim.StartVM(ctx, id), "failed boots: %v", e.fleet.Failed())
	require.Empty(t, e.fleet.Failed(), "a fake pod VM failed to boot")

	vms := e.liveSandboxVMs(id)
	require.Len(t, instanceIDs(vms), 1)
	vm := e.fleet.VM(vms[0].ID)
	require.NotNil(t, vm)
	assert.ElementsMatch(t, []podvm.Route{
		{Dst: netip.MustParsePrefix("0.0.0.0/0"), GW: gw, Dev: "eth0", Protocol: "boot", Scope: "universe"},
		{Dst: pod.net.IP.Masked(), Dev: "eth0", Protocol: "kernel", Scope: "link"},
		{Dst: netip.MustParsePrefix("10.96.0.0/12"), GW: gw, Dev: "eth0", Protocol: "static", Scope: "universe"},
	}, vm.Files.Config.Network.Routes, "only the routes the VM can install travel")
	installed, err := vm.PodRoutes()
	require.NoError(t, err)
	assert.Len(t, installed, 3, "the VM installed every route it was given")

	require.NoError(t, katafake.CheckAgent(ctx, sock), "the agent answers through caa")
	var rx *net.UDPConn
	require.NoError(t, podvmfake.InNetNS(vm.PodNamespace(), func() error {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: pod.net.IP.Addr().AsSlice(), Port: 7777})
		return err
	}))
	defer rx.Close()
	sent, err := podvmfake.SendUntilReceived(e.cn.NodeNS, pod.net.IP.Addr().String()+":7777", rx)
	require.NoError(t, err)
	require.True(t, sent, "no packet crossed caa's tunnel")
	require.NoError(t, e.shim.StopVM(ctx, id))
	d.stop(t)
}

func cidr(t *testing.T, s string) *net.IPNet {
	t.Helper()
	_, n, err := net.ParseCIDR(s)
	require.NoError(t, err)
	return n
}

// withPodNetlink runs f with a netlink handle in the namespace at path.
func withPodNetlink(t *testing.T, path string, f func(*netlink.Handle)) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	require.NoError(t, err)
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	require.NoError(t, err)
	defer h.Close()
	f(h)
}
