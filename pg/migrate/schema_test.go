package migrate_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// schema.sql for the default names creates SyncGuard's tables and
// indexes by their names.
func TestSchemaFile(t *testing.T) {
	t.Parallel()
	want := sqlFile(t, pg.Config{}, "schema.sql")
	for _, s := range []string{`"syncguard_locks"`, `"syncguard_fence_counters"`, `"idx_syncguard_locks_lock_id"`, `"idx_syncguard_locks_expires"`} {
		if !strings.Contains(want, s) {
			t.Errorf("schema lacks %s", s)
		}
	}
}

// Hostile or invalid names are InvalidArgument at New (pg's and
// migrate's) and SQL, with no query sent.
func TestBadNamesNoIO(t *testing.T) {
	t.Parallel()
	c := &pgtest.Recorder{}
	pool, _ := pgtest.Pool(t, c.Configure)
	c.Reset()
	long := strings.Repeat("a", 64)
	bad := []pg.Config{
		{LockTable: "locks; DROP TABLE x"}, {LockTable: `"locks"`}, {LockTable: "a.b.c"}, {LockTable: long},
		{LockTable: "1abc"}, {LockTable: "lo-cks"}, {LockTable: "s."}, {LockTable: ".t"}, {LockTable: "é"},
		{FenceTable: "f;--"}, {LockTable: "same", FenceTable: "same"}, {LockTable: "s.t", FenceTable: "s.t"},
		{LockTable: "syncguard_fence_counters"}, {NotifyChannel: "ch; x"}, {NotifyChannel: long},
		// An unqualified name may resolve to the qualified one.
		{LockTable: "public.t", FenceTable: "t"}, {LockTable: "t", FenceTable: "s.t"},
		{LockTable: "s.l", FenceTable: "l_holders"}, {LockTable: "l", FenceTable: "s.l_holders"},
	}
	for _, cfg := range bad {
		if _, err := pg.New(pool, cfg); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("pg.New(%+v) err = %v", cfg, err)
		}
		if _, err := migrate.New(pool, cfg); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("migrate.New(%+v) err = %v", cfg, err)
		}
		if _, err := migrate.SQL(cfg); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("SQL(%+v) err = %v", cfg, err)
		}
	}
	for _, db := range []pg.DB{nil, (*pgxpool.Pool)(nil)} { // also a nil *pgxpool.Pool inside the interface
		if _, err := pg.New(db, pg.Config{}); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("pg.New(%#v) err = %v", db, err)
		}
		if _, err := migrate.New(db, pg.Config{}); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("migrate.New(%#v) err = %v", db, err)
		}
	}
	// Different schemas, both qualified: two tables.
	for _, cfg := range []pg.Config{{LockTable: "a.t", FenceTable: "b.t"}, {LockTable: "a.l", FenceTable: "b.l_holders"}} {
		if _, err := newEnv(pool, cfg); err != nil {
			t.Errorf("New(%+v) err = %v", cfg, err)
		}
	}
	// A long but valid name keeps two distinct index names.
	sql := sqlFile(t, pg.Config{LockTable: strings.Repeat("l", 63)}, "schema.sql")
	if strings.Count(sql, "_lock_id\"") != 1 || strings.Count(sql, "_expires\"") != 1 {
		t.Error("long table name: index names lost their suffix")
	}
	if n := c.Queries() + c.Writes(); n != 0 {
		t.Fatalf("%d queries/writes for invalid config, want 0", n)
	}
}

// Eight concurrent SetupSchema calls on a fresh schema all succeed, and the
// result is SyncGuard's schema (columns, types, indexes).
func TestSetupSchemaConcurrentAndShape(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t, maxConns(8))
	s, err := newEnv(pool, pg.Config{LockTable: schema + ".my_locks", FenceTable: schema + ".my_fences"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	start := make(chan struct{})
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs <- s.mg.Up(ctx(t))
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent SetupSchema: %v", err)
		}
	}
	rows, err := pool.Query(ctx(t), `SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '')
		FROM information_schema.columns WHERE table_schema = $1
		AND table_name IN (SELECT table_name FROM information_schema.tables WHERE table_schema = $1 AND table_type = 'BASE TABLE')
		ORDER BY table_name, ordinal_position`, schema)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var tn, cn, dt, nn, def string
		if err := rows.Scan(&tn, &cn, &dt, &nn, &def); err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.Join([]string{tn, cn, dt, nn, def}, " "))
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	want := []string{
		"my_fences fence_key text NO ", "my_fences fence bigint NO 0", "my_fences key_debug text YES ",
		"my_locks key text NO ", "my_locks lock_id text NO ", "my_locks expires_at_ms bigint NO ",
		"my_locks acquired_at_ms bigint NO ", "my_locks fence text NO ", "my_locks user_key text NO ",
		"my_locks_holders key text NO ", "my_locks_holders lock_id text NO ", "my_locks_holders holder text NO ",
		"my_locks_holders excl_wait_until_ms bigint YES ", "my_locks_holders lock_delay_ms bigint YES ",
		"my_locks_holders delay_until_ms bigint YES ", "my_locks_holders revoked_lock_hash text YES ",
		"my_locks_queue seq bigint NO ", "my_locks_queue key text NO ", "my_locks_queue lock_id text NO ",
		"my_locks_queue fence_key text NO ", "my_locks_queue lim integer YES ", "my_locks_queue set_no bigint YES ",
		"my_locks_queue ttl_ms bigint NO ", "my_locks_queue delay_ms bigint NO ", "my_locks_queue holder text YES ",
		"my_locks_queue channel text NO ", "my_locks_queue enqueued_at_ms bigint NO ", "my_locks_queue expires_at_ms bigint NO ",
		"my_locks_shared lock_id text NO ", "my_locks_shared key text NO ", "my_locks_shared lim integer NO ",
		"my_locks_shared expires_at_ms bigint NO ", "my_locks_shared acquired_at_ms bigint NO ",
		"my_locks_shared fence bigint NO ", "my_locks_shared holder text YES ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("columns:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var idx []string
	rows, err = pool.Query(ctx(t), `SELECT indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY indexname`, schema)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			t.Fatal(err)
		}
		idx = append(idx, strings.ReplaceAll(d, schema+".", ""))
	}
	wantIdx := []string{
		"CREATE INDEX idx_my_locks_expires ON my_locks USING btree (expires_at_ms)",
		"CREATE UNIQUE INDEX idx_my_locks_lock_id ON my_locks USING btree (lock_id)",
		"CREATE INDEX idx_my_locks_queue_key ON my_locks_queue USING btree (key, seq)",
		"CREATE INDEX idx_my_locks_shared_key ON my_locks_shared USING btree (key)",
		"CREATE UNIQUE INDEX my_fences_pkey ON my_fences USING btree (fence_key)",
		"CREATE UNIQUE INDEX my_locks_holders_pkey ON my_locks_holders USING btree (key)",
		"CREATE INDEX my_locks_holders_revoked_lock_hash_idx ON my_locks_holders USING btree (revoked_lock_hash) WHERE (revoked_lock_hash IS NOT NULL)",
		"CREATE UNIQUE INDEX my_locks_pkey ON my_locks USING btree (key)",
		"CREATE UNIQUE INDEX my_locks_queue_lock_id_key ON my_locks_queue USING btree (lock_id)",
		"CREATE UNIQUE INDEX my_locks_queue_pkey ON my_locks_queue USING btree (seq)",
		"CREATE UNIQUE INDEX my_locks_shared_pkey ON my_locks_shared USING btree (lock_id)",
	}
	if strings.Join(idx, "\n") != strings.Join(wantIdx, "\n") {
		t.Fatalf("indexes:\n%s\nwant:\n%s", strings.Join(idx, "\n"), strings.Join(wantIdx, "\n"))
	}
	// Idempotent on an existing schema.
	if err := s.mg.Up(ctx(t)); err != nil {
		t.Fatal(err)
	}
}
