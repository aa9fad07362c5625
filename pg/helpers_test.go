package pg_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// counter is a pgx QueryTracer and PrepareTracer, plus a count of network
// writes (each round trip starts with one write).
type counter struct {
	queries, prepares, writes atomic.Int64
}

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.queries.Add(1)
	return ctx
}
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *counter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.prepares.Add(1)
	return ctx
}
func (c *counter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (c *counter) reset() { c.queries.Store(0); c.prepares.Store(0); c.writes.Store(0) }

type countingConn struct {
	net.Conn
	c *counter
}

func (w countingConn) Write(b []byte) (int, error) {
	w.c.writes.Add(1)
	return w.Conn.Write(b)
}

// withCounter installs c as tracer and write counter.
func withCounter(c *counter) func(*pgxpool.Config) {
	return func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = c
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{conn, c}, nil
		}
	}
}

func maxConns(n int32) func(*pgxpool.Config) {
	return func(cfg *pgxpool.Config) { cfg.MaxConns = n; cfg.MinConns = 0 }
}

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
	pool, schema := pgtest.Pool(t, configure...)
	s, err := pg.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	setupSchema(t, pool, cfg)
	return s, pool, schema
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// serverNow returns the server's clock_timestamp in ms.
func serverNow(t testing.TB, db testDB) int64 {
	t.Helper()
	var ms int64
	if err := db.QueryRow(ctx(t), "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&ms); err != nil {
		t.Fatal(err)
	}
	return ms
}

// testDB is what the tests' own statements run on (a pool, a connection,
// a transaction).
type testDB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

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
