package podvmfake_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/caa-project/caa/pkg/podvm"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// TestVMEndRefusesARouteWithNoDeviceNorGateway: the fake VM installs the
// pod's routes as the image's forwarder does, and fails where it exits: a
// route with neither device nor gateway (what a copied blackhole route
// becomes) is refused by the kernel with "no such device"; a route on a
// device the VM does not have is refused too; usable routes are installed.
func TestVMEndRefusesARouteWithNoDeviceNorGateway(t *testing.T) {
	pod := netip.MustParsePrefix("10.244.1.5/24")
	gw := netip.MustParseAddr("10.244.1.1")
	base := func(cn *podvmfake.CloudNetwork) podvm.Network {
		return podvm.Network{Interface: "eth0", PodIP: pod, PodMAC: "0a:58:0a:f4:01:05", MTU: 1500,
			VXLANID: 4242, VXLANPort: 4789, WorkerIP: cn.NodeIP,
			Routes: []podvm.Route{
				{Dst: netip.MustParsePrefix("0.0.0.0/0"), GW: gw, Dev: "eth0", Protocol: "boot", Scope: "universe"},
				{Dst: pod.Masked(), Dev: "eth0", Protocol: "kernel", Scope: "link"},
			}}
	}
	cn := podvmfake.NewCloudNetwork(t)
	require.NoError(t, podvmfake.BuildVMEnd(cn.VMNS, base(cn)))
	rs, err := podvmfake.PodRoutes(cn.VMNS)
	require.NoError(t, err)
	require.Len(t, rs, 2, "the default route (through a gateway reached by the subnet route added first) and the subnet route")

	cn = podvmfake.NewCloudNetwork(t)
	n := base(cn)
	n.Routes = append(n.Routes, podvm.Route{Dst: netip.MustParsePrefix("192.0.2.0/24")})
	err = podvmfake.BuildVMEnd(cn.VMNS, n)
	require.ErrorIs(t, err, unix.ENODEV)
	require.ErrorContains(t, err, "failed to add a route to 192.0.2.0/24")

	cn = podvmfake.NewCloudNetwork(t)
	n = base(cn)
	n.Routes = append(n.Routes, podvm.Route{Dst: netip.MustParsePrefix("192.0.2.0/24"), Dev: "eth1"})
	require.ErrorContains(t, podvmfake.BuildVMEnd(cn.VMNS, n), "failed to get interface eth1")
}
