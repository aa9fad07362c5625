package pg_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pglease/pg"
)

// BenchmarkAcquireRelease measures one uncontended Acquire + Release
// cycle (two round trips) on a single connection.
func BenchmarkAcquireRelease(b *testing.B) {
	s, _, _ := newStore(b, pg.Config{}, maxConns(1))
	c := ctx(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := s.Acquire(c, "bench", 30*time.Second)
		if err != nil || !r.OK {
			b.Fatal(r, err)
		}
		if ok, err := s.Release(c, r.LockID); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

// BenchmarkAcquireManyReleaseMany measures one AcquireMany + ReleaseMany
// of 64 keys (two round trips) on a single connection; locks/s counts keys.
func BenchmarkAcquireManyReleaseMany(b *testing.B) {
	s, _, _ := newStore(b, pg.Config{}, maxConns(1))
	c := ctx(b)
	reqs := make([]pg.AcquireRequest, 64)
	for i := range reqs {
		reqs[i] = pg.AcquireRequest{Key: fmt.Sprint("bench-", i), TTL: 30 * time.Second}
	}
	ids := make([]string, len(reqs))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := s.AcquireMany(c, reqs)
		if err != nil {
			b.Fatal(err)
		}
		for j, r := range res {
			if !r.OK {
				b.Fatal("not acquired")
			}
			ids[j] = r.LockID
		}
		if _, err := s.ReleaseMany(c, ids); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
	b.ReportMetric(float64(b.N*len(reqs))/b.Elapsed().Seconds(), "locks/s")
}
