package tunnel_test

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/caa-project/caa/pkg/podvm"
	"github.com/caa-project/caa/pkg/tunnel"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

const vxlanID = 555001

type world struct {
	cn  *podvmfake.CloudNetwork
	pod *podvmfake.Pod
	net podvm.Network
	cfg tunnel.Config
}

// newWorld builds a node, a VM and a pod namespace on the node, and the VM's
// end of the tunnel from what Inspect read, as a booted pod VM would have it.
func newWorld(t *testing.T) *world {
	t.Helper()
	cn := podvmfake.NewCloudNetwork(t)
	pod := cn.NewPod(t, netip.MustParsePrefix("10.244.1.5/24"))
	n, err := tunnel.Inspect(pod.NSPath)
	require.NoError(t, err)
	n.VXLANID, n.VXLANPort, n.WorkerIP = vxlanID, podvm.DefaultVXLANPort, cn.NodeIP
	require.NoError(t, podvmfake.BuildVMEnd(cn.VMNS, n))
	return &world{cn: cn, pod: pod, net: n, cfg: tunnel.Config{
		NetNSPath:     pod.NSPath,
		VXLANID:       vxlanID,
		Port:          podvm.DefaultVXLANPort,
		RemoteIP:      cn.VMIP.Addr().AsSlice(),
		HostNetNSPath: cn.NodeNS,
	}}
}

// udpListen opens a UDP socket in the namespace at ns.
func udpListen(t *testing.T, ns string, addr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	require.NoError(t, podvmfake.InNetNS(ns, func() error {
		a, err := net.ResolveUDPAddr("udp4", addr)
		if err != nil {
			return err
		}
		c, err = net.ListenUDP("udp4", a)
		return err
	}))
	t.Cleanup(func() { c.Close() })
	return c
}

// delivered sends from namespace ns to dst until rx receives the payload, or
// gives up after wait; it reports the source address seen by the receiver.
func delivered(t *testing.T, ns, dst string, rx *net.UDPConn, wait time.Duration) (string, bool) {
	t.Helper()
	var tx *net.UDPConn
	require.NoError(t, podvmfake.InNetNS(ns, func() error {
		a, err := net.ResolveUDPAddr("udp4", dst)
		if err != nil {
			return err
		}
		tx, err = net.DialUDP("udp4", nil, a)
		return err
	}))
	defer tx.Close()
	msg := fmt.Sprintf("hello %d", time.Now().UnixNano())
	deadline := time.Now().Add(wait)
	buf := make([]byte, 128)
	for time.Now().Before(deadline) {
		_, _ = tx.Write([]byte(msg))
		_ = rx.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		for {
			n, from, err := rx.ReadFromUDP(buf)
			if err != nil {
				break
			}
			if string(buf[:n]) == msg {
				return from.IP.String(), true
			}
		}
	}
	return "", false
}

func TestInspectReadsThePodSide(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	pod := cn.NewPod(t, netip.MustParsePrefix("10.244.1.5/24"))
	n, err := tunnel.Inspect(pod.NSPath)
	require.NoError(t, err)
	require.Equal(t, "eth0", n.Interface)
	require.Equal(t, pod.IP, n.PodIP)
	require.Equal(t, pod.MAC, n.PodMAC)
	require.Equal(t, 1500, n.MTU)
	require.ElementsMatch(t, []podvm.Route{
		{Dst: netip.MustParsePrefix("0.0.0.0/0"), GW: pod.GatewayIP, Dev: "eth0", Protocol: "boot", Scope: "universe"},
		{Dst: netip.MustParsePrefix("10.244.1.0/24"), Dev: "eth0", Protocol: "kernel", Scope: "link"},
	}, n.Routes)
	// What Inspect reads is what the VM accepts.
	n.VXLANID, n.VXLANPort, n.WorkerIP = vxlanID, 4789, cn.NodeIP
	require.NoError(t, n.Validate())
}

func TestPacketsCrossTheTunnelBothWays(t *testing.T) {
	w := newWorld(t)
	vmRx := udpListen(t, w.cn.VMNS, "10.244.1.5:9999")
	nodeRx := udpListen(t, w.cn.NodeNS, w.pod.GatewayIP.String()+":9998")

	// Without the tunnel, the cluster's packets for the pod end in the pod's
	// namespace on the node, and never reach the VM.
	_, ok := delivered(t, w.cn.NodeNS, "10.244.1.5:9999", vmRx, 300*time.Millisecond)
	require.False(t, ok, "a packet reached the VM with no tunnel: the test network is wrong")

	require.NoError(t, tunnel.Setup(w.cfg))
	from, ok := delivered(t, w.cn.NodeNS, "10.244.1.5:9999", vmRx, 10*time.Second)
	require.True(t, ok, "a packet for the pod did not reach the VM through the tunnel")
	require.Equal(t, w.pod.GatewayIP.String(), from)
	from, ok = delivered(t, w.cn.VMNS, w.pod.GatewayIP.String()+":9998", nodeRx, 10*time.Second)
	require.True(t, ok, "a packet from the VM did not come out of the pod's interface on the node")
	require.Equal(t, "10.244.1.5", from)

	require.NoError(t, tunnel.Teardown(w.cfg))
	_, ok = delivered(t, w.cn.NodeNS, "10.244.1.5:9999", vmRx, 300*time.Millisecond)
	require.False(t, ok, "the tunnel still carries packets after Teardown")
}

func podHandle(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	require.NoError(t, err)
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	require.NoError(t, err)
	t.Cleanup(h.Close)
	return h
}

func ourFilters(t *testing.T, h *netlink.Handle, dev string) []netlink.Filter {
	t.Helper()
	l, err := h.LinkByName(dev)
	require.NoError(t, err)
	fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	require.NoError(t, err)
	var out []netlink.Filter
	for _, f := range fs {
		if f.Attrs().Priority == tunnel.FilterPriority {
			out = append(out, f)
		}
	}
	return out
}

func TestSetupIsIdempotentAndCompletesWhatSurvived(t *testing.T) {
	w := newWorld(t)
	require.NoError(t, tunnel.Setup(w.cfg))
	h := podHandle(t, w.pod.NSPath)
	first, err := h.LinkByName(tunnel.LinkName)
	require.NoError(t, err)

	// A restart: the kernel kept everything; Setup checks and changes nothing.
	st, err := tunnel.Check(w.cfg)
	require.NoError(t, err)
	require.True(t, st.Complete(), "%+v", st)
	require.NoError(t, tunnel.Setup(w.cfg))
	again, err := h.LinkByName(tunnel.LinkName)
	require.NoError(t, err)
	require.Equal(t, first.Attrs().Index, again.Attrs().Index, "a whole tunnel must be kept, not rebuilt")
	require.Len(t, ourFilters(t, h, "eth0"), 1)
	require.Len(t, ourFilters(t, h, tunnel.LinkName), 1)

	t.Run("a redirect lost", func(t *testing.T) {
		for _, f := range ourFilters(t, h, tunnel.LinkName) {
			require.NoError(t, h.FilterDel(f))
		}
		st, err := tunnel.Check(w.cfg)
		require.NoError(t, err)
		require.True(t, st.ToTunnel)
		require.False(t, st.FromTunnel)
		require.False(t, st.Complete())
		require.NoError(t, tunnel.Setup(w.cfg))
		st, err = tunnel.Check(w.cfg)
		require.NoError(t, err)
		require.True(t, st.Complete(), "%+v", st)
	})

	t.Run("a crash between create and move", func(t *testing.T) {
		// The kernel allows one device per id and port in the node's
		// namespace, so the crash left no device in the pod's namespace.
		l, err := h.LinkByName(tunnel.LinkName)
		require.NoError(t, err)
		require.NoError(t, h.LinkDel(l))
		nh := podHandle(t, w.cn.NodeNS)
		leftover := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("caavx%d", vxlanID)}, VxlanId: vxlanID, Group: w.cfg.RemoteIP, Port: 4789}
		require.NoError(t, nh.LinkAdd(leftover))
		st, err := tunnel.Check(w.cfg)
		require.NoError(t, err)
		require.True(t, st.HostLeftover)
		require.False(t, st.Link)
		require.NoError(t, tunnel.Setup(w.cfg))
		st, err = tunnel.Check(w.cfg)
		require.NoError(t, err)
		require.True(t, st.Complete(), "%+v", st)
	})

	t.Run("a crash between move and rename", func(t *testing.T) {
		l, err := h.LinkByName(tunnel.LinkName)
		require.NoError(t, err)
		require.NoError(t, h.LinkDel(l))
		nh := podHandle(t, w.cn.NodeNS)
		name := fmt.Sprintf("caavx%d", vxlanID)
		require.NoError(t, nh.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name}, VxlanId: vxlanID, Group: w.cfg.RemoteIP, Port: 4789}))
		moved, err := nh.LinkByName(name)
		require.NoError(t, err)
		podNS, err := netns.GetFromPath(w.pod.NSPath)
		require.NoError(t, err)
		defer podNS.Close()
		require.NoError(t, nh.LinkSetNsFd(moved, int(podNS)))
		st, err := tunnel.Check(w.cfg)
		require.NoError(t, err)
		require.True(t, st.PodLeftover)
		require.False(t, st.Complete())
		require.NoError(t, tunnel.Setup(w.cfg))
		st, err = tunnel.Check(w.cfg)
		require.NoError(t, err)
		require.True(t, st.Complete(), "%+v", st)
	})

	t.Run("the device gone, filters with it", func(t *testing.T) {
		l, err := h.LinkByName(tunnel.LinkName)
		require.NoError(t, err)
		require.NoError(t, h.LinkDel(l))
		st, err := tunnel.Check(w.cfg)
		require.NoError(t, err)
		require.False(t, st.Link)
		require.NoError(t, tunnel.Setup(w.cfg))
		require.Len(t, ourFilters(t, h, "eth0"), 1, "the stale redirect to the deleted device must be replaced, not kept beside")
		st, err = tunnel.Check(w.cfg)
		require.NoError(t, err)
		require.True(t, st.Complete(), "%+v", st)
	})

	vmRx := udpListen(t, w.cn.VMNS, "10.244.1.5:9997")
	_, ok := delivered(t, w.cn.NodeNS, "10.244.1.5:9997", vmRx, 10*time.Second)
	require.True(t, ok, "the completed tunnel must carry packets")

	t.Run("another VM's settings are replaced", func(t *testing.T) {
		other := w.cfg
		other.RemoteIP = net.ParseIP("10.123.0.99")
		require.NoError(t, tunnel.Setup(other))
		st, err := tunnel.Check(w.cfg)
		require.NoError(t, err)
		require.True(t, st.Link)
		require.False(t, st.LinkMatches)
		st, err = tunnel.Check(other)
		require.NoError(t, err)
		require.True(t, st.Complete(), "%+v", st)
		require.NoError(t, tunnel.Setup(w.cfg))
	})
}

func TestTeardownIsIdempotent(t *testing.T) {
	w := newWorld(t)
	require.NoError(t, tunnel.Setup(w.cfg))
	require.NoError(t, tunnel.Teardown(w.cfg))
	h := podHandle(t, w.pod.NSPath)
	_, err := h.LinkByName(tunnel.LinkName)
	require.Error(t, err)
	require.Empty(t, ourFilters(t, h, "eth0"))
	eth0, err := h.LinkByName("eth0")
	require.NoError(t, err)
	qs, err := h.QdiscList(eth0)
	require.NoError(t, err)
	for _, q := range qs {
		require.NotEqual(t, "ingress", q.Type(), "the ingress qdisc caa added must go when no filter is left on it")
	}
	require.NoError(t, tunnel.Teardown(w.cfg), "a second Teardown")
	st, err := tunnel.Check(w.cfg)
	require.NoError(t, err)
	require.Equal(t, tunnel.State{PodNetNS: true}, st)

	require.NoError(t, tunnel.Setup(w.cfg))
	w.cn.Close() // the pod's namespace (and the node) are gone
	require.NoError(t, tunnel.Teardown(tunnel.Config{NetNSPath: w.pod.NSPath, VXLANID: vxlanID}), "a pod namespace already gone is success")
}

func TestSetupRefusesBadConfig(t *testing.T) {
	for name, cfg := range map[string]tunnel.Config{
		"NetNSPath": {VXLANID: 1, RemoteIP: net.ParseIP("10.0.0.1")},
		"VXLANID":   {NetNSPath: "/run/netns/x", VXLANID: 1 << 24, RemoteIP: net.ParseIP("10.0.0.1")},
		"RemoteIP":  {NetNSPath: "/run/netns/x", VXLANID: 1},
		"Port":      {NetNSPath: "/run/netns/x", VXLANID: 1, Port: 70000, RemoteIP: net.ParseIP("10.0.0.1")},
	} {
		require.ErrorContains(t, tunnel.Setup(cfg), name)
	}
	err := tunnel.Setup(tunnel.Config{NetNSPath: "/run/netns/caa-does-not-exist", VXLANID: 1, RemoteIP: net.ParseIP("10.0.0.1")})
	require.ErrorContains(t, err, "does not exist")
}

// TestTwoSandboxesKeepTheirOwnTunnels: two pods on one node, each with its VM
// and its VXLAN id; each pod's traffic reaches its own VM only, and tearing one
// down leaves the other working.
func TestTwoSandboxesKeepTheirOwnTunnels(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	type sb struct {
		pod *podvmfake.Pod
		vm  podvmfake.VMHost
		cfg tunnel.Config
		rx  *net.UDPConn
	}
	var sbs []sb
	for i, vm := range []podvmfake.VMHost{{NS: cn.VMNS, IP: cn.VMIP}, cn.AddVM(t)} {
		pod := cn.NewPod(t, netip.MustParsePrefix(fmt.Sprintf("10.244.%d.5/24", i+1)))
		n, err := tunnel.Inspect(pod.NSPath)
		require.NoError(t, err)
		n.VXLANID, n.VXLANPort, n.WorkerIP = vxlanID+i, 4789, cn.NodeIP
		require.NoError(t, podvmfake.BuildVMEnd(vm.NS, n))
		cfg := tunnel.Config{NetNSPath: pod.NSPath, VXLANID: n.VXLANID, RemoteIP: vm.IP.Addr().AsSlice(), HostNetNSPath: cn.NodeNS}
		require.NoError(t, tunnel.Setup(cfg))
		sbs = append(sbs, sb{pod: pod, vm: vm, cfg: cfg, rx: udpListen(t, vm.NS, pod.IP.Addr().String()+":9996")})
	}
	for _, s := range sbs {
		_, ok := delivered(t, cn.NodeNS, s.pod.IP.Addr().String()+":9996", s.rx, 10*time.Second)
		require.True(t, ok, "pod %s did not reach its VM", s.pod.IP)
	}
	// The same VXLAN id twice on one node is refused, and the first keeps working.
	dup := sbs[1].cfg
	dup.VXLANID = sbs[0].cfg.VXLANID
	require.NoError(t, tunnel.Teardown(sbs[1].cfg))
	require.Error(t, tunnel.Setup(dup))
	_, ok := delivered(t, cn.NodeNS, sbs[0].pod.IP.Addr().String()+":9996", sbs[0].rx, 10*time.Second)
	require.True(t, ok, "the first sandbox lost its tunnel to another's mistake")
	st, err := tunnel.Check(sbs[0].cfg)
	require.NoError(t, err)
	require.True(t, st.Complete(), "%+v", st)
}

// TestSetupRefusesTheWorkersOwnNamespace: a networkNamespacePath that is the
// worker's own namespace (with a default route, as a real node has) is
// refused by CheckPodNetNS, Setup and Teardown, and the node's interface gets
// no filter: a tunnel there would redirect the node's traffic into the VXLAN.
func TestSetupRefusesTheWorkersOwnNamespace(t *testing.T) {
	w := newWorld(t)
	h, err := netlink.NewHandleAt(mustNS(t, w.cn.NodeNS))
	require.NoError(t, err)
	defer h.Close()
	br, err := h.LinkByName("cloud0")
	require.NoError(t, err)
	require.NoError(t, h.RouteAdd(&netlink.Route{LinkIndex: br.Attrs().Index, Gw: net.ParseIP("10.123.255.254")}))

	cfg := w.cfg
	cfg.NetNSPath = w.cn.NodeNS
	require.ErrorIs(t, tunnel.CheckPodNetNS(cfg.NetNSPath, cfg.HostNetNSPath), tunnel.ErrWorkerNamespace)
	err = tunnel.Setup(cfg)
	require.ErrorIs(t, err, tunnel.ErrWorkerNamespace)
	require.ErrorContains(t, err, "networkNamespacePath "+w.cn.NodeNS)
	require.ErrorIs(t, tunnel.Teardown(cfg), tunnel.ErrWorkerNamespace)
	filters, err := h.FilterList(br, netlink.HANDLE_MIN_INGRESS)
	require.NoError(t, err)
	require.Empty(t, filters, "no filter on the node's interface")
	_, err = h.LinkByName(tunnel.LinkName)
	require.Error(t, err, "no VXLAN device in the node's namespace")
	require.NoError(t, tunnel.CheckPodNetNS(w.pod.NSPath, cfg.HostNetNSPath), "a pod's own namespace is fine")
}

func mustNS(t *testing.T, path string) netns.NsHandle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	require.NoError(t, err)
	t.Cleanup(func() { ns.Close() })
	return ns
}
