package tunnel_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/caa-project/caa/pkg/tunnel"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// guardNode is a node with two sandboxes, each with its pod namespace, its
// VM and its tunnel, and a third host on the cloud network with no tunnel.
type guardNode struct {
	cn       *podvmfake.CloudNetwork
	sbs      []guardSandbox
	stranger podvmfake.VMHost
}

type guardSandbox struct {
	pod    *podvmfake.Pod
	vm     podvmfake.VMHost
	cfg    tunnel.Config
	gwMAC  net.HardwareAddr // the node's end of the pod's veth
	rx     *net.UDPConn     // on the node, at the pod's gateway address
	rxPort int
}

func newGuardNode(t *testing.T) *guardNode {
	t.Helper()
	cn := podvmfake.NewCloudNetwork(t)
	g := &guardNode{cn: cn}
	nh := podHandle(t, cn.NodeNS)
	for i, vm := range []podvmfake.VMHost{{NS: cn.VMNS, IP: cn.VMIP}, cn.AddVM(t)} {
		pod := cn.NewPod(t, netip.MustParsePrefix(fmt.Sprintf("10.244.%d.5/24", i+1)))
		n, err := tunnel.Inspect(pod.NSPath)
		require.NoError(t, err)
		n.VXLANID, n.VXLANPort, n.WorkerIP = vxlanID+i, 4789, cn.NodeIP
		require.NoError(t, podvmfake.BuildVMEnd(vm.NS, n))
		cfg := tunnel.Config{NetNSPath: pod.NSPath, VXLANID: n.VXLANID, RemoteIP: vm.IP.Addr().AsSlice(), HostNetNSPath: cn.NodeNS}
		require.NoError(t, tunnel.Setup(cfg))
		veth, err := nh.LinkByName(pod.HostVeth)
		require.NoError(t, err)
		port := 9100 + i
		g.sbs = append(g.sbs, guardSandbox{pod: pod, vm: vm, cfg: cfg, gwMAC: veth.Attrs().HardwareAddr,
			rx: udpListen(t, cn.NodeNS, fmt.Sprintf("%s:%d", pod.GatewayIP, port)), rxPort: port})
	}
	g.stranger = cn.AddVM(t)
	return g
}

// vxlanPacket is the UDP payload of a VXLAN packet with id vni carrying an
// Ethernet frame from sandbox s's pod to its gateway on the node: what the
// pod VM sends when its pod talks to the node. msg is the inner UDP payload.
func vxlanPacket(vni int, s guardSandbox, msg string) []byte {
	podMAC, _ := net.ParseMAC(s.pod.MAC)
	src, dst := s.pod.IP.Addr().As4(), s.pod.GatewayIP.As4()
	udp := make([]byte, 8+len(msg))
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], uint16(s.rxPort))
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], msg) // checksum 0: none, as IPv4 allows
	ip := make([]byte, 20, 20+len(udp))
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
	copy(ip[12:], src[:])
	copy(ip[16:], dst[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	ip = append(ip, udp...)
	frame := append(append(append([]byte{}, s.gwMAC...), podMAC...), 0x08, 0x00)
	frame = append(frame, ip...)
	hdr := make([]byte, 8)
	hdr[0] = 0x08 // the I flag: the VNI is valid
	binary.BigEndian.PutUint32(hdr[4:], uint32(vni)<<8)
	return append(hdr, frame...)
}

// sendVXLAN sends one VXLAN packet from namespace ns (the outer source is
// that namespace's address) to the node's VXLAN port.
func (g *guardNode) sendVXLAN(t *testing.T, ns string, pkt []byte) {
	t.Helper()
	require.NoError(t, podvmfake.InNetNS(ns, func() error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: g.cn.NodeIP.Addr().AsSlice(), Port: 4789})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(pkt)
		return err
	}))
}

// arrives sends, from ns, a VXLAN packet with id vni that carries a frame
// of sandbox s's pod, every 50 ms until it comes out of s's pod interface on
// the node (s.rx reads it) or wait is over.
func (g *guardNode) arrives(t *testing.T, ns string, vni int, s guardSandbox, wait time.Duration) bool {
	t.Helper()
	msg := fmt.Sprintf("vni %d from %s at %d", vni, ns, time.Now().UnixNano())
	pkt := vxlanPacket(vni, s, msg)
	buf := make([]byte, 256)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
		g.sendVXLAN(t, ns, pkt)
		_ = s.rx.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		for {
			n, _, err := s.rx.ReadFromUDP(buf)
			if err != nil {
				break
			}
			if string(buf[:n]) == msg {
				return true
			}
		}
	}
	return false
}

// guardDrops reads the kernel's counters of the guard's drop rules: packets
// the node dropped as not of a recorded tunnel.
func guardDrops(t *testing.T, nodeNS string) uint64 {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(mustNS(t, nodeNS))))
	require.NoError(t, err)
	tbl := &nftables.Table{Name: tunnel.NoTrackTable, Family: nftables.TableFamilyIPv4}
	rs, err := c.GetRules(tbl, &nftables.Chain{Name: tunnel.GuardChain, Table: tbl})
	if errors.Is(err, unix.ENOENT) {
		return 0
	}
	require.NoError(t, err)
	var n uint64
	for _, r := range rs {
		var drop bool
		var count uint64
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Counter:
				count = e.Packets
			case *expr.Verdict:
				drop = e.Kind == expr.VerdictDrop
			}
		}
		if drop {
			n += count
		}
	}
	return n
}

// TestTunnelPacketsComeOnlyFromTheirOwnVM: the node delivers a VXLAN packet
// into a pod's namespace only when its outer source is that pod's VM and its
// id that pod's tunnel's (I13). A packet with the right id from another
// address (another pod's VM, or any host reaching the node's UDP 4789), or
// from the right VM with another pod's id, is dropped by the node, which
// counts it; the VM's own packets keep coming through.
func TestTunnelPacketsComeOnlyFromTheirOwnVM(t *testing.T) {
	g := newGuardNode(t)
	a, b := g.sbs[0], g.sbs[1]
	require.True(t, g.arrives(t, a.vm.NS, a.cfg.VXLANID, a, 10*time.Second), "the VM's own packet must reach its pod's interface")
	require.True(t, g.arrives(t, b.vm.NS, b.cfg.VXLANID, b, 10*time.Second), "the VM's own packet must reach its pod's interface")

	for _, c := range []struct {
		name string
		from string
		vni  int
		to   guardSandbox
	}{
		{"the right id from a host with no tunnel", g.stranger.NS, a.cfg.VXLANID, a},
		{"the right id from another pod's VM", b.vm.NS, a.cfg.VXLANID, a},
		{"another pod's id from a pod's VM", a.vm.NS, b.cfg.VXLANID, b},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := guardDrops(t, g.cn.NodeNS)
			require.False(t, g.arrives(t, c.from, c.vni, c.to, 500*time.Millisecond),
				"a VXLAN packet not from the tunnel's own VM came out of the pod's interface")
			require.Greater(t, guardDrops(t, g.cn.NodeNS), before, "the node's guard counts what it dropped")
		})
	}
	require.True(t, g.arrives(t, a.vm.NS, a.cfg.VXLANID, a, 10*time.Second), "the VM's own packets still pass")
}
