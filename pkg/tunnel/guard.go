package tunnel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The guard: a pod VM's packets enter only its own pod's namespace (I13).
//
// The kernel's VXLAN device takes a packet of its id from any source: it
// checks neither that the outer source is its remote nor anything else, so a
// VM (or any host that reaches the node's UDP port) sending with another
// sandbox's id would have its frames come out of that pod's interface on the
// node, as that pod. The guard drops, in the worker's namespace, every VXLAN
// packet that names a recorded tunnel's id or comes from a recorded tunnel's
// VM unless its (outer source, UDP port, VXLAN id) is one recorded tunnel's.
// It lives in caa's table beside the NOTRACK rules:
//
//	table ip caa-notrack
//	  set tunnels { type ipv4_addr . inet_service . integer }  VM . port . id, one per tunnel
//	  set peers   { type ipv4_addr . inet_service }            VM . port
//	  set ids     { type inet_service . integer }              port . id
//	  chain vxlan-guard (filter, hook input, priority raw)
//	    meta l4proto udp ip saddr . udp dport . <id> @tunnels counter accept
//	    meta l4proto udp ip saddr . udp dport @peers counter drop
//	    meta l4proto udp udp dport . <id> @ids counter drop
//
// <id> is the VXLAN header's id: the four bytes at UDP offset 11 (the last
// reserved byte of the header's first word and the 24-bit id, RFC 7348),
// masked to the id, so a set element's integer is the id itself. The input
// hook sees a datagram after reassembly, with its transport header. A
// packet of neither a recorded VM nor a recorded id is not caa's (another
// VXLAN user of the port, as Calico's id 4096 on 4789) and is left alone: for
// an id with no device the kernel drops it anyway. The per-packet cost is
// three hash lookups at most, whatever the number of tunnels; one tunnel is
// one element in each set.
//
// The sets are the record, as the NOTRACK rules' comments are: Setup adds a
// tunnel's elements in the same nftables transaction as its NOTRACK pair
// (replacing those of an earlier VM with its id), Teardown removes them in
// the one that removes the pair, and a tunnel element's comment is the pair's.
// A transaction is atomic, so no packet sees the guard half made. When the
// guard is missing from a table that has NOTRACK pairs (made by a caa before
// the guard), the transaction that makes it fills it with those pairs'
// tunnels first, so the live tunnels of the node never see a guard without
// their elements. RebuildGuard sets the elements to the tunnels the ledger
// records, in one transaction.
//
// What it rests on: the outer source address. A host that can send with a
// VM's address as its source (the cloud network's anti-spoofing off, or a
// host on the node's own segment) and knows the VM's tunnel id passes it.
const (
	GuardChain   = "vxlan-guard"
	guardTunnels = "tunnels"
	guardPeers   = "peers"
	guardIDs     = "ids"
	guardAccept  = "caa-vxlan-guard recorded tunnel"
	guardPeer    = "caa-vxlan-guard from a tunnel's VM with another id"
	guardID      = "caa-vxlan-guard a tunnel's id from another source"
)

// vniOffset is where the guard reads the VXLAN id (see above).
const vniOffset = 8 + 3

// guardEntry is one tunnel as the guard knows it.
type guardEntry struct {
	vm   netip.Addr
	port uint16
	id   uint32
}

func entryOf(cfg Config) (guardEntry, error) {
	vm, ok := netip.AddrFromSlice(cfg.RemoteIP.To4())
	if !ok {
		return guardEntry{}, fmt.Errorf("tunnel: Config.RemoteIP %s: the guard takes an IPv4 address", cfg.RemoteIP)
	}
	return guardEntry{vm: vm, port: uint16(cfg.port()), id: uint32(cfg.VXLANID)}, nil
}

func (e guardEntry) comment() string {
	return noTrackComment(int(e.id), net.IP(e.vm.AsSlice()), int(e.port))
}

func (e guardEntry) key() []byte {
	b := make([]byte, 12)
	a := e.vm.As4()
	copy(b, a[:])
	binary.BigEndian.PutUint16(b[4:], e.port)
	binary.BigEndian.PutUint32(b[8:], e.id)
	return b
}

func (e guardEntry) peerKey() []byte { return e.key()[:8] }

func (e guardEntry) idKey() []byte { return e.key()[4:] }

func entryFromKey(k []byte) (guardEntry, bool) {
	if len(k) != 12 {
		return guardEntry{}, false
	}
	return guardEntry{vm: netip.AddrFrom4([4]byte(k[:4])), port: binary.BigEndian.Uint16(k[4:]), id: binary.BigEndian.Uint32(k[8:])}, true
}

// entryFromComment reads a NOTRACK pair's comment ("caa-vxlan <id> <VM>:<port>").
func entryFromComment(c string) (guardEntry, bool) {
	rest, ok := strings.CutPrefix(c, noTrackTag+" ")
	if !ok {
		return guardEntry{}, false
	}
	idS, addr, ok := strings.Cut(rest, " ")
	if !ok {
		return guardEntry{}, false
	}
	id, err := strconv.ParseUint(idS, 10, 24)
	if err != nil {
		return guardEntry{}, false
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return guardEntry{}, false
	}
	return guardEntry{vm: ap.Addr(), port: ap.Port(), id: uint32(id)}, true
}

func guardSets(t *nftables.Table) (tunnels, peers, ids *nftables.Set) {
	ip, port, id := nftables.TypeIPAddr, nftables.TypeInetService, nftables.TypeInteger
	mk := func(name, comment string, types ...nftables.SetDatatype) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, KeyType: nftables.MustConcatSetType(types...), Concatenation: true,
			KeyByteOrder: binaryutil.BigEndian, Comment: comment}
	}
	return mk(guardTunnels, "caa: VM . VXLAN port . VXLAN id of each tunnel", ip, port, id),
		mk(guardPeers, "caa: VM . VXLAN port of each tunnel", ip, port),
		mk(guardIDs, "caa: VXLAN port . VXLAN id of each tunnel", port, id)
}

func guardChainOf(t *nftables.Table) *nftables.Chain {
	return &nftables.Chain{Name: GuardChain, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityRaw}
}

// Loads into 32-bit registers: reg1 (NFT_REG_1, the first word of the
// concatenation) and the words after it, NFT_REG32_01 and _02.
const (
	reg1  = 1
	reg9  = 9
	reg10 = 10
)

func loadSaddr(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}
}

func loadDport(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

func loadVNI(reg uint32) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: vniOffset, Len: 4},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: []byte{0, 0xff, 0xff, 0xff}, Xor: []byte{0, 0, 0, 0}},
	}
}

func guardRules(t *nftables.Table, c *nftables.Chain, tunnels, peers, ids *nftables.Set) []*nftables.Rule {
	udp := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_UDP}},
	}
	lookup := func(s *nftables.Set) expr.Any {
		return &expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID}
	}
	rule := func(comment string, exprs ...expr.Any) *nftables.Rule {
		return &nftables.Rule{Table: t, Chain: c, Exprs: append(slices.Clone(udp), exprs...),
			UserData: userdata.AppendString(nil, userdata.TypeComment, comment)}
	}
	accept := append([]expr.Any{loadSaddr(reg1), loadDport(reg9)}, loadVNI(reg10)...)
	byID := append([]expr.Any{loadDport(reg1)}, loadVNI(reg9)...)
	return []*nftables.Rule{
		rule(guardAccept, append(accept, lookup(tunnels), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept})...),
		rule(guardPeer, loadSaddr(reg1), loadDport(reg9), lookup(peers), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}),
		rule(guardID, append(byID, lookup(ids), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})...),
	}
}

// guardState is what of the guard is in the kernel.
type guardState struct {
	sets    map[string]bool
	rulesOK bool // the chain holds exactly the three rules, in order
	tunnels []nftables.SetElement
	peers   []nftables.SetElement
	ids     []nftables.SetElement
}

func (g guardState) complete() bool {
	return g.sets[guardTunnels] && g.sets[guardPeers] && g.sets[guardIDs] && g.rulesOK
}

// entries are the guard's tunnels.
func (g guardState) entries() []guardEntry {
	var out []guardEntry
	for _, el := range g.tunnels {
		if e, ok := entryFromKey(el.Key); ok {
			out = append(out, e)
		}
	}
	return out
}

// readGuard reads the guard; a missing table is an empty state.
func readGuard(c *nftables.Conn) (guardState, error) {
	g := guardState{sets: map[string]bool{}}
	t := &nftables.Table{Name: NoTrackTable, Family: nftables.TableFamilyIPv4}
	if _, err := c.ListTableOfFamily(NoTrackTable, nftables.TableFamilyIPv4); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return g, nil
		}
		return g, fmt.Errorf("tunnel: look up nftables table %s: %w", NoTrackTable, err)
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return g, fmt.Errorf("tunnel: list the sets of table ip %s: %w", NoTrackTable, err)
	}
	tunnels, peers, ids := guardSets(t)
	for _, s := range sets {
		var into *[]nftables.SetElement
		var want *nftables.Set
		switch s.Name {
		case guardTunnels:
			into, want = &g.tunnels, tunnels
		case guardPeers:
			into, want = &g.peers, peers
		case guardIDs:
			into, want = &g.ids, ids
		default:
			continue
		}
		if s.KeyType.Bytes != want.KeyType.Bytes {
			continue // someone else's set of the name: making the guard's fails, saying so
		}
		g.sets[s.Name] = true
		if *into, err = c.GetSetElements(s); err != nil {
			return g, fmt.Errorf("tunnel: list set %s of table ip %s: %w", s.Name, NoTrackTable, err)
		}
	}
	// A chain that is not there lists no rule, as an empty one.
	rules, err := c.GetRules(t, guardChainOf(t))
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return g, fmt.Errorf("tunnel: list %s %s: %w", NoTrackTable, GuardChain, err)
	}
	want := []string{guardAccept, guardPeer, guardID}
	g.rulesOK = len(rules) == len(want)
	for i := 0; g.rulesOK && i < len(rules); i++ {
		g.rulesOK = ruleComment(rules[i]) == want[i]
	}
	return g, nil
}

// planGuard queues in c's batch what makes the kernel's guard (cur) hold
// want's tunnels: the sets, the chain and its rules where missing, then
// each set's elements. It reports whether it queued anything.
func planGuard(c *nftables.Conn, cur guardState, want []guardEntry) (bool, error) {
	t := &nftables.Table{Name: NoTrackTable, Family: nftables.TableFamilyIPv4}
	tunnels, peers, ids := guardSets(t)
	changed := false
	if !cur.complete() {
		c.AddTable(t)
		changed = true
	}
	for _, s := range []*nftables.Set{tunnels, peers, ids} {
		if cur.sets[s.Name] {
			continue
		}
		if err := c.AddSet(s, nil); err != nil {
			return false, fmt.Errorf("tunnel: set %s of table ip %s: %w", s.Name, NoTrackTable, err)
		}
	}
	type keyed struct {
		key     []byte
		comment string
	}
	var wt, wp, wi []keyed
	for _, e := range want {
		wt = append(wt, keyed{e.key(), e.comment()})
		wp = append(wp, keyed{e.peerKey(), ""})
		wi = append(wi, keyed{e.idKey(), ""})
	}
	for _, l := range []struct {
		set  *nftables.Set
		cur  []nftables.SetElement
		want []keyed
	}{{tunnels, cur.tunnels, wt}, {peers, cur.peers, wp}, {ids, cur.ids, wi}} {
		var add, del []nftables.SetElement
		for _, w := range l.want {
			if !slices.ContainsFunc(l.cur, func(e nftables.SetElement) bool { return bytes.Equal(e.Key, w.key) }) &&
				!slices.ContainsFunc(add, func(e nftables.SetElement) bool { return bytes.Equal(e.Key, w.key) }) {
				add = append(add, nftables.SetElement{Key: w.key, Comment: w.comment})
			}
		}
		for _, e := range l.cur {
			if !slices.ContainsFunc(l.want, func(w keyed) bool { return bytes.Equal(e.Key, w.key) }) {
				del = append(del, nftables.SetElement{Key: e.Key})
			}
		}
		if len(del) > 0 {
			if err := c.SetDeleteElements(l.set, del); err != nil {
				return false, fmt.Errorf("tunnel: remove elements of set %s: %w", l.set.Name, err)
			}
			changed = true
		}
		if len(add) > 0 {
			if err := c.SetAddElements(l.set, add); err != nil {
				return false, fmt.Errorf("tunnel: add elements to set %s: %w", l.set.Name, err)
			}
			changed = true
		}
	}
	if !cur.rulesOK {
		// Made if missing (an existing one is kept), emptied, filled.
		ch := guardChainOf(t)
		c.AddChain(ch)
		c.FlushChain(ch)
		for _, r := range guardRules(t, ch, tunnels, peers, ids) {
			c.AddRule(r)
		}
		changed = true
	}
	return changed, nil
}

// guardWith is the guard's tunnels with e in place of any other of e's id
// (an earlier VM's, as the NOTRACK pair of the id is replaced).
func guardWith(cur []guardEntry, e guardEntry) []guardEntry {
	return append(guardWithout(cur, int(e.id)), e)
}

// guardWithout is the guard's tunnels without id's.
func guardWithout(cur []guardEntry, id int) []guardEntry {
	return slices.DeleteFunc(slices.Clone(cur), func(x guardEntry) bool { return x.id == uint32(id) })
}

// seedGuard is the guard's tunnels to start from: the guard's own when it is
// whole, else the tunnels of the NOTRACK pairs (a table made before the
// guard, or one someone emptied) together with what is left of the guard's.
func seedGuard(g guardState, pre []*nftables.Rule) []guardEntry {
	cur := g.entries()
	if g.complete() {
		return cur
	}
	for _, r := range pre {
		if e, ok := entryFromComment(ruleComment(r)); ok && !slices.Contains(cur, e) {
			cur = append(cur, e)
		}
	}
	return cur
}

// hasGuard reports whether the guard is whole and passes cfg's tunnel.
func hasGuard(c *nftables.Conn, cfg Config) (bool, error) {
	g, err := readGuard(c)
	if err != nil {
		return false, err
	}
	e, err := entryOf(cfg)
	if err != nil {
		return false, err
	}
	return g.complete() && slices.Contains(g.entries(), e), nil
}

// Recorded is one tunnel the node's records hold, for RebuildGuard.
type Recorded struct {
	VXLANID, Port int
	RemoteIP      net.IP
}

// RebuildGuard makes the guard of the worker's namespace (hostNetNSPath as
// Config.HostNetNSPath) pass exactly the tunnels recorded returns, in one
// nftables transaction: no packet sees the guard missing or half filled. It
// calls recorded while it holds the node's lock, so a Setup or Teardown of
// this or another process does not interleave: a tunnel is recorded (in the
// ledger) before its Setup, and stays recorded through its Teardown, so what
// recorded returns includes every tunnel a Setup made. A record without an
// IPv4 VM address (no tunnel yet) is skipped. Nothing is written when the guard
// already matches; with no tunnel recorded and no table, nothing is made.
func RebuildGuard(hostNetNSPath string, recorded func() ([]Recorded, error)) error {
	hostNS, err := openHostNS(hostNetNSPath)
	if err != nil {
		return err
	}
	defer hostNS.Close()
	unlock, err := lockNoTrack(hostNS)
	if err != nil {
		return err
	}
	defer unlock()
	rs, err := recorded()
	if err != nil {
		return fmt.Errorf("tunnel: the recorded tunnels: %w", err)
	}
	var want []guardEntry
	for _, r := range rs {
		if r.VXLANID < 1 || r.VXLANID > 1<<24-1 || r.RemoteIP.To4() == nil || r.RemoteIP.IsUnspecified() {
			continue // no tunnel (yet), or none caa's IPv4 table could hold
		}
		e, err := entryOf(Config{VXLANID: r.VXLANID, Port: r.Port, RemoteIP: r.RemoteIP})
		if err != nil {
			return err
		}
		if !slices.Contains(want, e) {
			want = append(want, e)
		}
	}
	c, err := noTrackConn(hostNS)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	cur, err := readGuard(c)
	if err != nil {
		return err
	}
	if len(want) == 0 && len(cur.tunnels) == 0 {
		return nil
	}
	changed, err := planGuard(c, cur, want)
	if err != nil || !changed {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("tunnel: rebuild the VXLAN guard (table ip %s) from %d recorded tunnels: %w", NoTrackTable, len(want), err)
	}
	return nil
}

func openHostNS(path string) (netns.NsHandle, error) {
	var ns netns.NsHandle
	var err error
	if path != "" {
		ns, err = netns.GetFromPath(path)
	} else {
		ns, err = netns.Get()
	}
	if err != nil {
		return netns.None(), fmt.Errorf("tunnel: open the worker's network namespace: %w", err)
	}
	return ns, nil
}
