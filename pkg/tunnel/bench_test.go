package tunnel_test

import (
	"net/netip"
	"testing"

	"github.com/caa-project/caa/pkg/podvm"
	"github.com/caa-project/caa/pkg/tunnel"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// The tunnel's cost per StartVM and per restart: a Setup from nothing, and a
// Setup that finds the tunnel whole (what a restart pays per sandbox). Run as
// root:
//
//	go test -run '^$' -bench Setup -benchtime 200x ./pkg/tunnel
func benchWorld(b *testing.B) tunnel.Config {
	cn := podvmfake.NewCloudNetwork(b)
	pod := cn.NewPod(b, netip.MustParsePrefix("10.244.1.5/24"))
	return tunnel.Config{NetNSPath: pod.NSPath, VXLANID: vxlanID, Port: podvm.DefaultVXLANPort, RemoteIP: cn.VMIP.Addr().AsSlice(), HostNetNSPath: cn.NodeNS}
}

func BenchmarkSetupFromNothing(b *testing.B) {
	cfg := benchWorld(b)
	for b.Loop() {
		if err := tunnel.Setup(cfg); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := tunnel.Teardown(cfg); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkSetupAfterRestart(b *testing.B) {
	cfg := benchWorld(b)
	if err := tunnel.Setup(cfg); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := tunnel.Setup(cfg); err != nil {
			b.Fatal(err)
		}
	}
}
