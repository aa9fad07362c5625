package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/store"
)

// BenchmarkHolderCost compares an uncontended Acquire + Release cycle (one
// connection) with and without the holder identity (an upsert into the
// holder table on acquire; release leaves the row, so the next grant's
// upsert is a HOT update), and AcquireMany + ReleaseMany of 64 keys. Besides time it reports the WAL bytes written
// per cycle (pg_current_wal_lsn), which does not depend on the machine's
// load:
//
//	go run ./internal/cmd/withpg -- go test -run XXX -bench HolderCost -count 6 ./pg/ | benchstat -col /holder -
func BenchmarkHolderCost(b *testing.B) {
	for _, batch := range []int{1, 64} {
		for _, holder := range []bool{false, true} {
			b.Run(fmt.Sprintf("batch=%d/holder=%t", batch, holder), func(b *testing.B) {
				s, pool, _ := newStore(b, store.Config{}, maxConns(1))
				if !holder {
					store.WithoutHolderForTest(s)
				}
				c := ctx(b)
				reqs := make([]store.AcquireRequest, batch)
				for i := range reqs {
					reqs[i] = store.AcquireRequest{Key: fmt.Sprint("bench-", i), TTL: 30 * time.Second}
				}
				ids := make([]string, batch)
				cycle := func() {
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
				cycle() // prepare the statements, create the rows
				lsn := func() int64 {
					var n int64
					if err := pool.QueryRow(c, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").Scan(&n); err != nil {
						b.Fatal(err)
					}
					return n
				}
				b.ResetTimer()
				start := lsn()
				for range b.N {
					cycle()
				}
				wal := lsn() - start
				b.StopTimer()
				b.ReportMetric(float64(wal)/float64(b.N), "walB/cycle")
			})
		}
	}
}
