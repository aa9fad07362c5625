package tooltest

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	pgmigrate "github.com/pglease/pglease/pg/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// env is a fresh schema: a pool and a database/sql handle whose
// search_path is that schema, a Store and a Migrator on it.
type env struct {
	schema string
	pool   *pgxpool.Pool
	db     *sql.DB
	store  *pg.Store
	mg     *pgmigrate.Migrator
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool, schema := pgtest.Pool(t)
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = schema
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	s, err := pg.New(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	mg, err := pgmigrate.New(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{schema: schema, pool: pool, db: db, store: s, mg: mg}
}

// snapshot lists the schema's tables, columns, indexes and functions (with
// a hash of their bodies, in which the schema's name is replaced: the
// guard's trigger function names its tables with it), ignoring the tools'
// own bookkeeping tables.
func (e *env) snapshot(t *testing.T) string {
	t.Helper()
	rows, err := e.pool.Query(ctx(t), `
SELECT 'column ' || c.table_name || '.' || c.column_name || ' ' || c.data_type
  FROM information_schema.columns c WHERE c.table_schema = $1 AND c.table_name NOT LIKE '%migration%' AND c.table_name NOT LIKE 'goose%'
UNION ALL
SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename NOT LIKE '%migration%' AND tablename NOT LIKE 'goose%'
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(replace(p.prosrc, $1, 'SCHEMA')) FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
ORDER BY 1`, e.schema)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(strings.Join(lines, "\n"), e.schema+".", "")
}

// check asserts the Store's view: the recorded version and, at the
// current version, a working acquire.
func (e *env) check(t *testing.T, want int) {
	t.Helper()
	v, _, err := e.mg.Version(ctx(t))
	if err != nil || v != want {
		t.Fatalf("schema version %d, %v; want %d", v, err, want)
	}
	if want == pgmigrate.Latest {
		if err := e.mg.Check(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// fresh is the snapshot Up leaves, to compare the tools' result with.
func fresh(t *testing.T) string {
	e := newEnv(t)
	if err := e.mg.Up(ctx(t)); err != nil {
		t.Fatal(err)
	}
	return e.snapshot(t)
}

func TestGoose(t *testing.T) {
	t.Parallel()
	want := fresh(t)
	e := newEnv(t)
	c := ctx(t)
	sub, err := fs.Sub(files(t), "goose")
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, e.db, sub)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(c); err != nil {
		t.Fatal(err)
	}
	e.check(t, pgmigrate.Latest)
	up := e.snapshot(t)
	if up != want {
		t.Fatalf("goose up:\n%s\nwant (Up):\n%s", up, want)
	}
	// A lease and its fence counter survive down to 0 and up again.
	r, err := e.store.Acquire(c, "k", time.Minute)
	if err != nil || !r.OK {
		t.Fatal(r, err)
	}
	if _, err := p.DownTo(c, 0); err != nil {
		t.Fatal(err)
	}
	e.check(t, 0)
	if got := e.snapshot(t); !strings.Contains(got, "syncguard_fence_counters.fence ") || strings.Contains(got, "function") {
		t.Fatalf("goose down to 0:\n%s", got)
	}
	if _, err := p.Up(c); err != nil {
		t.Fatal(err)
	}
	if got := e.snapshot(t); got != up {
		t.Fatalf("goose up/down/up:\n%s\nwant:\n%s", got, up)
	}
	if res, err := e.store.Acquire(c, "k", time.Minute); err != nil || res.OK {
		t.Fatalf("the lease held before down/up: Acquire = %v, %v", res, err)
	}
	if ok, err := e.store.Release(c, r.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}

	// The optional design functions, with a goose table of their own.
	dsub, err := fs.Sub(files(t), "designs/goose")
	if err != nil {
		t.Fatal(err)
	}
	dp, err := goose.NewProvider(goose.DialectPostgres, e.db, dsub, goose.WithTableName("pglease_design_migrations"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dp.Up(c); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := e.pool.QueryRow(c, "SELECT email_to_lock_id('a@b.c')").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := dp.DownTo(c, 0); err != nil {
		t.Fatal(err)
	}
	if got := e.snapshot(t); got != up {
		t.Fatalf("designs down:\n%s\nwant:\n%s", got, up)
	}
}

func newMigrate(t *testing.T, e *env, dir, table string) *migrate.Migrate {
	t.Helper()
	src, err := iofs.New(files(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := migratepgx.WithInstance(e.db, &migratepgx.Config{MigrationsTable: table})
	if err != nil {
		t.Fatal(err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestGolangMigrate(t *testing.T) {
	t.Parallel()
	want := fresh(t)
	for _, start := range []string{"empty", "v0"} {
		t.Run(start, func(t *testing.T) {
			e := newEnv(t)
			c := ctx(t)
			if start == "v0" {
				// SetupSchema before schema versions, with a held lease.
				if _, err := e.pool.Exec(c, schemaV0(t)); err != nil {
					t.Fatal(err)
				}
				if _, err := e.pool.Exec(c, `INSERT INTO syncguard_locks VALUES ('held', 'AAAAAAAAAAAAAAAAAAAAAA', 9999999999999, 0, '000000000000007', 'held');
					INSERT INTO syncguard_fence_counters VALUES ('fence:held', 7, 'held')`); err != nil {
					t.Fatal(err)
				}
			}
			m := newMigrate(t, e, "migrations", "schema_migrations")
			if err := m.Up(); err != nil {
				t.Fatal(err)
			}
			e.check(t, pgmigrate.Latest)
			up := e.snapshot(t)
			if up != want {
				t.Fatalf("migrate up:\n%s\nwant (Up):\n%s", up, want)
			}
			if err := m.Down(); err != nil {
				t.Fatal(err)
			}
			e.check(t, 0)
			if err := m.Up(); err != nil {
				t.Fatal(err)
			}
			if got := e.snapshot(t); got != up {
				t.Fatalf("migrate up/down/up:\n%s\nwant:\n%s", got, up)
			}
			if start == "v0" {
				r, err := e.store.Acquire(c, "held", time.Minute)
				if err != nil || r.OK {
					t.Fatalf("Acquire of the held key = %v, %v", r, err)
				}
			}
			r, err := e.store.Acquire(c, "other", time.Minute)
			if err != nil || !r.OK {
				t.Fatal(r, err)
			}
			// Designs: a sequence with its own table.
			dm := newMigrate(t, e, "designs/migrations", "pglease_design_migrations")
			if err := dm.Up(); err != nil {
				t.Fatal(err)
			}
			if err := dm.Down(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
				t.Fatal(err)
			}
		})
	}
}

// files is what the tools apply: migrate.SQL for the default names, the
// same files as pg/migrate/sql (a test of package pg/migrate keeps them
// equal).
func files(t *testing.T) fs.FS {
	t.Helper()
	fsys, err := pgmigrate.SQL(pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

// schemaV0 reads pg/migrate/testdata/schema_v0.sql: the schema SetupSchema
// created before schema versions (the one copy, shared with package
// pg/migrate's tests).
func schemaV0(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../testdata/schema_v0.sql")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
