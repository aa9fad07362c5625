package manager

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// Helpers of the fault-class tests (fault_*_test.go): servers of their own
// (a clock-shifted one, one on a small filesystem), a fenced resource whose
// accepted writes the server logs, and the check that reads that log.

// requireFaultsEnv, when set (CI sets it), turns a missing fault facility
// (libfaketime, mount, PgBouncer) into a failure instead of a skip.
const requireFaultsEnv = "PGLEASE_REQUIRE_FAULTS"

// needFacility skips the test because a facility it needs is missing
// (reason says which and how to get it), or fails it when
// PGLEASE_REQUIRE_FAULTS is set.
func needFacility(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv(requireFaultsEnv) != "" {
		t.Fatalf("%s is set but %s", requireFaultsEnv, reason)
	}
	t.Skip(reason)
}

// ownServer starts a throwaway cluster of the test's own (stopped when
// the test ends) with opts, creates pglease's tables with their default
// names in its postgres database, and returns it with a superuser pool.
// Fault tests that shift the server's clock, fill its disk or change its
// settings run there, never on the package's shared server.
func ownServer(t *testing.T, opts pgtest.Options) (*pgtest.Cluster, *pgxpool.Pool) {
	t.Helper()
	if os.Getenv("DATABASE_URL") != "" && pgtest.ClusterForTest() == nil {
		t.Skip("DATABASE_URL given: this fault test starts a server of its own, which needs PostgreSQL's binaries")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 40
	}
	cl, err := pgtest.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	pool := serverPool(t, cl.URL, 8)
	mg, err := migrate.New(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.Up(ctx); err != nil {
		t.Fatal(err)
	}
	return cl, pool
}

// serverPool returns a pool on url with at most n connections, closed when
// the test ends.
func serverPool(t *testing.T, url string, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// faultManager returns a Manager on pool with cfg, closed when the test
// ends (a Close error is reported, not fatal: some fault tests close it
// while the server is unwell).
func faultManager(t *testing.T, pool *pgxpool.Pool, cfg Config) *Manager {
	t.Helper()
	m, err := New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	return m
}

// fencedResource is a table of rows written only through a fence
// (fault_res: id, fence, val) and a trigger that logs every change the
// server accepted to fault_res_log, in commit order of the row's writes
// (the row lock orders them), with the writer's fence.
type fencedResource struct {
	guard *pg.FenceGuard
}

func newFencedResource(t *testing.T, ctx context.Context, pool *pgxpool.Pool) *fencedResource {
	t.Helper()
	for _, q := range []string{
		`CREATE TABLE fault_res (id text PRIMARY KEY, fence bigint, val bigint NOT NULL DEFAULT 0)`,
		`CREATE TABLE fault_res_log (seq bigserial PRIMARY KEY, id text NOT NULL, fence bigint, val bigint)`,
		`CREATE FUNCTION fault_res_audit() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		   INSERT INTO fault_res_log (id, fence, val) VALUES (NEW.id, NEW.fence, NEW.val);
		   RETURN NEW;
		 END $$`,
		`CREATE TRIGGER fault_res_audit AFTER INSERT OR UPDATE ON fault_res
		 FOR EACH ROW EXECUTE FUNCTION fault_res_audit()`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	g, err := pg.NewFenceGuard("fault_res", "id", "fence")
	if err != nil {
		t.Fatal(err)
	}
	return &fencedResource{guard: g}
}

// write is a correct client's fenced write of val to row id.
func (r *fencedResource) write(ctx context.Context, pool *pgxpool.Pool, id string, fence pglease.Fence, val int64) (bool, error) {
	return r.guard.Upsert(ctx, pool, id, fence, pg.Set{Column: "val", Value: val})
}

// writeIgnoringFence is the broken client of the negative controls: it
// writes with its fence but without the fence's condition, as a client
// that trusts its lease instead of fencing would.
func writeIgnoringFence(ctx context.Context, pool *pgxpool.Pool, id string, fence pglease.Fence, val int64) error {
	_, err := pool.Exec(ctx, `INSERT INTO fault_res (id, fence, val) VALUES ($1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET fence = EXCLUDED.fence, val = EXCLUDED.val`, id, int64(fence), val)
	return err
}

// fencedLogViolations reads the server's log of accepted writes and
// returns one line per write of a row that carried a lower fence than a
// write accepted before it: a stale holder's write landing after its
// successor's (S3 broken). Empty means the resource is consistent.
func fencedLogViolations(t *testing.T, ctx context.Context, pool *pgxpool.Pool) (violations []string, writes int) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT seq, id, fence FROM fault_res_log ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	highest := map[string]int64{}
	for rows.Next() {
		var seq, fence int64
		var id string
		if err := rows.Scan(&seq, &id, &fence); err != nil {
			t.Fatal(err)
		}
		writes++
		if h, ok := highest[id]; ok && fence < h {
			violations = append(violations, fmt.Sprintf("write %d of row %q has fence %d after fence %d was accepted", seq, id, fence, h))
			continue
		}
		highest[id] = fence
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return violations, writes
}
