package migrate_test

import (
	"context"
	"io/fs"
	"path"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The package's short names for pgtest's helpers (the one set the
// store, pg and pg/migrate tests share).
var maxConns = pgtest.MaxConns

func ctx(t testing.TB) context.Context { return pgtest.Ctx(t) }

// testDB is what the tests' own statements run on (a pool, a connection,
// a transaction).
type testDB = pgtest.Querier

// env is a Migrator and the lease store on the same tables and DB: the
// schema under test and the operations that use it.
type env struct {
	*store.Store
	mg *migrate.Migrator
}

func newEnv(db pg.DB, cfg pg.Config) (*env, error) {
	s, err := store.New("pg.New", db, store.Config(cfg))
	if err != nil {
		return nil, err
	}
	mg, err := migrate.New(db, cfg)
	if err != nil {
		return nil, err
	}
	return &env{Store: s, mg: mg}, nil
}

// newSuperStore is an env on a fresh schema, set up, as the harness's
// superuser (tests of schema changes).
func newSuperStore(t testing.TB, cfg pg.Config, configure ...func(*pgxpool.Config)) (*env, *pgxpool.Pool, string) {
	t.Helper()
	pool, schema := pgtest.Pool(t, configure...)
	e, err := newEnv(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.mg.Up(ctx(t)); err != nil {
		t.Fatal(err)
	}
	return e, pool, schema
}

// migrateTo runs To(target) on a connection of pool; with drop, that
// session first sets pglease.drop_tables = 'on'.
func migrateTo(t testing.TB, pool *pgxpool.Pool, cfg pg.Config, target int, drop bool) {
	t.Helper()
	if err := migrateToErr(ctx(t), pool, cfg, target, drop); err != nil {
		t.Fatalf("To(%d, drop tables %v): %v", target, drop, err)
	}
}

func migrateToErr(c context.Context, pool *pgxpool.Pool, cfg pg.Config, target int, drop bool) error {
	conn, err := pool.Acquire(c)
	if err != nil {
		return err
	}
	defer conn.Release()
	if drop {
		if _, err := conn.Exec(c, "SET pglease.drop_tables = 'on'"); err != nil {
			return err
		}
		defer conn.Exec(context.Background(), "RESET pglease.drop_tables") //nolint:errcheck
	}
	mg, err := migrate.New(conn, cfg)
	if err != nil {
		return err
	}
	return mg.To(c, target)
}

// migration is one numbered migration of migrate.SQL.
type migration struct {
	version  int
	name     string
	up, down string
}

// migrations returns migrate.SQL(cfg)'s numbered migrations (dir
// "migrations", or "designs/migrations"), oldest first.
func migrations(t testing.TB, cfg pg.Config, dir string) []migration {
	t.Helper()
	fsys, err := migrate.SQL(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ups, err := fs.Glob(fsys, dir+"/*.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	var out []migration
	for i, p := range ups {
		base := strings.TrimSuffix(path.Base(p), ".up.sql")
		up, err := fs.ReadFile(fsys, p)
		if err != nil {
			t.Fatal(err)
		}
		down, err := fs.ReadFile(fsys, path.Join(dir, base+".down.sql"))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, migration{version: i + 1, name: base[5:], up: string(up), down: string(down)})
	}
	return out
}

// sqlFile returns one file of migrate.SQL(cfg).
func sqlFile(t testing.TB, cfg pg.Config, name string) string {
	t.Helper()
	fsys, err := migrate.SQL(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// to runs the env's To(v), failing the test on an error.
func (e *env) to(t testing.TB, v int) {
	t.Helper()
	if err := e.mg.To(ctx(t), v); err != nil {
		t.Fatalf("To(%d): %v", v, err)
	}
}

// waitServer polls until the server clock reaches ms.
func waitServer(t testing.TB, db testDB, ms int64) { t.Helper(); pgtest.WaitServerMs(t, db, ms) }
