package memory_test

import (
	"testing"
	"time"

	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/mocks/cloud"
	"github.com/caa-project/caa/test/mocks/memory"
)

func factory(_ testing.TB, opts cloud.Options) conformance.Harness {
	c := cloud.New(opts)
	return conformance.Harness{Provider: memory.New(c), Cloud: c}
}

func TestConformance(t *testing.T) { conformance.Run(t, factory) }

func BenchmarkMemory(b *testing.B) {
	for _, latency := range []time.Duration{0, 50 * time.Millisecond} {
		b.Run("latency="+latency.String(), func(b *testing.B) { conformance.Bench(b, factory, latency) })
	}
}
