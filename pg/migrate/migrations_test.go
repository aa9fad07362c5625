package migrate_test

import (
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// schemaV0 is schema.sql as SetupSchema created it before schema
// versions (main at 4b739cd): v0, the version every upgrade test starts
// from.
//
//go:embed testdata/schema_v0.sql
var schemaV0 string

// snapshot describes every object in schema (tables, columns, indexes,
// functions with a hash of their body, in which the schema's name is
// replaced (the guard's trigger function names its tables with it), and
// their security and settings, views, triggers) and the pglease schema
// version record, one line each, sorted.
func snapshot(t testing.TB, db testDB, schema string) string {
	t.Helper()
	rows, err := db.Query(ctx(t), `
SELECT 'column ' || c.table_name || '.' || c.column_name || ' ' || c.data_type || ' ' || c.is_nullable || ' ' || coalesce(c.column_default, '')
  FROM information_schema.columns c WHERE c.table_schema = $1
UNION ALL
SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = $1
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(replace(p.prosrc, $1, 'SCHEMA')) || ' ' || p.provolatile::text
    || ' ' || p.prosecdef::text || ' ' || coalesce(array_to_string(p.proconfig, ','), '')
  FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
UNION ALL
SELECT 'view ' || c.relname || ' ' || md5(replace(pg_get_viewdef(c.oid), $1, 'SCHEMA'))
  FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'v'
UNION ALL
SELECT 'trigger ' || t.tgname || ' on ' || t.tgrelid::regclass::text
  FROM pg_trigger t JOIN pg_class r ON r.oid = t.tgrelid WHERE r.relnamespace = $1::regnamespace AND NOT t.tgisinternal
ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(strings.Join(lines, "\n"), schema+".", "")
}

func version(t testing.TB, s *env) (int, int) {
	t.Helper()
	v, c, err := s.mg.Version(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return v, c
}

// Up, down and up again leaves the database as after one up, at every
// step; down keeps SyncGuard's tables and their rows (fence counters
// included), and a SyncGuard process working through it all (its
// prepared statements cached) never fails and never loses its lock. (A
// migration that added a column to the lock table would fail its cached
// `SELECT *` with "cached plan must not change result type": checked by
// trying it. Hence the holder table of its own.)
func TestMigrateUpDownUp(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t)
	s, err := newEnv(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	snaps := map[int]string{0: snapshot(t, pool, schema)}
	for v := 1; v <= migrate.Latest; v++ {
		s.to(t, v)
		snaps[v] = snapshot(t, pool, schema)
		if got, _ := version(t, s); got != v {
			t.Fatalf("version after Migrate(%d) = %d", v, got)
		}
	}
	if snaps[migrate.Latest] == snaps[migrate.Latest-1] {
		t.Fatal("the last migration changed nothing")
	}

	// Data: a SyncGuard lease, a pglease lease, fence counters.
	sg := pgtest.NewSyncGuard(t, pool)
	sgID, ok, err := sg.Acquire("sg-key", time.Minute)
	if err != nil || !ok {
		t.Fatalf("SyncGuard acquire: %v %v", ok, err)
	}
	pgID := mustAcquire(t, s, "pg-key", time.Minute)
	if ok, err := sg.ExtendOrRelease(sgID, time.Minute); err != nil || !ok {
		t.Fatalf("SyncGuard extend: %v %v", ok, err)
	}
	data := func() string {
		rows, err := pool.Query(c, `SELECT key || ' ' || lock_id || ' ' || fence FROM syncguard_locks
			UNION ALL SELECT fence_key || ' ' || fence FROM syncguard_fence_counters ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	before := data()

	// Down one step at a time to 0, then up again, and every
	// down-up pair from the top.
	for v := migrate.Latest - 1; v >= 0; v-- {
		s.to(t, v)
		if got := snapshot(t, pool, schema); !strings.Contains(got, "column syncguard_fence_counters.fence ") {
			t.Fatalf("down to %d dropped SyncGuard's tables:\n%s", v, got)
		}
		if v > 0 {
			if got := snapshot(t, pool, schema); got != snaps[v] {
				t.Fatalf("down to %d:\n%s\nwant (as after up to %d):\n%s", v, got, v, snaps[v])
			}
		}
		if d := data(); d != before {
			t.Fatalf("down to %d changed the data:\n%s\nwant:\n%s", v, d, before)
		}
		// The SyncGuard process keeps working on its cached statements.
		if ok, err := sg.ExtendOrRelease(sgID, time.Minute); err != nil || !ok {
			t.Fatalf("SyncGuard extend at version %d: %v %v", v, ok, err)
		}
		before = data() // the extend changed expires_at_ms only
	}
	for v := 1; v <= migrate.Latest; v++ {
		s.to(t, v)
		if got := snapshot(t, pool, schema); got != snaps[v] {
			t.Fatalf("up/down/up to %d:\n%s\nwant:\n%s", v, got, snaps[v])
		}
		if ok, err := sg.ExtendOrRelease(sgID, time.Minute); err != nil || !ok {
			t.Fatalf("SyncGuard extend at version %d: %v %v", v, ok, err)
		}
	}
	if d := data(); d != before {
		t.Fatalf("up/down/up changed the data:\n%s\nwant:\n%s", d, before)
	}
	// pglease's lease survived too (its holder row went with migration 2's
	// down: the lease is still held, its holder no longer known).
	if ok, err := s.Release(c, pgID); err != nil || !ok {
		t.Fatalf("Release after up/down/up = %v, %v", ok, err)
	}
	if ok, err := sg.ExtendOrRelease(sgID, 0); err != nil || !ok {
		t.Fatalf("SyncGuard release: %v %v", ok, err)
	}
	// A new acquire of the SyncGuard key continues its fence.
	if r, err := s.Acquire(c, store.AcquireRequest{Key: "sg-key", TTL: time.Minute}); err != nil || !r.OK || r.Fence != 2 {
		t.Fatalf("Acquire after SyncGuard's release = %v, %v; want fence 2", r, err)
	}

	// Down to 0 with DropTables drops them: only when asked.
	migrateTo(t, pool, pg.Config{}, 0, true)
	if got := snapshot(t, pool, schema); got != "" {
		t.Fatalf("down to 0 with DropTables left:\n%s", got)
	}
}

// Each migration file, run on its own as a migration tool would (with the
// tool's own bookkeeping, not SetupSchema's), goes up and down; down of
// migration 1 keeps the tables without pglease.drop_tables and drops them
// with it.
func TestMigrationSQLStandalone(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t)
	c := ctx(t)
	ms := migrations(t, pg.Config{}, "migrations")
	if len(ms) != migrate.Latest {
		t.Fatalf("%d migrations, SchemaVersion %d", len(ms), migrate.Latest)
	}
	s, err := newEnv(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		if m.version != i+1 || m.name == "" {
			t.Fatalf("migration %d: %+v", i, m)
		}
		if _, err := pool.Exec(c, m.up); err != nil {
			t.Fatalf("up %d: %v", m.version, err)
		}
		if v, _ := version(t, s); v != m.version {
			t.Fatalf("up %d recorded %d", m.version, v)
		}
	}
	full := snapshot(t, pool, schema)
	if err := s.mg.Check(c); err != nil {
		t.Fatal(err)
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if _, err := pool.Exec(c, ms[i].down); err != nil {
			t.Fatalf("down %d: %v", ms[i].version, err)
		}
		if v, _ := version(t, s); v != ms[i].version-1 {
			t.Fatalf("down %d recorded %d", ms[i].version, v)
		}
	}
	if got := snapshot(t, pool, schema); !strings.Contains(got, "syncguard_locks") || strings.Contains(got, "function") {
		t.Fatalf("after all downs:\n%s", got)
	}
	// schema.sql is all the ups.
	if _, err := pool.Exec(c, sqlFile(t, pg.Config{}, "schema.sql")); err != nil {
		t.Fatal(err)
	}
	if got := snapshot(t, pool, schema); got != full {
		t.Fatalf("schema.sql:\n%s\nwant:\n%s", got, full)
	}
	// The explicit drop, the way a tool user asks for it: a session setting.
	conn, err := pool.Acquire(c)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(c, "SET pglease.drop_tables = 'on'"); err != nil {
		t.Fatal(err)
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if _, err := conn.Exec(c, ms[i].down); err != nil {
			t.Fatalf("down %d: %v", ms[i].version, err)
		}
	}
	if _, err := conn.Exec(c, "RESET pglease.drop_tables"); err != nil {
		t.Fatal(err)
	}
	if got := snapshot(t, pool, schema); got != "" {
		t.Fatalf("after downs with pglease.drop_tables = on:\n%s", got)
	}
}

// A database set up by SetupSchema before schema versions (v0), with a
// live lease held through v0's functions, upgrades in place: the lease
// stays held and its fence continues, v0's functions are gone, and the
// result equals a fresh install.
func TestUpgradeFromV0(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	fresh, freshSchema := pgtest.Pool(t)
	fs, err := newEnv(fresh, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.mg.Up(c); err != nil {
		t.Fatal(err)
	}
	want := snapshot(t, fresh, freshSchema)

	for _, how := range []string{"SetupSchema", "Migrate", "migration files"} {
		t.Run(how, func(t *testing.T) {
			pool, schema := pgtest.Pool(t)
			if _, err := pool.Exec(c, schemaV0); err != nil {
				t.Fatal(err)
			}
			v0fn := strings.Split(strings.Split(schemaV0, `FUNCTION "pglease_acquire_`)[1], `"`)[0]
			var fence int64
			var id = keys.NewLockID()
			if err := pool.QueryRow(c, `SELECT o_fence FROM "pglease_acquire_`+v0fn+`"($1, $1, $2, $3, $4)`,
				[]string{"held"}, []string{"fence:held"}, []string{id}, []int64{60000}).Scan(&fence); err != nil || fence != 1 {
				t.Fatalf("v0 acquire: %v %v", fence, err)
			}
			s, err := newEnv(pool, pg.Config{})
			if err != nil {
				t.Fatal(err)
			}
			var se *migrate.SchemaError
			if _, err := s.Acquire(c, store.AcquireRequest{Key: "other", TTL: time.Minute}); !errors.As(err, &se) || se.Found != 0 || !errors.Is(err, pglease.ErrInvalidArgument) {
				t.Fatalf("Acquire on v0 = %v, want a SchemaError with Found 0", err)
			}
			switch how {
			case "SetupSchema":
				err = s.mg.Up(c)
			case "Migrate":
				err = s.mg.To(c, migrate.Latest)
			default:
				for _, m := range migrations(t, pg.Config{}, "migrations") {
					if _, err = pool.Exec(c, m.up); err != nil {
						break
					}
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := snapshot(t, pool, schema); got != want {
				t.Fatalf("upgraded v0:\n%s\nwant (fresh install):\n%s", got, want)
			}
			if r, err := s.Acquire(c, store.AcquireRequest{Key: "held", TTL: time.Minute}); err != nil || r.OK {
				t.Fatalf("Acquire of the key v0 holds = %v, %v; want locked", r, err)
			}
			info, err := s.LookupByID(c, id)
			if err != nil || info == nil || info.Fence != 1 || info.Holder != "" {
				t.Fatalf("LookupByID of v0's lease = %v, %v", info, err)
			}
			if ok, err := s.Release(c, id); err != nil || !ok {
				t.Fatalf("Release of v0's lease = %v, %v", ok, err)
			}
			if r, err := s.Acquire(c, store.AcquireRequest{Key: "held", TTL: time.Minute}); err != nil || !r.OK || r.Fence != 2 {
				t.Fatalf("Acquire after release = %v, %v; want fence 2", r, err)
			}
		})
	}
}

// The Store checks the schema before its first acquire and says how to
// migrate; a newer schema that still serves this version is accepted,
// one that does not asks for a newer pglease.
func TestSchemaCheck(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Pool(t)
	c := ctx(t)
	s, err := newEnv(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	wantFound := func(s *env, found int, msg string) {
		t.Helper()
		_, err := s.Acquire(c, store.AcquireRequest{Key: "k", TTL: time.Minute})
		var se *migrate.SchemaError
		if !errors.As(err, &se) || se.Found != found || se.Want != migrate.Latest || !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Fatalf("Acquire = %v, want SchemaError Found %d", err, found)
		}
		if !strings.Contains(err.Error(), msg) {
			t.Fatalf("error %q does not say %q", err, msg)
		}
		if err := s.mg.Check(c); !errors.As(err, &se) || se.Found != found {
			t.Fatalf("CheckSchema = %v", err)
		}
	}
	wantFound(s, 0, "pglease migrate")
	for v := 1; v < migrate.Latest; v++ {
		s.to(t, v)
		wantFound(s, v, "pglease migrate")
	}
	s.to(t, migrate.Latest)
	if r, err := s.Acquire(c, store.AcquireRequest{Key: "k", TTL: time.Minute}); err != nil || !r.OK {
		t.Fatalf("Acquire at the current version = %v, %v", r, err)
	}

	// A future version that still serves this one, then one that does not.
	next := migrate.Latest + 1
	record := func(v, from int) {
		t.Helper()
		if _, err := pool.Exec(c, fmt.Sprintf(`DO $$ DECLARE f text; BEGIN
			SELECT p.oid::regprocedure::text INTO f FROM pg_proc p WHERE p.proname LIKE 'pglease\_schema\_%%' AND p.pronamespace = current_schema()::regnamespace;
			EXECUTE format('CREATE OR REPLACE FUNCTION %%s(OUT version integer, OUT compatible_from integer) LANGUAGE sql AS $f$ SELECT %d, %d $f$', replace(f, '()', ''));
			END $$`, v, from)); err != nil {
			t.Fatal(err)
		}
	}
	record(next, migrate.Latest)
	s2, _ := newEnv(pool, pg.Config{})
	if r, err := s2.Acquire(c, store.AcquireRequest{Key: "k2", TTL: time.Minute}); err != nil || !r.OK {
		t.Fatalf("Acquire on a newer schema that serves this version = %v, %v", r, err)
	}
	if err := s2.mg.Up(c); err != nil {
		t.Fatalf("SetupSchema on a newer compatible schema = %v", err)
	}
	if err := s2.mg.To(c, 1); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("Migrate down from an unknown version = %v", err)
	}
	record(next, next)
	s3, _ := newEnv(pool, pg.Config{})
	wantFound(s3, next, "upgrade pglease")
	if err := s3.mg.Up(c); !strings.Contains(fmt.Sprint(err), "upgrade pglease") {
		t.Fatalf("SetupSchema on an incompatible newer schema = %v", err)
	}
	// The Store that already checked keeps working (it checked at start).
	if r, err := s.Acquire(c, store.AcquireRequest{Key: "k3", TTL: time.Minute}); err != nil || !r.OK {
		t.Fatalf("Acquire on the checked Store = %v, %v", r, err)
	}
	// Bad targets: no I/O needed to refuse.
	for _, v := range []int{-1, migrate.Latest + 1} {
		if err := s.mg.To(c, v); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Fatalf("Migrate(%d) = %v", v, err)
		}
	}
}

// The holder identity: recorded per grant, overridable, shown by Lookup,
// gone with the release, and never shown for a lease SyncGuard took over
// from a pglease holder.
func TestHolderIdentity(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Pool(t)
	c := ctx(t)
	s, err := newEnv(pool, pg.Config{Holder: "billing-worker on web-3"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.mg.Up(c); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(store.DefaultHolder(), "[") || !strings.Contains(store.DefaultHolder(), "]@") {
		t.Fatalf("DefaultHolder = %q, want program[pid]@host", store.DefaultHolder())
	}
	for _, bad := range []string{strings.Repeat("x", store.MaxHolderBytes+1), "a\nb", "\xff"} {
		if _, err := newEnv(pool, pg.Config{Holder: bad}); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Fatalf("New(Holder %q) = %v", bad, err)
		}
	}
	r, err := s.Acquire(c, store.AcquireRequest{Key: "job", TTL: 300 * time.Millisecond})
	if err != nil || !r.OK {
		t.Fatal(r, err)
	}
	if info, err := s.LookupByKey(c, "job"); err != nil || info == nil || info.Holder != "billing-worker on web-3" {
		t.Fatalf("LookupByKey = %v, %v", info, err)
	}
	// It expires; SyncGuard takes the key over (its upsert leaves our
	// holder row behind).
	waitServer(t, pool, r.ExpiresAt.UnixMilli()+keys.TimeToleranceMs+5)
	sg := pgtest.NewSyncGuard(t, pool)
	sgID, ok, err := sg.Acquire("job", time.Minute)
	if err != nil || !ok {
		t.Fatalf("SyncGuard takeover: %v %v", ok, err)
	}
	info, err := s.LookupByID(c, sgID)
	if err != nil || info == nil || info.Holder != "" || info.Fence != 2 {
		t.Fatalf("LookupByID of SyncGuard's grant = %v, %v; want no holder", info, err)
	}
	if ok, err := sg.ExtendOrRelease(sgID, 0); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// Another pglease process takes it: its own identity.
	s2, _ := newEnv(pool, pg.Config{})
	r2, err := s2.Acquire(c, store.AcquireRequest{Key: "job", TTL: time.Minute})
	if err != nil || !r2.OK {
		t.Fatal(r2, err)
	}
	if info, err := s.LookupByKey(c, "job"); err != nil || info == nil || info.Holder != store.DefaultHolder() {
		t.Fatalf("LookupByKey = %v, %v", info, err)
	}
	if ok, err := s2.Release(c, r2.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// The released lease's holder row stays (cheaper next grant) but is
	// never shown: the next grant by SyncGuard has no holder.
	var n int
	if err := pool.QueryRow(c, "SELECT count(*) FROM syncguard_locks_holders").Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d holder rows after release, %v", n, err)
	}
	sgID, ok, err = sg.Acquire("job", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if info, err := s.LookupByID(c, sgID); err != nil || info == nil || info.Holder != "" {
		t.Fatalf("LookupByID after a released pglease grant = %v, %v; want no holder", info, err)
	}
	if ok, err := sg.ExtendOrRelease(sgID, 0); err != nil || !ok {
		t.Fatal(ok, err)
	}
}

// Going down with a release trigger installed keeps the hashKey function
// the trigger calls, so SyncGuard's releases (DELETEs) keep working.
func TestMigrateDownKeepsReleaseTrigger(t *testing.T) {
	t.Parallel()
	s, pool, _ := newSuperStore(t, pg.Config{})
	c := ctx(t)
	ch := pgtest.RandomName("trg")
	if err := s.mg.SetupReleaseTrigger(c, ch); err != nil {
		t.Fatal(err)
	}
	sg := pgtest.NewSyncGuard(t, pool)
	for _, v := range []int{1, 0} {
		s.to(t, v)
		id, ok, err := sg.Acquire("k", time.Minute)
		if err != nil || !ok {
			t.Fatalf("SyncGuard acquire at %d: %v %v", v, ok, err)
		}
		if ok, err := sg.ExtendOrRelease(id, 0); err != nil || !ok {
			t.Fatalf("SyncGuard release with the trigger at version %d: %v %v", v, ok, err)
		}
	}
	if err := s.mg.DropReleaseTrigger(c); err != nil {
		t.Fatal(err)
	}
	s.to(t, 1)
	s.to(t, 0)
	var n int
	if err := pool.QueryRow(c, "SELECT count(*) FROM pg_proc WHERE pronamespace = current_schema()::regnamespace").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d functions left at version 0 without the trigger (%v)", n, err)
	}
}

// ListLeases: live rows first with counts of all, filters by key and
// lockId, works on SyncGuard's tables alone (no holder table), and
// rejects bad options before any I/O.
func TestListLeases(t *testing.T) {
	t.Parallel()
	var cnt pgtest.Recorder
	s, pool, _ := newSuperStore(t, pg.Config{}, cnt.Configure)
	c := ctx(t)
	short := mustAcquire(t, s, "short", 300*time.Millisecond)
	_ = short
	long := mustAcquire(t, s, "long", time.Minute)
	list, err := s.ListLeases(c, store.ListOptions{})
	if err != nil || list.Total != 2 || list.Live != 2 || len(list.Rows) != 2 || !list.HolderKnown {
		t.Fatalf("ListLeases = %+v, %v", list, err)
	}
	waitServer(t, pool, list.Now.UnixMilli()+300+keys.TimeToleranceMs+5)
	list, err = s.ListLeases(c, store.ListOptions{Limit: 1})
	if err != nil || list.Total != 2 || list.Live != 1 || len(list.Rows) != 1 || list.Rows[0].Key != "long" ||
		list.Rows[0].Holder != store.DefaultHolder() || !list.Rows[0].Live {
		t.Fatalf("ListLeases(Limit 1) = %+v, %v", list, err)
	}
	var adv int64
	if err := pool.QueryRow(c, "SELECT hashtext('long')::bigint").Scan(&adv); err != nil || list.Rows[0].AdvisoryKey != adv {
		t.Fatalf("AdvisoryKey %d, want %d (%v)", list.Rows[0].AdvisoryKey, adv, err)
	}
	if got := fmt.Sprint(list.Rows[0]); strings.Contains(got, "long") || strings.Contains(got, long) {
		t.Fatalf("LeaseRow prints raw fields: %s", got)
	}
	for _, o := range []store.ListOptions{{Key: "short"}, {LockID: short}} {
		l, err := s.ListLeases(c, o)
		if err != nil || l.Total != 1 || l.Live != 0 || len(l.Rows) != 1 || l.Rows[0].Key != "short" || l.Rows[0].Live {
			t.Fatalf("ListLeases(%+v) = %+v, %v", o, l, err)
		}
	}
	if f, ok, err := s.FenceCounter(c, "long"); err != nil || !ok || f != 1 {
		t.Fatalf("FenceCounter = %v %v %v", f, ok, err)
	}
	if _, ok, err := s.FenceCounter(c, "never"); err != nil || ok {
		t.Fatalf("FenceCounter(never) = %v %v", ok, err)
	}
	s.to(t, 1) // no holder table
	if l, err := s.ListLeases(c, store.ListOptions{}); err != nil || l.HolderKnown || l.Total != 2 || l.Rows[0].Holder != "" {
		t.Fatalf("ListLeases without the holder table = %+v, %v", l, err)
	}
	cnt.Reset()
	for _, o := range []store.ListOptions{{Limit: -1}, {Limit: store.MaxBatch + 1}, {Key: "a", LockID: short}, {LockID: "bad"}, {Key: strings.Repeat("x", 600)}} {
		if _, err := s.ListLeases(c, o); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Fatalf("ListLeases(%+v) = %v", o, err)
		}
	}
	if _, _, err := s.FenceCounter(c, ""); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatal(err)
	}
	if n := cnt.Queries() + cnt.Writes(); n != 0 {
		t.Fatalf("%d queries/writes for bad options", n)
	}
}

// A Store remembers the schema checks of this process per target (so a
// Store built per transaction does not check again), and a migration
// forgets them: after a Store on the pool checked, a migration down to 3
// makes Stores built afterwards, on the pool or a transaction, fail with
// the SchemaError instead of calling functions that are gone.
func TestMigrationForgetsSchemaChecks(t *testing.T) {
	t.Parallel()
	e, pool, _ := newSuperStore(t, pg.Config{})
	c := ctx(t)
	r, err := e.Acquire(c, store.AcquireRequest{Key: "forget", TTL: time.Minute})
	if err != nil || !r.OK {
		t.Fatalf("Acquire on the current schema = %+v, %v", r, err)
	}
	if _, err := e.Release(c, r.LockID); err != nil {
		t.Fatal(err)
	}
	migrateTo(t, pool, pg.Config{}, 3, false)
	tx, err := pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(c) }()
	for _, db := range []pg.DB{pool, tx} {
		s, err := pg.New(db, pg.Config{})
		if err != nil {
			t.Fatal(err)
		}
		var se *migrate.SchemaError
		if _, err := s.Acquire(c, "forget", time.Minute); !errors.As(err, &se) || se.Found != 3 {
			t.Fatalf("Acquire on %T after a migration down to 3 = %v; want the SchemaError (found 3)", db, err)
		}
	}
}
