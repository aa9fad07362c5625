package pg_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// syncCommit is the transaction's synchronous_commit.
func syncCommit(t *testing.T, db testDB) string {
	t.Helper()
	var v string
	if err := db.QueryRow(ctx(t), "SELECT current_setting('synchronous_commit')").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// A Store on the caller's pgx.Tx (pg.New(tx, cfg)) acquires, extends and
// releases in that transaction: a grant exists iff the transaction
// commits, and a rollback leaves nothing, not even a fence gap (the
// counter's increment rolls back with it); a release commits with the
// caller's writes (release-on-commit) and leaves the caller's commit as
// durable as it was.
func TestStoreInCallerTransaction(t *testing.T) {
	t.Parallel()
	out, pool, _ := newStore(t, pg.Config{NotifyChannel: "pglease_tx"})
	c := ctx(t)
	const key = "tx-key"
	inTx := func(commit bool, fn func(s *pg.Store, tx pgx.Tx)) {
		t.Helper()
		tx, err := pool.Begin(c)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(c) }()
		s, err := pg.New(tx, pg.Config{NotifyChannel: "pglease_tx"})
		if err != nil {
			t.Fatal(err)
		}
		fn(s, tx)
		if commit {
			if err := tx.Commit(c); err != nil {
				t.Fatal(err)
			}
		} else if err := tx.Rollback(c); err != nil {
			t.Fatal(err)
		}
	}
	locked := func(want bool, when string) {
		t.Helper()
		if got, err := out.IsLocked(c, key); err != nil || got != want {
			t.Fatalf("%s: IsLocked = %v, %v; want %v", when, got, err, want)
		}
	}

	// Rolled back: nothing granted, no fence used.
	inTx(false, func(s *pg.Store, tx pgx.Tx) {
		r, err := s.Acquire(c, key, time.Minute)
		if err != nil || !r.OK || r.Fence != 1 {
			t.Fatalf("Acquire in a transaction = %+v, %v", r, err)
		}
		if e, err := s.Extend(c, r.LockID, 2*time.Minute); err != nil || !e.OK {
			t.Fatalf("Extend in the transaction = %+v, %v", e, err)
		}
		locked(false, "before the commit, seen from outside")
	})
	locked(false, "after the rollback")
	r, err := out.Acquire(c, key, time.Minute)
	if err != nil || !r.OK || r.Fence != 1 {
		t.Fatalf("Acquire after the rollback = %+v, %v; want fence 1 (no gap)", r, err)
	}
	if ok, err := out.Release(c, r.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}

	// Committed: granted.
	var held pg.AcquireResult
	inTx(true, func(s *pg.Store, tx pgx.Tx) {
		held, err = s.Acquire(c, key, time.Minute)
		if err != nil || !held.OK || held.Fence != 2 {
			t.Fatalf("Acquire in a transaction = %+v, %v", held, err)
		}
	})
	locked(true, "after the commit")
	if info, err := out.Lookup(c, key); err != nil || info == nil || info.Fence != 2 {
		t.Fatalf("Lookup = %v, %v", info, err)
	}

	// A release rolled back keeps the lease; one committed frees it, and
	// only at the commit. Neither makes the caller's commit asynchronous.
	for _, commit := range []bool{false, true} {
		inTx(commit, func(s *pg.Store, tx pgx.Tx) {
			if ok, err := s.Release(c, held.LockID); err != nil || !ok {
				t.Fatalf("Release in a transaction = %v, %v", ok, err)
			}
			if v := syncCommit(t, tx); v != "on" {
				t.Fatalf("synchronous_commit = %s after a release in the caller's transaction: its commit would not be durable", v)
			}
			locked(true, "released in an open transaction, seen from outside")
		})
		locked(!commit, "after the release's transaction ended")
	}

	// Outside a pgx.Tx too: an explicit BEGIN on a connection, whose
	// transaction wrote before the release (here: another acquire).
	r, err = out.Acquire(c, key, time.Minute)
	if err != nil || !r.OK || r.Fence != 3 {
		t.Fatalf("Acquire = %+v, %v; want fence 3", r, err)
	}
	conn, err := pool.Acquire(c)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(c, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	s, err := pg.New(conn, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if o, err := s.Acquire(c, key+"-other", time.Minute); err != nil || !o.OK {
		t.Fatal(o, err)
	}
	if ok, err := s.Release(c, r.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if v := syncCommit(t, conn); v != "on" {
		t.Fatalf("synchronous_commit = %s after a release inside BEGIN on a connection", v)
	}
	if _, err := conn.Exec(c, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	locked(false, "after COMMIT")
}

// A Store built per transaction on the caller's pgx.Tx checks the schema
// once per target in this process, not once per transaction: after the
// first transaction, an acquire and a release in the caller's
// transaction are one query each (the schema check would be one more),
// on the same connection or another of the pool. (A new Store on the
// pool checks for itself, once for its life.)
func TestStoreInCallerTransactionChecksSchemaOnce(t *testing.T) {
	t.Parallel()
	cnt := &pgtest.Recorder{}
	_, pool, _ := newStore(t, pg.Config{}, cnt.Configure, maxConns(2))
	c := ctx(t)
	for round := range 4 {
		tx, err := pool.Begin(c)
		if err != nil {
			t.Fatal(err)
		}
		s, err := pg.New(tx, pg.Config{})
		if err != nil {
			t.Fatal(err)
		}
		cnt.Reset()
		r, err := s.Acquire(c, "tx-check-once", time.Minute)
		if err != nil || !r.OK {
			t.Fatalf("round %d: Acquire in the transaction = %+v, %v", round, r, err)
		}
		acq := cnt.Queries()
		cnt.Reset()
		if ok, err := s.Release(c, r.LockID); err != nil || !ok {
			t.Fatalf("round %d: Release = %v, %v", round, ok, err)
		}
		rel := cnt.Queries()
		if err := tx.Commit(c); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: acquire %d queries, release %d", round, acq, rel)
		if round > 0 && (acq != 1 || rel != 1) {
			t.Errorf("round %d: acquire %d queries, release %d in the caller's transaction; want 1 and 1 (the schema was checked in round 0)", round, acq, rel)
		}
	}
	// The other connection of the pool, in a transaction of its own.
	conns := make([]interface{ Release() }, 0, 2)
	for range 2 {
		cn, err := pool.Acquire(c)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, cn)
		tx, err := cn.Begin(c)
		if err != nil {
			t.Fatal(err)
		}
		s, err := pg.New(tx, pg.Config{})
		if err != nil {
			t.Fatal(err)
		}
		cnt.Reset()
		if _, err := s.IsLocked(c, "tx-check-once"); err != nil {
			t.Fatal(err)
		}
		r, err := s.Acquire(c, "tx-check-once-2", time.Minute)
		if err != nil || !r.OK {
			t.Fatalf("Acquire = %+v, %v", r, err)
		}
		if q := cnt.Queries(); q != 2 {
			t.Errorf("IsLocked and Acquire in a transaction on another connection: %d queries, want 2", q)
		}
		if err := tx.Rollback(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, cn := range conns {
		cn.Release()
	}
}
