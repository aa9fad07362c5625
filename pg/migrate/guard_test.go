package migrate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// guardEnv is a schema set up like production (roles.sql): the owner
// role owns the lease schema and a table "orders" (account is the lease
// key) guarded by the database guard; the runtime role takes leases and
// writes orders.
type guardEnv struct {
	rs    *pgtest.RoleSchema
	owner *pgx.Conn
	mg    *migrate.Migrator // the owner's
	rt    *pgxpool.Pool     // the runtime role's
	s     *store.Store      // on rt
	admin *pgxpool.Pool     // superuser: a writer that never calls pglease
}

func newGuardEnv(t *testing.T) *guardEnv {
	t.Helper()
	c := ctx(t)
	rs := pgtest.RoleSchemaForTest(t)
	owner, err := pgx.Connect(c, rs.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = owner.Close(context.Background()) })
	if _, err := owner.Exec(c, `CREATE TABLE orders (id integer PRIMARY KEY, account text, amount integer NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.ExecGrants(c, owner, "GRANT SELECT, INSERT, UPDATE, DELETE ON orders TO "+rs.Runtime); err != nil {
		t.Fatal(err)
	}
	mg, err := migrate.New(owner, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.Guard(c, "orders", "account"); err != nil {
		t.Fatalf("Guard: %v", err)
	}
	rt := rs.RuntimePool(t)
	s, err := store.New("pg.New", rt, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &guardEnv{rs: rs, owner: owner, mg: mg, rt: rt, s: s, admin: rs.AdminPool(t)}
}

func (e *guardEnv) lease(t *testing.T, key string, ttl time.Duration) store.AcquireResult {
	t.Helper()
	r, err := e.s.Acquire(ctx(t), store.AcquireRequest{Key: key, TTL: ttl})
	if err != nil || !r.OK {
		t.Fatalf("Acquire(%s) = %+v, %v", pglease.HashKey(key), r, err)
	}
	return r
}

// wantPGL10 asserts that err is the guard's refusal, with a message that
// says why and a detail that names the key only by its hash.
func wantPGL10(t *testing.T, what string, err error, key string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "PGL10" {
		t.Fatalf("%s: %v; want SQLSTATE PGL10", what, err)
	}
	if pgErr.Message != "pglease: this transaction holds no live lease of the row's key" {
		t.Fatalf("%s: message %q", what, pgErr.Message)
	}
	if key != "" && (!strings.Contains(pgErr.Detail, pglease.HashKey(key)) || strings.Contains(pgErr.Detail, key)) {
		t.Fatalf("%s: detail %q; want the key's hash, not the key", what, pgErr.Detail)
	}
}

// write runs fn in a transaction of db that first sets pglease.lock_ids
// to ids (when not ""), and commits; it returns fn's or the commit's
// error.
func write(t *testing.T, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, ids string, fn func(tx pgx.Tx) error) error {
	t.Helper()
	c := ctx(t)
	tx, err := db.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(c) }()
	if ids != "" {
		if _, err := tx.Exec(c, "SELECT set_config('pglease.lock_ids', $1, true)", ids); err != nil {
			t.Fatal(err)
		}
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(c)
}

func insert(c context.Context, id int, account string) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		_, err := tx.Exec(c, "INSERT INTO orders (id, account) VALUES ($1, $2)", id, account)
		return err
	}
}

// The guard lets a writer holding a live guarded lease of the row's key
// write (insert, update, delete), and refuses with PGL10 a writer
// without one: a plain connection (even a superuser's), another key's
// lease, an expired lease, a released one, a stale holder after a
// takeover; an update that moves a row to another key needs both leases.
func TestGuardRefusesWritersWithoutLease(t *testing.T) {
	t.Parallel()
	e := newGuardEnv(t)
	c := ctx(t)
	a := e.lease(t, "acct-1", time.Minute)
	b := e.lease(t, "acct-2", time.Minute)

	// With the lease, guarded by store.Guard: every kind of write.
	err := write(t, e.rt, "", func(tx pgx.Tx) error {
		if _, err := e.s.Guard(c, tx, a.LockID); err != nil {
			return err
		}
		for _, q := range []string{"INSERT INTO orders (id, account) VALUES (1, 'acct-1'), (2, 'acct-1')",
			"UPDATE orders SET amount = 5 WHERE id = 1", "DELETE FROM orders WHERE id = 2"} {
			if _, err := tx.Exec(c, q); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("writes under the key's lease: %v", err)
	}

	// No lease at all: the runtime role, the owner, a superuser.
	wantPGL10(t, "insert without a lease", write(t, e.rt, "", insert(c, 3, "acct-1")), "acct-1")
	wantPGL10(t, "update by a superuser", write(t, e.admin, "", func(tx pgx.Tx) error {
		_, err := tx.Exec(c, "UPDATE orders SET amount = 6 WHERE id = 1")
		return err
	}), "acct-1")
	_, err = e.owner.Exec(c, "DELETE FROM orders WHERE id = 1")
	wantPGL10(t, "delete by the table's owner", err, "acct-1")
	// Another key's lease.
	wantPGL10(t, "insert under another key's lease", write(t, e.rt, b.LockID, insert(c, 3, "acct-1")), "acct-1")
	// NULL key.
	wantPGL10(t, "insert with a NULL key", write(t, e.rt, a.LockID, insert(c, 3, "")), "")
	// Moving a row to another key needs both leases.
	move := func(tx pgx.Tx) error {
		_, err := tx.Exec(c, "UPDATE orders SET account = 'acct-2' WHERE id = 1")
		return err
	}
	wantPGL10(t, "moving a row with the old key's lease only", write(t, e.rt, a.LockID, move), "acct-2")
	wantPGL10(t, "moving a row with the new key's lease only", write(t, e.rt, b.LockID, move), "acct-1")
	if err := write(t, e.rt, a.LockID+","+b.LockID, move); err != nil {
		t.Fatalf("moving a row with both leases: %v", err)
	}

	// Expired while the transaction runs (it was live at the guard).
	short := e.lease(t, "acct-3", 300*time.Millisecond)
	wantPGL10(t, "insert after the lease expired", write(t, e.rt, "", func(tx pgx.Tx) error {
		if _, err := e.s.Guard(c, tx, short.LockID); err != nil {
			return err
		}
		waitServer(t, e.rt, short.ExpiresAt.UnixMilli()+1)
		return insert(c, 4, "acct-3")(tx)
	}), "acct-3")
	// A stale holder after a takeover (by lockId: its lease row now has
	// another one).
	waitServer(t, e.rt, short.ExpiresAt.UnixMilli()+keys.TimeToleranceMs)
	next := e.lease(t, "acct-3", time.Minute)
	wantPGL10(t, "insert by the holder taken over", write(t, e.rt, short.LockID, insert(c, 4, "acct-3")), "acct-3")
	if err := write(t, e.rt, next.LockID, insert(c, 4, "acct-3")); err != nil {
		t.Fatalf("insert by the new holder: %v", err)
	}
	// Released.
	if ok, err := e.s.Release(c, next.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
	wantPGL10(t, "insert under a released lease", write(t, e.rt, next.LockID, insert(c, 5, "acct-3")), "acct-3")
	// Shared holds do not guard writes.
	rd, err := e.s.AcquireSharedMany(c, []store.SharedRequest{{Key: "acct-4", TTL: time.Minute}})
	if err != nil || !rd[0].OK {
		t.Fatal(rd, err)
	}
	wantPGL10(t, "insert under a reader's hold", write(t, e.rt, rd[0].LockID, insert(c, 6, "acct-4")), "acct-4")

	var n int
	if err := e.rt.QueryRow(c, "SELECT count(*) FROM orders").Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d orders, %v; want the 2 written under leases", n, err)
	}
}

// Unguard removes the guard (writers pass again); the SQL-callable form
// installs and removes it too, idempotently; a migration down refuses
// while a table is guarded.
func TestGuardInstallForms(t *testing.T) {
	t.Parallel()
	e := newGuardEnv(t)
	c := ctx(t)
	if err := e.mg.Guard(c, "orders", "account"); err != nil {
		t.Fatalf("Guard again: %v", err)
	}
	var n int
	if err := e.owner.QueryRow(c, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass AND NOT tgisinternal").Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d triggers on orders after Guard twice, %v; want the row trigger and the TRUNCATE one", n, err)
	}
	if err := e.mg.Unguard(c, "orders"); err != nil {
		t.Fatal(err)
	}
	if err := write(t, e.rt, "", insert(c, 1, "acct-1")); err != nil {
		t.Fatalf("insert after Unguard: %v", err)
	}
	if err := e.mg.Unguard(c, "orders"); err != nil {
		t.Fatalf("Unguard again: %v", err)
	}
	// From SQL, by the table's owner.
	if _, err := e.owner.Exec(c, "SELECT syncguard_locks_guard('orders', 'account')"); err != nil {
		t.Fatal(err)
	}
	wantPGL10(t, "insert after the SQL guard", write(t, e.rt, "", insert(c, 2, "acct-1")), "acct-1")
	// The runtime role may not install or remove one.
	if _, err := e.rt.Exec(c, "SELECT syncguard_locks_unguard('orders')"); err == nil {
		t.Fatal("the runtime role removed the guard")
	}
	rtMg, err := migrate.New(e.rt, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rtMg.Unguard(c, "orders"); !errors.Is(err, pglease.ErrAuthFailed) {
		t.Fatalf("Unguard as the runtime role = %v; want AuthFailed", err)
	}
	// Going down while a table is guarded fails and says why.
	if err := e.mg.To(c, 3); err == nil || !strings.Contains(err.Error(), "1 tables are guarded by this lock table's leases") {
		t.Fatalf("To(3) with a guarded table = %v", err)
	}
	if _, err := e.owner.Exec(c, "SELECT syncguard_locks_unguard('orders')"); err != nil {
		t.Fatal(err)
	}
	if err := e.mg.To(c, 3); err != nil {
		t.Fatalf("To(3) after unguarding: %v", err)
	}
	if err := e.mg.Up(c); err != nil {
		t.Fatal(err)
	}
}

// Bad names are InvalidArgument before any I/O; pglease's own tables
// cannot be guarded; a missing table or column is InvalidArgument.
func TestGuardBadInput(t *testing.T) {
	t.Parallel()
	var cnt pgtest.Recorder
	e, pool, _ := newSuperStore(t, pg.Config{}, cnt.Configure)
	c := ctx(t)
	cnt.Reset()
	for _, tc := range [][2]string{{"bad name", "k"}, {"a.b.c", "k"}, {"orders", "bad col"}, {"orders", ""},
		{"syncguard_locks", "key"}, {"syncguard_fence_counters", "fence_key"}, {"syncguard_locks_shared", "key"},
		{"syncguard_locks_queue", "key"}} {
		if err := e.mg.Guard(c, tc[0], tc[1]); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("Guard(%q, %q) = %v", tc[0], tc[1], err)
		}
	}
	if err := e.mg.Unguard(c, "x y"); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("Unguard(bad) = %v", err)
	}
	if n := cnt.Queries() + cnt.Writes(); n != 0 {
		t.Fatalf("%d queries/writes for bad input", n)
	}
	if err := e.mg.Guard(c, "no_such_table", "k"); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("Guard(missing table) = %v", err)
	}
	if _, err := pool.Exec(c, "CREATE TABLE t1 (k text)"); err != nil {
		t.Fatal(err)
	}
	if err := e.mg.Guard(c, "t1", "nope"); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("Guard(missing column) = %v", err)
	}
}

// BenchmarkGuardedWrite measures one single-row UPDATE, each its own
// transaction on one connection, on a plain table and on a guarded one
// whose writer holds the row key's lease (pglease.lock_ids set for the
// session): the difference is the guard's cost per write (the trigger,
// one index lookup and the FOR KEY SHARE lock of the lease's row).
func BenchmarkGuardedWrite(b *testing.B) {
	e, pool, _ := newSuperStore(b, pg.Config{})
	c := ctx(b)
	for _, q := range []string{
		"CREATE TABLE plain (id integer PRIMARY KEY, account text, amount integer NOT NULL DEFAULT 0)",
		"CREATE TABLE guarded (id integer PRIMARY KEY, account text, amount integer NOT NULL DEFAULT 0)",
		"INSERT INTO plain VALUES (1, 'acct', 0)",
		"INSERT INTO guarded VALUES (1, 'acct', 0)",
	} {
		if _, err := pool.Exec(c, q); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.mg.Guard(c, "guarded", "account"); err != nil {
		b.Fatal(err)
	}
	r, err := e.Acquire(c, store.AcquireRequest{Key: "acct", TTL: time.Hour})
	if err != nil || !r.OK {
		b.Fatal(r, err)
	}
	conn, err := pool.Acquire(c)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(c, "SELECT set_config('pglease.lock_ids', $1, false)", r.LockID); err != nil {
		b.Fatal(err)
	}
	for _, table := range []string{"plain", "guarded"} {
		b.Run(table, func(b *testing.B) {
			q := "UPDATE " + table + " SET amount = amount + 1 WHERE id = 1"
			for b.Loop() {
				if _, err := conn.Exec(c, q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// pglease_advisory_locks is one view per schema, shared by every lock
// table in it: going down with one pair keeps it for the other, going
// down with both drops it.
func TestAdvisoryViewSharedBySchema(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Pool(t)
	c := ctx(t)
	cfgs := []pg.Config{{}, {LockTable: "other_locks", FenceTable: "other_fences"}}
	envs := make([]*env, len(cfgs))
	for i, cfg := range cfgs {
		e, err := newEnv(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.mg.Up(c); err != nil {
			t.Fatal(err)
		}
		envs[i] = e
	}
	exists := func() bool {
		t.Helper()
		var ok bool
		if err := pool.QueryRow(c, "SELECT to_regclass('pglease_advisory_locks') IS NOT NULL").Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	envs[0].to(t, 3)
	if !exists() {
		t.Fatal("one pair's down dropped the view the other pair uses")
	}
	envs[1].to(t, 3)
	if exists() {
		t.Fatal("the view survived both pairs' down")
	}
	envs[0].to(t, migrate.Latest)
	if !exists() {
		t.Fatal("up did not create the view again")
	}
}
