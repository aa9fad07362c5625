package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

// appName makes a pool's sessions report name as their application_name
// (to find them in pg_stat_activity).
func appName(name string) func(*pgxpool.Config) {
	return func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["application_name"] = name }
}

// waitLockWait returns once a session of application app waits for a
// lock (of any kind): the thing itself, not a timing guess.
func waitLockWait(t *testing.T, db testDB, app string) {
	t.Helper()
	waitLockWaitOr(t, db, app, nil)
}

// waitLockWaitOr is waitLockWait that also returns once answered is
// closed (nil: never): the waiter answered before its wait was seen.
func waitLockWaitOr(t *testing.T, db testDB, app string, answered <-chan struct{}) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx(t), 20*time.Second)
	defer cancel()
	for {
		var n int
		if err := db.QueryRow(c, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case <-c.Done():
			t.Fatalf("no session of %s waited for a lock", app)
		case <-answered:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Guard, in the caller's transaction: checks that the lease is live and
// this lockId's (LockLost otherwise, leaving the transaction usable),
// answers its fence, and adds the lockId to pglease.lock_ids for the
// transaction only.
func TestGuardChecksAndRecords(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	a := exclusive(t, s, pgtest.RandomName("ga_"), time.Minute)
	b := exclusive(t, s, pgtest.RandomName("gb_"), time.Minute)
	gone := exclusive(t, s, pgtest.RandomName("gc_"), time.Minute)
	release(t, s, gone.LockID)
	rd := shared(t, s, pgtest.RandomName("gd_"), 0, time.Minute)
	tx, err := pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(c) }()
	for _, id := range []string{gone.LockID, keys.NewLockID(), rd.LockID} {
		if _, err := s.Guard(c, tx, id); !errors.Is(err, pglease.ErrLockLost) {
			t.Fatalf("Guard of a released, unknown or shared lease = %v; want LockLost", err)
		}
	}
	g, err := s.Guard(c, tx, a.LockID)
	if err != nil || g.Fence != a.Fence || !g.ExpiresAt.Equal(a.ExpiresAt) {
		t.Fatalf("Guard = %+v, %v; want fence %s, expiry %v", g, err, a.Fence, a.ExpiresAt)
	}
	if _, err := s.Guard(c, tx, b.LockID); err != nil {
		t.Fatal(err)
	}
	var ids string
	if err := tx.QueryRow(c, "SELECT current_setting('pglease.lock_ids')").Scan(&ids); err != nil || ids != a.LockID+","+b.LockID {
		t.Fatalf("pglease.lock_ids = %q, %v; want the two lockIds", ids, err)
	}
	if err := tx.Commit(c); err != nil {
		t.Fatal(err)
	}
	var after *string
	if err := pool.QueryRow(c, "SELECT nullif(current_setting('pglease.lock_ids', true), '')").Scan(&after); err != nil || after != nil {
		t.Fatalf("pglease.lock_ids after the commit = %v, %v; want none", after, err)
	}
	for _, bad := range []string{"", "short"} {
		if _, err := s.Guard(c, pool, bad); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Fatalf("Guard(%q) = %v", bad, err)
		}
	}
	if _, err := s.Guard(c, nil, a.LockID); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("Guard(nil tx) = %v", err)
	}
}

// A transaction that guards a lease does not block the lease's heartbeat
// (extend locks the row FOR NO KEY UPDATE) nor another acquirer's
// refused attempt; once the lease has expired, a takeover waits for the
// guarding transaction to end (observed waiting for a lock in
// pg_stat_activity), and is granted after its commit.
func TestGuardBlocksTakeoverNotHeartbeat(t *testing.T) {
	t.Parallel()
	rs := pgtest.RoleSchemaForTest(t)
	pool := rs.RuntimePool(t)
	app := pgtest.RandomName("taker_")
	takerPool := rs.RuntimePool(t, appName(app))
	s, err := store.New("pg.New", pool, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	taker, err := store.New("pg.New", takerPool, store.Config{Holder: "taker"})
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	key := pgtest.RandomName("guarded_")
	l := exclusive(t, s, key, 800*time.Millisecond)
	tx, err := pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(c) }()
	if _, err := s.Guard(c, tx, l.LockID); err != nil {
		t.Fatal(err)
	}
	// The heartbeat and a refused attempt finish while tx is open (a
	// bounded context: blocked, they would fail).
	bounded, cancel := context.WithTimeout(c, 10*time.Second)
	defer cancel()
	e, err := s.ExtendMany(bounded, []store.ExtendRequest{{LockID: l.LockID, TTL: 800 * time.Millisecond}})
	if err != nil || !e[0].OK {
		t.Fatalf("extend of a guarded lease = %+v, %v", e, err)
	}
	if r, err := taker.Acquire(bounded, store.AcquireRequest{Key: key, TTL: time.Minute}); err != nil || r.OK {
		t.Fatalf("attempt on the live guarded lease = %+v, %v; want refused at once", r, err)
	}
	// Expired (tx still open): the takeover waits for tx.
	waitServer(t, pool, e[0].ExpiresAt.UnixMilli()+keys.TimeToleranceMs+5)
	// The takeover waits at most 100 ms for tx's row lock, then answers
	// "held, try again": on a loaded machine that answer can come before
	// the wait is seen or before the commit; the attempt is then made
	// again. A grant while tx is open fails the test.
	waited := false
	var r store.AcquireResult
	var beforeCommit int64
	for attempt := 1; attempt <= 20 && !waited; attempt++ {
		got, answered := make(chan store.AcquireResult, 1), make(chan struct{})
		go func() {
			r, err := taker.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
			if err != nil {
				t.Error(err)
			}
			got <- r
			close(answered)
		}()
		waitLockWaitOr(t, pool, app, answered)
		if err := tx.QueryRow(c, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&beforeCommit); err != nil {
			t.Fatal(err)
		}
		select {
		case r = <-got:
			if r.OK {
				t.Fatalf("takeover granted while the guarding transaction was open: %+v", r)
			}
			continue // answered "held" after its bounded wait: again
		default:
			waited = true
		}
		if err := tx.Commit(c); err != nil {
			t.Fatal(err)
		}
		r = <-got
	}
	if !waited {
		t.Fatal("the takeover never waited for the guarding transaction in 20 attempts")
	}
	if !r.OK {
		// Its wait ended (100 ms) before the commit: the next attempt,
		// after the commit, takes the key over.
		var err error
		if r, err = taker.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if !r.OK || r.Fence != l.Fence+1 || r.AcquiredAt.UnixMilli() < beforeCommit {
		t.Fatalf("takeover = %+v; want fence %d granted at or after %d (the guard's commit)", r, l.Fence+1, beforeCommit)
	}
}

// A release alone (one statement, sent as pgx sends it: the extended
// protocol) commits without waiting for its WAL flush (synchronous_commit
// off, read right after the function ran, in the same statement); in a
// transaction that wrote before it, or with p_async false (the store on a
// pgx.Tx), the setting stays on so the transaction's writes stay durable.
func TestReleaseAloneIsAsync(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	q := "WITH r AS MATERIALIZED (SELECT * FROM " + s.Names().FnRelease4 + "($1, NULL, 0, $2))" +
		" SELECT r.o_ok, current_setting('synchronous_commit') FROM r"
	check := func(db testDB, async bool, want string) {
		t.Helper()
		r := exclusive(t, s, pgtest.RandomName("async_"), time.Minute)
		var ok bool
		var sc string
		if err := db.QueryRow(c, q, []string{r.LockID}, async).Scan(&ok, &sc); err != nil || !ok || sc != want {
			t.Fatalf("release (async %v) = %v, synchronous_commit %s, %v; want %s", async, ok, sc, err, want)
		}
	}
	check(pool, true, "off")
	check(pool, false, "on")
	tx, err := pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(c) }()
	if _, err := s.Guard(c, tx, exclusive(t, s, pgtest.RandomName("w_"), time.Minute).LockID); err != nil {
		t.Fatal(err) // a row lock: assigns the transaction an id, like a write
	}
	check(tx, true, "on")
}
