package tunnel_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/caa-project/caa/pkg/tunnel"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// noTrackRules reads the worker namespace's caa-notrack table: chain name to
// the comments of its rules; nil when the table is gone.
func noTrackRules(t *testing.T, nodeNS string) map[string][]string {
	t.Helper()
	ns := mustNS(t, nodeNS)
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	require.NoError(t, err)
	tbl, err := c.ListTableOfFamily(tunnel.NoTrackTable, nftables.TableFamilyIPv4)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	require.NoError(t, err)
	out := map[string][]string{}
	for _, name := range []string{"prerouting", "output"} {
		rs, err := c.GetRules(tbl, &nftables.Chain{Name: name, Table: tbl})
		require.NoError(t, err)
		out[name] = []string{}
		for _, r := range rs {
			cm, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			var notrack bool
			for _, e := range r.Exprs {
				if _, ok := e.(*expr.Notrack); ok {
					notrack = true
				}
			}
			require.True(t, notrack, "rule %q ends in notrack", cm)
			out[name] = append(out[name], cm)
		}
	}
	return out
}

// TestNoTrackRulesFollowTheTunnels: the worker gets NOTRACK rules for each
// tunnel's UDP (from the VM to the VXLAN port, and to the VM's VXLAN port)
// with its first Setup, one copy however often Setup runs (a restart), its
// own pair per tunnel; a Teardown removes only its tunnel's pair, and the
// table goes with the last tunnel. A fresh process sees the kernel's rules
// (nothing is kept in memory), so a restarted caa tears down correctly.
func TestNoTrackRulesFollowTheTunnels(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	require.Nil(t, noTrackRules(t, cn.NodeNS), "no table before any tunnel")
	var cfgs []tunnel.Config
	var pair []string
	for i, vm := range []podvmfake.VMHost{{NS: cn.VMNS, IP: cn.VMIP}, cn.AddVM(t)} {
		pod := cn.NewPod(t, netip.MustParsePrefix(fmt.Sprintf("10.244.%d.5/24", i+1)))
		n, err := tunnel.Inspect(pod.NSPath)
		require.NoError(t, err)
		n.VXLANID, n.VXLANPort, n.WorkerIP = vxlanID+i, 4789, cn.NodeIP
		require.NoError(t, podvmfake.BuildVMEnd(vm.NS, n))
		cfgs = append(cfgs, tunnel.Config{NetNSPath: pod.NSPath, VXLANID: n.VXLANID, RemoteIP: vm.IP.Addr().AsSlice(), HostNetNSPath: cn.NodeNS})
		pair = append(pair, fmt.Sprintf("caa-vxlan %d %s:4789", n.VXLANID, vm.IP.Addr()))
	}

	require.NoError(t, tunnel.Setup(cfgs[0]))
	one := map[string][]string{"prerouting": {pair[0]}, "output": {pair[0]}}
	require.Equal(t, one, noTrackRules(t, cn.NodeNS), "the first tunnel's pair")
	st, err := tunnel.Check(cfgs[0])
	require.NoError(t, err)
	require.True(t, st.NoTrack)
	require.True(t, st.Complete(), "%+v", st)
	require.NoError(t, tunnel.Setup(cfgs[0]), "a restart's Setup")
	require.Equal(t, one, noTrackRules(t, cn.NodeNS), "one copy after two Setups")

	require.NoError(t, tunnel.Setup(cfgs[1]))
	two := map[string][]string{"prerouting": {pair[0], pair[1]}, "output": {pair[0], pair[1]}}
	require.Equal(t, two, noTrackRules(t, cn.NodeNS), "a pair per tunnel, one copy each")
	require.NoError(t, tunnel.Setup(cfgs[1]))
	require.NoError(t, tunnel.Setup(cfgs[0]))
	require.Equal(t, two, noTrackRules(t, cn.NodeNS))

	// A refused tunnel (its id is in use) leaves the first's rules alone.
	dup := cfgs[1]
	dup.VXLANID = cfgs[0].VXLANID
	dup.RemoteIP = net.ParseIP("10.123.0.77")
	require.Error(t, tunnel.Setup(dup))
	require.Equal(t, two, noTrackRules(t, cn.NodeNS), "a refused Setup changed another tunnel's rules")

	// Rules lost (someone flushed the table): Check sees it, Setup repairs.
	ns := mustNS(t, cn.NodeNS)
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	require.NoError(t, err)
	c.DelTable(&nftables.Table{Name: tunnel.NoTrackTable, Family: nftables.TableFamilyIPv4})
	require.NoError(t, c.Flush())
	st, err = tunnel.Check(cfgs[0])
	require.NoError(t, err)
	require.False(t, st.NoTrack)
	require.False(t, st.Complete())
	require.NoError(t, tunnel.Setup(cfgs[0]))
	require.NoError(t, tunnel.Setup(cfgs[1]))
	require.Equal(t, two, noTrackRules(t, cn.NodeNS))

	require.NoError(t, tunnel.Teardown(cfgs[0]))
	other := map[string][]string{"prerouting": {pair[1]}, "output": {pair[1]}}
	require.Equal(t, other, noTrackRules(t, cn.NodeNS), "the other tunnel keeps its rules")
	require.NoError(t, tunnel.Teardown(cfgs[0]), "a second Teardown")
	require.Equal(t, other, noTrackRules(t, cn.NodeNS))
	st, err = tunnel.Check(cfgs[1])
	require.NoError(t, err)
	require.True(t, st.Complete(), "%+v", st)

	require.NoError(t, tunnel.Teardown(cfgs[1]))
	require.Nil(t, noTrackRules(t, cn.NodeNS), "the table goes with the last tunnel")
	require.NoError(t, tunnel.Teardown(cfgs[1]))
}

// TestNoTrackChangesWaitForTheNodeLock: the table's changes take a lock
// every process of the node shares (an flock on the node namespace's
// file), so a caa beside another caa of a hand-over, or a tool, never
// removes the table under the other's new rules. While another holder (the
// test, by its own open of the namespace) has the lock, Setup adds nothing;
// once it lets go, Setup completes.
func TestNoTrackChangesWaitForTheNodeLock(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	pod := cn.NewPod(t, netip.MustParsePrefix("10.244.1.5/24"))
	n, err := tunnel.Inspect(pod.NSPath)
	require.NoError(t, err)
	n.VXLANID, n.VXLANPort, n.WorkerIP = vxlanID, 4789, cn.NodeIP
	require.NoError(t, podvmfake.BuildVMEnd(cn.VMNS, n))
	cfg := tunnel.Config{NetNSPath: pod.NSPath, VXLANID: n.VXLANID, RemoteIP: cn.VMIP.Addr().AsSlice(), HostNetNSPath: cn.NodeNS}

	other, err := os.Open(cn.NodeNS)
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, unix.Flock(int(other.Fd()), unix.LOCK_EX))
	done := make(chan error, 1)
	go func() { done <- tunnel.Setup(cfg) }()
	select {
	case err := <-done:
		t.Fatalf("Setup changed the table while another process held the node's lock (err %v)", err)
	case <-time.After(300 * time.Millisecond): // a window to see it wait; it cannot end early
	}
	require.Nil(t, noTrackRules(t, cn.NodeNS), "no rule while the lock is held elsewhere")
	require.NoError(t, unix.Flock(int(other.Fd()), unix.LOCK_UN))
	require.NoError(t, <-done)
	pair := fmt.Sprintf("caa-vxlan %d %s:4789", n.VXLANID, cn.VMIP.Addr())
	require.Equal(t, map[string][]string{"prerouting": {pair}, "output": {pair}}, noTrackRules(t, cn.NodeNS))
	require.NoError(t, tunnel.Teardown(cfg))
}
