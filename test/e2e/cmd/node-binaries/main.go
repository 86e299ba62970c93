// Command node-binaries builds, or finds in the cache, a real node's
// programs that test/e2e/realnode runs (containerd, its runc shim, ctr,
// runc, the CNI plugins, crictl and the kubelet), and prints their paths.
// Running it before `go test` keeps the cold builds (minutes) out of the
// tests' timeout. runc is built with cgo: it needs gcc and libseccomp-dev.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/caa-project/caa/test/e2e/cluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	bins, err := cluster.EnsureNodeBinaries(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "node-binaries:", err)
		os.Exit(1)
	}
	for _, b := range []struct{ name, path string }{
		{"containerd", bins.Containerd}, {"ctr", bins.Ctr}, {"containerd-shim-runc-v2", bins.ShimRuncV2},
		{"runc", bins.Runc}, {"bridge", bins.CNIBridge}, {"host-local", bins.CNIHostLocal},
		{"loopback", bins.CNILoopback}, {"portmap", bins.CNIPortmap}, {"crictl", bins.Crictl},
		{"kubelet", bins.Kubelet},
	} {
		fmt.Printf("%s %s\n", b.name, b.path)
	}
	fmt.Fprintf(os.Stderr, "node-binaries: ready in %s\n", time.Since(start).Round(time.Second))
}
