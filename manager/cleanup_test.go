package manager

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// TestPoolClosesSoonAfterBlackhole: after a statement of the Manager got
// no answer on a blackholed connection, pgconn cleans the connection up
// in a goroutine of its own (a cancel request on a new connection, then
// Terminate and a drain), which pgxpool.Pool.Close waits for: on a pool
// configured by pg.ConfigurePool (manager.Open, pg.NewPool), that
// clean-up is bounded by the connect timeout and a second per step, not
// pgx's 15 s. Close of the Manager, with a lock held, returns the
// failure to release it (the database cannot be reached).
func TestPoolClosesSoonAfterBlackhole(t *testing.T) {
	t.Parallel()
	proxy := newProxy(t)
	pool, _ := pgtest.RuntimePool(t, func(c *pgxpool.Config) {
		viaProxy(proxy)(c.ConnConfig)
		if err := pg.ConfigurePool(c); err != nil {
			t.Fatal(err)
		}
	})
	m, err := newManager("test", pool, false, Config{StatementTimeout: 2 * time.Second, CloseTimeout: time.Second}, func(m *Manager) {
		m.k.Test = kernel.TestHooks{ListenConfig: viaProxy(proxy)}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	ctx := ctxT(t)
	if err := m.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	lk, err := m.Acquire(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = proxy.Pass() }()
	if err := proxy.Blackhole(); err != nil {
		t.Fatal(err)
	}
	// A statement that gets no answer: its connection is broken, and pgx
	// cleans it up.
	if _, _, err := m.TryAcquire(ctx, "other"); !errors.Is(err, pglease.ErrNetworkTimeout) {
		t.Fatalf("TryAcquire through a blackhole = %v, want NetworkTimeout", err)
	}
	if err := m.Close(ctx); err == nil {
		t.Fatal("Close released a lock through a blackhole")
	}
	_ = lk
	t0 := time.Now()
	pool.Close()
	took := time.Since(t0)
	t.Logf("pool.Close after the Manager's Close: %v", took)
	// pgx's own bound is 15 s from the statement's failure; the bounded
	// clean-up ends within about 3 s of it, before Close has returned.
	if took > 8*time.Second {
		t.Fatalf("pool.Close waited %v for pgx's clean-up of the blackholed connection", took)
	}
}
