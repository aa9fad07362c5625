package manager

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// appPeer returns another Manager on b's schema whose sessions report
// application_name app (to find its waits in pg_stat_activity).
func appPeer(t *testing.T, b *bundle, app string) *Manager {
	t.Helper()
	pcfg := b.pool.Config().Copy()
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	m, err := newManager("test", pool, false, Config{DisableNotify: true}, func(*Manager) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

// waitLockWait returns once a session of application app waits for a
// lock on the server: the wait itself, not a timing guess.
func waitLockWait(t *testing.T, b *bundle, app string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout())
	for {
		var n int
		if err := b.admin.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session of %s waited for a lock", app)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGuardTakeoverWaitsForCommit: a transaction that guarded a lease
// keeps its key from being taken over, even after the lease expired, until
// it commits; the takeover then comes after the transaction's writes.
func TestGuardTakeoverWaitsForCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	if _, err := b.admin.Exec(ctx, "CREATE TABLE guarded_writes (at_ms bigint NOT NULL); GRANT SELECT, INSERT ON guarded_writes TO PUBLIC"); err != nil {
		t.Fatal(err)
	}
	const key = "guard:takeover"
	lk, err := b.m.Acquire(ctx, key, WithTTL(400*time.Millisecond), WithoutAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := lk.Guard(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO guarded_writes VALUES (floor(extract(epoch FROM clock_timestamp()) * 1000))"); err != nil {
		t.Fatal(err)
	}
	// Past the lease's expiry and the takeover tolerance, on the server.
	for {
		var free bool
		if err := b.admin.QueryRow(ctx, "SELECT expires_at_ms + 1000 < floor(extract(epoch FROM clock_timestamp()) * 1000) FROM syncguard_locks WHERE key = $1", key).Scan(&free); err != nil {
			t.Fatal(err)
		}
		if free {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	peer := appPeer(t, b, "guard_takeover")
	type result struct {
		lk  *Lock
		ok  bool
		err error
	}
	got := make(chan result, 1)
	go func() {
		lk, ok, err := peer.TryAcquire(ctx, key)
		got <- result{lk, ok, err}
	}()
	waitLockWait(t, b, "guard_takeover") // the takeover waits for the guarding transaction
	select {
	case r := <-got:
		t.Fatalf("takeover while the guarding transaction is open: %v %v", r.ok, r.err)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if !r.ok || r.err != nil {
		t.Fatalf("takeover after commit: %v %v", r.ok, r.err)
	}
	var wrote int64
	if err := b.admin.QueryRow(ctx, "SELECT at_ms FROM guarded_writes").Scan(&wrote); err != nil {
		t.Fatal(err)
	}
	if r.lk.AcquiredAt().UnixMilli() < wrote || r.lk.Fence() <= lk.Fence() {
		t.Errorf("takeover at %d (fence %v), the guarded write at %d (fence %v)", r.lk.AcquiredAt().UnixMilli(), r.lk.Fence(), wrote, lk.Fence())
	}
	if err := r.lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("release of the expired lease: %v", err)
	}
}

// TestGuardHeartbeatNotBlocked: a transaction that guards a lease for
// several TTLs does not block its heartbeat.
func TestGuardHeartbeatNotBlocked(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "guard:heartbeat", WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := lk.Guard(ctx, tx); err != nil {
		t.Fatal(err)
	}
	exp := lk.ExpiresAt()
	drain(&b.sig.Extended)
	extends := 0
	// A blocked heartbeat makes no extend at all. The TTL (extends every
	// second) and the 15 s allow a loaded machine its stalls without the
	// lease's trust window running out (3 extends take 3 s when nothing
	// is late).
	for deadline := time.After(15 * time.Second); extends < 3; {
		select {
		case n := <-b.sig.Extended.Ch:
			extends += n
		case <-deadline:
			t.Fatalf("%d extends in 15 s (TTL 3 s) while a transaction guards the lease", extends)
		}
	}
	if err := lk.Err(); err != nil || !lk.ExpiresAt().After(exp) {
		t.Fatalf("lease while guarded: %v, expiry %v (was %v)", err, lk.ExpiresAt(), exp)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestGuardEnded: Guard of a lock that ended is its cause's code before
// any I/O; of a lease the server no longer has, LockLost, with the
// transaction still usable.
func TestGuardEnded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rel, err := b.m.Acquire(ctx, "guard:released")
	if err != nil {
		t.Fatal(err)
	}
	if err := rel.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rel.Guard(ctx, tx); !errors.Is(err, pglease.ErrReleased) {
		t.Fatalf("Guard of a released lock: %v", err)
	}
	gone, err := b.m.Acquire(ctx, "guard:gone")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.admin.Exec(ctx, "DELETE FROM syncguard_locks WHERE key = 'guard:gone'"); err != nil {
		t.Fatal(err)
	}
	if err := gone.Guard(ctx, tx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("Guard of a lease the server no longer has: %v", err)
	}
	var one int
	if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("transaction after a refused Guard: %v", err)
	}
	_ = gone.Release(ctx)
}

// TestGuardWithDatabaseGuard: on a table migrate.Migrator.Guard guards, a
// write of a key's row needs a transaction that guarded a live lease of
// that key.
func TestGuardWithDatabaseGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	if _, err := b.admin.Exec(ctx, "CREATE TABLE accounts (k text PRIMARY KEY, balance int NOT NULL); INSERT INTO accounts VALUES ('acct:1', 0), ('acct:2', 0); GRANT SELECT, UPDATE ON accounts TO PUBLIC"); err != nil {
		t.Fatal(err)
	}
	mg, err := migrate.New(b.admin, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.Guard(ctx, "accounts", "k"); err != nil {
		t.Fatal(err)
	}
	write := func(guard *Lock, key string) error {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if guard != nil {
			if err := guard.Guard(ctx, tx); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE k = $1", key); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	refused := func(what string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "PGL10" {
			t.Errorf("%s: %v, want SQLSTATE PGL10", what, err)
		}
	}
	refused("no lease", write(nil, "acct:1"))
	lk, err := b.m.Acquire(ctx, "acct:1")
	if err != nil {
		t.Fatal(err)
	}
	refused("a lease not guarded", write(nil, "acct:1"))
	refused("another key's lease", write(lk, "acct:2"))
	if err := write(lk, "acct:1"); err != nil {
		t.Fatalf("guarded write: %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var bal int
	if err := b.admin.QueryRow(ctx, "SELECT balance FROM accounts WHERE k = 'acct:1'").Scan(&bal); err != nil || bal != 1 {
		t.Fatalf("balance %d (%v), want 1", bal, err)
	}
}

// TestGuardWithStrictDatabaseGuard: on a table migrate.Migrator.GuardStrict
// guards, the Manager's guarded transactions write (a lock of Acquire, one
// of AcquireAll, one handed over by a release to a waiter), and a
// transaction presenting the lease's lock_id read from the lock table is
// refused.
func TestGuardWithStrictDatabaseGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	if _, err := b.admin.Exec(ctx, "CREATE TABLE saccounts (k text PRIMARY KEY, balance int NOT NULL); INSERT INTO saccounts VALUES ('sacct:1', 0), ('sacct:2', 0), ('sacct:3', 0); GRANT SELECT, UPDATE ON saccounts TO PUBLIC"); err != nil {
		t.Fatal(err)
	}
	mg, err := migrate.New(b.admin, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.GuardStrict(ctx, "saccounts", "k"); err != nil {
		t.Fatal(err)
	}
	write := func(guard *Lock, lockIDs, key string) error {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if guard != nil {
			if err := guard.Guard(ctx, tx); err != nil {
				return err
			}
		}
		if lockIDs != "" {
			if _, err := tx.Exec(ctx, "SELECT set_config('pglease.lock_ids', $1, true)", lockIDs); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, "UPDATE saccounts SET balance = balance + 1 WHERE k = $1", key); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	refused := func(what string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "PGL10" {
			t.Errorf("%s: %v, want SQLSTATE PGL10", what, err)
		}
	}
	lk, err := b.m.Acquire(ctx, "sacct:1")
	if err != nil {
		t.Fatal(err)
	}
	var read string
	if err := b.pool.QueryRow(ctx, "SELECT lock_id FROM syncguard_locks WHERE key = 'sacct:1'").Scan(&read); err != nil {
		t.Fatal(err)
	}
	refused("the lock_id read from the lock table", write(nil, read, "sacct:1"))
	if err := write(lk, "", "sacct:1"); err != nil {
		t.Fatalf("Acquire's lock, guarded: %v", err)
	}
	set, err := b.m.AcquireAll(ctx, []string{"sacct:2", "sacct:3"})
	if err != nil {
		t.Fatal(err)
	}
	if err := write(set[1], "", "sacct:3"); err != nil {
		t.Fatalf("AcquireAll's lock, guarded: %v", err)
	}
	// A waiter of the same Manager gets the key from the release (one
	// statement hands it over).
	got := make(chan *Lock, 1)
	go func() {
		w, err := b.m.Acquire(ctx, "sacct:2")
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	time.Sleep(200 * time.Millisecond) // let the waiter queue; either way it gets the key
	if err := set[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	_ = set[1].Release(ctx)
	w := <-got
	if w == nil {
		t.FailNow()
	}
	if err := write(w, "", "sacct:2"); err != nil {
		t.Fatalf("a waiter's lock, guarded: %v", err)
	}
	for _, l := range []*Lock{lk, w} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var sum int
	if err := b.admin.QueryRow(ctx, "SELECT sum(balance) FROM saccounts").Scan(&sum); err != nil || sum != 3 {
		t.Fatalf("balances sum to %d (%v), want the 3 guarded writes", sum, err)
	}
}
