package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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

// listener is a connection LISTENing on a channel.
type listener struct {
	conn    *pgx.Conn
	channel string
}

func listen(t testing.TB, channel string) *listener {
	t.Helper()
	c := ctx(t)
	conn, err := pgx.Connect(c, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	// The channel and its 256 wake channels (store.WakeChannel), where
	// the trigger's wake-ups go.
	q := "LISTEN " + pgx.Identifier{channel}.Sanitize()
	for i := range 256 {
		q += "; LISTEN " + pgx.Identifier{fmt.Sprintf("%s.%02x", channel, i)}.Sanitize()
	}
	if _, err := conn.Exec(c, q); err != nil {
		t.Fatal(err)
	}
	return &listener{conn: conn, channel: channel}
}

// drain returns the payloads received on the channel so far, without
// sleeping: it sends a sentinel notification from db in a new transaction
// and reads until the sentinel arrives. PostgreSQL delivers notifications
// in commit order, so everything committed before has been read.
func (l *listener) drain(t testing.TB, db testDB) []string {
	t.Helper()
	sentinel := pgtest.RandomName("sentinel")
	c := ctx(t)
	if _, err := db.Exec(c, "SELECT pg_notify($1, $2)", l.channel, sentinel); err != nil {
		t.Fatal(err)
	}
	var got []string
	wc, cancel := context.WithTimeout(c, 10*time.Second)
	defer cancel()
	for {
		n, err := l.conn.WaitForNotification(wc)
		if err != nil {
			t.Fatalf("waiting for the sentinel: %v", err)
		}
		if n.Payload == sentinel && n.Channel == l.channel {
			return got
		}
		note, ok := store.ParseNotification(n.Payload)
		if wake := ok && note.Kind == store.NotifyWake; wake && n.Channel != store.WakeChannel(l.channel, n.Payload) ||
			!wake && n.Channel != l.channel {
			t.Fatalf("%q came on %q: a wake-up goes on its key's wake channel of %q, anything else on the channel", n.Payload, n.Channel, l.channel)
		}
		got = append(got, n.Payload)
	}
}

// syncGuardRelease runs SyncGuard 2.5.2's release statements: BEGIN;
// now; SELECT … FOR UPDATE; DELETE by key; COMMIT.
func syncGuardRelease(c context.Context, db *pgxpool.Pool, lockID string) (bool, error) {
	tx, err := db.Begin(c)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(c) }()
	var now float64
	if err := tx.QueryRow(c, "SELECT EXTRACT(EPOCH FROM NOW()) * 1000 AS now_ms").Scan(&now); err != nil {
		return false, err
	}
	var key string
	var exp int64
	err = tx.QueryRow(c, "SELECT key, expires_at_ms FROM syncguard_locks WHERE lock_id = $1 FOR UPDATE", lockID).Scan(&key, &exp)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, tx.Commit(c)
	}
	if err != nil {
		return false, err
	}
	if exp <= int64(now)-keys.TimeToleranceMs {
		return false, tx.Commit(c)
	}
	if _, err := tx.Exec(c, "DELETE FROM syncguard_locks WHERE key = $1", key); err != nil {
		return false, err
	}
	return true, tx.Commit(c)
}

func mustAcquire(t testing.TB, s *env, key string, ttl time.Duration) string {
	t.Helper()
	r, err := s.Acquire(ctx(t), store.AcquireRequest{Key: key, TTL: ttl})
	if err != nil || !r.OK {
		t.Fatalf("Acquire = %v, %v", r, err)
	}
	return r.LockID
}

func equal(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

// A SyncGuard release (DELETE by key) notifies hashKey(key) only while the
// trigger is installed; so does a delete from a session whose search_path
// does not contain the lock table or the functions.
func TestReleaseTriggerSyncGuardDelete(t *testing.T) {
	t.Parallel()
	s, pool, schema := newSuperStore(t, pg.Config{})
	c := ctx(t)
	ch := pgtest.RandomName("trg")
	l := listen(t, ch)
	const key = "sg-rel-😀"

	release := func() {
		t.Helper()
		if ok, err := syncGuardRelease(c, pool, mustAcquire(t, s, key, time.Minute)); err != nil || !ok {
			t.Fatalf("SyncGuard release = %v, %v", ok, err)
		}
	}
	release()
	if got := l.drain(t, pool); len(got) != 0 {
		t.Fatalf("without the trigger: %d notifications", len(got))
	}

	if err := s.mg.SetupReleaseTrigger(c, ch); err != nil {
		t.Fatal(err)
	}
	release()
	if got, want := l.drain(t, pool), []string{pglease.HashKey(key)}; !equal(got, want) {
		t.Fatalf("with the trigger: %q, want %q", got, want)
	}

	// Another search_path: the trigger function and hashKey are qualified.
	other, err := pgx.Connect(c, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	mustAcquire(t, s, "sg-other", time.Minute)
	if _, err := other.Exec(c, "SET search_path = pg_catalog"); err != nil {
		t.Fatal(err)
	}
	tag, err := other.Exec(c, "DELETE FROM "+pgx.Identifier{schema, "syncguard_locks"}.Sanitize()+" WHERE key = $1", "sg-other")
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatal(tag, err)
	}
	if got, want := l.drain(t, pool), []string{pglease.HashKey("sg-other")}; !equal(got, want) {
		t.Fatalf("other search_path: %q, want %q", got, want)
	}

	if err := s.mg.DropReleaseTrigger(c); err != nil {
		t.Fatal(err)
	}
	release()
	if got := l.drain(t, pool); len(got) != 0 {
		t.Fatalf("after DropReleaseTrigger: %d notifications", len(got))
	}
}

// pglease's release with NotifyChannel = the trigger's channel notifies the
// same payload twice in one transaction; PostgreSQL delivers it once.
// Distinct keys released together are distinct notifications. Takeover of
// an expired row (an UPDATE) and refused releases notify nothing.
func TestReleaseTriggerNoDoubleNotify(t *testing.T) {
	t.Parallel()
	ch := pgtest.RandomName("trg")
	s, pool, _ := newSuperStore(t, pg.Config{NotifyChannel: ch})
	c := ctx(t)
	l := listen(t, ch)

	// The mechanism: identical notifications in one transaction collapse.
	if _, err := pool.Exec(c, "SELECT pg_notify($1, 'x'), pg_notify($1, 'x'), pg_notify($1, 'y')", ch); err != nil {
		t.Fatal(err)
	}
	if got := l.drain(t, pool); !equal(got, []string{"x", "y"}) {
		t.Fatalf("PostgreSQL de-duplication: %q", got)
	}

	if err := s.mg.SetupReleaseTrigger(c, ch); err != nil {
		t.Fatal(err)
	}
	id := mustAcquire(t, s, "k1", time.Minute)
	if ok, err := s.Release(c, id); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if got, want := l.drain(t, pool), []string{pglease.HashKey("k1")}; !equal(got, want) {
		t.Fatalf("Release with trigger and NotifyChannel: %q, want %q", got, want)
	}

	ids := []string{mustAcquire(t, s, "k1", time.Minute), mustAcquire(t, s, "k2", time.Minute)}
	if oks, err := s.ReleaseMany(c, ids); err != nil || !oks[0] || !oks[1] {
		t.Fatal(oks, err)
	}
	got := l.drain(t, pool)
	if len(got) != 2 || !(equal(got, []string{pglease.HashKey("k1"), pglease.HashKey("k2")}) || equal(got, []string{pglease.HashKey("k2"), pglease.HashKey("k1")})) {
		t.Fatalf("ReleaseMany: %q", got)
	}

	// Takeover: the expired row is overwritten (UPDATE), not deleted; the
	// expired holder's release is refused and deletes nothing.
	r, err := s.Acquire(c, store.AcquireRequest{Key: "k3", TTL: time.Millisecond})
	if err != nil || !r.OK {
		t.Fatal(r, err)
	}
	waitServer(t, pool, r.ExpiresAt.UnixMilli()+keys.TimeToleranceMs)
	if ok, err := s.Release(c, r.LockID); err != nil || ok {
		t.Fatalf("expired Release = %v, %v", ok, err)
	}
	r2 := mustAcquire(t, s, "k3", time.Minute)
	if got := l.drain(t, pool); len(got) != 0 {
		t.Fatalf("takeover notified %q", got)
	}
	if ok, err := s.Release(c, r2); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if got, want := l.drain(t, pool), []string{pglease.HashKey("k3")}; !equal(got, want) {
		t.Fatalf("release after takeover: %q, want %q", got, want)
	}
}

func triggerOID(t *testing.T, db testDB) (oids []uint32, args []string) {
	t.Helper()
	rows, err := db.Query(ctx(t), `SELECT t.oid, encode(t.tgargs, 'escape') FROM pg_trigger t
		WHERE t.tgrelid = to_regclass('syncguard_locks') AND NOT t.tgisinternal`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var o uint32
		var a string
		if err := rows.Scan(&o, &a); err != nil {
			t.Fatal(err)
		}
		oids, args = append(oids, o), append(args, a)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return oids, args
}

// Concurrent setups succeed and leave one trigger; a repeated setup with
// the same channel leaves the trigger untouched; a new channel re-points
// it; drop is idempotent, also without the table; setup without the table
// is InvalidArgument.
func TestReleaseTriggerIdempotent(t *testing.T) {
	t.Parallel()
	s, pool, _ := newSuperStore(t, pg.Config{})
	c := ctx(t)
	ch1, ch2 := pgtest.RandomName("trg"), pgtest.RandomName("trg")
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- s.mg.SetupReleaseTrigger(c, ch1) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	oids, args := triggerOID(t, pool)
	if len(oids) != 1 || args[0] != ch1+`\000` {
		t.Fatalf("triggers %v %q", oids, args)
	}
	if err := s.mg.SetupReleaseTrigger(c, ch1); err != nil {
		t.Fatal(err)
	}
	if again, _ := triggerOID(t, pool); len(again) != 1 || again[0] != oids[0] {
		t.Fatalf("same channel recreated the trigger: %v → %v", oids, again)
	}

	l1, l2 := listen(t, ch1), listen(t, ch2)
	if err := s.mg.SetupReleaseTrigger(c, ch2); err != nil {
		t.Fatal(err)
	}
	if ok, err := syncGuardRelease(c, pool, mustAcquire(t, s, "k", time.Minute)); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if got := l1.drain(t, pool); len(got) != 0 {
		t.Fatalf("old channel got %q", got)
	}
	if got, want := l2.drain(t, pool), []string{pglease.HashKey("k")}; !equal(got, want) {
		t.Fatalf("new channel got %q, want %q", got, want)
	}

	for range 2 {
		if err := s.mg.DropReleaseTrigger(c); err != nil {
			t.Fatal(err)
		}
	}
	if oids, _ := triggerOID(t, pool); len(oids) != 0 {
		t.Fatalf("triggers after drop: %v", oids)
	}
	var fns int
	if err := pool.QueryRow(c, "SELECT count(*) FROM pg_proc WHERE proname LIKE 'pglease_release_notify%' AND pronamespace = current_schema()::regnamespace").Scan(&fns); err != nil || fns != 0 {
		t.Fatalf("trigger functions after drop: %d, %v", fns, err)
	}

	missing, err := newEnv(pool, pg.Config{LockTable: "no_such_locks", FenceTable: "no_such_fences"})
	if err != nil {
		t.Fatal(err)
	}
	if err := missing.mg.DropReleaseTrigger(c); err != nil {
		t.Fatalf("Drop without table: %v", err)
	}
	if err := missing.mg.SetupReleaseTrigger(c, ch1); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Fatalf("Setup without table: %v", err)
	}
}

// SQL's release_trigger.sql (with a NotifyChannel) is what
// SetupReleaseTrigger runs, usable as a migration after schema.sql, and
// release_trigger_drop.sql removes it.
func TestReleaseTriggerSQL(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Pool(t)
	c := ctx(t)
	ch := pgtest.RandomName("trg")
	cfg := pg.Config{NotifyChannel: ch}
	if _, err := pool.Exec(c, sqlFile(t, cfg, "schema.sql")+sqlFile(t, cfg, "release_trigger.sql")); err != nil {
		t.Fatal(err)
	}
	s, err := newEnv(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l := listen(t, ch)
	if ok, err := syncGuardRelease(c, pool, mustAcquire(t, s, "m", time.Minute)); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if got, want := l.drain(t, pool), []string{pglease.HashKey("m")}; !equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if ok, err := s.ReleaseTriggerInstalled(c, ch); err != nil || !ok {
		t.Fatalf("ReleaseTriggerInstalled after release_trigger.sql = %v, %v", ok, err)
	}
	if _, err := pool.Exec(c, sqlFile(t, cfg, "release_trigger_drop.sql")); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.ReleaseTriggerInstalled(c, ch); err != nil || ok {
		t.Fatalf("ReleaseTriggerInstalled after release_trigger_drop.sql = %v, %v", ok, err)
	}
}

// Bad input is rejected before any I/O.
func TestReleaseTriggerBadInput(t *testing.T) {
	t.Parallel()
	var cnt pgtest.Recorder
	pool, _ := pgtest.Pool(t, cnt.Configure)
	s, err := newEnv(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	cancelled, cancel := context.WithCancel(c)
	cancel()
	cnt.Reset()
	for _, ch := range []string{"", "1a", "a-b", "a b", "x'y", "ä", strings.Repeat("a", 64), "pg_notify;--"} {
		if err := s.mg.SetupReleaseTrigger(c, ch); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
			t.Errorf("SetupReleaseTrigger(%q) = %v", ch, err)
		}
		if _, err := migrate.SQL(pg.Config{NotifyChannel: ch}); ch != "" && pglease.CodeOf(err) != pglease.CodeInvalidArgument {
			t.Errorf("SQL(NotifyChannel %q) = %v", ch, err)
		}
	}
	if _, err := migrate.SQL(pg.Config{LockTable: "bad name", NotifyChannel: "ok"}); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("SQL(bad table) = %v", err)
	}
	var nilCtx context.Context
	if err := s.mg.SetupReleaseTrigger(nilCtx, "ok"); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("nil ctx = %v", err)
	}
	if err := s.mg.SetupReleaseTrigger(cancelled, "ok"); pglease.CodeOf(err) != pglease.CodeAborted || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx = %v", err)
	}
	if err := s.mg.DropReleaseTrigger(nilCtx); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("Drop nil ctx = %v", err)
	}
	if err := s.mg.DropReleaseTrigger(cancelled); pglease.CodeOf(err) != pglease.CodeAborted {
		t.Errorf("Drop cancelled ctx = %v", err)
	}
	if q, p, w := cnt.Queries(), cnt.Prepares(), cnt.Writes(); q+p+w != 0 {
		t.Fatalf("bad input did I/O: %d queries, %d prepares, %d writes", q, p, w)
	}
}

// stmtTriggerSQL is the statement-level alternative (transition table),
// installed only by the benchmark for comparison.
func stmtTriggerSQL(ch string) string {
	return `CREATE OR REPLACE FUNCTION bench_release_notify_stmt() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify(TG_ARGV[0], pglease_hashkey_v1(o.user_key)) FROM old_rows AS o;
  RETURN NULL;
END
$fn$;
CREATE TRIGGER bench_release_notify_stmt AFTER DELETE ON syncguard_locks REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION bench_release_notify_stmt('` + ch + `');`
}

// BenchmarkReleaseTrigger measures uncontended acquire + release cycles
// (each worker its own key) on a pool of 8 connections, with 1 and 8
// workers, while a connection LISTENs and drains the channel.
//
//   - pglease/…: Acquire + Store.Release (one round trip each).
//     none: no notification; notify: NotifyChannel set (the Manager's
//     default today); trigger+notify: row trigger and NotifyChannel (two
//     identical pg_notify, delivered once); trigger: row trigger only;
//     stmt-trigger: statement-level trigger with a transition table only.
//   - syncguard/…: Acquire + SyncGuard's 5-round-trip release.
//     none, trigger (row), stmt-trigger.
//
// Run: go run ./internal/cmd/withpg -durable -- go test -run XXX -bench ReleaseTrigger -benchtime 3s ./pg/
func BenchmarkReleaseTrigger(b *testing.B) {
	type variant struct {
		name            string
		notify, row     bool
		stmt, sgRelease bool
	}
	variants := []variant{
		{name: "pglease/none"},
		{name: "pglease/notify", notify: true},
		{name: "pglease/trigger+notify", notify: true, row: true},
		{name: "pglease/trigger", row: true},
		{name: "pglease/stmt-trigger", stmt: true},
		{name: "syncguard/none", sgRelease: true},
		{name: "syncguard/trigger", row: true, sgRelease: true},
		{name: "syncguard/stmt-trigger", stmt: true, sgRelease: true},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			ch := pgtest.RandomName("bench")
			cfg := pg.Config{}
			if v.notify {
				cfg.NotifyChannel = ch
			}
			// As the superuser: installing the trigger (and the statement
			// trigger) is DDL the runtime role may not run.
			s, pool, _ := newSuperStore(b, cfg, maxConns(8))
			c, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			if v.row {
				if err := s.mg.SetupReleaseTrigger(c, ch); err != nil {
					b.Fatal(err)
				}
			}
			if v.stmt {
				if _, err := pool.Exec(c, stmtTriggerSQL(ch)); err != nil {
					b.Fatal(err)
				}
			}
			l := listen(b, ch)
			lctx, stop := context.WithCancel(context.Background())
			var received atomic.Int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					if _, err := l.conn.WaitForNotification(lctx); err != nil {
						return
					}
					received.Add(1)
				}
			}()
			defer func() { stop(); <-done }()

			for _, workers := range []int{1, 8} {
				b.Run(fmt.Sprintf("g%d", workers), func(b *testing.B) {
					var next atomic.Int64
					var wg sync.WaitGroup
					errs := make(chan error, workers)
					b.ResetTimer()
					for w := range workers {
						key := fmt.Sprintf("bench-%d", w)
						wg.Go(func() {
							for next.Add(1) <= int64(b.N) {
								r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 30 * time.Second})
								if err != nil || !r.OK {
									errs <- fmt.Errorf("acquire: %v %v", r, err)
									return
								}
								var ok bool
								if v.sgRelease {
									ok, err = syncGuardRelease(c, pool, r.LockID)
								} else {
									ok, err = s.Release(c, r.LockID)
								}
								if err != nil || !ok {
									errs <- fmt.Errorf("release: %v %v", ok, err)
									return
								}
							}
						})
					}
					wg.Wait()
					b.StopTimer()
					close(errs)
					for err := range errs {
						b.Fatal(err)
					}
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
				})
			}
		})
	}
}

// TestReleaseTriggerSyncGuardRole: with the release trigger installed by
// the owner role and roles.sql applied, a SyncGuard service connecting
// as a role of its own, with only the table grants SyncGuard needs (no
// EXECUTE on any pglease function), releases by its DELETE: the row goes
// and the trigger notifies hashKey(key). That role still cannot call
// pglease's functions itself; pglease's runtime role releases as before.
func TestReleaseTriggerSyncGuardRole(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	rs := pgtest.RoleSchemaForTest(t)
	admin := rs.AdminPool(t)
	ch := pgtest.RandomName("trg")
	l := listen(t, ch)

	owner, err := pgx.Connect(c, rs.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(context.Background())
	ownerStore, err := newEnv(owner, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ownerStore.mg.SetupReleaseTrigger(c, ch); err != nil {
		t.Fatalf("SetupReleaseTrigger as the owner role: %v", err)
	}

	// SyncGuard's role: CONNECT, USAGE on the schema, and the table grants
	// of SyncGuard's backend (lock table: SELECT/INSERT/UPDATE/DELETE;
	// fence table: SELECT/INSERT/UPDATE).
	sg := pgtest.RandomName("syncguard_")
	var db string
	if err := admin.QueryRow(c, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	schema := pgx.Identifier{rs.Schema}.Sanitize()
	if err := pgtest.ExecGrants(c, admin, "CREATE ROLE "+sg+" LOGIN; GRANT CONNECT ON DATABASE "+pgx.Identifier{db}.Sanitize()+" TO "+sg+
		"; GRANT USAGE ON SCHEMA "+schema+" TO "+sg+
		"; GRANT SELECT, INSERT, UPDATE, DELETE ON "+schema+".syncguard_locks TO "+sg+
		"; GRANT SELECT, INSERT, UPDATE ON "+schema+".syncguard_fence_counters TO "+sg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before the schema is dropped (cleanups run LIFO)
		cc, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, q := range []string{"DROP OWNED BY " + sg, "DROP ROLE " + sg} {
			if err := pgtest.ExecGrants(cc, admin, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	sgPool := rolePool(t, sg, rs.Schema)

	rt := rs.RuntimePool(t)
	s, err := newEnv(rt, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const key = "sg-role-😀"
	id := mustAcquire(t, s, key, time.Minute)
	if ok, err := syncGuardRelease(c, sgPool, id); err != nil || !ok {
		t.Fatalf("SyncGuard's release as its own role = %v, %v", ok, err)
	}
	var left int
	if err := admin.QueryRow(c, "SELECT count(*) FROM syncguard_locks WHERE key = $1", key).Scan(&left); err != nil || left != 0 {
		t.Fatalf("rows left after SyncGuard's release: %d, %v", left, err)
	}
	if got, want := l.drain(t, admin), []string{pglease.HashKey(key)}; !equal(got, want) {
		t.Fatalf("notifications %q, want %q", got, want)
	}

	// No more than that: SyncGuard's role cannot run pglease's functions.
	_, err = sgPool.Exec(c, "SELECT "+schema+".pglease_hashkey_v1('x')")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("hashKey as SyncGuard's role: %v, want SQLSTATE 42501", err)
	}

	// pglease's runtime role still releases (and notifies through the trigger).
	if ok, err := s.Release(c, mustAcquire(t, s, key, time.Minute)); err != nil || !ok {
		t.Fatalf("Release as the runtime role = %v, %v", ok, err)
	}
	if got, want := l.drain(t, admin), []string{pglease.HashKey(key)}; !equal(got, want) {
		t.Fatalf("runtime release: notifications %q, want %q", got, want)
	}
}
