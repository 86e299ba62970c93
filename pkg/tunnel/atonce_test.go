//go:build measure

package tunnel_test

import (
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caa-project/caa/pkg/podvm"
	"github.com/caa-project/caa/pkg/tunnel"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// What the number of tunnel operations run at once buys on this kernel
// (sandbox.DefaultTunnelOps is chosen from it): 100 pods' tunnels read
// (Inspect), set up, checked (Setup on whole tunnels, a restart's share) and
// torn down, 1, 2, 4, 8, 16 and 100 at a time, with the process's OS threads
// after each. A measurement, not a check: it asserts nothing, so it is built
// only with the measure tag, as root (a few minutes):
//
//	go test -tags measure -run TestMeasureTunnelOperationsAtOnce -v ./pkg/tunnel
func TestMeasureTunnelOperationsAtOnce(t *testing.T) {
	cn := podvmfake.NewCloudNetwork(t)
	var cfgs []tunnel.Config
	for i := range 100 {
		pod := cn.NewPod(t, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 5}), 24))
		cfgs = append(cfgs, tunnel.Config{NetNSPath: pod.NSPath, VXLANID: vxlanID + i, Port: podvm.DefaultVXLANPort,
			RemoteIP: cn.VMIP.Addr().AsSlice(), HostNetNSPath: cn.NodeNS})
	}
	inspect := func(cfg tunnel.Config) error { _, err := tunnel.Inspect(cfg.NetNSPath); return err }
	t.Logf("100 tunnels, median of 3 passes: inspect, setup, check (setup again), teardown; threads of the process after")
	for _, n := range []int{1, 2, 4, 8, 16, 100} {
		var took [4][]time.Duration
		for range 3 {
			for i, op := range []func(tunnel.Config) error{inspect, tunnel.Setup, tunnel.Setup, tunnel.Teardown} {
				took[i] = append(took[i], atOnce(t, cfgs, n, op))
			}
		}
		t.Logf("%3d at once: inspect %6s  setup %8s  check %7s  teardown %8s  threads %s", n, median3(took[0]), median3(took[1]),
			median3(took[2]), median3(took[3]), threads())
	}
}

// atOnce runs op on every config, at most n at once, and returns the time.
func atOnce(t *testing.T, cfgs []tunnel.Config, n int, op func(tunnel.Config) error) time.Duration {
	t.Helper()
	turns := make(chan struct{}, n)
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, cfg := range cfgs {
		wg.Go(func() {
			turns <- struct{}{}
			defer func() { <-turns }()
			errs[i] = op(cfg)
		})
	}
	wg.Wait()
	d := time.Since(t0)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func median3(ds []time.Duration) time.Duration {
	a, b, c := ds[0], ds[1], ds[2]
	return max(min(a, b), min(max(a, b), c)).Round(time.Millisecond)
}

func threads() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "?"
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
