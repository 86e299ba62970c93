// Command e2e-binaries builds, or finds in the cache, the binaries the e2e
// tests run (etcd, the Kubernetes control plane, kubectl, kwok), and prints
// their paths. Running it before `go test` keeps the cold build (minutes)
// out of the tests' timeout. It builds all of them unless CAA_E2E_BINARIES
// names a few (CAA_E2E_BINARIES=etcd,kube-apiserver: what `make demo` runs).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/caa-project/caa/test/e2e/cluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	bins, err := cluster.EnsureBinaries(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e-binaries:", err)
		os.Exit(1)
	}
	for _, b := range []struct{ name, path string }{
		{"etcd", bins.Etcd}, {"kube-apiserver", bins.APIServer},
		{"kube-controller-manager", bins.ControllerManager}, {"kube-scheduler", bins.Scheduler},
		{"kubectl", bins.Kubectl}, {"kwok", bins.Kwok},
	} {
		if b.path != "" {
			fmt.Printf("%s %s\n", b.name, b.path)
		}
	}
}
