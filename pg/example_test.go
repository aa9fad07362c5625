package pg_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/pg"
)

func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, err := pg.New(pool, pg.Config{LockTable: "example_locks", FenceTable: "example_fences"})
	if err != nil {
		panic(err)
	}
	if err := store.SetupSchema(ctx); err != nil {
		panic(err)
	}

	lease, err := store.Acquire(ctx, "invoice:42", 30*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println("acquired:", lease.OK, "fence:", lease.Fence)

	again, _ := store.Acquire(ctx, "invoice:42", 30*time.Second)
	fmt.Println("second acquire:", again.OK)

	ext, _ := store.Extend(ctx, lease.LockID, time.Minute)
	fmt.Println("extended:", ext.OK, ext.ExpiresAt.Sub(lease.AcquiredAt) >= time.Minute)

	released, _ := store.Release(ctx, lease.LockID)
	fmt.Println("released:", released)
	// Output:
	// acquired: true fence: 000000000000001
	// second acquire: false
	// extended: true true
	// released: true
}
