package tunnel

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NOTRACK for the tunnel's UDP in the worker's namespace.
//
// Each VXLAN packet picks a random source port towards a fixed destination
// port, so connection tracking sees every packet as a new UDP flow and a busy
// node's conntrack table fills with them. Upstream (commit 2a79d39b, issue
// 2015) adds two iptables rules per tunnel in the raw table: NOTRACK for UDP
// to the VM's IP and the VXLAN port (OUTPUT) and from the VM's IP to that port
// (PREROUTING). caa adds the same two matches through nftables' netlink API
// (no iptables binary needed on the node), in a table of its own:
//
//	table ip caa-notrack
//	  chain prerouting (filter, hook prerouting, priority raw)
//	    ip saddr <VM> udp dport <port> notrack   comment "caa-vxlan <id> <VM>:<port>"
//	  chain output     (filter, hook output, priority raw)
//	    ip daddr <VM> udp dport <port> notrack   comment "caa-vxlan <id> <VM>:<port>"
//
// The kernel is the record: a tunnel's rules are found by their comment, so a
// restarted caa (or the one a hand-over started) sees what an earlier one
// added. Setup adds a tunnel's pair once (a second Setup adds nothing; a pair
// for the same id with another VM or port is replaced); Teardown removes its
// pair, and the table with the last pair.
const (
	NoTrackTable = "caa-notrack"
	noTrackPre   = "prerouting"
	noTrackOut   = "output"
	noTrackTag   = "caa-vxlan"
)

// lockNoTrack serialises changes to the node's one table across every
// process and goroutine of the node: the check for "no pair left" and the
// table's removal must not interleave with another tunnel's Setup, since
// deleting a chain removes the rules in it, so a pair added between the
// check and the removal would go with the table. The lock is an flock on
// the namespace's own file (one per namespace, whoever opened it: each
// Setup and Teardown opens its own handle, so goroutines exclude each other
// too), which also covers two caa processes of a hand-over and a bench or
// tool beside caa. It is released with unlock, or when the process dies.
func lockNoTrack(hostNS netns.NsHandle) (unlock func(), err error) {
	for {
		err = unix.Flock(int(hostNS), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("tunnel: lock the node namespace's NOTRACK table: %w", err)
	}
	return func() { _ = unix.Flock(int(hostNS), unix.LOCK_UN) }, nil
}

func noTrackComment(id int, remote net.IP, port int) string {
	return fmt.Sprintf("%s %d %s:%d", noTrackTag, id, remote, port)
}

func noTrackIDPrefix(id int) string { return fmt.Sprintf("%s %d ", noTrackTag, id) }

func noTrackObjects() (*nftables.Table, *nftables.Chain, *nftables.Chain) {
	t := &nftables.Table{Name: NoTrackTable, Family: nftables.TableFamilyIPv4}
	pre := &nftables.Chain{Name: noTrackPre, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw}
	out := &nftables.Chain{Name: noTrackOut, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityRaw}
	return t, pre, out
}

// noTrackRule matches UDP to port from (source) or to (!source) addr.
func noTrackRule(t *nftables.Table, c *nftables.Chain, addr net.IP, port int, source bool, comment string) *nftables.Rule {
	offset := uint32(16) // IPv4 destination address
	if source {
		offset = 12
	}
	return &nftables.Rule{
		Table: t, Chain: c,
		Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr.To4()},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
			&expr.Notrack{},
		},
		UserData: userdata.AppendString(nil, userdata.TypeComment, comment),
	}
}

func ruleComment(r *nftables.Rule) string {
	s, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	return s
}

// noTrackConn opens nftables in the worker's namespace.
func noTrackConn(hostNS netns.NsHandle) (*nftables.Conn, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(hostNS)))
	if err != nil {
		return nil, fmt.Errorf("tunnel: nftables in the worker's namespace: %w", err)
	}
	return c, nil
}

// tableRules lists the rules of the two chains; a missing table is none.
func tableRules(c *nftables.Conn) (pre, out []*nftables.Rule, exists bool, err error) {
	t, preC, outC := noTrackObjects()
	if _, err := c.ListTableOfFamily(NoTrackTable, nftables.TableFamilyIPv4); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil, false, nil
		}
		return nil, nil, false, fmt.Errorf("tunnel: look up nftables table %s: %w", NoTrackTable, err)
	}
	pre, err = c.GetRules(t, preC)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, nil, true, fmt.Errorf("tunnel: list %s %s: %w", NoTrackTable, noTrackPre, err)
	}
	out, err = c.GetRules(t, outC)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, nil, true, fmt.Errorf("tunnel: list %s %s: %w", NoTrackTable, noTrackOut, err)
	}
	return pre, out, true, nil
}

// ensureNoTrack adds cfg's pair of rules unless exactly that pair is there,
// removing other rules for cfg's id (an earlier VM's, or a second copy), and
// in the same transaction the guard's elements of cfg's tunnel (guard.go).
func ensureNoTrack(hostNS netns.NsHandle, cfg Config) error {
	unlock, err := lockNoTrack(hostNS)
	if err != nil {
		return err
	}
	defer unlock()
	c, err := noTrackConn(hostNS)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	pre, out, _, err := tableRules(c)
	if err != nil {
		return err
	}
	entry, err := entryOf(cfg)
	if err != nil {
		return err
	}
	guard, err := readGuard(c)
	if err != nil {
		return err
	}
	seed := seedGuard(guard, pre)
	want := noTrackComment(cfg.VXLANID, cfg.RemoteIP, cfg.port())
	prefix := noTrackIDPrefix(cfg.VXLANID)
	changed := false
	havePre, haveOut := false, false
	for _, l := range []struct {
		rules []*nftables.Rule
		have  *bool
	}{{pre, &havePre}, {out, &haveOut}} {
		for _, r := range l.rules {
			cm := ruleComment(r)
			if !strings.HasPrefix(cm, prefix) {
				continue
			}
			if cm == want && !*l.have {
				*l.have = true
				continue
			}
			if err := c.DelRule(r); err != nil {
				return fmt.Errorf("tunnel: remove stale NOTRACK rule %q: %w", cm, err)
			}
			changed = true
		}
	}
	t, preC, outC := noTrackObjects()
	if !havePre || !haveOut {
		c.AddTable(t)
		c.AddChain(preC)
		c.AddChain(outC)
		if !havePre {
			c.AddRule(noTrackRule(t, preC, cfg.RemoteIP, cfg.port(), true, want))
		}
		if !haveOut {
			c.AddRule(noTrackRule(t, outC, cfg.RemoteIP, cfg.port(), false, want))
		}
		changed = true
	}
	// The guard's elements in the same transaction (guard.go).
	guarded, err := planGuard(c, guard, guardWith(seed, entry))
	if err != nil {
		return err
	}
	if !changed && !guarded {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("tunnel: add NOTRACK rules and the VXLAN guard's elements for the tunnel's UDP (%s, table ip %s): %w "+
			"(the kernel needs nf_tables with conntrack; caa needs NET_ADMIN in the node's namespace)", want, NoTrackTable, err)
	}
	return nil
}

// removeNoTrack removes the rules and the guard's elements of VXLAN id and,
// when no tunnel is left, the table.
func removeNoTrack(hostNS netns.NsHandle, id int) error {
	unlock, err := lockNoTrack(hostNS)
	if err != nil {
		return err
	}
	defer unlock()
	c, err := noTrackConn(hostNS)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	pre, out, exists, err := tableRules(c)
	if err != nil || !exists {
		return err
	}
	guard, err := readGuard(c)
	if err != nil {
		return err
	}
	rest := guardWithout(seedGuard(guard, pre), id)
	prefix := noTrackIDPrefix(id)
	left := 0
	for _, r := range append(pre, out...) {
		if !strings.HasPrefix(ruleComment(r), prefix) {
			left++
			continue
		}
		if err := c.DelRule(r); err != nil {
			return fmt.Errorf("tunnel: remove NOTRACK rule %q: %w", ruleComment(r), err)
		}
	}
	if left == 0 && len(rest) == 0 {
		t, _, _ := noTrackObjects()
		c.DelTable(t)
	} else if _, err := planGuard(c, guard, rest); err != nil {
		// The guard's elements of the id go in the same transaction.
		return err
	}
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("tunnel: remove NOTRACK rules of VXLAN %d (table ip %s): %w", id, NoTrackTable, err)
	}
	return nil
}

// hasNoTrack reports whether cfg's pair is in place, and whether the guard
// is whole and passes cfg's tunnel.
func hasNoTrack(hostNS netns.NsHandle, cfg Config) (noTrack, guard bool, err error) {
	c, err := noTrackConn(hostNS)
	if err != nil {
		return false, false, err
	}
	defer c.CloseLasting()
	pre, out, _, err := tableRules(c)
	if err != nil {
		return false, false, err
	}
	want := noTrackComment(cfg.VXLANID, cfg.RemoteIP, cfg.port())
	has := func(rs []*nftables.Rule) bool {
		for _, r := range rs {
			if ruleComment(r) == want {
				return true
			}
		}
		return false
	}
	if guard, err = hasGuard(c, cfg); err != nil {
		return false, false, err
	}
	return has(pre) && has(out), guard, nil
}
