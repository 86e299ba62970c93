package tunnel

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// Teardown removes the tunnel: caa's filters (and the ingress qdisc when no
// other filter is left on it), the VXLAN device, any leftover in the
// worker's namespace, and the tunnel's NOTRACK rules (their table with the
// last tunnel's). A pod namespace already gone took its devices with it;
// that is success. Idempotent.
func Teardown(cfg Config) error {
	if cfg.NetNSPath == "" {
		return errors.New("tunnel: Config.NetNSPath is empty")
	}
	h, err := open(cfg)
	if err != nil {
		return err
	}
	defer h.close()
	var errs []error
	if cfg.VXLANID > 0 {
		errs = append(errs, deleteHostLeftover(h, cfg))
	}
	if h.podNSMissing {
		if cfg.VXLANID > 0 {
			errs = append(errs, removeNoTrack(h.hostNS, cfg.VXLANID))
		}
		return errors.Join(errs...)
	}
	if cfg.VXLANID > 0 {
		errs = append(errs, deletePodLeftover(h, cfg))
	}
	links, err := h.pod.LinkList()
	if err != nil {
		return fmt.Errorf("tunnel: list links of %s: %w", cfg.NetNSPath, err)
	}
	for _, l := range links {
		if l.Attrs().Name == LinkName {
			continue
		}
		fs, err := ours(h.pod, l)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, f := range fs {
			if err := h.pod.FilterDel(f); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("tunnel: remove filter on %s: %w", l.Attrs().Name, err))
			}
		}
		if len(fs) > 0 {
			errs = append(errs, dropIdleIngress(h.pod, l))
		}
	}
	if l, err := h.pod.LinkByName(LinkName); err == nil {
		if err := h.pod.LinkDel(l); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("tunnel: remove %s from %s: %w", LinkName, cfg.NetNSPath, err))
		}
	} else if !isNotFound(err) {
		errs = append(errs, fmt.Errorf("tunnel: look up %s in %s: %w", LinkName, cfg.NetNSPath, err))
	}
	// The tunnel's NOTRACK rules go after its device: no packet of it is
	// tracked while it exists.
	if cfg.VXLANID > 0 {
		errs = append(errs, removeNoTrack(h.hostNS, cfg.VXLANID))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tunnel: teardown %s: %w", cfg.NetNSPath, err)
	}
	return nil
}

func dropIdleIngress(h *netlink.Handle, l netlink.Link) error {
	fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil || len(fs) > 0 {
		return nil
	}
	qs, err := h.QdiscList(l)
	if err != nil {
		return nil
	}
	for _, q := range qs {
		if q.Type() == "ingress" {
			if err := h.QdiscDel(q); err != nil && !isNotFound(err) {
				return fmt.Errorf("tunnel: remove ingress qdisc of %s: %w", l.Attrs().Name, err)
			}
		}
	}
	return nil
}

// Check reports what of cfg's tunnel is in the kernel, changing nothing.
func Check(cfg Config) (State, error) {
	var s State
	if err := cfg.validate(); err != nil {
		return s, err
	}
	h, err := open(cfg)
	if err != nil {
		return s, err
	}
	defer h.close()
	if _, err := h.host.LinkByName(cfg.hostLinkName()); err == nil {
		s.HostLeftover = true
	}
	if s.NoTrack, s.Guard, err = hasNoTrack(h.hostNS, cfg); err != nil {
		return s, err
	}
	if h.podNSMissing {
		return s, nil
	}
	s.PodNetNS = true
	if _, err := h.pod.LinkByName(cfg.hostLinkName()); err == nil {
		s.PodLeftover = true
	}
	vx, err := h.pod.LinkByName(LinkName)
	if err != nil {
		if isNotFound(err) {
			return s, nil
		}
		return s, fmt.Errorf("tunnel: look up %s in %s: %w", LinkName, cfg.NetNSPath, err)
	}
	s.Link = true
	s.LinkMatches = matches(vx, cfg) && vx.Attrs().Flags&net.FlagUp != 0
	podIf, err := podInterface(h.pod, cfg.PodInterface)
	if err != nil {
		return s, fmt.Errorf("tunnel: %s: %w", cfg.NetNSPath, err)
	}
	for _, p := range []struct {
		from, to netlink.Link
		ok       *bool
	}{{podIf, vx, &s.ToTunnel}, {vx, podIf, &s.FromTunnel}} {
		fs, err := ours(h.pod, p.from)
		if err != nil {
			return s, err
		}
		for _, f := range fs {
			if redirectsTo(f, p.to.Attrs().Index) {
				*p.ok = true
			}
		}
	}
	return s, nil
}
