// Command e2e-binaries builds, or finds in the cache, the binaries the e2e
// tests run (etcd, the Kubernetes control plane, kubectl, kwok), and prints
// their paths. Running
// it before `go test` keeps the cold build (minutes) out of the tests'
// timeout.
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
	fmt.Printf("etcd %s\nkube-apiserver %s\nkube-controller-manager %s\nkube-scheduler %s\nkubectl %s\nkwok %s\n",
		bins.Etcd, bins.APIServer, bins.ControllerManager, bins.Scheduler, bins.Kubectl, bins.Kwok)
}
