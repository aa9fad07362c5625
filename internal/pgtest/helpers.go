package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest/pgrec"
	"github.com/pglease/pglease/internal/store"
)

// Recorder is the statement recorder the tests share (pgrec.Recorder:
// counts of statements, prepares and network writes, and hooks).
type Recorder = pgrec.Recorder

// Statement is a statement a Recorder saw (pgrec.Statement).
type Statement = pgrec.Statement

// Querier is what a test's own statements run on: a pool, a connection
// or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Ctx returns a context that ends after 30 s or with the test.
func Ctx(tb testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return c
}

// MaxConns is a pool configure function: at most n connections, none
// kept open.
func MaxConns(n int32) func(*pgxpool.Config) {
	return func(cfg *pgxpool.Config) { cfg.MaxConns = n; cfg.MinConns = 0 }
}

// ServerNowMs returns the server's clock_timestamp in Unix milliseconds
// (floored, as the lease functions read it).
func ServerNowMs(tb testing.TB, db Querier) int64 {
	tb.Helper()
	var ms int64
	if err := db.QueryRow(Ctx(tb), "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&ms); err != nil {
		tb.Fatal(err)
	}
	return ms
}

// WaitServerMs polls until the server's clock reaches ms (Unix
// milliseconds); it fails the test after 20 s more.
func WaitServerMs(tb testing.TB, db Querier, ms int64) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		now := ServerNowMs(tb, db)
		if now >= ms {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal("pgtest: the server's clock did not advance")
		}
		time.Sleep(time.Duration(min(ms-now, 50)) * time.Millisecond)
	}
}

// LeasePool is Pool with the lease schema for cfg's table names set up
// in its fresh schema, by the harness's superuser: for tests whose
// subject is a schema change the runtime role may not make, or that use
// other table names than roles.sql grants on (RuntimePool is the
// production-like one). It returns the pool and the schema's name.
func LeasePool(tb testing.TB, cfg store.Config, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, string) {
	tb.Helper()
	mustSetup(tb)
	pool, schema := Pool(tb, configure...)
	if err := store.Setup.Install(Ctx(tb), pool, cfg); err != nil {
		tb.Fatalf("pgtest: set the lease schema up: %v", err)
	}
	return pool, schema
}

// mustSetup fails the test when the lease schema cannot be set up: pgtest
// sits below pg/migrate (whose tests import it), and sets schemas up with
// what pg/migrate registers in the store when it is linked (store.Setup).
func mustSetup(tb testing.TB) {
	tb.Helper()
	if store.Setup.Install == nil || store.Setup.RolesSQL == nil {
		tb.Fatal("pgtest: no lease schema installer: the test binary does not link pg/migrate (import it, blank if need be)")
	}
}
