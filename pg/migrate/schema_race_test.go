package migrate_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// syncGuardSetup is what SyncGuard 2.5.2's setupSchema runs for the
// tables {t} and {f}: its DDL, without pglease's advisory lock.
const syncGuardSetup = `CREATE TABLE IF NOT EXISTS {t} (
  key TEXT PRIMARY KEY,
  lock_id TEXT NOT NULL,
  expires_at_ms BIGINT NOT NULL,
  acquired_at_ms BIGINT NOT NULL,
  fence TEXT NOT NULL,
  user_key TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS idx_{ti}_lock_id ON {t} (lock_id);
CREATE INDEX IF NOT EXISTS idx_{ti}_expires ON {t} (expires_at_ms);
CREATE TABLE IF NOT EXISTS {f} (
  fence_key TEXT PRIMARY KEY,
  fence BIGINT NOT NULL DEFAULT 0,
  key_debug TEXT
);`

// TestSetupSchemaRacesSyncGuard: pglease's SetupSchema (Up) and
// SyncGuard's setupSchema started at once on a fresh schema, each on its
// own connection: the catalog races of their idempotent DDL (23505 on
// pg_type/pg_class, 42P07, 42710) are retried inside SetupSchema, which
// returns nil every time. A few rounds, each on a fresh schema.
func TestSetupSchemaRacesSyncGuard(t *testing.T) {
	t.Parallel()
	const rounds, n = 4, 8
	for round := range rounds {
		pool, schema := pgtest.Pool(t, maxConns(n))
		cfg := pg.Config{LockTable: schema + ".locks", FenceTable: schema + ".fences"}
		sg := strings.NewReplacer("{t}", schema+".locks", "{ti}", "locks", "{f}", schema+".fences").Replace(syncGuardSetup)
		var wg sync.WaitGroup
		ready, start := make(chan struct{}, n), make(chan struct{})
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				conn, err := pool.Acquire(ctx) // one connection each, taken before the start
				if err != nil {
					errs <- err
					ready <- struct{}{}
					return
				}
				defer conn.Release()
				ready <- struct{}{}
				<-start
				if i%2 == 1 {
					// SyncGuard's side: its errors are not pglease's.
					_, _ = conn.Exec(ctx, sg)
					return
				}
				s, err := newEnv(conn.Conn(), cfg)
				if err == nil {
					err = s.mg.Up(ctx)
				}
				if err != nil {
					errs <- fmt.Errorf("SetupSchema %d: %w (retryable %v)", i, err, pglease.Retryable(err))
				}
			}()
		}
		for range n {
			<-ready
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		if t.Failed() {
			return
		}
		s, err := newEnv(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.mg.Check(context.Background()); err != nil {
			t.Fatalf("round %d: schema after the race: %v", round, err)
		}
	}
}
