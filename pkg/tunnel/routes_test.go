package tunnel_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/caa-project/caa/pkg/podvm"
	"github.com/caa-project/caa/pkg/tunnel"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// AddUnusableRoutes gives a pod namespace the routes a pod VM cannot
// install: blackhole, unreachable and prohibit routes (no device, no
// gateway), and a unicast route a routing daemon added under its own
// protocol number (bgp, 186). It also adds one usable static route.
func addRoutes(t *testing.T, nsPath string, gw netip.Addr) {
	t.Helper()
	h := podHandle(t, nsPath)
	eth0, err := h.LinkByName("eth0")
	require.NoError(t, err)
	cidr := func(s string) *net.IPNet { _, n, err := net.ParseCIDR(s); require.NoError(t, err); return n }
	for _, r := range []*netlink.Route{
		{Dst: cidr("192.0.2.0/24"), Type: unix.RTN_BLACKHOLE},
		{Dst: cidr("198.51.100.0/24"), Type: unix.RTN_UNREACHABLE},
		{Dst: cidr("203.0.113.0/24"), Type: unix.RTN_PROHIBIT},
		{Dst: cidr("172.16.0.0/16"), Gw: gw.AsSlice(), LinkIndex: eth0.Attrs().Index, Protocol: 186},
		{Dst: cidr("10.96.0.0/12"), Gw: gw.AsSlice(), LinkIndex: eth0.Attrs().Index, Protocol: unix.RTPROT_STATIC},
	} {
		require.NoError(t, h.RouteAdd(r), "%v", r)
	}
}

// TestInspectLeavesOutRoutesTheVMCannotInstall: only unicast routes of the
// four protocols the forwarder knows travel to the VM, and the VM installs
// every one of them (the fake VM adds them as the image does, and would
// fail on a route with neither device nor gateway).
func TestInspectLeavesOutRoutesTheVMCannotInstall(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	pod := cn.NewPod(t, netip.MustParsePrefix("10.244.1.5/24"))
	addRoutes(t, pod.NSPath, pod.GatewayIP)
	n, err := tunnel.Inspect(pod.NSPath)
	require.NoError(t, err)
	require.ElementsMatch(t, []podvm.Route{
		{Dst: netip.MustParsePrefix("0.0.0.0/0"), GW: pod.GatewayIP, Dev: "eth0", Protocol: "boot", Scope: "universe"},
		{Dst: netip.MustParsePrefix("10.244.1.0/24"), Dev: "eth0", Protocol: "kernel", Scope: "link"},
		{Dst: netip.MustParsePrefix("10.96.0.0/12"), GW: pod.GatewayIP, Dev: "eth0", Protocol: "static", Scope: "universe"},
	}, n.Routes)
	n.VXLANID, n.VXLANPort, n.WorkerIP = vxlanID, podvm.DefaultVXLANPort, cn.NodeIP
	require.NoError(t, n.Validate())
	require.NoError(t, podvmfake.BuildVMEnd(cn.VMNS, n), "the VM installs every route it is given")
	installed, err := podvmfake.PodRoutes(cn.VMNS)
	require.NoError(t, err)
	require.Len(t, installed, 3)
}
