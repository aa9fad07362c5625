package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
)

// BenchmarkAcquireRelease measures one uncontended Acquire + Release
// cycle (two round trips) on a single connection.
func BenchmarkAcquireRelease(b *testing.B) {
	s, pool, _ := newStore(b, store.Config{}, maxConns(1))
	c := ctx(b)
	b.ResetTimer()
	wal := walMeter(b, pool)
	for i := 0; i < b.N; i++ {
		r, err := s.Acquire(c, store.AcquireRequest{Key: "bench", TTL: 30 * time.Second})
		if err != nil || !r.OK {
			b.Fatal(r, err)
		}
		if ok, err := s.Release(c, r.LockID); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
	b.ReportMetric(float64(wal())/float64(b.N), "walB/cycle")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

// BenchmarkAcquireManyReleaseMany measures one AcquireMany + ReleaseMany
// of 64 keys (two round trips) on a single connection; locks/s counts keys.
func BenchmarkAcquireManyReleaseMany(b *testing.B) {
	s, pool, _ := newStore(b, store.Config{}, maxConns(1))
	c := ctx(b)
	reqs := make([]store.AcquireRequest, 64)
	for i := range reqs {
		reqs[i] = store.AcquireRequest{Key: fmt.Sprint("bench-", i), TTL: 30 * time.Second}
	}
	ids := make([]string, len(reqs))
	b.ResetTimer()
	wal := walMeter(b, pool)
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
	b.ReportMetric(float64(wal())/float64(b.N*len(reqs)), "walB/lock")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
	b.ReportMetric(float64(b.N*len(reqs))/b.Elapsed().Seconds(), "locks/s")
}

// BenchmarkExtend measures one Extend (one round trip, one durable commit:
// synchronous_commit = on) of a held lock on a single connection. Run it
// against a server with fsync on (withpg -durable) to see the WAL flush.
func BenchmarkExtend(b *testing.B) {
	s, _, _ := newStore(b, store.Config{}, maxConns(1))
	c := ctx(b)
	r, err := s.Acquire(c, store.AcquireRequest{Key: "bench", TTL: 30 * time.Second})
	if err != nil || !r.OK {
		b.Fatal(r, err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if e, err := s.Extend(c, r.LockID, 30*time.Second); err != nil || !e.OK {
			b.Fatal(e, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "extends/s")
}

// BenchmarkExtendMany measures one ExtendMany of 1,000 held locks (a
// heartbeat tick of a Manager holding them: one statement, one commit).
func BenchmarkExtendMany(b *testing.B) {
	s, _, _ := newStore(b, store.Config{}, maxConns(1))
	c := ctx(b)
	reqs := make([]store.AcquireRequest, 1000)
	for i := range reqs {
		reqs[i] = store.AcquireRequest{Key: fmt.Sprint("bench-", i), TTL: 30 * time.Second}
	}
	res, err := s.AcquireMany(c, reqs)
	if err != nil {
		b.Fatal(err)
	}
	ext := make([]store.ExtendRequest, len(res))
	for i, r := range res {
		if !r.OK {
			b.Fatal("not acquired")
		}
		ext[i] = store.ExtendRequest{LockID: r.LockID, TTL: 30 * time.Second}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.ExtendMany(c, ext); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(ext))/b.Elapsed().Seconds(), "locks/s")
}

// BenchmarkHandOff measures one HandOff of a held key to a new lockId on a
// single connection (one round trip, one durable commit: the statement of
// a local hot-key section, what bench's "handoff chain" drives). Besides
// time it reports the WAL bytes written per grant (pg_current_wal_lsn
// around the loop), which does not depend on the machine's load. Run it
// against a server with fsync on (withpg -durable) to see the WAL flush.
func BenchmarkHandOff(b *testing.B) {
	s, pool, _ := newStore(b, store.Config{}, maxConns(1))
	c := ctx(b)
	r, err := s.Acquire(c, store.AcquireRequest{Key: "bench", TTL: 30 * time.Second})
	if err != nil || !r.OK {
		b.Fatal(r, err)
	}
	cur := r.LockID
	hand := func() {
		next := keys.NewLockID()
		res, err := s.HandOff(c, []store.HandOffRequest{{Old: cur, Key: "bench", TTL: 30 * time.Second, LockID: next}})
		if err != nil || !res[0].Released || !res[0].OK {
			b.Fatal(res, err)
		}
		cur = next
	}
	hand() // prepare the statement
	b.ResetTimer()
	wal := walMeter(b, pool)
	for i := 0; i < b.N; i++ {
		hand()
	}
	b.ReportMetric(float64(wal())/float64(b.N), "walB/grant")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handoffs/s")
}

// walMeter reads the server's WAL position and returns a func that
// answers the bytes of WAL written since (by every session of the server:
// run benchmarks that report it on a server of their own).
func walMeter(b *testing.B, pool *pgxpool.Pool) func() int64 {
	b.Helper()
	lsn := func() int64 {
		var n int64
		if err := pool.QueryRow(context.Background(), "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	start := lsn()
	return func() int64 { return lsn() - start }
}
