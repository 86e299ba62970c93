package tunnel_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
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
	require.NoError(t, g.send(ns, pkt))
}

func (g *guardNode) send(ns string, pkt []byte) error {
	return podvmfake.InNetNS(ns, func() error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: g.cn.NodeIP.Addr().AsSlice(), Port: 4789})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(pkt)
		return err
	})
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

// guardCounters reads the kernel's counters of the guard's drop rules, in
// the chain's order: packets from a tunnel's VM with another id, then
// packets with a tunnel's id from another source. None without the chain.
func guardCounters(t *testing.T, nodeNS string) []uint64 {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(mustNS(t, nodeNS))))
	require.NoError(t, err)
	tbl := &nftables.Table{Name: tunnel.NoTrackTable, Family: nftables.TableFamilyIPv4}
	rs, err := c.GetRules(tbl, &nftables.Chain{Name: tunnel.GuardChain, Table: tbl})
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	require.NoError(t, err)
	var out []uint64
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
			out = append(out, count)
		}
	}
	return out
}

// guardDrops is the sum of guardCounters: packets the node dropped as not
// of a recorded tunnel.
func guardDrops(t *testing.T, nodeNS string) uint64 {
	t.Helper()
	var n uint64
	for _, c := range guardCounters(t, nodeNS) {
		n += c
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

// guardTunnels reads the guard's tunnels set: "VM:port id" per element,
// with each element's comment; nil when the set is not there.
func guardTunnels(t *testing.T, nodeNS string) map[string]string {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(mustNS(t, nodeNS))))
	require.NoError(t, err)
	tbl := &nftables.Table{Name: tunnel.NoTrackTable, Family: nftables.TableFamilyIPv4}
	s, err := c.GetSetByName(tbl, "tunnels")
	if err != nil {
		return nil
	}
	els, err := c.GetSetElements(s)
	require.NoError(t, err)
	out := map[string]string{}
	for _, e := range els {
		require.Len(t, e.Key, 12)
		k := fmt.Sprintf("%s:%d %d", netip.AddrFrom4([4]byte(e.Key[:4])), binary.BigEndian.Uint16(e.Key[4:]), binary.BigEndian.Uint32(e.Key[8:]))
		out[k] = e.Comment
	}
	return out
}

func (s guardSandbox) element() string {
	return fmt.Sprintf("%s:4789 %d", s.vm.IP.Addr(), s.cfg.VXLANID)
}

func (s guardSandbox) recorded() tunnel.Recorded {
	return tunnel.Recorded{VXLANID: s.cfg.VXLANID, Port: 4789, RemoteIP: s.cfg.RemoteIP}
}

// TestGuardFollowsTheTunnels: one element per tunnel from its Setup, one
// copy however often Setup runs; a tunnel's id given to another VM replaces
// the element, so the earlier VM's packets stop; Teardown removes only its
// tunnel's, and Check reports a guard that lost the tunnel's element.
func TestGuardFollowsTheTunnels(t *testing.T) {
	g := newGuardNode(t)
	a, b := g.sbs[0], g.sbs[1]
	comment := func(s guardSandbox) string {
		return fmt.Sprintf("caa-vxlan %d %s:4789", s.cfg.VXLANID, s.vm.IP.Addr())
	}
	both := map[string]string{a.element(): comment(a), b.element(): comment(b)}
	require.Equal(t, both, guardTunnels(t, g.cn.NodeNS))
	require.NoError(t, tunnel.Setup(a.cfg), "a restart's Setup")
	require.NoError(t, tunnel.Setup(b.cfg))
	require.Equal(t, both, guardTunnels(t, g.cn.NodeNS), "one element per tunnel after Setups again")
	st, err := tunnel.Check(a.cfg)
	require.NoError(t, err)
	require.True(t, st.Guard && st.Complete(), "%+v", st)

	// The guard rebuilt from records that lack a: Check sees a's element
	// gone, Setup puts it back.
	require.NoError(t, tunnel.RebuildGuard(g.cn.NodeNS, func() ([]tunnel.Recorded, error) {
		return []tunnel.Recorded{b.recorded()}, nil
	}))
	require.Equal(t, map[string]string{b.element(): comment(b)}, guardTunnels(t, g.cn.NodeNS))
	st, err = tunnel.Check(a.cfg)
	require.NoError(t, err)
	require.False(t, st.Guard)
	require.False(t, st.Complete())
	require.NoError(t, tunnel.Setup(a.cfg))
	require.Equal(t, both, guardTunnels(t, g.cn.NodeNS))
	require.True(t, g.arrives(t, a.vm.NS, a.cfg.VXLANID, a, 10*time.Second))
	require.False(t, g.arrives(t, g.stranger.NS, a.cfg.VXLANID, a, 300*time.Millisecond))

	// The guard's rules lost (someone flushed its chain), the sets kept:
	// Check sees it, Setup makes the rules again.
	nc, err := nftables.New(nftables.WithNetNSFd(int(mustNS(t, g.cn.NodeNS))))
	require.NoError(t, err)
	nc.FlushChain(&nftables.Chain{Name: tunnel.GuardChain, Table: &nftables.Table{Name: tunnel.NoTrackTable, Family: nftables.TableFamilyIPv4}})
	require.NoError(t, nc.Flush())
	require.True(t, g.arrives(t, g.stranger.NS, b.cfg.VXLANID, b, 10*time.Second), "no rules, no guard")
	st, err = tunnel.Check(b.cfg)
	require.NoError(t, err)
	require.False(t, st.Guard)
	require.NoError(t, tunnel.Setup(b.cfg))
	st, err = tunnel.Check(a.cfg)
	require.NoError(t, err)
	require.True(t, st.Guard, "%+v", st)
	require.False(t, g.arrives(t, g.stranger.NS, b.cfg.VXLANID, b, 300*time.Millisecond))
	require.Equal(t, both, guardTunnels(t, g.cn.NodeNS))

	// a's id with another VM (the stranger): its element replaces a's.
	moved := a.cfg
	moved.RemoteIP = g.stranger.IP.Addr().AsSlice()
	require.NoError(t, tunnel.Setup(moved))
	require.Equal(t, map[string]string{
		fmt.Sprintf("%s:4789 %d", g.stranger.IP.Addr(), a.cfg.VXLANID): fmt.Sprintf("caa-vxlan %d %s:4789", a.cfg.VXLANID, g.stranger.IP.Addr()),
		b.element(): comment(b),
	}, guardTunnels(t, g.cn.NodeNS))
	require.False(t, g.arrives(t, a.vm.NS, a.cfg.VXLANID, a, 300*time.Millisecond), "the id's earlier VM is not passed")
	require.True(t, g.arrives(t, g.stranger.NS, a.cfg.VXLANID, a, 10*time.Second), "the id's new VM is")
	require.NoError(t, tunnel.Setup(a.cfg))

	require.NoError(t, tunnel.Teardown(a.cfg))
	require.Equal(t, map[string]string{b.element(): comment(b)}, guardTunnels(t, g.cn.NodeNS), "b keeps its element")
	require.True(t, g.arrives(t, b.vm.NS, b.cfg.VXLANID, b, 10*time.Second))
	require.NoError(t, tunnel.Teardown(a.cfg), "a second Teardown")
	require.NoError(t, tunnel.Teardown(b.cfg))
	require.Nil(t, guardTunnels(t, g.cn.NodeNS), "the guard goes with the table and the last tunnel")
}

// dropGuard takes the guard out of the node's table and leaves the NOTRACK
// pairs, as a caa from before the guard left the table.
func dropGuard(t *testing.T, nodeNS string) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(mustNS(t, nodeNS))))
	require.NoError(t, err)
	tbl := &nftables.Table{Name: tunnel.NoTrackTable, Family: nftables.TableFamilyIPv4}
	c.DelChain(&nftables.Chain{Name: tunnel.GuardChain, Table: tbl})
	for _, s := range []string{"tunnels", "peers", "ids"} {
		c.DelSet(&nftables.Set{Table: tbl, Name: s})
	}
	require.NoError(t, c.Flush())
	require.Nil(t, guardTunnels(t, nodeNS))
	require.Len(t, noTrackRules(t, nodeNS)["prerouting"], 2, "the NOTRACK pairs stay")
}

// TestGuardFromAnEarlierCaaKeepsTheLiveTunnels: on a node whose table a caa
// from before the guard made (NOTRACK pairs, no guard), the first Setup
// after the update, of one tunnel, makes the guard with every tunnel of the
// pairs, so the others, not set up again yet, keep their packets.
func TestGuardFromAnEarlierCaaKeepsTheLiveTunnels(t *testing.T) {
	g := newGuardNode(t)
	a, b := g.sbs[0], g.sbs[1]
	dropGuard(t, g.cn.NodeNS)
	require.True(t, g.arrives(t, g.stranger.NS, b.cfg.VXLANID, b, 10*time.Second), "no guard: a stranger's packet passes")

	require.NoError(t, tunnel.Setup(a.cfg))
	require.Equal(t, []string{a.element(), b.element()}, keys(guardTunnels(t, g.cn.NodeNS)))
	require.True(t, g.arrives(t, b.vm.NS, b.cfg.VXLANID, b, 10*time.Second), "b's VM, whose tunnel was not set up again, still passes")
	require.False(t, g.arrives(t, g.stranger.NS, b.cfg.VXLANID, b, 300*time.Millisecond), "and b's id is guarded")

	// The same through a Teardown: the guard is made with the pairs left.
	dropGuard(t, g.cn.NodeNS)
	require.NoError(t, tunnel.Teardown(a.cfg))
	require.Equal(t, []string{b.element()}, keys(guardTunnels(t, g.cn.NodeNS)))
	require.True(t, g.arrives(t, b.vm.NS, b.cfg.VXLANID, b, 10*time.Second))
	require.False(t, g.arrives(t, a.vm.NS, b.cfg.VXLANID, b, 300*time.Millisecond))
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// witness counts, in a table of the test's own in the node's namespace, the
// VXLAN packets vxlanPacket makes for sandbox s from each of sources, on the
// node's input hook just before the guard (priority -350) and just after it
// (100): nothing but the guard stands between. The count is of the test's
// packets only (their inner UDP port), not of what else a VM's kernel sends.
type witness struct {
	nodeNS string
	table  *nftables.Table
}

func newWitness(t *testing.T, nodeNS string, s guardSandbox, sources ...netip.Addr) *witness {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(mustNS(t, nodeNS))))
	require.NoError(t, err)
	w := &witness{nodeNS: nodeNS, table: c.AddTable(&nftables.Table{Name: "caa-test-witness", Family: nftables.TableFamilyIPv4})}
	// The inner UDP destination port: after the outer UDP header (8), the
	// VXLAN header (8), the Ethernet header (14) and the inner IPv4 header (20).
	inner := binary.BigEndian.AppendUint16(nil, uint16(s.rxPort))
	count := func(ch *nftables.Chain, src netip.Addr) {
		c.AddRule(&nftables.Rule{Table: w.table, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src.AsSlice()},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x12, 0xb5}}, // 4789
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 8 + 8 + 14 + 20 + 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: inner},
			&expr.Counter{},
		}})
	}
	pre := c.AddChain(&nftables.Chain{Name: "pre", Table: w.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityRef(-350)})
	post := c.AddChain(&nftables.Chain{Name: "post", Table: w.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityRef(100)})
	for _, ch := range []*nftables.Chain{pre, post} {
		for _, src := range sources {
			count(ch, src)
		}
	}
	require.NoError(t, c.Flush())
	return w
}

// counts reads the counters, per source: arrived, and past the guard.
func (w *witness) counts(t *testing.T) (arrived, past []uint64) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(mustNS(t, w.nodeNS))))
	require.NoError(t, err)
	read := func(chain string) []uint64 {
		rs, err := c.GetRules(w.table, &nftables.Chain{Name: chain, Table: w.table})
		require.NoError(t, err)
		var out []uint64
		for _, r := range rs {
			for _, e := range r.Exprs {
				if ctr, ok := e.(*expr.Counter); ok {
					out = append(out, ctr.Packets)
				}
			}
		}
		return out
	}
	return read("pre"), read("post")
}

// TestGuardRebuildLeavesNoGap: a restarted caa rebuilds the guard from its
// records (RebuildGuard, each one changing the sets: a stale record comes
// and goes) and sets every tunnel up again, while a VM sends its own packets
// and a stranger sends with that VM's id, back to back. By the kernel's
// counters, every one of the stranger's packets that reached the node was
// dropped by the guard and none got past it, and every one of the VM's got
// past: the guard is never missing, half filled or without a live tunnel.
func TestGuardRebuildLeavesNoGap(t *testing.T) {
	g := newGuardNode(t)
	a, b := g.sbs[0], g.sbs[1]
	stale := tunnel.Recorded{VXLANID: vxlanID + 7, Port: 4789, RemoteIP: net.ParseIP("10.123.9.9")}
	records := [][]tunnel.Recorded{{a.recorded(), b.recorded(), stale}, {b.recorded(), a.recorded()}}
	require.Len(t, guardCounters(t, g.cn.NodeNS), 2)
	w := newWitness(t, g.cn.NodeNS, a, g.stranger.IP.Addr(), a.vm.IP.Addr())
	before := guardCounters(t, g.cn.NodeNS)

	type result struct {
		n   int
		err error
	}
	stop := make(chan struct{})
	sent := make(chan result, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				sent <- result{n: n}
				return
			default:
			}
			for _, p := range []struct{ ns, msg string }{{g.stranger.NS, "spoof"}, {a.vm.NS, "own"}} {
				if err := g.send(p.ns, vxlanPacket(a.cfg.VXLANID, a, fmt.Sprintf("%s %d", p.msg, n))); err != nil {
					sent <- result{n: n, err: err}
					return
				}
			}
			n++
			time.Sleep(time.Millisecond) // a steady stream through the rebuilds
		}
	}()
	for i := range 40 {
		recs := records[i%2]
		require.NoError(t, tunnel.RebuildGuard(g.cn.NodeNS, func() ([]tunnel.Recorded, error) { return recs, nil }))
		require.Len(t, guardTunnels(t, g.cn.NodeNS), len(recs))
		require.NoError(t, tunnel.Setup(a.cfg))
		require.NoError(t, tunnel.Setup(b.cfg))
	}
	close(stop)
	res := <-sent
	require.NoError(t, res.err)
	n := uint64(res.n)
	// The last packets may still be on their way through the kernel.
	var arrived, past, after []uint64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		arrived, past = w.counts(t)
		after = guardCounters(t, g.cn.NodeNS)
		if after[1]-before[1]+past[0] >= arrived[0] && past[1]+after[0]-before[0] >= arrived[1] {
			break
		}
	}
	t.Logf("sent %d pairs; arrived from the stranger %d, from the VM %d; past the guard %d and %d; dropped from VMs %d, with ids %d",
		n, arrived[0], arrived[1], past[0], past[1], after[0]-before[0], after[1]-before[1])
	// A packet may be lost on the way, before the guard: the test network
	// loses some of the VM's (untracked) packets between prerouting and
	// input, with or without the guard.
	require.Greater(t, arrived[0], n/2, "the stranger's packets reached the node through the rebuilds")
	require.Greater(t, arrived[1], n/2, "the VM's packets reached the node through the rebuilds")
	require.Zero(t, past[0], "a stranger's packet with a tunnel's id got past the guard")
	require.Equal(t, arrived[0], after[1]-before[1], "each of the stranger's packets dropped by the guard")
	require.Zero(t, after[0]-before[0], "none of the VM's packets dropped")
	require.Equal(t, arrived[1], past[1], "each of the VM's packets passed the guard")
	_ = a.rx.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	buf := make([]byte, 256)
	for {
		m, _, err := a.rx.ReadFromUDP(buf)
		if err != nil {
			break
		}
		require.NotContains(t, string(buf[:m]), "spoof", "a stranger's packet came out of the pod's interface")
	}
}
