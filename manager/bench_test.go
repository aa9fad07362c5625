package manager

import (
	"context"
	"strconv"
	"sync"
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

// BenchmarkSharedCycle: one uncontended reader Acquire (Shared) and its
// Release (two round trips), as BenchmarkAcquireRelease for a lease.
func BenchmarkSharedCycle(b *testing.B) {
	bd := setup(b, setupOpts{noSignals: true})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		lk, err := bd.m.Acquire(ctx, "bench:shared", Shared())
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireAll2 and BenchmarkAcquireAll8: one uncontended
// AcquireAll of 2 or 8 keys (one round trip) and the release of its locks
// (concurrent Releases, batched into one statement when they meet).
func BenchmarkAcquireAll2(b *testing.B) { benchAcquireAll(b, 2) }
func BenchmarkAcquireAll8(b *testing.B) { benchAcquireAll(b, 8) }

func benchAcquireAll(b *testing.B, n int) {
	bd := setup(b, setupOpts{noSignals: true})
	ctx := context.Background()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "bench:set:" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	for b.Loop() {
		locks, err := bd.m.AcquireAll(ctx, keys)
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		for _, lk := range locks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := lk.Release(ctx); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
	}
}
