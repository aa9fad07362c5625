package election

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager"
)

// A candidate process re-executes the test binary with electionChildEnv
// set; TestMain then runs electionChild instead of the tests.
const (
	childURLEnv    = "PGLEASE_ELECTION_CHILD_URL"
	childSchemaEnv = "PGLEASE_ELECTION_CHILD_SCHEMA"
)

func TestMain(m *testing.M) {
	if os.Getenv(electionChildEnv) != "" {
		os.Exit(electionChild())
	}
	pgtest.Main(m)
}

// childPool is the pool of a candidate process: the parent's database
// (childURLEnv) with the test's schema (childSchemaEnv) on its search_path.
func childPool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(os.Getenv(childURLEnv))
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(childSchemaEnv)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// waitTimeout is how long a test waits for something to happen; scaled
// in CI.
func waitTimeout() time.Duration {
	if os.Getenv("CI") != "" {
		return 30 * time.Second
	}
	return 15 * time.Second
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout())
	t.Cleanup(cancel)
	return ctx
}

// bundle is a test's Manager on a pool whose search_path is a fresh
// schema with the lease tables.
type bundle struct {
	pool   *pgxpool.Pool
	schema string
	m      *manager.Manager
}

// setup returns a Manager with cfg on a fresh schema, closed when the
// test ends.
func setup(t testing.TB, cfg manager.Config) *bundle {
	t.Helper()
	pool, schema := pgtest.Pool(t)
	b := &bundle{pool: pool, schema: schema}
	b.m = b.newPeer(t, cfg)
	if err := b.m.SetupSchema(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return b
}

// newPeer returns another Manager on the bundle's pool, closed when the
// test ends (unless the test closed it).
func (b *bundle) newPeer(t testing.TB, cfg manager.Config) *manager.Manager {
	t.Helper()
	m, err := manager.New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := m.Close(ctx); err != nil && !errors.Is(err, pglease.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

// lockRow returns the lock_id of key's live lease, and whether there is one.
func lockRow(t testing.TB, pool *pgxpool.Pool, key string) (string, bool) {
	t.Helper()
	var id string
	err := pool.QueryRow(context.Background(),
		"SELECT lock_id FROM syncguard_locks WHERE key = $1 AND expires_at_ms > floor(extract(epoch FROM clock_timestamp())*1000)", key).Scan(&id)
	if err == pgx.ErrNoRows {
		return "", false
	}
	if err != nil {
		t.Fatalf("lock row: %v", err)
	}
	return id, true
}
