package kernel

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
	_ "github.com/pglease/pglease/pg/migrate" // sets store.Setup, which pgtest sets schemas up with
)

// TestMain runs the kernel's tests; those on a real store get a throwaway
// PostgreSQL (pgtest) when DATABASE_URL is unset.
func TestMain(m *testing.M) { pgtest.Main(m) }

// waitTimeout is how long a test waits for a signal; scaled in CI.
func waitTimeout() time.Duration {
	if os.Getenv("CI") != "" {
		return 30 * time.Second
	}
	return 15 * time.Second
}

// ctxT is a context for one test's calls, ended with the test.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout())
	t.Cleanup(cancel)
	return ctx
}

// pgKernel starts a kernel as a Manager does (Make, then Start) with cfg
// on a fresh schema of the test server, as its runtime role (the lease
// schema set up by its owner, as the Manager's tests have it), and closes it at the test's end,
// checking that no lock row is left.
func pgKernel(t testing.TB, cfg Config) (*Kernel, *pgxpool.Pool) {
	t.Helper()
	pool, _ := pgtest.RuntimePool(t)
	k, err := Make("test", pool, false, cfg)
	if err != nil {
		t.Fatal(err)
	}
	k.Start()
	t.Cleanup(func() {
		if err := k.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		if n := countLocks(t, pool); n != 0 && !t.Failed() {
			t.Errorf("%d lock rows left after Close", n)
		}
	})
	return k, pool
}

// countLocks counts the live lock rows.
func countLocks(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(),
		"SELECT count(*) FROM syncguard_locks WHERE expires_at_ms > floor(extract(epoch FROM clock_timestamp())*1000)").Scan(&n)
	if err != nil {
		t.Fatalf("count locks: %v", err)
	}
	return n
}
