package manager

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// TestOpenAllPooledConnectionsBroken (found by the soak; dead connections cost one bounded timeout):
// every connection of the pool Open made goes half-open (server side
// closed, client side silent), then the network is back. pgxpool keeps a
// broken connection's slot until pgconn has drained its socket, up to
// 15 s on a silent one, so before pg.ConfigurePool no statement of the Manager
// ran for about 15 s after the network was back (17.1 s / 16.1 s here,
// -race; 3.3 s / 2.3 s with it):
// about a statement timeout (reused at once) or a second per
// broken connection (after a second idle, pgxpool's liveness ping).
func TestOpenAllPooledConnectionsBroken(t *testing.T) {
	t.Parallel()
	const statementTimeout = 3 * time.Second
	// Under 15 s (pgconn's drain) with room for a loaded machine: a
	// statement timeout, then a second per connection.
	const bound = statementTimeout + 7*time.Second
	for _, c := range []struct {
		name    string
		idle    time.Duration
		newPool bool // pg.NewPool given to New, rather than Open
	}{
		{"reused at once", 0, false},
		{"after a second idle", 1200 * time.Millisecond, false},
		{"pg.NewPool given to New", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			proxy := newProxy(t)
			u, err := url.Parse(pgtest.SchemaURL(t))
			if err != nil || u.Host == "" {
				t.Skipf("needs a URL-style DATABASE_URL: %v", err)
			}
			u.Host = proxy.Addr()
			q := u.Query()
			q.Set("pool_max_conns", "4")
			u.RawQuery = q.Encode()
			ctx := ctxT(t)
			mcfg := Config{DisableNotify: true, StatementTimeout: statementTimeout}
			var m *Manager
			if c.newPool {
				pool, err := pg.NewPool(ctx, u.String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close) // after m.Close: cleanups run last-in first-out
				m, err = New(pool, mcfg)
				if err != nil {
					t.Fatal(err)
				}
			} else if m, err = Open(ctx, u.String(), mcfg); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := m.Close(context.Background()); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			if err := m.SetupSchema(ctx); err != nil {
				t.Fatal(err)
			}
			// All four pooled connections open, then broken.
			var conns []*pgxpool.Conn
			for range 4 {
				pc, err := m.k.Pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, pc)
			}
			if err := proxy.HalfOpen(); err != nil {
				t.Fatal(err)
			}
			if err := proxy.Pass(); err != nil { // new connections work
				t.Fatal(err)
			}
			for _, pc := range conns {
				pc.Release()
			}
			time.Sleep(c.idle)
			start := time.Now()
			lk, err := m.Acquire(ctx, "k", WithAcquireTimeout(3*bound))
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				t.Fatalf("release: %v", err)
			}
			t.Logf("uncontended Acquire after all 4 pooled connections broke: %v", took)
			if took >= bound {
				t.Errorf("took %v (bound %v): broken connections kept their pool slots", took, bound)
			}
		})
	}
}
