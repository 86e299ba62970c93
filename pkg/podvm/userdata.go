package podvm

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"

	yaml "go.yaml.in/yaml/v2"
)

// cloudConfig is the one shape the image's provisioning decodes: write_files
// entries with a path and a content, nothing else (it decodes strictly).
type cloudConfig struct {
	WriteFiles []writeFile `yaml:"write_files"`
}

type writeFile struct {
	Path    string `yaml:"path"`
	Content string `yaml:"content"`
}

// forwarderConfig is apf.json, keyed as the forwarder decodes it.
type forwarderConfig struct {
	PodNetwork    *podNetwork `json:"pod-network"`
	PodNamespace  string      `json:"pod-namespace"`
	PodName       string      `json:"pod-name"`
	TLSServerKey  string      `json:"tls-server-key,omitempty"`
	TLSServerCert string      `json:"tls-server-cert,omitempty"`
	TLSClientCA   string      `json:"tls-client-ca,omitempty"`
}

type podNetwork struct {
	PodIP         netip.Prefix `json:"podip"`
	PodHwAddr     string       `json:"pod-hw-addr"`
	InterfaceName string       `json:"interface"`
	WorkerNodeIP  netip.Prefix `json:"worker-node-ip"`
	TunnelType    string       `json:"tunnel-type"`
	Routes        []wireRoute  `json:"routes"`
	Neighbors     []wireNeigh  `json:"neighbors"`
	MTU           int          `json:"mtu"`
	Index         int          `json:"index"`
	VXLANPort     int          `json:"vxlan-port,omitempty"`
	VXLANID       int          `json:"vxlan-id,omitempty"`
	// Dedicated (a second worker interface for tunnels) and external
	// networking through the VM are not features caa offers; written false
	// so the VM's side reads them as upstream's default.
	Dedicated           bool `json:"dedicated"`
	ExternalNetViaPodVM bool `json:"external-net-via-pod-vm"`
}

type wireRoute struct {
	Dst      netip.Prefix `json:"dst"`
	GW       netip.Addr   `json:"gw"`
	Dev      string       `json:"dev,omitempty"`
	Protocol string       `json:"protocol,omitempty"`
	Scope    string       `json:"scope,omitempty"`
}

type wireNeigh struct {
	IP           netip.Addr `json:"ip"`
	HardwareAddr string     `json:"hw-addr,omitempty"`
	Dev          string     `json:"dev,omitempty"`
	State        string     `json:"state,omitempty"`
}

// UserData returns cfg as a #cloud-config the pod VM image accepts. Every
// field is checked first; an error names the field and what to change.
func UserData(cfg Config) ([]byte, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	apf, err := json.MarshalIndent(toWire(cfg), "", "  ")
	if err != nil {
		return nil, fmt.Errorf("podvm: encode %s: %w", ForwarderConfigPath, err)
	}
	cc := cloudConfig{WriteFiles: []writeFile{{Path: ForwarderConfigPath, Content: string(apf) + "\n"}}}
	if len(cfg.AuthJSON) > 0 {
		cc.WriteFiles = append(cc.WriteFiles, writeFile{Path: AuthJSONPath, Content: string(cfg.AuthJSON)})
	}
	if cfg.InitData != "" {
		enc, err := encodeInitData(cfg.InitData)
		if err != nil {
			return nil, fmt.Errorf("podvm: encode InitData: %w", err)
		}
		cc.WriteFiles = append(cc.WriteFiles, writeFile{Path: InitDataPath, Content: enc})
	}
	if cfg.ScratchSpace {
		cc.WriteFiles = append(cc.WriteFiles, writeFile{Path: ScratchSpacePath, Content: ""})
	}
	body, err := yaml.Marshal(cc)
	if err != nil {
		return nil, fmt.Errorf("podvm: encode cloud-config: %w", err)
	}
	return append([]byte("#cloud-config\n"), body...), nil
}

// Validate checks cfg as UserData does.
func (cfg Config) Validate() error {
	req := func(field, v, fix string) error {
		if strings.TrimSpace(v) == "" {
			return fmt.Errorf("podvm: Config.%s is empty: %s", field, fix)
		}
		return nil
	}
	if err := errors.Join(
		req("PodName", cfg.PodName, "take it from the CRI annotation io.kubernetes.cri.sandbox-name"),
		req("PodNamespace", cfg.PodNamespace, "take it from the CRI annotation io.kubernetes.cri.sandbox-namespace"),
		req("SandboxID", cfg.SandboxID, "pass the id of kata's CreateVM request"),
	); err != nil {
		return err
	}
	if err := cfg.Network.Validate(); err != nil {
		return fmt.Errorf("podvm: sandbox %s: %w", cfg.SandboxID, err)
	}
	if _, err := tls.X509KeyPair(cfg.TLSServerCertPEM, cfg.TLSServerKeyPEM); err != nil {
		return fmt.Errorf("podvm: sandbox %s: Config.TLSServerCertPEM/TLSServerKeyPEM are not a certificate and its key (%v): issue them with pki.CA.IssueServer", cfg.SandboxID, err)
	}
	if !bytes.Contains(cfg.TLSClientCAPEM, []byte("-----BEGIN CERTIFICATE-----")) {
		return fmt.Errorf("podvm: sandbox %s: Config.TLSClientCAPEM holds no PEM certificate: pass pki.CA.CertPEM()", cfg.SandboxID)
	}
	if n := len(cfg.AuthJSON); n > MaxAuthJSON {
		return fmt.Errorf("podvm: sandbox %s: Config.AuthJSON is %d bytes, over the %d-byte cap: give the pod fewer or smaller imagePullSecrets", cfg.SandboxID, n, MaxAuthJSON)
	}
	if len(cfg.AuthJSON) > 0 && !json.Valid(cfg.AuthJSON) {
		return fmt.Errorf("podvm: sandbox %s: Config.AuthJSON is not JSON: pass the pod's pull secrets as a container auth file", cfg.SandboxID)
	}
	if n := len(cfg.InitData); n > MaxInitData {
		return fmt.Errorf("podvm: sandbox %s: Config.InitData is %d bytes, over the %d-byte cap: shorten the pod's io.katacontainers.config.hypervisor.cc_init_data annotation", cfg.SandboxID, n, MaxInitData)
	}
	return nil
}

// Validate checks the network as the VM's side will use it.
func (n Network) Validate() error {
	switch {
	case n.VXLANID < 1 || n.VXLANID > MaxVXLANID:
		return fmt.Errorf("Network.VXLANID %d: must be in 1..%d (upstream allocates from %d)", n.VXLANID, MaxVXLANID, VXLANIDBase)
	case n.VXLANPort < 1 || n.VXLANPort > 65535:
		return fmt.Errorf("Network.VXLANPort %d: must be a UDP port (default %d)", n.VXLANPort, DefaultVXLANPort)
	case !n.WorkerIP.IsValid():
		return errors.New("Network.WorkerIP is unset: pass the node's IP the VM can reach, as address/prefix")
	case n.Interface == "":
		return errors.New("Network.Interface is empty: pass the pod's interface name (tunnel.Inspect reads it)")
	case !n.PodIP.IsValid() || !n.PodIP.Addr().Is4():
		return fmt.Errorf("Network.PodIP %q: must be an IPv4 address/prefix (the forwarder takes IPv4 only)", n.PodIP)
	case n.MTU < 68:
		return fmt.Errorf("Network.MTU %d: must be at least 68", n.MTU)
	}
	if _, err := net.ParseMAC(n.PodMAC); err != nil {
		return fmt.Errorf("Network.PodMAC %q: %w", n.PodMAC, err)
	}
	for i, r := range n.Routes {
		if !r.Dst.IsValid() {
			return fmt.Errorf("Network.Routes[%d].Dst is unset: use 0.0.0.0/0 for the default route", i)
		}
		if r.Protocol != "" && !slices.Contains(RouteProtocols, r.Protocol) {
			return fmt.Errorf("Network.Routes[%d].Protocol %q: the forwarder knows only %v", i, r.Protocol, RouteProtocols)
		}
		if r.Scope != "" && !slices.Contains(RouteScopes, r.Scope) {
			return fmt.Errorf("Network.Routes[%d].Scope %q: the forwarder knows only %v", i, r.Scope, RouteScopes)
		}
	}
	for i, nb := range n.Neighbors {
		if !nb.IP.IsValid() {
			return fmt.Errorf("Network.Neighbors[%d].IP is unset", i)
		}
		if nb.State != "" && !slices.Contains(NeighborStates, nb.State) {
			return fmt.Errorf("Network.Neighbors[%d].State %q: the forwarder knows only %v", i, nb.State, NeighborStates)
		}
	}
	return nil
}

func toWire(cfg Config) forwarderConfig {
	n := cfg.Network
	pn := &podNetwork{
		PodIP:         n.PodIP,
		PodHwAddr:     n.PodMAC,
		InterfaceName: n.Interface,
		WorkerNodeIP:  n.WorkerIP,
		TunnelType:    TunnelType,
		MTU:           n.MTU,
		VXLANPort:     n.VXLANPort,
		VXLANID:       n.VXLANID,
		Routes:        []wireRoute{},
		Neighbors:     []wireNeigh{},
	}
	if n.VXLANID >= VXLANIDBase {
		pn.Index = n.VXLANID - VXLANIDBase
	}
	for _, r := range n.Routes {
		pn.Routes = append(pn.Routes, wireRoute(r))
	}
	for _, nb := range n.Neighbors {
		pn.Neighbors = append(pn.Neighbors, wireNeigh{IP: nb.IP, HardwareAddr: nb.MAC, Dev: nb.Dev, State: nb.State})
	}
	return forwarderConfig{
		PodNetwork:    pn,
		PodNamespace:  cfg.PodNamespace,
		PodName:       cfg.PodName,
		TLSServerKey:  string(cfg.TLSServerKeyPEM),
		TLSServerCert: string(cfg.TLSServerCertPEM),
		TLSClientCA:   string(cfg.TLSClientCAPEM),
	}
}

// Parse reads user data as the pod VM's provisioning does: a strict decoding of
// write_files, then only the allow-listed paths; then it decodes apf.json as
// the forwarder does (failing where the forwarder would fail to start),
// auth.json and the initdata.
func Parse(userData []byte) (Files, error) {
	var cc cloudConfig
	if err := yaml.UnmarshalStrict(userData, &cc); err != nil {
		return Files{}, fmt.Errorf("podvm: user data is not the cloud-config the pod VM accepts: %w", err)
	}
	f := Files{Written: map[string][]byte{}}
	for _, wf := range cc.WriteFiles {
		if !slices.Contains(allowedPaths, wf.Path) {
			f.Skipped = append(f.Skipped, wf.Path)
			continue
		}
		// Later entries for one path overwrite earlier ones, as the
		// provisioning's sequential writes do.
		f.Written[wf.Path] = []byte(wf.Content)
	}
	apf, ok := f.Written[ForwarderConfigPath]
	if !ok {
		return f, fmt.Errorf("podvm: user data has no %s: the forwarder would not start", ForwarderConfigPath)
	}
	var w forwarderConfig
	if err := json.NewDecoder(bytes.NewReader(apf)).Decode(&w); err != nil {
		return f, fmt.Errorf("podvm: %s: %w", ForwarderConfigPath, err)
	}
	f.Config = fromWire(w)
	if w.PodNetwork == nil {
		// The forwarder's pod network setup reads it unconditionally.
		return f, fmt.Errorf("podvm: %s has no pod-network: the forwarder would not start", ForwarderConfigPath)
	}
	if err := f.Config.Network.Validate(); err != nil {
		return f, fmt.Errorf("podvm: %s: %w", ForwarderConfigPath, err)
	}
	if a, ok := f.Written[AuthJSONPath]; ok {
		f.Config.AuthJSON = a
	}
	if enc, ok := f.Written[InitDataPath]; ok {
		doc, err := decodeInitData(string(enc))
		if err != nil {
			return f, fmt.Errorf("podvm: %s: %w", InitDataPath, err)
		}
		f.Config.InitData = doc
	}
	_, f.Config.ScratchSpace = f.Written[ScratchSpacePath]
	return f, nil
}

func fromWire(w forwarderConfig) Config {
	cfg := Config{
		PodName:          w.PodName,
		PodNamespace:     w.PodNamespace,
		TLSServerCertPEM: []byte(w.TLSServerCert),
		TLSServerKeyPEM:  []byte(w.TLSServerKey),
		TLSClientCAPEM:   []byte(w.TLSClientCA),
	}
	if pn := w.PodNetwork; pn != nil {
		cfg.Network = Network{
			VXLANID:   pn.VXLANID,
			VXLANPort: pn.VXLANPort,
			WorkerIP:  pn.WorkerNodeIP,
			Interface: pn.InterfaceName,
			PodIP:     pn.PodIP,
			PodMAC:    pn.PodHwAddr,
			MTU:       pn.MTU,
		}
		for _, r := range pn.Routes {
			cfg.Network.Routes = append(cfg.Network.Routes, Route(r))
		}
		for _, nb := range pn.Neighbors {
			cfg.Network.Neighbors = append(cfg.Network.Neighbors, Neighbor{IP: nb.IP, MAC: nb.HardwareAddr, Dev: nb.Dev, State: nb.State})
		}
	}
	return cfg
}

func encodeInitData(doc string) (string, error) {
	var buf bytes.Buffer
	b64 := base64.NewEncoder(base64.StdEncoding, &buf)
	gz := gzip.NewWriter(b64)
	if _, err := io.WriteString(gz, doc); err != nil {
		return "", err
	}
	if err := gz.Close(); err != nil {
		return "", err
	}
	if err := b64.Close(); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// LooksEncodedInitData says whether s is in the annotation's form, gzip then
// base64 (whose text starts "H4sI", the gzip magic in base64), rather than
// the TOML document itself.
func LooksEncodedInitData(s string) bool {
	return strings.HasPrefix(strings.TrimSpace(s), "H4sI")
}

// DecodeInitData decodes initdata in the annotation's form (gzip then
// base64) into the document, at most 4*MaxInitData bytes.
func DecodeInitData(enc string) (string, error) { return decodeInitData(enc) }

func decodeInitData(enc string) (string, error) {
	gz, err := gzip.NewReader(base64.NewDecoder(base64.StdEncoding, strings.NewReader(strings.TrimSpace(enc))))
	if err != nil {
		return "", fmt.Errorf("not gzip in base64: %w", err)
	}
	doc, err := io.ReadAll(io.LimitReader(gz, 4*MaxInitData))
	if err != nil {
		return "", fmt.Errorf("not gzip in base64: %w", err)
	}
	return string(doc), nil
}
