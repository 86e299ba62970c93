package sandbox

import (
	"context"

	"github.com/caa-project/caa/pkg/ledger"
)

// PodSide is the pod VM side of a sandbox: what its VM boots with, the pod
// network's tunnel and the agent relay. The daemon's implementation is
// PodVMSide (packages pki, podvm, tunnel and relay); tests use fakes.
type PodSide interface {
	// UserData builds the user data of a sandbox's VM: the forwarder's
	// configuration (the pod network read from the sandbox's network
	// namespace, the tunnel's settings, a TLS server certificate issued
	// for the VM's name, the client CA) and the initdata when given. It
	// returns the serial of the certificate it issued.
	UserData(ctx context.Context, in UserDataInput) (data []byte, certSerial string, err error)
	// SetupTunnel joins the sandbox's network namespace to its VM. It is
	// idempotent and inspects what kernel state already exists.
	SetupTunnel(netns string, t ledger.Tunnel) error
	// TeardownTunnel removes the node's end of the tunnel; idempotent.
	TeardownTunnel(netns string, t ledger.Tunnel) error
	// GuardTunnels makes the node's VXLAN guard pass exactly the tunnels
	// recorded returns, which it calls while no tunnel is set up or torn
	// down on the node (package tunnel's RebuildGuard); idempotent.
	GuardTunnels(recorded func() ([]ledger.Tunnel, error)) error
	// StartRelay serves the agent socket at socketPath at once and relays
	// every connection to the forwarder at addr over mutual TLS, checking
	// the forwarder's certificate against serverName.
	StartRelay(ctx context.Context, socketPath, addr, serverName string) (Relay, error)
}

// UserDataInput is what a sandbox's user data is built from.
type UserDataInput struct {
	Sandbox ledger.Sandbox // pod, sandbox id, VM name, netns
	Tunnel  ledger.Tunnel  // VXLAN id and port, the node's IP
	// InitData is the initdata document (TOML, decoded); AuthJSON the
	// pod's image-pull credentials (a secret: never logged or stored).
	InitData string
	AuthJSON []byte
}

// Relay is one sandbox's agent relay.
type Relay interface {
	// WaitReachable returns once the forwarder answered, or ctx's error.
	WaitReachable(ctx context.Context) error
	// Close removes the socket and closes every relayed connection.
	Close() error
}
