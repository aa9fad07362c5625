package pg_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// A lease taken without a Manager guards the transaction that writes
// the key's rows of a table the database guard protects (here the
// strict guard, which a lockId copied from the lock table does not
// pass).
func ExampleStore_Guard() {
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
	if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS example_guarded_orders; CREATE TABLE example_guarded_orders (id int PRIMARY KEY, customer text NOT NULL)"); err != nil {
		panic(err)
	}
	if err := mg.GuardStrict(ctx, "example_guarded_orders", "customer"); err != nil {
		panic(err)
	}
	store, err := pg.New(pool, cfg)
	if err != nil {
		panic(err)
	}

	lease, err := store.Acquire(ctx, "customer:7", 30*time.Second)
	if err != nil || !lease.OK {
		panic(fmt.Sprint(lease, err))
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	if _, err := store.Guard(ctx, tx, lease.LockID); err != nil { // a takeover now waits for tx
		panic(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO example_guarded_orders VALUES (1, 'customer:7')"); err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	if _, err := store.Release(ctx, lease.LockID); err != nil { // after the transaction
		panic(err)
	}

	_, err = pool.Exec(ctx, "INSERT INTO example_guarded_orders VALUES (2, 'customer:7')")
	var pgErr *pgconn.PgError
	fmt.Println("a write without the lease refused:", errors.As(err, &pgErr) && pgErr.Code == "PGL10")
	// Output:
	// a write without the lease refused: true
}
