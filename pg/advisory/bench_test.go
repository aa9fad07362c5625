package advisory

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// BenchmarkSessionLockUnlock: one TryLock + Unlock cycle on a Session
// (two round trips).
func BenchmarkSessionLockUnlock(b *testing.B) {
	pool := newPool(b)
	s := openSession(b, pool, nil)
	ctx := context.Background()
	k := randKey()
	for b.Loop() {
		l, ok, err := s.TryLock(ctx, k)
		if !ok || err != nil {
			b.Fatal(ok, err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

// BenchmarkXactLock: WithXactLock with an empty fn (BEGIN, lock, COMMIT).
func BenchmarkXactLock(b *testing.B) {
	pool := newPool(b)
	ctx := context.Background()
	k := randKey()
	fn := func(pgx.Tx) error { return nil }
	for b.Loop() {
		if err := WithXactLock(ctx, pool, k, fn); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}
