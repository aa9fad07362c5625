package manager

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/telemetry"
)

// TestMissingGrantLogsOnce: a runtime role without its grant on the
// shared-hold table fails every acquire with AuthFailed, whose message
// names the roles script; an AcquireAll of 100 keys, then a TryAcquire,
// log one Warn record between them, not one per key.
func TestMissingGrantLogsOnce(t *testing.T) {
	t.Parallel()
	rs := pgtest.RoleSchemaForTest(t)
	ctx := ctxT(t)
	admin := rs.AdminPool(t)
	if err := pgtest.ExecGrants(ctx, admin, "REVOKE ALL ON TABLE "+rs.Schema+".syncguard_locks_shared FROM "+rs.Runtime); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, rs.RuntimeURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	logs := &syncBuffer{}
	m, err := New(pool, Config{Telemetry: telemetry.Config{Logger: slog.New(slog.NewJSONHandler(logs, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = m.Close(c)
	})
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("privlog:%d", i)
	}
	if _, err := m.AcquireAll(ctx, keys); pglease.CodeOf(err) != pglease.CodeAuthFailed || !strings.Contains(err.Error(), "pglease sql roles") {
		t.Fatalf("AcquireAll without the shared-hold grant = %v, want AuthFailed naming `pglease sql roles`", err)
	}
	if _, _, err := m.TryAcquire(ctx, "privlog:try"); pglease.CodeOf(err) != pglease.CodeAuthFailed {
		t.Fatalf("TryAcquire without the shared-hold grant = %v, want AuthFailed", err)
	}
	if n := strings.Count(logs.String(), `"level":"WARN"`); n != 1 {
		t.Errorf("%d Warn records for one missing grant, want 1:\n%s", n, logs)
	}
}
