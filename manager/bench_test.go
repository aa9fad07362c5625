package manager

import (
	"context"
	"testing"
)

// BenchmarkAcquireRelease: one uncontended Acquire and its Release
// through the Manager against the real database (two round trips). The
// telemetry providers are whatever Config.Telemetry leaves: the otel
// globals, no-ops here.
func BenchmarkAcquireRelease(b *testing.B) {
	bd := setup(b, setupOpts{noSignals: true})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		lk, err := bd.m.Acquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
