// Package tunnel joins a pod's network namespace on the worker to its pod VM
// with a VXLAN tunnel, through netlink (no commands run).
//
// The worker side, as the peer-pods pod VM expects it (confirmed 2026-12-01 in
// confidential-containers/cloud-api-adaptor at fbdde756,
// src/cloud-api-adaptor/pkg/podnetwork/tunneler/vxlan/workernode.go and
// podnode.go): a VXLAN device whose remote is the VM's IP, with the sandbox's
// VXLAN id and UDP port (4789 by default), is created in the worker's own
// network namespace (so its UDP socket lives there and reaches the VM over the
// node's network), then moved into the pod's namespace; there, tc ingress
// filters redirect every frame arriving on the pod's interface (eth0) out of
// the VXLAN device and every frame arriving from the tunnel out of eth0. The
// pod's IP and MAC live on the VM's end of the tunnel; the pod namespace on the
// worker is a conduit.
//
// As upstream, the tunnel's UDP skips connection tracking in the worker's
// namespace, through nftables' netlink API rather than the iptables binary
// (notrack.go). caa names its devices so that what survived a crash or
// restart is found and completed instead of duplicated.
package tunnel

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Names and marks of what Setup creates.
const (
	// LinkName is the VXLAN device's name in the pod's namespace (one per
	// namespace).
	LinkName = "caavxlan"
	// hostPrefix + VXLAN id names the device in the worker's namespace for
	// the moment between its creation and its move (a leftover there is a
	// crash in that moment).
	hostPrefix = "caavx"
	// FilterPriority marks caa's tc filters on the ingress of the pod's
	// interface and of the VXLAN device.
	FilterPriority = 0xcaa
	DefaultPort    = 4789
)

// Config is one sandbox's tunnel.
type Config struct {
	// NetNSPath is the pod's network namespace (kata's CreateVM
	// networkNamespacePath; a /var/run/netns path is read under /run/netns
	// when the former does not exist, see ResolveNetNS).
	NetNSPath string
	// VXLANID is the tunnel's id (as in the VM's user data); Port its UDP
	// port (0: 4789). The id must be unique on the node: the kernel keeps one
	// VXLAN device per id and port in the worker's namespace, and a second
	// sandbox with the same id fails Setup (the first keeps its tunnel).
	VXLANID int
	Port    int
	// RemoteIP is the VM's IP; LocalIP optionally the worker's source address.
	RemoteIP net.IP
	LocalIP  net.IP
	// PodInterface is the pod's interface to redirect; empty: the interface
	// of the namespace's default route.
	PodInterface string
	// HostNetNSPath is where the VXLAN's UDP socket lives; empty: caa's own
	// network namespace (the node's, with hostNetwork). Tests set it.
	HostNetNSPath string
}

func (c Config) port() int {
	if c.Port == 0 {
		return DefaultPort
	}
	return c.Port
}

func (c Config) hostLinkName() string { return fmt.Sprintf("%s%d", hostPrefix, c.VXLANID) }

func (c Config) validate() error {
	switch {
	case c.NetNSPath == "":
		return errors.New("tunnel: Config.NetNSPath is empty: pass CreateVM's networkNamespacePath")
	case c.VXLANID < 1 || c.VXLANID > 1<<24-1:
		return fmt.Errorf("tunnel: Config.VXLANID %d: must be in 1..16777215", c.VXLANID)
	case c.port() < 1 || c.port() > 65535:
		return fmt.Errorf("tunnel: Config.Port %d: not a UDP port", c.Port)
	case c.RemoteIP == nil || c.RemoteIP.IsUnspecified():
		return errors.New("tunnel: Config.RemoteIP is unset: pass the VM's IP")
	}
	return nil
}

// State is what of a tunnel is in the kernel.
type State struct {
	// PodNetNS: the pod's namespace exists.
	PodNetNS bool
	// Link: the VXLAN device is in the pod's namespace; LinkMatches: with
	// this config's id, remote and port, and up.
	Link, LinkMatches bool
	// ToTunnel and FromTunnel: the two redirects are in place.
	ToTunnel, FromTunnel bool
	// HostLeftover: a device of this id is still in the worker's namespace;
	// PodLeftover: one was moved into the pod's but not renamed (a crash in
	// either moment).
	HostLeftover, PodLeftover bool
	// NoTrack: the worker's NOTRACK rules for the tunnel's UDP are there
	// (notrack.go).
	NoTrack bool
	// Guard: the worker's VXLAN guard is whole and passes the tunnel's
	// packets from its VM (guard.go).
	Guard bool
}

// Complete reports whether the tunnel is whole.
func (s State) Complete() bool {
	return s.PodNetNS && s.Link && s.LinkMatches && s.ToTunnel && s.FromTunnel && !s.HostLeftover && !s.PodLeftover && s.NoTrack && s.Guard
}

type handles struct {
	host, pod     *netlink.Handle
	hostNS, podNS netns.NsHandle
	podNSMissing  bool
}

func (h *handles) close() {
	if h.host != nil {
		h.host.Close()
	}
	if h.pod != nil {
		h.pod.Close()
	}
	if h.hostNS.IsOpen() {
		h.hostNS.Close()
	}
	if h.podNS.IsOpen() {
		h.podNS.Close()
	}
}

func open(cfg Config) (*handles, error) {
	h := &handles{hostNS: netns.None(), podNS: netns.None()}
	var err error
	if cfg.HostNetNSPath != "" {
		h.hostNS, err = netns.GetFromPath(cfg.HostNetNSPath)
	} else {
		h.hostNS, err = netns.Get()
	}
	if err != nil {
		h.close()
		return nil, fmt.Errorf("tunnel: open the worker's network namespace: %w", err)
	}
	if h.host, err = netlink.NewHandleAt(h.hostNS); err != nil {
		h.close()
		return nil, fmt.Errorf("tunnel: netlink in the worker's namespace: %w", err)
	}
	h.podNS, err = netns.GetFromPath(ResolveNetNS(cfg.NetNSPath))
	if errors.Is(err, os.ErrNotExist) {
		h.podNSMissing = true
		return h, nil
	}
	if err != nil {
		h.close()
		return nil, fmt.Errorf("tunnel: open pod network namespace %s: %w", cfg.NetNSPath, err)
	}
	if h.podNS.Equal(h.hostNS) {
		h.close()
		return nil, workerNamespace(cfg.NetNSPath)
	}
	if h.pod, err = netlink.NewHandleAt(h.podNS); err != nil {
		h.close()
		return nil, fmt.Errorf("tunnel: netlink in %s: %w", cfg.NetNSPath, err)
	}
	return h, nil
}

// ErrWorkerNamespace: the pod network namespace given is the worker's own.
// A tunnel there would redirect every frame of the node's default interface
// into the VXLAN device and cut the node off its network.
var ErrWorkerNamespace = errors.New("the pod network namespace is the worker's own")

func workerNamespace(path string) error {
	return fmt.Errorf("tunnel: networkNamespacePath %s: %w; refusing to tunnel the node's own interface "+
		"(a peer pod needs its own network namespace: no hostNetwork)", path, ErrWorkerNamespace)
}

// CheckPodNetNS refuses a pod namespace that is the worker's own
// (hostNetNSPath as in Config.HostNetNSPath: empty is the caller's), before
// anything is built or created for it. A namespace that does not exist is
// left to Inspect and Setup to report.
func CheckPodNetNS(netnsPath, hostNetNSPath string) error {
	pod, err := netns.GetFromPath(ResolveNetNS(netnsPath))
	if err != nil {
		return nil
	}
	defer pod.Close()
	var host netns.NsHandle
	if hostNetNSPath != "" {
		host, err = netns.GetFromPath(hostNetNSPath)
	} else {
		host, err = netns.Get()
	}
	if err != nil {
		return fmt.Errorf("tunnel: open the worker's network namespace: %w", err)
	}
	defer host.Close()
	if pod.Equal(host) {
		return workerNamespace(netnsPath)
	}
	return nil
}

// Setup builds the tunnel, or completes what of it survived: a device of this
// id left in the worker's namespace is removed, a device in the pod's
// namespace with other settings is replaced, missing redirects are added. It
// is idempotent, and safe to call again after a crash at any point.
func Setup(cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	h, err := open(cfg)
	if err != nil {
		return err
	}
	defer h.close()
	if h.podNSMissing {
		return fmt.Errorf("tunnel: pod network namespace %s does not exist: the sandbox is gone", cfg.NetNSPath)
	}
	podIf, err := podInterface(h.pod, cfg.PodInterface)
	if err != nil {
		return fmt.Errorf("tunnel: %s: %w", cfg.NetNSPath, err)
	}
	vx, err := ensureLink(h, cfg)
	if err != nil {
		return err
	}
	// Once the device holds the id (the kernel refuses a second tunnel with
	// an id in use, which must not touch the first's rules), and before the
	// redirects send the pod's first packet.
	if err := ensureNoTrack(h.hostNS, cfg); err != nil {
		return err
	}
	for _, l := range []netlink.Link{podIf, vx} {
		if err := ensureIngress(h.pod, l); err != nil {
			return fmt.Errorf("tunnel: %s: %w", cfg.NetNSPath, err)
		}
	}
	if err := ensureRedirect(h.pod, podIf, vx); err != nil {
		return fmt.Errorf("tunnel: %s: redirect %s to %s: %w", cfg.NetNSPath, podIf.Attrs().Name, LinkName, err)
	}
	if err := ensureRedirect(h.pod, vx, podIf); err != nil {
		return fmt.Errorf("tunnel: %s: redirect %s to %s: %w", cfg.NetNSPath, LinkName, podIf.Attrs().Name, err)
	}
	return nil
}

func ensureLink(h *handles, cfg Config) (netlink.Link, error) {
	l, err := h.pod.LinkByName(LinkName)
	if err == nil {
		if matches(l, cfg) {
			if l.Attrs().Flags&net.FlagUp == 0 {
				if err := h.pod.LinkSetUp(l); err != nil {
					return nil, fmt.Errorf("tunnel: set %s up: %w", LinkName, err)
				}
			}
			// A leftover from an earlier crash is not this device.
			if err := deleteHostLeftover(h, cfg); err != nil {
				return nil, err
			}
			return h.pod.LinkByName(LinkName)
		}
		// Another tunnel's settings (a new VM for the sandbox's namespace):
		// replace it; its filters go with it.
		if err := h.pod.LinkDel(l); err != nil {
			return nil, fmt.Errorf("tunnel: replace %s in %s: %w", LinkName, cfg.NetNSPath, err)
		}
	} else if !isNotFound(err) {
		return nil, fmt.Errorf("tunnel: look up %s in %s: %w", LinkName, cfg.NetNSPath, err)
	}
	if err := deleteHostLeftover(h, cfg); err != nil {
		return nil, err
	}
	if err := deletePodLeftover(h, cfg); err != nil {
		return nil, err
	}
	name := cfg.hostLinkName()
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: name},
		VxlanId:   cfg.VXLANID,
		Group:     cfg.RemoteIP,
		SrcAddr:   cfg.LocalIP,
		Port:      cfg.port(),
	}
	if err := h.host.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("tunnel: create VXLAN %s (id %d, remote %s:%d): %w", name, cfg.VXLANID, cfg.RemoteIP, cfg.port(), err)
	}
	created, err := h.host.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("tunnel: find %s after creating it: %w", name, err)
	}
	if err := h.host.LinkSetNsFd(created, int(h.podNS)); err != nil {
		_ = h.host.LinkDel(created)
		return nil, fmt.Errorf("tunnel: move %s into %s: %w", name, cfg.NetNSPath, err)
	}
	moved, err := h.pod.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("tunnel: find %s in %s: %w", name, cfg.NetNSPath, err)
	}
	if err := h.pod.LinkSetName(moved, LinkName); err != nil {
		return nil, fmt.Errorf("tunnel: rename %s to %s in %s: %w", name, LinkName, cfg.NetNSPath, err)
	}
	if err := h.pod.LinkSetUp(moved); err != nil {
		return nil, fmt.Errorf("tunnel: set %s up in %s: %w", LinkName, cfg.NetNSPath, err)
	}
	return h.pod.LinkByName(LinkName)
}

func deleteHostLeftover(h *handles, cfg Config) error {
	l, err := h.host.LinkByName(cfg.hostLinkName())
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tunnel: look up %s: %w", cfg.hostLinkName(), err)
	}
	if _, ok := l.(*netlink.Vxlan); !ok {
		return fmt.Errorf("tunnel: %s in the worker's namespace is a %s, not caa's VXLAN: rename or remove it", cfg.hostLinkName(), l.Type())
	}
	if err := h.host.LinkDel(l); err != nil && !isNotFound(err) {
		return fmt.Errorf("tunnel: remove leftover %s: %w", cfg.hostLinkName(), err)
	}
	return nil
}

// deletePodLeftover removes a device moved into the pod's namespace but not
// yet renamed (a crash in that moment): it still holds the id in the worker's
// namespace, so a new device could not be made.
func deletePodLeftover(h *handles, cfg Config) error {
	l, err := h.pod.LinkByName(cfg.hostLinkName())
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tunnel: look up %s in %s: %w", cfg.hostLinkName(), cfg.NetNSPath, err)
	}
	if _, ok := l.(*netlink.Vxlan); !ok {
		return fmt.Errorf("tunnel: %s in %s is a %s, not caa's VXLAN", cfg.hostLinkName(), cfg.NetNSPath, l.Type())
	}
	if err := h.pod.LinkDel(l); err != nil && !isNotFound(err) {
		return fmt.Errorf("tunnel: remove leftover %s from %s: %w", cfg.hostLinkName(), cfg.NetNSPath, err)
	}
	return nil
}

func matches(l netlink.Link, cfg Config) bool {
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		return false
	}
	if cfg.LocalIP != nil && !vx.SrcAddr.Equal(cfg.LocalIP) {
		return false
	}
	return vx.VxlanId == cfg.VXLANID && vx.Group.Equal(cfg.RemoteIP) && vx.Port == cfg.port()
}

func ensureIngress(h *netlink.Handle, l netlink.Link) error {
	qs, err := h.QdiscList(l)
	if err != nil {
		return fmt.Errorf("list qdiscs of %s: %w", l.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Type() == "ingress" {
			return nil
		}
	}
	q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: l.Attrs().Index,
		Handle:    netlink.MakeHandle(0xffff, 0),
		Parent:    netlink.HANDLE_INGRESS,
	}}
	if err := h.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add ingress qdisc to %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// ours returns caa's filters on l's ingress.
func ours(h *netlink.Handle, l netlink.Link) ([]netlink.Filter, error) {
	fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		return nil, fmt.Errorf("list filters of %s: %w", l.Attrs().Name, err)
	}
	var out []netlink.Filter
	for _, f := range fs {
		if f.Attrs().Priority == FilterPriority {
			out = append(out, f)
		}
	}
	return out, nil
}

func redirectsTo(f netlink.Filter, target int) bool {
	u, ok := f.(*netlink.U32)
	if !ok {
		return false
	}
	for _, a := range u.Actions {
		if m, ok := a.(*netlink.MirredAction); ok && m.Ifindex == target && m.MirredAction == netlink.TCA_EGRESS_REDIR {
			return true
		}
	}
	return false
}

func ensureRedirect(h *netlink.Handle, from, to netlink.Link) error {
	fs, err := ours(h, from)
	if err != nil {
		return err
	}
	for _, f := range fs {
		if redirectsTo(f, to.Attrs().Index) {
			return nil
		}
	}
	// Stale filters of ours (to a device since replaced) go first.
	for _, f := range fs {
		if err := h.FilterDel(f); err != nil && !isNotFound(err) {
			return fmt.Errorf("remove stale filter on %s: %w", from.Attrs().Name, err)
		}
	}
	mirred := netlink.NewMirredAction(to.Attrs().Index)
	mirred.MirredAction = netlink.TCA_EGRESS_REDIR
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: from.Attrs().Index,
			Parent:    netlink.HANDLE_MIN_INGRESS,
			Priority:  FilterPriority,
			Protocol:  unix.ETH_P_ALL,
		},
		Actions: []netlink.Action{mirred},
	}
	return h.FilterAdd(f)
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV)
}
