package podvmfake

import (
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/caa-project/caa/pkg/podvm"
)

// PodRouteTable is the routing table of the VM's namespace where the fake VM
// installs the pod's routes. The real image installs them in the pod's own
// namespace inside the VM; the fake VM's namespace is also the VM's own
// network, so the pod's routes (a default route among them) go to a table no
// rule looks up: the kernel still checks each one as it would in the image.
const PodRouteTable = 0xcaa

// installRoutes adds the pod's routes as the forwarder's pod side does
// (podnetwork/podnode.go, confirmed at fbdde756): the routes without a gateway
// first (a gateway must be reachable when its route is added), each on the
// device it names, which in the VM is the tunnel's end (vxlan0 here, the pod
// interface's name in the image); a route without a gateway takes the link
// scope. The first route the kernel refuses stops the forwarder: a route with
// neither device nor gateway (what a blackhole route of the pod would become)
// fails with "no such device", as in the image.
func installRoutes(h *netlink.Handle, n podvm.Network, vx netlink.Link) error {
	var first, second []podvm.Route
	for _, r := range n.Routes {
		if r.GW.IsValid() {
			second = append(second, r)
		} else {
			first = append(first, r)
		}
	}
	for _, r := range append(first, second...) {
		nr := &netlink.Route{
			Table: PodRouteTable,
			Dst:   &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), 32)},
		}
		switch r.Dev {
		case "":
		case n.Interface:
			nr.LinkIndex = vx.Attrs().Index
		default:
			return fmt.Errorf("failed to add a route to %s via %s: failed to get interface %s: Link not found", r.Dst, r.GW, r.Dev)
		}
		if r.GW.IsValid() {
			nr.Gw = r.GW.AsSlice()
			nr.Scope = scopeByName(r.Scope)
		} else {
			nr.Scope = netlink.SCOPE_LINK
		}
		if i := slices.Index(podvm.RouteProtocols, r.Protocol); i >= 0 {
			nr.Protocol = netlink.RouteProtocol([]int{unix.RTPROT_STATIC, unix.RTPROT_BOOT, unix.RTPROT_DHCP, unix.RTPROT_KERNEL}[i])
		}
		if err := h.RouteAdd(nr); err != nil {
			return fmt.Errorf("failed to add a route to %s via %s: %w", r.Dst, r.GW, err)
		}
	}
	return nil
}

func scopeByName(s string) netlink.Scope {
	switch s {
	case "site":
		return netlink.SCOPE_SITE
	case "link":
		return netlink.SCOPE_LINK
	case "host":
		return netlink.SCOPE_HOST
	case "nowhere":
		return netlink.SCOPE_NOWHERE
	}
	return netlink.SCOPE_UNIVERSE
}

// PodRoutes lists the pod routes the fake VM at nsPath installed.
func PodRoutes(nsPath string) ([]netlink.Route, error) {
	h, err := handleAt(nsPath)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: PodRouteTable}, netlink.RT_FILTER_TABLE)
}
