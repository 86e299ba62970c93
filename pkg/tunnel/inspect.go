package tunnel

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/caa-project/caa/pkg/podvm"
)

// Inspect reads the pod side of podvm.Network from the pod's namespace: its
// interface (the one of the default route), the interface's single IPv4
// address, MAC and MTU, the namespace's IPv4 routes of the main table the pod
// VM can install (installable) and the interface's permanent neighbours. The caller fills in VXLANID, VXLANPort and
// WorkerIP. As upstream's worker side (podnetwork/workernode.go), it reads
// before the tunnel exists; a tunnel already set up is left out of the result.
func Inspect(netnsPath string) (podvm.Network, error) {
	var n podvm.Network
	ns, err := netns.GetFromPath(ResolveNetNS(netnsPath))
	if err != nil {
		return n, fmt.Errorf("tunnel: open pod network namespace %s: %w", netnsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return n, fmt.Errorf("tunnel: netlink in %s: %w", netnsPath, err)
	}
	defer h.Close()
	link, err := podInterface(h, "")
	if err != nil {
		return n, fmt.Errorf("tunnel: %s: %w", netnsPath, err)
	}
	a := link.Attrs()
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return n, fmt.Errorf("tunnel: %s: addresses of %s: %w", netnsPath, a.Name, err)
	}
	if len(addrs) != 1 {
		return n, fmt.Errorf("tunnel: %s: %s has %d IPv4 addresses; the pod VM takes exactly one", netnsPath, a.Name, len(addrs))
	}
	n.PodIP = toPrefix(addrs[0].IPNet)
	n.Interface = a.Name
	n.PodMAC = a.HardwareAddr.String()
	n.MTU = a.MTU

	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return n, fmt.Errorf("tunnel: %s: routes: %w", netnsPath, err)
	}
	names := map[int]string{}
	if links, err := h.LinkList(); err == nil {
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
	}
	for _, r := range routes {
		dev := names[r.LinkIndex]
		if dev == LinkName || !installable(r) {
			continue
		}
		rt := podvm.Route{Dst: toPrefix(r.Dst), Dev: dev, Scope: r.Scope.String()}
		if r.Dst == nil {
			rt.Dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		}
		if gw, ok := netip.AddrFromSlice(r.Gw); ok {
			rt.GW = gw.Unmap()
		}
		// installable let through only the four protocols the forwarder
		// knows by name.
		if p := r.Protocol.String(); slices.Contains(podvm.RouteProtocols, p) {
			rt.Protocol = p
		}
		if !slices.Contains(podvm.RouteScopes, rt.Scope) {
			rt.Scope = ""
		}
		n.Routes = append(n.Routes, rt)
	}
	neighs, err := h.NeighList(a.Index, netlink.FAMILY_V4)
	if err != nil {
		return n, fmt.Errorf("tunnel: %s: neighbours: %w", netnsPath, err)
	}
	for _, nb := range neighs {
		if nb.State&netlink.NUD_PERMANENT == 0 {
			continue
		}
		ip, ok := netip.AddrFromSlice(nb.IP)
		if !ok {
			continue
		}
		n.Neighbors = append(n.Neighbors, podvm.Neighbor{IP: ip.Unmap(), MAC: nb.HardwareAddr.String(), Dev: a.Name, State: "permanent"})
	}
	return n, nil
}

// installable reports whether the pod VM can install r in its copy of the
// pod's namespace. As upstream's worker side (netops RouteList's default
// filters, confirmed at fbdde756), only unicast routes of protocol static,
// boot, dhcp or kernel travel: a blackhole, unreachable or prohibit route has
// no device and no gateway, and the forwarder, which adds every route it is
// given and exits on the first refusal, would stop there ("no such device").
// Routes a routing daemon or a CNI's agent added under its own protocol number
// stay on the worker, as upstream leaves them. A multipath route (its hops
// in MultiPath, no device or gateway of its own) would fail the same way, so it
// stays too.
func installable(r netlink.Route) bool {
	if r.Type != unix.RTN_UNICAST {
		return false
	}
	switch r.Protocol {
	case unix.RTPROT_STATIC, unix.RTPROT_BOOT, unix.RTPROT_DHCP, unix.RTPROT_KERNEL:
	default:
		return false
	}
	return r.LinkIndex > 0 || r.Gw != nil
}

// podInterface returns the named link, or the one of the default route with
// the lowest metric.
func podInterface(h *netlink.Handle, name string) (netlink.Link, error) {
	if name != "" {
		l, err := h.LinkByName(name)
		if err != nil {
			return nil, fmt.Errorf("pod interface %s: %w", name, err)
		}
		return l, nil
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("routes: %w", err)
	}
	best := -1
	for i, r := range routes {
		if ones := prefixLen(r.Dst); ones == 0 && r.LinkIndex > 0 && (best < 0 || r.Priority < routes[best].Priority) {
			best = i
		}
	}
	if best < 0 {
		return nil, errors.New("no IPv4 default route to tell the pod's interface: set Config.PodInterface")
	}
	l, err := h.LinkByIndex(routes[best].LinkIndex)
	if err != nil {
		return nil, fmt.Errorf("default route's interface: %w", err)
	}
	return l, nil
}

func prefixLen(n *net.IPNet) int {
	if n == nil {
		return 0
	}
	ones, _ := n.Mask.Size()
	return ones
}

func toPrefix(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}
