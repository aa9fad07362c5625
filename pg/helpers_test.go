package pg_test

import (
	"context"
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

// newStore returns a Store with its schema set up in a fresh schema. With
// SyncGuard's default table names (what roles.sql grants on), the
// schema is set up by the owner role and the Store and the returned pool
// connect as the runtime role, as in production. With other table names,
// everything runs as the harness's superuser (newSuperStore).
func newStore(t testing.TB, cfg pg.Config, configure ...func(*pgxpool.Config)) (*pg.Store, *pgxpool.Pool, string) {
	t.Helper()
	if cfg.LockTable != "" || cfg.FenceTable != "" {
		return newSuperStore(t, cfg, configure...)
	}
	pool, rs := pgtest.RuntimePool(t, configure...)
	s, err := pg.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, pool, rs.Schema
}

// newSuperStore is newStore as the harness's superuser, which also set
// up the schema: for tests whose subject is a schema change the runtime
// role may not make (the release trigger, migrations) or whose setup
// does DDL through the Store's pool.
func newSuperStore(t testing.TB, cfg pg.Config, configure ...func(*pgxpool.Config)) (*pg.Store, *pgxpool.Pool, string) {
	t.Helper()
	pool, schema := pgtest.LeasePool(t, store.Config(cfg), configure...)
	s, err := pg.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, pool, schema
}

func ctx(t testing.TB) context.Context { return pgtest.Ctx(t) }

// serverNow returns the server's clock_timestamp in ms.
func serverNow(t testing.TB, db testDB) int64 { t.Helper(); return pgtest.ServerNowMs(t, db) }

// testDB is what the tests' own statements run on (a pool, a connection,
// a transaction).
type testDB = pgtest.Querier

// setupSchema migrates cfg's tables on db to the current version.
func setupSchema(t testing.TB, db pg.DB, cfg pg.Config) {
	t.Helper()
	mg, err := migrate.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.Up(ctx(t)); err != nil {
		t.Fatal(err)
	}
}
