// Package podvm builds the user data the peer-pods pod VM image boots from, and
// reads it back the way the image's provisioning does.
//
// What the image accepts (confirmed 2026-12-01 in confidential-containers/
// cloud-api-adaptor at fbdde756, src/cloud-api-adaptor):
//   - pkg/userdata/provision.go: the user data is YAML decoded strictly (unknown
//     keys are an error) into a document whose only key is write_files, each
//     entry holding only path and content; a file is written only when its path
//     is on an allow-list; the others are logged and skipped. The allow-list
//     (pkg/paths/paths.go): /run/peerpod/aa.toml, cdh.toml, apf.json,
//     auth.json, initdata, scratch-space.marker.
//   - pkg/forwarder/forwarder.go: apf.json is the forwarder's configuration,
//     decoded (not strictly) from JSON with the keys pod-network, pod-namespace,
//     pod-name, tls-server-key, tls-server-cert, tls-client-ca (and optional
//     tls-min-version, tls-cipher-suites); the forwarder listens on 0.0.0.0:15150
//     with the server key/cert and requires client certificates from the client
//     CA (pkg/util/tlsutil/tls.go: RequireAndVerifyClientCert, TLS 1.2 at least).
//   - pkg/podnetwork/tunneler/tunneler.go: pod-network's keys (podip,
//     pod-hw-addr, interface, worker-node-ip, tunnel-type, routes, neighbors,
//     mtu, index, vxlan-port, vxlan-id, dedicated, external-net-via-pod-vm);
//     pkg/util/netops/netops.go: a route's protocol and scope and a neighbour's
//     state are names, and a name outside its table fails the decoding.
//   - pkg/podnetwork/tunneler/vxlan/workernode.go: VXLAN port 4789 and ids
//     from 555000 by default.
//   - pkg/initdata/initdata.go and pkg/util/cloud.go: /run/peerpod/initdata
//     holds the kata cc_init_data annotation's document gzipped then base64'd.
//   - src/cloud-providers/util/cloudinit/cloudconfig.go: auth.json is capped
//     at 12288 bytes.
//   - podvm/misc-settings.sh and the forwarder's systemd unit: an image built
//     with certificates in /etc/certificates takes them (and its own CA) over
//     apf.json's, an image built with FORWARDER_PORT listens elsewhere, one
//     built with TLS_OPTIONS=-disable-tls speaks no TLS. caa supports the
//     default build: no baked certificates, port 15150, TLS on.
package podvm

import (
	"net/netip"
)

// Paths the pod VM's provisioning writes (its allow-list, in part).
const (
	ForwarderConfigPath = "/run/peerpod/apf.json"
	AuthJSONPath        = "/run/peerpod/auth.json"
	InitDataPath        = "/run/peerpod/initdata"
	ScratchSpacePath    = "/run/peerpod/scratch-space.marker"
)

// allowedPaths is the provisioning's full allow-list.
var allowedPaths = []string{
	"/run/peerpod/aa.toml",
	"/run/peerpod/cdh.toml",
	ForwarderConfigPath,
	AuthJSONPath,
	InitDataPath,
	ScratchSpacePath,
}

// AllowedPaths returns the provisioning's allow-list.
func AllowedPaths() []string { return append([]string(nil), allowedPaths...) }

// Defaults of the pod network and the forwarder.
const (
	ForwarderPort    = 15150
	DefaultVXLANPort = 4789
	VXLANIDBase      = 555000
	// MaxVXLANID is the largest 24-bit VXLAN network identifier.
	MaxVXLANID = 1<<24 - 1
	// TunnelType is the only tunnel caa builds.
	TunnelType = "vxlan"
)

// Caps on what a pod may put into its VM's user data.
const (
	MaxAuthJSON = 12288
	MaxInitData = 16384
)

// Config is everything a pod VM's user data says.
type Config struct {
	PodName      string
	PodNamespace string
	// SandboxID is not written to the VM (the image has no field for it); it
	// names the sandbox in errors.
	SandboxID string

	Network Network

	// TLSServerCertPEM and TLSServerKeyPEM are the VM's forwarder's
	// certificate and key (pki.CA.IssueServer); TLSClientCAPEM is the CA
	// whose client certificates the forwarder accepts (pki.CA.CertPEM).
	TLSServerCertPEM []byte
	TLSServerKeyPEM  []byte
	TLSClientCAPEM   []byte

	// AuthJSON is the pod's image-pull credentials as a container auth file
	// ({"auths": {...}}), optional, at most MaxAuthJSON bytes.
	AuthJSON []byte
	// InitData is the pod's initdata document (kata's cc_init_data
	// annotation, TOML), optional, at most MaxInitData bytes. It is written
	// gzipped and base64-encoded, as the image expects.
	InitData string
	// ScratchSpace asks the image to set up its encrypted scratch space.
	ScratchSpace bool
}

// Network is the pod network as the forwarder expects it: the VM plays the
// pod's interface at the far end of a VXLAN tunnel from the worker.
type Network struct {
	// VXLANID is the tunnel's network identifier, unique per pod VM on the
	// worker (VXLANIDBase + index upstream); VXLANPort its UDP port.
	VXLANID   int
	VXLANPort int
	// WorkerIP is the worker's address the VM sends the tunnel to, with its
	// prefix length (the VM uses the address only).
	WorkerIP netip.Prefix

	// Interface is the pod's interface in its network namespace (eth0).
	Interface string
	// PodIP is the pod's IPv4 address with its prefix length, PodMAC its
	// interface's hardware address, MTU its MTU (the VM caps it at 1450).
	PodIP  netip.Prefix
	PodMAC string
	MTU    int
	// Routes and Neighbors are the pod namespace's IPv4 routes and permanent
	// neighbours, which the VM installs in the pod's namespace.
	Routes    []Route
	Neighbors []Neighbor
}

// Route is one route of the pod's namespace. Protocol and Scope are netlink's
// names (RouteProtocols, RouteScopes); Dst 0.0.0.0/0 is the default route.
type Route struct {
	Dst      netip.Prefix
	GW       netip.Addr
	Dev      string
	Protocol string
	Scope    string
}

// Neighbor is one permanent neighbour entry of the pod's namespace; State is
// one of NeighborStates.
type Neighbor struct {
	IP    netip.Addr
	MAC   string
	Dev   string
	State string
}

// RouteProtocols, RouteScopes and NeighborStates are the names the forwarder
// decodes; any other name fails its start.
var (
	RouteProtocols = []string{"static", "boot", "dhcp", "kernel"}
	RouteScopes    = []string{"universe", "site", "link", "host", "nowhere"}
	NeighborStates = []string{"none", "incomplete", "reachable", "stale", "delay", "probe", "failed", "noarp", "permanent"}
)

// Files is user data as the pod VM's provisioning reads it.
type Files struct {
	// Written maps each allow-listed path to the content the image writes.
	Written map[string][]byte
	// Skipped lists the paths outside the allow-list, which the image skips.
	Skipped []string
	// Config is what the written files say, decoded as the forwarder and the
	// image decode them (SandboxID stays empty: the VM is not told).
	Config Config
}
