package advisory

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestXactLocks(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	other := openSession(t, pool, testOpts())
	ctx := ctxT(t, 15*time.Second)
	free := func(k Key) bool {
		t.Helper()
		l, ok, err := other.TryLock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			_ = l.Release(ctx)
		}
		return ok
	}

	t.Run("released at commit", func(t *testing.T) {
		// The application's table, made by its owner; the lock's user
		// (the runtime role) only writes to it.
		_, schema := pgtest.Pool(t)
		x := schema + ".x"
		if _, err := superConn(t).Exec(ctx, "CREATE TABLE "+x+" (a int); GRANT USAGE ON SCHEMA "+schema+" TO PUBLIC; GRANT SELECT, INSERT ON "+x+" TO PUBLIC"); err != nil {
			t.Fatal(err)
		}
		k := Pair(int32(time.Now().UnixNano()), 1)
		ran := false
		err := WithXactLock(ctx, pool, k, func(tx pgx.Tx) error {
			ran = true
			if free(k) {
				t.Error("lock free inside the transaction")
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+x+" VALUES (1)")
			return err
		})
		if err != nil || !ran {
			t.Fatal(err, ran)
		}
		if !free(k) {
			t.Fatal("lock held after commit")
		}
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+x).Scan(&n); err != nil || n != 1 {
			t.Fatalf("fn's write not committed: %d, %v", n, err)
		}
	})

	t.Run("released at rollback", func(t *testing.T) {
		k := randKey()
		mine := errors.New("fn failed")
		err := WithXactLock(ctx, pool, k, func(pgx.Tx) error { return mine })
		if err != mine {
			t.Fatalf("err = %v, want fn's error as is", err)
		}
		if !free(k) {
			t.Fatal("lock held after rollback")
		}
	})

	t.Run("try and contention", func(t *testing.T) {
		k := randKey()
		tx1, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx1.Rollback(ctx)
		if ok, err := TryXactLock(ctx, tx1, k); !ok || err != nil {
			t.Fatal(ok, err)
		}
		tx2, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx2.Rollback(ctx)
		if ok, err := TryXactLock(ctx, tx2, k); ok || err != nil {
			t.Fatalf("second transaction: %v %v", ok, err)
		}
		// lock_timeout on the caller's transaction: a typed, clear error.
		if _, err := tx2.Exec(ctx, "SET LOCAL lock_timeout = '50ms'"); err != nil {
			t.Fatal(err)
		}
		err = XactLock(ctx, tx2, k)
		wantCode(t, err, pglease.CodeNetworkTimeout)
		if !strings.Contains(err.Error(), "lock_timeout") {
			t.Errorf("message not clear: %v", err)
		}
		_ = tx2.Rollback(ctx)

		// The caller's ctx ending: Aborted.
		tx3, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx3.Rollback(ctx)
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		err = XactLock(wctx, tx3, k)
		wantCode(t, err, pglease.CodeAborted)
		if err := tx1.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		// pgx closed tx3's connection, but its backend may still be queued
		// for k (it notices the closed socket only when it next writes, or
		// at client_connection_check_interval), so it can be granted k
		// briefly before it exits.
		waitFor(t, "k free after commit", func() bool { return free(k) })
	})
}
