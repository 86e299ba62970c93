package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/caa-project/caa/pkg/provider"
)

// BenchmarkStartupList is S1's cloud listing in-process, for a CPU
// profile of what caa does with the pages (caa itself serves no pprof):
//
//	go test -run '^$' -bench StartupList -cpuprofile cpu.out ./test/bench
//
// Each cloud's real provider, configured from the same flags caa gets,
// lists listN VMs through its SDK from the bench's fake, no latency.
func BenchmarkStartupList(b *testing.B) {
	const listN = 2000
	for _, name := range []string{"aws", "azure", "ibmcloud"} {
		b.Run(name, func(b *testing.B) {
			f, err := newFakeCloud(name)
			if err != nil {
				b.Fatal(err)
			}
			defer f.close()
			for _, kv := range f.env {
				k, v, _ := strings.Cut(kv, "=")
				b.Setenv(k, v)
			}
			for _, k := range []string{"AWS_PROFILE", "AZURE_CLIENT_ID", "AZURE_TENANT_ID"} {
				b.Setenv(k, os.Getenv(k)) // restored after; cleared for the SDK chains
				_ = os.Unsetenv(k)
			}
			ctx := context.Background()
			p, err := providerFromFlags(ctx, name, f.flags)
			if err != nil {
				b.Fatal(err)
			}
			sel := provider.Selector{Cluster: "bench-cluster", Node: "bench-node"}
			seed(b, ctx, p, sel, listN)
			b.ResetTimer()
			for b.Loop() {
				vms, err := p.List(ctx, sel)
				if err != nil || len(vms) != listN {
					b.Fatalf("list: %d VMs, %v", len(vms), err)
				}
			}
		})
	}
}

// seed creates n VMs for sel through the provider, 16 at a time.
func seed(b *testing.B, ctx context.Context, p provider.Provider, sel provider.Selector, n int) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			uid := fmt.Sprintf("0000-%06d", i)
			_, err := p.Create(ctx, provider.Spec{Key: uid + "-a1", Cluster: sel.Cluster, Node: sel.Node, PodUID: uid,
				PodNamespace: "bench", PodName: "p-" + uid, InstanceType: instanceType(p.Name()), Image: image(p.Name())})
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("seed: %v", err)
	}
}

func instanceType(cloud string) string {
	return map[string]string{"aws": "m6a.large", "azure": "Standard_DC2as_v5", "ibmcloud": "bx3dc-2x10"}[cloud]
}

func image(cloud string) string {
	return map[string]string{"aws": "ami-0123456789abcdef0", "azure": "Canonical:ubuntu-24_04-lts:server:latest", "ibmcloud": "r006-bench-image"}[cloud]
}
