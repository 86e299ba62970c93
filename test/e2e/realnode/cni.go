package realnode

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/caa-project/caa/test/e2e/cluster"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// cniNetwork is the pods' network: a bridge, as the usual single-node
// setups have (containerd's own example, kind's ptp aside), with addresses
// from host-local. No masquerade and no port maps: nothing here leaves the
// node, so iptables stays untouched.
type cniNetwork struct {
	Bridge string
	Subnet netip.Prefix
}

// newCNINetwork picks a bridge name and, unless one is given, a /24 of
// 10.200.0.0/13 for the pods, so that nodes of parallel tests (and of other
// packages) on one machine do not meet.
func newCNINetwork(subnet netip.Prefix) (cniNetwork, error) {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return cniNetwork{}, err
	}
	n := cniNetwork{Bridge: "rn" + hex.EncodeToString(b), Subnet: subnet}
	if !n.Subnet.IsValid() {
		i, err := rand.Int(rand.Reader, big.NewInt(8*256))
		if err != nil {
			return cniNetwork{}, err
		}
		v := int(i.Int64())
		n.Subnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + v/256), byte(v % 256), 0}), 24)
	}
	return n, nil
}

// write installs the plugins (links to the cached builds) in binDir and the
// network's conflist in confDir; host-local keeps its leases in dataDir.
func (n cniNetwork) write(bins cluster.NodeBinaries, binDir, confDir, dataDir string) error {
	for _, d := range []string{binDir, confDir, dataDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cni: %w", err)
		}
	}
	for name, path := range map[string]string{
		"bridge": bins.CNIBridge, "host-local": bins.CNIHostLocal, "loopback": bins.CNILoopback, "portmap": bins.CNIPortmap,
	} {
		if err := os.Symlink(path, filepath.Join(binDir, name)); err != nil {
			return fmt.Errorf("cni plugin %s: %w", name, err)
		}
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "caa-e2e",
		"plugins": []any{map[string]any{
			"type":        "bridge",
			"bridge":      n.Bridge,
			"isGateway":   true,
			"ipMasq":      false,
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": n.Subnet.String()}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": dataDir,
			},
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-caa-e2e.conflist"), b, 0o644); err != nil {
		return fmt.Errorf("cni: %w", err)
	}
	return nil
}

// deleteLink removes the network device name (the pods' bridge) from the
// namespace at netns (empty: this process's), if it is there.
func deleteLink(netns, name string) error {
	del := func() error {
		link, err := netlink.LinkByName(name)
		if err != nil {
			var notFound netlink.LinkNotFoundError
			if errors.As(err, &notFound) {
				return nil
			}
			return fmt.Errorf("find bridge %s: %w", name, err)
		}
		if err := netlink.LinkDel(link); err != nil {
			return fmt.Errorf("delete bridge %s: %w", name, err)
		}
		return nil
	}
	if netns == "" {
		return del()
	}
	return podvmfake.InNetNS(netns, del)
}
