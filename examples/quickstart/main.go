// Command quickstart takes a lease lock on PostgreSQL with pglease's
// Manager, works under it, and releases it.
//
//	DATABASE_URL=postgres://user:password@localhost:5432/app go run .
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
)

func main() {
	if err := run(context.Background(), os.Getenv("DATABASE_URL")); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, databaseURL string) error {
	// A pgxpool.Pool that recovers fast from dead connections (pg.ConfigurePool).
	pool, err := pg.NewPool(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close() // runs after m.Close: a Manager never closes a pool it was given

	m, err := manager.New(pool, manager.Config{}) // the zero Config means the defaults
	if err != nil {
		return err
	}
	defer m.Close(ctx) // releases whatever is still held

	// Create the lock tables and functions if they are missing (idempotent),
	// or apply pg/migrate/sql/schema.sql with your migrations instead.
	if err := m.SetupSchema(ctx); err != nil {
		return err
	}

	// Acquire waits for the lock as long as its ctx allows (like
	// sync.Mutex or etcd's Mutex.Lock; manager.WithAcquireTimeout caps
	// it), then heartbeats its lease until Release. The deadline here is
	// long enough to wait out a crashed holder's 30 s lease.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	lk, err := m.Acquire(wctx, "payment:123", manager.WithTTL(30*time.Second))
	if errors.Is(err, pglease.ErrAcquisitionTimeout) {
		// Held by someone else until the deadline. (An outage is not
		// this: it ends the wait with ErrServiceUnavailable or
		// ErrNetworkTimeout, and pglease.Retryable says so.)
		return fmt.Errorf("payment 123 is being charged elsewhere: %w", err)
	}
	if err != nil {
		return err
	}
	// lk.Context() ends, with cause pglease.ErrLockLost, as soon as the lock
	// can no longer be trusted. The fence grows with every acquire of the
	// key: pass it to what you write to, so a stale holder is refused.
	err = charge(lk.Context(), lk.Fence())
	if rerr := lk.Release(ctx); err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}

	// TryAcquire makes one attempt: ok is false when another holder has
	// the key (not an error), and then there is no lock to release.
	report, ok, err := m.TryAcquire(ctx, "report:daily")
	if err != nil {
		return err
	}
	if !ok {
		fmt.Println("someone else is writing the daily report")
	} else {
		fmt.Println("writing the daily report")
		if err := report.Release(ctx); err != nil {
			return err
		}
	}

	// Do acquires, runs the function with the lock (its context, its
	// fence) and releases, also if the function panics.
	return m.Do(ctx, "job:42", func(ctx context.Context, lk *manager.Lock) error {
		fmt.Println("running job 42 under fence", lk.Fence())
		return nil
	})
}

// charge stands for the work the lock protects.
func charge(ctx context.Context, fence pglease.Fence) error {
	fmt.Println("charging payment 123 under fence", fence)
	return ctx.Err()
}
