package advisory

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// bouncerPool returns a pool on the package database through b, with pgx's
// exec mode set as the docs tell users to for a transaction pooler.
func bouncerPool(t *testing.T, b *pgtest.Bouncer, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	// As the runtime role, like newPool: PgBouncer passes
	// each client's user on to the server.
	rt, err := pgx.ParseConfig(pgtest.RuntimeRoleURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = rt.User
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestPgBouncerXactLocks: transaction-level advisory locks work through a
// transaction-mode pooler (the lock lives exactly as long as the
// transaction, which PgBouncer keeps on one server connection): a fenced
// read-modify-write counter incremented by 8 clients over 2 server
// connections loses no update, and TryXactLock sees a held key as taken.
func TestPgBouncerXactLocks(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction, PoolSize: 3})
	pool := bouncerPool(t, b, 8)
	ctx := ctxT(t, 60*time.Second)
	schema := pgtest.Schema(t)
	table := schema + ".counter"
	if _, err := superConn(t).Exec(ctx, "CREATE TABLE "+table+" (n int NOT NULL); INSERT INTO "+table+" VALUES (0); "+
		"GRANT USAGE ON SCHEMA "+schema+" TO PUBLIC; GRANT SELECT, UPDATE ON "+table+" TO PUBLIC"); err != nil {
		t.Fatal(err)
	}
	k := randKey()
	const clients, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				err := WithXactLock(ctx, pool, k, func(tx pgx.Tx) error {
					var n int
					if err := tx.QueryRow(ctx, "SELECT n FROM "+table).Scan(&n); err != nil {
						return err
					}
					// Widen the race window: without the lock, updates get lost.
					if _, err := tx.Exec(ctx, "SELECT pg_sleep(0.002)"); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, "UPDATE "+table+" SET n = $1", n+1)
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatalf("WithXactLock through PgBouncer: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT n FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != clients*each {
		t.Fatalf("counter = %d, want %d: an update was lost", n, clients*each)
	}

	// A held key is taken for another transaction, free after COMMIT.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if ok, err := TryXactLock(ctx, tx, k); err != nil || !ok {
		t.Fatalf("TryXactLock on a free key: %v %v", ok, err)
	}
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := TryXactLock(ctx, tx2, k); err != nil || ok {
		t.Fatalf("TryXactLock on a held key: %v %v", ok, err)
	}
	_ = tx2.Rollback(ctx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx3, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx3.Rollback(ctx) //nolint:errcheck
	if ok, err := TryXactLock(ctx, tx3, k); err != nil || !ok {
		t.Fatalf("TryXactLock after COMMIT: %v %v", ok, err)
	}
}

// TestPgBouncerSessionLockRefusedInTransactionMode: session advisory locks
// through a transaction-mode pooler would leak to other clients of the
// server connection; Open refuses them.
func TestPgBouncerSessionLockRefusedInTransactionMode(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction, PoolSize: 4})
	pool := bouncerPool(t, b, 4)
	ctx := ctxT(t, 30*time.Second)
	s, err := Open(ctx, pool, testOpts())
	if err == nil {
		_ = s.Close(ctx)
		t.Fatal("Open through a transaction-mode PgBouncer succeeded; session locks would leak to other clients")
	}
	if !errors.Is(err, pglease.ErrInvalidArgument) || !strings.Contains(err.Error(), "pooler") {
		t.Fatalf("Open error = %v, want InvalidArgument naming the transaction-mode pooler", err)
	}
}

// TestPgBouncerSessionLockSessionMode: through a session-mode pooler a
// session advisory lock holds (another session cannot take it) and is
// freed by Unlock.
func TestPgBouncerSessionLockSessionMode(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolSession})
	pool := bouncerPool(t, b, 4)
	ctx := ctxT(t, 30*time.Second)
	s := openSession(t, pool, testOpts())
	direct := openSession(t, newPool(t), testOpts())
	k := randKey()
	l, ok, err := s.TryLock(ctx, k)
	if err != nil || !ok {
		t.Fatalf("TryLock through session-mode PgBouncer: %v %v", ok, err)
	}
	if _, ok, err := direct.TryLock(ctx, k); err != nil || ok {
		t.Fatalf("a direct session took a key held through PgBouncer: %v %v", ok, err)
	}
	// Held across the probe's transactions: still held a few probes later.
	time.Sleep(3 * testOpts().ProbeInterval)
	if s.Err() != nil {
		t.Fatalf("session through session-mode PgBouncer ended: %v", s.Err())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	ld, ok, err := direct.TryLock(ctx, k)
	if err != nil || !ok {
		t.Fatalf("key not free after Release through PgBouncer: %v %v", ok, err)
	}
	_ = ld.Release(ctx)
}
