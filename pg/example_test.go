package pg_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/pglease/pglease/pg"
)

func Example() {
	ctx := context.Background()
	pool, err := pg.NewPool(ctx, os.Getenv("DATABASE_URL")) // a pgxpool.Pool set up by pg.ConfigurePool
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	// readme:begin store
	// pg.Config{} uses SyncGuard's tables, syncguard_locks and syncguard_fence_counters.
	store, err := pg.New(pool, pg.Config{LockTable: "example_locks", FenceTable: "example_fences"})
	if err != nil {
		panic(err)
	}
	if err := store.SetupSchema(ctx); err != nil { // idempotent; or apply pg/schema.sql
		panic(err)
	}

	lease, err := store.Acquire(ctx, pg.AcquireRequest{Key: "invoice:42", TTL: 30 * time.Second}) // one round trip, never waits
	if err != nil {
		panic(err)
	}
	fmt.Println("acquired:", lease.OK, "fence:", lease.Fence)

	again, err := store.Acquire(ctx, pg.AcquireRequest{Key: "invoice:42", TTL: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	fmt.Println("second acquire:", again.OK) // held: a result, not an error

	ext, err := store.Extend(ctx, lease.LockID, time.Minute) // new expiry = server time + 1 min
	if err != nil {
		panic(err)
	}
	fmt.Println("extended:", ext.OK, ext.ExpiresAt.Sub(lease.AcquiredAt) >= time.Minute)

	released, err := store.Release(ctx, lease.LockID)
	if err != nil {
		panic(err)
	}
	fmt.Println("released:", released)
	// readme:end store

	// Output:
	// acquired: true fence: 000000000000001
	// second acquire: false
	// extended: true true
	// released: true
}
