package store_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
	_ "github.com/pglease/pglease/pg/migrate" // sets store.Setup, which pgtest sets schemas up with
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
func newStore(t testing.TB, cfg store.Config, configure ...func(*pgxpool.Config)) (*store.Store, *pgxpool.Pool, string) {
	t.Helper()
	if cfg.LockTable != "" || cfg.FenceTable != "" {
		return newSuperStore(t, cfg, configure...)
	}
	pool, rs := pgtest.RuntimePool(t, configure...)
	s, err := store.New("pg.New", pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, pool, rs.Schema
}

// newSuperStore is newStore as the harness's superuser, which also set
// up the schema: for tests whose subject is a schema change the runtime
// role may not make (the release trigger, migrations) or whose setup
// does DDL through the Store's pool.
func newSuperStore(t testing.TB, cfg store.Config, configure ...func(*pgxpool.Config)) (*store.Store, *pgxpool.Pool, string) {
	t.Helper()
	pool, schema := pgtest.LeasePool(t, cfg, configure...)
	s, err := store.New("pg.New", pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.MarkChecked()
	return s, pool, schema
}

func ctx(t testing.TB) context.Context { return pgtest.Ctx(t) }

// serverNow returns the server's clock_timestamp in ms.
func serverNow(t testing.TB, db testDB) int64 { t.Helper(); return pgtest.ServerNowMs(t, db) }

// waitServer polls until the server clock reaches ms.
func waitServer(t testing.TB, db testDB, ms int64) { t.Helper(); pgtest.WaitServerMs(t, db, ms) }

// testDB is what the tests' own statements run on (a pool, a connection,
// a transaction).
type testDB = pgtest.Querier

// setupSchema migrates s's tables to the current version with package
// pg/migrate, as the Manager's SetupSchema does (which then spares the
// store its own check).
func setupSchema(s *store.Store, ctx context.Context) error {
	if err := store.Setup.Install(ctx, s.DBForTest(), s.ConfigForTest()); err != nil {
		return err
	}
	s.MarkChecked()
	return nil
}
