package reconcile

import (
	"context"
	"testing"
	"time"
)

// BenchmarkWarmStartupPass is a warm restart's startup pass at N=1000 with
// every VM alive: a new reconciler on the same ledger and cloud, the
// listing served from memory, so what it measures is the pass's own work
// (the ledger's reads and writes, the decisions, the adoption) on top of
// the listing.
func BenchmarkWarmStartupPass(b *testing.B) {
	f := newPassFixture(b, time.Hour)
	ctx := context.Background()
	pods := peerPods(1000)
	if res := f.rec.Pass(ctx, pods, true); !res.Converged() {
		b.Fatalf("setup pass: %v", res.Err)
	}
	for b.Loop() {
		restarted := &Reconciler{Exec: f.rec.Exec, Config: cfg, Now: f.clock.Now}
		if res := restarted.Pass(ctx, pods, true); res.Err != nil || res.CloudWrites != 0 {
			b.Fatalf("warm pass: err %v, %d cloud writes", res.Err, res.CloudWrites)
		}
	}
}
