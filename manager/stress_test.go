package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestFencedCounterNoLostUpdate: 200 goroutines × 20 keys, each running a
// read-modify-write of a per-key counter under the lock, with the write
// fenced (accepted only if its fence is above the stored one). Property:
// no lost update (final counts equal the successful sections), no
// overlap of two holders of one key in this process, and no fenced write
// ever rejected (each grant's fence is above the previous holder's).
func TestFencedCounterNoLostUpdate(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.MaxConns = 6 }}})
	ctx := ctxT(t)
	work, _ := pgtest.Pool(t, func(c *pgxpool.Config) {
		c.MaxConns = 12
		c.ConnConfig.RuntimeParams["search_path"] = b.schema
	})
	const goroutines, keys, rounds = 200, 20, 10
	if _, err := work.Exec(ctx, "CREATE TABLE counters (key text PRIMARY KEY, value bigint NOT NULL, fence bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		if _, err := work.Exec(ctx, "INSERT INTO counters VALUES ($1, 0, 0)", fmt.Sprint("ctr:", k)); err != nil {
			t.Fatal(err)
		}
	}
	var active [keys]atomic.Int32
	var done, overlaps, rejected atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				k := (g + r*7) % keys
				key := fmt.Sprint("ctr:", k)
				lk, err := b.m.Acquire(ctx, key, WithAcquireTimeout(time.Minute))
				if err != nil {
					t.Error(err)
					return
				}
				err = func(fctx context.Context) error {
					if active[k].Add(1) != 1 {
						overlaps.Add(1)
					}
					defer active[k].Add(-1)
					var v int64
					if err := work.QueryRow(fctx, "SELECT value FROM counters WHERE key = $1", key).Scan(&v); err != nil {
						return err
					}
					tag, err := work.Exec(fctx, "UPDATE counters SET value = $2, fence = $3 WHERE key = $1 AND fence < $3", key, v+1, int64(lk.Fence()))
					if err != nil {
						return err
					}
					if tag.RowsAffected() != 1 {
						rejected.Add(1)
						return nil
					}
					done.Add(1)
					return nil
				}(lk.Context())
				if rerr := lk.Release(ctx); rerr != nil && err == nil {
					err = rerr
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	var total int64
	if err := work.QueryRow(ctx, "SELECT sum(value) FROM counters").Scan(&total); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d sections in %v (%d acquire batches seen)", done.Load(), time.Since(start), countBatches(b.sig, kernel.KindAcquire))
	if overlaps.Load() != 0 || rejected.Load() != 0 {
		t.Fatalf("overlaps %d, fenced writes rejected %d", overlaps.Load(), rejected.Load())
	}
	if total != goroutines*rounds || done.Load() != goroutines*rounds {
		t.Fatalf("counter sum %d, sections %d, want %d", total, done.Load(), goroutines*rounds)
	}
}

// countBatches drains the batchSent signal and counts batches of kind.
func countBatches(s *kernel.Signals, kind kernel.BatchKind) (n int) {
	for {
		select {
		case bi := <-s.BatchSent.Ch:
			if bi.Kind == kind {
				n++
			}
		default:
			return n
		}
	}
}

// TestCloseUnderLoad closes the Manager while 60 goroutines acquire and
// release 10 keys: every call returns (a lock, ErrClosed, or a timeout),
// every held lock ends with cause ErrClosed or pglease.ErrReleased, and nothing is
// left in the table.
func TestCloseUnderLoad(t *testing.T) {
	t.Parallel()
	testCloseUnderLoad(t, Config{})
}

// TestFairCloseUnderLoad is TestCloseUnderLoad with the fair queue: a
// grant that Close's drain makes to a ticket nobody will hear of any more
// (a waiter's, or one an attempt queued again after its caller released
// the grant) is released, not left in the table.
func TestFairCloseUnderLoad(t *testing.T) {
	t.Parallel()
	testCloseUnderLoad(t, Config{FairQueue: true})
}

func testCloseUnderLoad(t *testing.T, cfg Config) {
	b := setup(t, setupOpts{cfg: cfg})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	var closedErrs atomic.Int64
	for g := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; ; r++ {
				lk, err := b.m.Acquire(ctx, fmt.Sprint("load:", (g+r)%10), WithAcquireTimeout(10*time.Second))
				if errors.Is(err, pglease.ErrClosed) {
					closedErrs.Add(1)
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				_ = lk.Release(ctx) // may race Close: nil either way
				if c := context.Cause(lk.Context()); !errors.Is(c, pglease.ErrReleased) && !errors.Is(c, pglease.ErrClosed) {
					t.Errorf("cause = %v", c)
				}
			}
		}()
	}
	for range 100 {
		wait(t, &b.sig.Granted)
	}
	if err := b.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(waitTimeout()):
		t.Fatal("callers hang after Close")
	}
	if closedErrs.Load() != 60 {
		t.Fatalf("%d goroutines saw ErrClosed, want 60", closedErrs.Load())
	}
	if n := countLocks(t, b.pool); n != 0 {
		t.Fatalf("%d rows left", n)
	}
}

// TestConcurrentClose: 100 goroutines call Close while others acquire;
// none hangs, all return nil, and later calls get ErrClosed.
func TestConcurrentClose(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	held, err := b.m.Acquire(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				_, err := b.m.Acquire(ctx, fmt.Sprint("c", i%5))
				if err != nil && !errors.Is(err, pglease.ErrClosed) {
					t.Error(err)
				}
			}
			if err := b.m.Close(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(waitTimeout()):
		t.Fatal("Close or Acquire hangs")
	}
	if !errors.Is(held.Err(), pglease.ErrClosed) {
		t.Fatalf("held lock cause = %v", held.Err())
	}
	if _, err := b.m.Acquire(ctx, "c"); !errors.Is(err, pglease.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestOpenOwnsPool: a Manager from Open closes its own pool.
func TestOpenOwnsPool(t *testing.T) {
	t.Parallel()
	// SchemaURL adds search_path to the URL whether it has a query or
	// not (a DATABASE_URL without sslmode has none).
	m, err := Open(ctxT(t), pgtest.SchemaURL(t), Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetupSchema(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	lk, err := m.Acquire(ctxT(t), "own")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(lk.Err(), pglease.ErrClosed) {
		t.Fatalf("cause %v", lk.Err())
	}
	if err := m.k.Pool.Ping(context.Background()); err == nil {
		t.Fatal("owned pool still open after Close")
	}
}
