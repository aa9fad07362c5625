package manager_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// exampleManager opens a Manager on DATABASE_URL with the schema set up;
// done closes it and its pool.
func exampleManager(ctx context.Context) (m *manager.Manager, pool *pgxpool.Pool, done func()) {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	m, err = manager.New(pool, manager.Config{})
	if err != nil {
		panic(err)
	}
	if err := m.SetupSchema(ctx); err != nil {
		panic(err)
	}
	return m, pool, func() {
		m.Close(ctx)
		pool.Close()
	}
}

func ExampleShared() {
	ctx := context.Background()
	m, _, done := exampleManager(ctx)
	defer done()

	// readme:begin shared
	// Readers share the key, in this process and others; a writer (a plain
	// Acquire) excludes them all, and once it waits, new readers wait behind it.
	r1, err := m.Acquire(ctx, "example:config", manager.Shared())
	if err != nil {
		panic(err)
	}
	r2, err := m.Acquire(ctx, "example:config", manager.Shared())
	if err != nil {
		panic(err)
	}
	_, ok, err := m.TryAcquire(ctx, "example:config") // a writer
	fmt.Println("writer while readers hold it:", ok, err)
	fmt.Println("readers read under the same fence:", r1.Fence() == r2.Fence())
	r1.Release(ctx)
	r2.Release(ctx)

	w, err := m.Acquire(ctx, "example:config")
	if err != nil {
		panic(err)
	}
	fmt.Println("the writer's fence is above the readers':", w.Fence() > r1.Fence())
	w.Release(ctx)
	// readme:end shared

	// Output:
	// writer while readers hold it: false <nil>
	// readers read under the same fence: true
	// the writer's fence is above the readers': true
}

func ExampleWithLimit() {
	ctx := context.Background()
	m, _, done := exampleManager(ctx)
	defer done()

	// readme:begin semaphore
	// At most 2 holders of "example:gpu" at once, across every process.
	p1, err := m.Acquire(ctx, "example:gpu", manager.WithLimit(2))
	if err != nil {
		panic(err)
	}
	p2, err := m.Acquire(ctx, "example:gpu", manager.WithLimit(2))
	if err != nil {
		panic(err)
	}
	_, ok, err := m.TryAcquire(ctx, "example:gpu", manager.WithLimit(2))
	fmt.Println("a third permit:", ok, err)
	fmt.Println("each permit has a fence of its own:", p2.Fence() > p1.Fence())

	// A limit raised to 3 (a rolling deploy) waits while permits taken
	// with limit 2 live: never more permits than the smallest live limit.
	_, ok, err = m.TryAcquire(ctx, "example:gpu", manager.WithLimit(3))
	fmt.Println("a third permit with limit 3:", ok, err)
	p1.Release(ctx)
	p2.Release(ctx)
	// readme:end semaphore

	// Output:
	// a third permit: false <nil>
	// each permit has a fence of its own: true
	// a third permit with limit 3: false <nil>
}

func ExampleManager_AcquireAll() {
	ctx := context.Background()
	m, _, done := exampleManager(ctx)
	defer done()

	// readme:begin sets
	// A transfer needs both accounts: both locks or none, whatever the order
	// other callers name them in, so two transfers never deadlock.
	locks, err := m.AcquireAll(ctx, []string{"example:acct:1", "example:acct:2"})
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", locks[0].Key(), locks[1].Key())

	_, ok, err := m.TryAcquireAll(ctx, []string{"example:acct:2", "example:acct:3"})
	fmt.Println("a set sharing a key:", ok, err) // nothing taken, acct:3 included
	for _, lk := range locks {
		lk.Release(ctx) // each lock is an ordinary lease
	}
	// readme:end sets

	// Output:
	// held: example:acct:1 example:acct:2
	// a set sharing a key: false <nil>
}

func ExampleLock_Guard() {
	ctx := context.Background()
	m, pool, done := exampleManager(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_accounts (key text PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO example_accounts VALUES ('example:acct:7', 0) ON CONFLICT DO NOTHING`); err != nil {
		panic(err)
	}
	defer pool.Exec(ctx, "DROP TABLE example_accounts")

	// readme:begin guard
	// Once: a write of a row of example_accounts needs a transaction that
	// guarded a live lease of the row's key.
	mg, err := migrate.New(pool, pg.Config{})
	if err != nil {
		panic(err)
	}
	if err := mg.Guard(ctx, "example_accounts", "key"); err != nil {
		panic(err)
	}

	lk, err := m.Acquire(ctx, "example:acct:7")
	if err != nil {
		panic(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	if err := lk.Guard(ctx, tx); err != nil { // a takeover now waits for this transaction
		panic(err)
	}
	if _, err := tx.Exec(ctx, "UPDATE example_accounts SET balance = balance + 10 WHERE key = $1", lk.Key()); err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	lk.Release(ctx) // after the transaction: a release waits for it

	_, err = pool.Exec(ctx, "UPDATE example_accounts SET balance = 0 WHERE key = 'example:acct:7'")
	var pgErr *pgconn.PgError
	fmt.Println("a write without the lease:", errors.As(err, &pgErr) && pgErr.Code == "PGL10")
	// readme:end guard

	// Output:
	// a write without the lease: true
}
