package podvm_test

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/podvm"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func testConfig(t *testing.T) podvm.Config {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	certPEM, keyPEM, _, err := ca.IssueServer(nil, []string{"podvm-web-0-01234567"}, time.Hour)
	require.NoError(t, err)
	return podvm.Config{
		PodName:      "web-0",
		PodNamespace: "shop",
		SandboxID:    "0123456789abcdef0123456789abcdef",
		Network: podvm.Network{
			VXLANID:   555007,
			VXLANPort: 4789,
			WorkerIP:  netip.MustParsePrefix("10.123.0.1/24"),
			Interface: "eth0",
			PodIP:     netip.MustParsePrefix("10.244.1.5/24"),
			PodMAC:    "02:42:0a:f4:01:05",
			MTU:       1450,
			Routes: []podvm.Route{
				{Dst: netip.MustParsePrefix("0.0.0.0/0"), GW: netip.MustParseAddr("10.244.1.1"), Dev: "eth0", Protocol: "boot", Scope: "universe"},
				{Dst: netip.MustParsePrefix("10.244.1.0/24"), Dev: "eth0", Protocol: "kernel", Scope: "link"},
			},
			Neighbors: []podvm.Neighbor{{IP: netip.MustParseAddr("10.244.1.1"), MAC: "ee:ee:ee:ee:ee:ee", Dev: "eth0", State: "permanent"}},
		},
		TLSServerCertPEM: certPEM,
		TLSServerKeyPEM:  keyPEM,
		TLSClientCAPEM:   ca.CertPEM(),
		AuthJSON:         []byte(`{"auths":{"registry.example":{"auth":"dXNlcjpwYXNz"}}}`),
		InitData:         "algorithm = \"sha256\"\nversion = \"0.1.0\"\n\n[data]\n\"aa.toml\" = '''\n'''\n",
		ScratchSpace:     true,
	}
}

func TestRoundTrip(t *testing.T) {
	cfg := testConfig(t)
	ud, err := podvm.UserData(cfg)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(ud, []byte("#cloud-config\n")), "cloud-init needs the #cloud-config line first")
	f, err := podvm.Parse(ud)
	require.NoError(t, err)
	require.Empty(t, f.Skipped)
	want := cfg
	want.SandboxID = "" // not sent to the VM
	require.Equal(t, want, f.Config)
}

// sources says where each field of the user data comes from in caa. Every
// field the pod VM reads must be listed: the golden test fails on one that is
// not, so nothing reaches a VM without a named origin.
var sources = map[string]string{
	"/run/peerpod/apf.json":                        "caa: always written (the forwarder's configuration)",
	"apf.json pod-name":                            "CreateVM annotation io.kubernetes.cri.sandbox-name -> Config.PodName",
	"apf.json pod-namespace":                       "CreateVM annotation io.kubernetes.cri.sandbox-namespace -> Config.PodNamespace",
	"apf.json tls-server-cert":                     "pki.CA.IssueServer for the VM's name (the relay's ServerName) -> Config.TLSServerCertPEM",
	"apf.json tls-server-key":                      "pki.CA.IssueServer (never in the ledger) -> Config.TLSServerKeyPEM",
	"apf.json tls-client-ca":                       "pki.CA.CertPEM, the cluster's agent CA -> Config.TLSClientCAPEM",
	"apf.json pod-network.tunnel-type":             "constant podvm.TunnelType",
	"apf.json pod-network.vxlan-id":                "caa's per-node VXLAN id allocation, recorded per sandbox -> Network.VXLANID",
	"apf.json pod-network.vxlan-port":              "caa's VXLAN port setting (default 4789) -> Network.VXLANPort",
	"apf.json pod-network.index":                   "derived: Network.VXLANID - 555000 (upstream's tunnel index; the VM does not use it)",
	"apf.json pod-network.worker-node-ip":          "the node's IP the VM reaches -> Network.WorkerIP",
	"apf.json pod-network.interface":               "tunnel.Inspect: the pod netns's default-route interface -> Network.Interface",
	"apf.json pod-network.podip":                   "tunnel.Inspect: that interface's IPv4 address -> Network.PodIP",
	"apf.json pod-network.pod-hw-addr":             "tunnel.Inspect: that interface's MAC -> Network.PodMAC",
	"apf.json pod-network.mtu":                     "tunnel.Inspect: that interface's MTU -> Network.MTU",
	"apf.json pod-network.routes[*].dst":           "tunnel.Inspect: pod netns main-table route -> Network.Routes[i].Dst",
	"apf.json pod-network.routes[*].gw":            "tunnel.Inspect: route gateway -> Network.Routes[i].GW",
	"apf.json pod-network.routes[*].dev":           "tunnel.Inspect: route device -> Network.Routes[i].Dev",
	"apf.json pod-network.routes[*].protocol":      "tunnel.Inspect: route protocol name -> Network.Routes[i].Protocol",
	"apf.json pod-network.routes[*].scope":         "tunnel.Inspect: route scope name -> Network.Routes[i].Scope",
	"apf.json pod-network.neighbors[*].ip":         "tunnel.Inspect: permanent neighbour -> Network.Neighbors[i].IP",
	"apf.json pod-network.neighbors[*].hw-addr":    "tunnel.Inspect: neighbour MAC -> Network.Neighbors[i].MAC",
	"apf.json pod-network.neighbors[*].dev":        "tunnel.Inspect: neighbour device -> Network.Neighbors[i].Dev",
	"apf.json pod-network.neighbors[*].state":      "tunnel.Inspect: always permanent -> Network.Neighbors[i].State",
	"apf.json pod-network.dedicated":               "constant false (caa has no dedicated tunnel interface)",
	"apf.json pod-network.external-net-via-pod-vm": "constant false (caa offers no external network through the VM)",
	"/run/peerpod/auth.json":                       "the pod's imagePullSecrets as an auth file -> Config.AuthJSON (capped at 12288 bytes)",
	"/run/peerpod/initdata":                        "CreateVM annotation io.katacontainers.config.hypervisor.cc_init_data, gzip+base64 -> Config.InitData",
	"/run/peerpod/scratch-space.marker":            "caa's scratch-space setting -> Config.ScratchSpace",
}

var indexRE = regexp.MustCompile(`\[\d+\]`)

func flatten(prefix string, v any, out map[string]any) {
	switch x := v.(type) {
	case map[string]any:
		for k, vv := range x {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			flatten(p, vv, out)
		}
	case []any:
		for i, vv := range x {
			flatten(fmt.Sprintf("%s[%d]", prefix, i), vv, out)
		}
	default:
		out[prefix] = v
	}
}

func describe(key string, v any) string {
	s, ok := v.(string)
	if !ok {
		b, _ := json.Marshal(v)
		return string(b)
	}
	b, _ := pem.Decode([]byte(s))
	if b == nil {
		return fmt.Sprintf("%q", s)
	}
	if b.Type == "CERTIFICATE" {
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return "PEM CERTIFICATE (unparsable)"
		}
		what := "leaf"
		if c.IsCA {
			what = "CA"
		}
		return fmt.Sprintf("PEM CERTIFICATE (%s, DNS %v, IPs %v, usage %v)", what, c.DNSNames, c.IPAddresses, c.ExtKeyUsage)
	}
	return "PEM " + b.Type
}

// TestUserDataConformance renders caa's user data as the pod VM reads it
// (podvm.Parse: the provisioning's strict write_files decoding and
// allow-list; apf.json as the forwarder decodes it), field by field with the
// source of each, against testdata/userdata.golden.
func TestUserDataConformance(t *testing.T) {
	cfg := testConfig(t)
	ud, err := podvm.UserData(cfg)
	require.NoError(t, err)
	f, err := podvm.Parse(ud)
	require.NoError(t, err)

	var lines []string
	missing := map[string]bool{}
	add := func(key, field, value string) {
		src, ok := sources[key]
		if !ok {
			missing[key] = true
		}
		lines = append(lines, fmt.Sprintf("%s = %s\n    <- %s", field, value, src))
	}
	paths := make([]string, 0, len(f.Written))
	for p := range f.Written {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		content := f.Written[p]
		switch p {
		case podvm.ForwarderConfigPath:
			add(p, p, "(JSON, the keys below)")
			var generic map[string]any
			require.NoError(t, json.Unmarshal(content, &generic))
			flat := map[string]any{}
			flatten("", generic, flat)
			keys := make([]string, 0, len(flat))
			for k := range flat {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				add("apf.json "+indexRE.ReplaceAllString(k, "[*]"), "  apf.json "+k, describe(k, flat[k]))
			}
		case podvm.InitDataPath:
			add(p, p, fmt.Sprintf("(gzip+base64 of %q)", f.Config.InitData))
		default:
			add(p, p, fmt.Sprintf("%q", content))
		}
	}
	for k := range missing {
		t.Errorf("user data field %q has no source in the sources table: name where caa takes it from", k)
	}
	got := "# caa's user data for a pod VM, as the pod VM's provisioning and forwarder read it.\n" +
		"# Each field: <file or apf.json key> = <value>, then where caa takes it from.\n" +
		strings.Join(lines, "\n") + "\n"
	golden := filepath.Join("testdata", "userdata.golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "run go test ./pkg/podvm -run Conformance -update to create it")
	require.Equal(t, string(want), got)
}

func TestParseIsTheProvisioningsReading(t *testing.T) {
	cfg := testConfig(t)
	ud, err := podvm.UserData(cfg)
	require.NoError(t, err)

	t.Run("unknown top-level key fails as the strict decoding does", func(t *testing.T) {
		_, err := podvm.Parse(append(bytes.Clone(ud), []byte("runcmd: [reboot]\n")...))
		require.Error(t, err)
	})
	t.Run("a write_files entry with permissions fails", func(t *testing.T) {
		bad := "#cloud-config\nwrite_files:\n- path: /run/peerpod/apf.json\n  content: '{}'\n  permissions: '0644'\n"
		_, err := podvm.Parse([]byte(bad))
		require.Error(t, err)
	})
	t.Run("paths off the allow-list are skipped", func(t *testing.T) {
		extra := bytes.Replace(ud, []byte("write_files:\n"), []byte("write_files:\n- path: /etc/shadow\n  content: x\n"), 1)
		f, err := podvm.Parse(extra)
		require.NoError(t, err)
		require.Equal(t, []string{"/etc/shadow"}, f.Skipped)
		require.NotContains(t, f.Written, "/etc/shadow")
	})
	t.Run("no apf.json, no forwarder", func(t *testing.T) {
		_, err := podvm.Parse([]byte("#cloud-config\nwrite_files: []\n"))
		require.ErrorContains(t, err, podvm.ForwarderConfigPath)
	})
	t.Run("no pod network, no forwarder", func(t *testing.T) {
		_, err := podvm.Parse([]byte("#cloud-config\nwrite_files:\n- path: /run/peerpod/apf.json\n  content: '{\"pod-name\": \"x\"}'\n"))
		require.ErrorContains(t, err, "pod-network")
	})
	t.Run("a route protocol the forwarder does not know", func(t *testing.T) {
		bad := bytes.Replace(ud, []byte(`"protocol": "boot"`), []byte(`"protocol": "bird"`), 1)
		require.NotEqual(t, ud, bad)
		_, err := podvm.Parse(bad)
		require.ErrorContains(t, err, "Protocol")
	})
}

func TestUserDataRejectsBadConfigNamingTheField(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*podvm.Config)
	}{
		{"PodName", func(c *podvm.Config) { c.PodName = "" }},
		{"PodNamespace", func(c *podvm.Config) { c.PodNamespace = " " }},
		{"SandboxID", func(c *podvm.Config) { c.SandboxID = "" }},
		{"Network.VXLANID", func(c *podvm.Config) { c.Network.VXLANID = 1 << 24 }},
		{"Network.VXLANPort", func(c *podvm.Config) { c.Network.VXLANPort = 0 }},
		{"Network.WorkerIP", func(c *podvm.Config) { c.Network.WorkerIP = netip.Prefix{} }},
		{"Network.PodIP", func(c *podvm.Config) { c.Network.PodIP = netip.MustParsePrefix("fd00::5/64") }},
		{"Network.PodMAC", func(c *podvm.Config) { c.Network.PodMAC = "nope" }},
		{"Network.MTU", func(c *podvm.Config) { c.Network.MTU = 0 }},
		{"Network.Interface", func(c *podvm.Config) { c.Network.Interface = "" }},
		{"Network.Routes[1].Scope", func(c *podvm.Config) { c.Network.Routes[1].Scope = "galaxy" }},
		{"Network.Neighbors[0].State", func(c *podvm.Config) { c.Network.Neighbors[0].State = "perm" }},
		{"TLSServerCertPEM", func(c *podvm.Config) { c.TLSServerKeyPEM = c.TLSClientCAPEM }},
		{"TLSClientCAPEM", func(c *podvm.Config) { c.TLSClientCAPEM = nil }},
		{"AuthJSON", func(c *podvm.Config) { c.AuthJSON = bytes.Repeat([]byte("a"), podvm.MaxAuthJSON+1) }},
		{"AuthJSON", func(c *podvm.Config) { c.AuthJSON = []byte("{not json") }},
		{"InitData", func(c *podvm.Config) { c.InitData = strings.Repeat("x", podvm.MaxInitData+1) }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			cfg := testConfig(t)
			tc.edit(&cfg)
			_, err := podvm.UserData(cfg)
			require.ErrorContains(t, err, tc.field)
		})
	}
	t.Run("at the caps is fine", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.InitData = strings.Repeat("x", podvm.MaxInitData)
		auth := `{"auths":{"r":{"auth":"` + strings.Repeat("a", podvm.MaxAuthJSON-len(`{"auths":{"r":{"auth":""}}}`)) + `"}}}`
		require.Len(t, auth, podvm.MaxAuthJSON)
		cfg.AuthJSON = []byte(auth)
		_, err := podvm.UserData(cfg)
		require.NoError(t, err)
	})
}
