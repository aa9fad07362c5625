package pg_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// A guard with a grant column keeps which grant wrote each row's fence:
// a retry of that grant passes, another grant carrying the same fence (the
// lock database lost a grant, e.g. failover to an asynchronous replica)
// is refused with FenceRegression.
func ExampleFenceGuard_WithGrantColumn() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	const table = "example_invoices"
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+
		" (id text PRIMARY KEY, fence bigint, fence_grant text, status text)"); err != nil {
		panic(err)
	}
	defer pool.Exec(ctx, "DROP TABLE "+table) //nolint:errcheck

	guard, err := pg.NewFenceGuard(table, "id", "fence")
	if err != nil {
		panic(err)
	}
	guard, err = guard.WithGrantColumn("fence_grant")
	if err != nil {
		panic(err)
	}
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
	lease, err := store.Acquire(ctx, "invoice:7", 30*time.Second)
	if err != nil || !lease.OK {
		panic(fmt.Sprint(lease.OK, err))
	}
	defer store.Release(ctx, lease.LockID) //nolint:errcheck

	// Every write sets the grant column to the writer's GrantID (with a
	// manager.Lock: lk.GrantID()).
	grant := pg.Set{Column: "fence_grant", Value: pg.GrantID(lease.LockID)}
	ok, err := guard.Upsert(ctx, pool, "7", lease.Fence, grant, pg.Set{Column: "status", Value: "paid"})
	fmt.Println("write:", ok, err)
	ok, err = guard.Upsert(ctx, pool, "7", lease.Fence, grant, pg.Set{Column: "status", Value: "paid"})
	fmt.Println("retry:", ok, err)

	other := pg.Set{Column: "fence_grant", Value: pg.GrantID(keys.NewLockID())} // as if a second grant got the same fence
	ok, err = guard.Update(ctx, pool, "7", lease.Fence, other, pg.Set{Column: "status", Value: "void"})
	fmt.Println("repeat:", ok, errors.Is(err, pglease.ErrFenceRegression), errors.Is(err, pg.ErrFenceRepeated))
	// Output:
	// write: true <nil>
	// retry: true <nil>
	// repeat: false true true
}
