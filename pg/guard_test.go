package pg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// TestStoreGuard: a lease taken with a Store (no Manager) passes the
// database guard, strict or not, through Store.Guard in the writing
// transaction, also when it was taken by another Store of the process (a
// Store per transaction); without Store.Guard, or with a lease that
// ended, the write is refused or Guard says CodeLockLost.
func TestStoreGuard(t *testing.T) {
	t.Parallel()
	s, pool, _ := newSuperStore(t, pg.Config{})
	c := ctx(t)
	if _, err := pool.Exec(c, "CREATE TABLE g_orders (id int PRIMARY KEY, account text)"); err != nil {
		t.Fatal(err)
	}
	mg, err := migrate.New(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.GuardStrict(c, "g_orders", "account"); err != nil {
		t.Fatal(err)
	}
	inTx := func(fn func(tx pgx.Tx) error) error {
		tx, err := pool.Begin(c)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if err := fn(tx); err != nil {
			return err
		}
		return tx.Commit(c)
	}
	res, err := s.Acquire(c, "g:1", time.Minute)
	if err != nil || !res.OK {
		t.Fatal(res, err)
	}
	ins := func(tx pgx.Tx, id int) error {
		_, err := tx.Exec(c, "INSERT INTO g_orders VALUES ($1, 'g:1')", id)
		return err
	}
	var pgErr *pgconn.PgError
	if err := inTx(func(tx pgx.Tx) error { return ins(tx, 1) }); !errors.As(err, &pgErr) || pgErr.Code != "PGL10" {
		t.Fatalf("write without Store.Guard = %v, want PGL10", err)
	}
	if err := inTx(func(tx pgx.Tx) error {
		f, err := s.Guard(c, tx, res.LockID)
		if err != nil {
			return err
		}
		if f != res.Fence {
			t.Errorf("Guard's fence %v, want the grant's %v", f, res.Fence)
		}
		return ins(tx, 1)
	}); err != nil {
		t.Fatalf("write after Store.Guard: %v", err)
	}
	// A Store on the transaction guards a lease another Store took.
	if err := inTx(func(tx pgx.Tx) error {
		st, err := pg.New(tx, pg.Config{})
		if err != nil {
			return err
		}
		if _, err := st.Guard(c, tx, res.LockID); err != nil {
			return err
		}
		return ins(tx, 2)
	}); err != nil {
		t.Fatalf("write after a per-transaction Store's Guard: %v", err)
	}
	if ok, err := s.Release(c, res.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := inTx(func(tx pgx.Tx) error {
		_, err := s.Guard(c, tx, res.LockID)
		return err
	}); pglease.CodeOf(err) != pglease.CodeLockLost {
		t.Fatalf("Guard of a released lease = %v, want LockLost", err)
	}
	if _, err := s.Guard(c, nil, res.LockID); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Fatalf("Guard(nil tx) = %v, want InvalidArgument", err)
	}
	if err := inTx(func(tx pgx.Tx) error {
		_, err := s.Guard(c, tx, "not a lock id")
		return err
	}); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Fatalf("Guard(bad lockId) = %v, want InvalidArgument", err)
	}
}
