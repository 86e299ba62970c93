package sandbox

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/podvm"
	"github.com/caa-project/caa/pkg/relay"
	"github.com/caa-project/caa/pkg/tunnel"
)

// PodVMSide is the daemon's PodSide: the cluster's agent CA (pki), the
// peer-pods image's user data (podvm), the VXLAN tunnel (tunnel) and the
// agent relay (relay).
type PodVMSide struct {
	CA *pki.CA
	// CertTTL is the life of each VM's server certificate (default one
	// year: a VM lives as long as its sandbox).
	CertTTL time.Duration
	// HostNetNS, when set, is where the tunnel's UDP socket lives (tests);
	// empty is caa's own namespace (the node's, with hostNetwork).
	HostNetNS string
	// Dial, when set, opens the relay's TCP connections (tests).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	Log  *slog.Logger

	mu     sync.Mutex
	client *tls.Config
}

var _ PodSide = (*PodVMSide)(nil)

// UserData reads the pod network from the sandbox's namespace, issues the
// VM's server certificate for its name and builds the cloud-config.
func (p *PodVMSide) UserData(_ context.Context, in UserDataInput) ([]byte, string, error) {
	if err := tunnel.CheckPodNetNS(in.Sandbox.NetNS, p.HostNetNS); err != nil {
		return nil, "", err
	}
	nw, err := tunnel.Inspect(in.Sandbox.NetNS)
	if err != nil {
		return nil, "", fmt.Errorf("read the pod network: %w", err)
	}
	nw.VXLANID, nw.VXLANPort = in.Tunnel.VXLANID, in.Tunnel.Port
	worker, err := netip.ParseAddr(in.Tunnel.LocalIP)
	if err != nil {
		return nil, "", fmt.Errorf("the node's IP %q (--node-ip): %w", in.Tunnel.LocalIP, err)
	}
	nw.WorkerIP = netip.PrefixFrom(worker, worker.BitLen())
	ttl := p.CertTTL
	if ttl <= 0 {
		ttl = 365 * 24 * time.Hour
	}
	certPEM, keyPEM, serial, err := p.CA.IssueServer(nil, []string{in.Sandbox.VMName}, ttl)
	if err != nil {
		return nil, "", fmt.Errorf("issue the VM's certificate: %w", err)
	}
	data, err := podvm.UserData(podvm.Config{
		PodName: in.Sandbox.Name, PodNamespace: in.Sandbox.Namespace, SandboxID: in.Sandbox.ID, Network: nw,
		TLSServerCertPEM: certPEM, TLSServerKeyPEM: keyPEM, TLSClientCAPEM: p.CA.CertPEM(), InitData: in.InitData,
		AuthJSON: in.AuthJSON,
	})
	if err != nil {
		return nil, "", err
	}
	return data, serial, nil
}

func (p *PodVMSide) tunnelConfig(netns string, t ledger.Tunnel) tunnel.Config {
	return tunnel.Config{NetNSPath: netns, VXLANID: t.VXLANID, Port: t.Port, RemoteIP: net.ParseIP(t.RemoteIP),
		LocalIP: net.ParseIP(t.LocalIP), HostNetNSPath: p.HostNetNS}
}

// SetupTunnel builds the node's end of the tunnel (idempotent).
func (p *PodVMSide) SetupTunnel(netns string, t ledger.Tunnel) error {
	return tunnel.Setup(p.tunnelConfig(netns, t))
}

// TeardownTunnel removes it (idempotent; a namespace already gone is fine).
func (p *PodVMSide) TeardownTunnel(netns string, t ledger.Tunnel) error {
	if netns == "" || t.VXLANID == 0 {
		return nil
	}
	if _, err := os.Stat(netns); os.IsNotExist(err) {
		return nil
	}
	return tunnel.Teardown(p.tunnelConfig(netns, t))
}

// GuardTunnels rebuilds the node's VXLAN guard from the recorded tunnels.
func (p *PodVMSide) GuardTunnels(recorded func() ([]ledger.Tunnel, error)) error {
	return tunnel.RebuildGuard(p.HostNetNS, func() ([]tunnel.Recorded, error) {
		ts, err := recorded()
		if err != nil {
			return nil, err
		}
		out := make([]tunnel.Recorded, 0, len(ts))
		for _, t := range ts {
			out = append(out, tunnel.Recorded{VXLANID: t.VXLANID, Port: t.Port, RemoteIP: net.ParseIP(t.RemoteIP)})
		}
		return out, nil
	})
}

// StartRelay serves the agent socket and relays it over mutual TLS.
func (p *PodVMSide) StartRelay(ctx context.Context, socketPath, addr, serverName string) (Relay, error) {
	p.mu.Lock()
	if p.client == nil {
		c, err := p.CA.ClientTLS()
		if err != nil {
			p.mu.Unlock()
			return nil, fmt.Errorf("caa's client certificate: %w", err)
		}
		p.client = c
	}
	client := p.client
	p.mu.Unlock()
	if err := os.MkdirAll(filepath.Dir(socketPath), 0o700); err != nil {
		return nil, fmt.Errorf("agent socket directory: %w", err)
	}
	return relay.Start(ctx, relay.Config{SocketPath: socketPath, Addr: addr, TLS: client, ServerName: serverName, Dial: p.Dial, Log: p.Log})
}
