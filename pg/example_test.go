package pg_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
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
	cfg := pg.Config{LockTable: "example_locks", FenceTable: "example_fences"}
	mg, err := migrate.New(pool, cfg)
	if err != nil {
		panic(err)
	}
	if err := mg.Up(ctx); err != nil { // idempotent; or apply pg/migrate/sql/schema.sql
		panic(err)
	}
	store, err := pg.New(pool, cfg)
	if err != nil {
		panic(err)
	}

	lease, err := store.Acquire(ctx, "invoice:42", 30*time.Second) // one round trip, never waits
	if err != nil {
		panic(err)
	}
	fmt.Println("acquired:", lease.OK, "fence:", lease.Fence)

	again, err := store.Acquire(ctx, "invoice:42", 30*time.Second)
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

// When the outcome of an acquire is unknown (CodeAmbiguous: the
// connection died after the statement was sent), the grant may have
// committed: the result's LockID releases it if it did.
func ExampleStore_Acquire() {
	ctx := context.Background()
	pool, err := pg.NewPool(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	cfg := pg.Config{LockTable: "example_locks", FenceTable: "example_fences"}
	mg, err := migrate.New(pool, cfg)
	if err != nil {
		panic(err)
	}
	if err := mg.Up(ctx); err != nil {
		panic(err)
	}
	store, err := pg.New(pool, cfg)
	if err != nil {
		panic(err)
	}

	res, err := store.Acquire(ctx, "invoice:43", 30*time.Second)
	if errors.Is(err, pglease.ErrAmbiguous) {
		// The grant may have committed: remove it if it did.
		_, _ = store.Release(context.WithoutCancel(ctx), res.LockID)
		return
	}
	if err != nil {
		panic(err)
	}
	fmt.Println("acquired:", res.OK)
	released, err := store.Release(ctx, res.LockID)
	fmt.Println("released:", released, err)
	// Output:
	// acquired: true
	// released: true <nil>
}
