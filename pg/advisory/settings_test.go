package advisory

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestSessionOverridesRoleTimeouts: role defaults that would end or
// cancel a lock connection (idle_session_timeout, statement_timeout,
// lock_timeout) are overridden on the Session's connection, and the
// keepalive settings are in force.
func TestSessionOverridesRoleTimeouts(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, 20*time.Second)
	role := pgtest.RandomName("hostile_")
	sc := superConn(t)
	pg14 := serverMajor(t) >= 14 // idle_session_timeout is 14+
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN",
		// 1 s, not less: on a loaded machine a pooled connection can sit
		// idle that long before Open's first statement, and the server
		// would end it first. That the Session overrides it is checked by
		// its value below.
		"ALTER ROLE " + role + " SET idle_session_timeout = '1s'",
		"ALTER ROLE " + role + " SET idle_in_transaction_session_timeout = '100ms'",
		// Long enough for Open's first statement (which runs under it) on a
		// loaded machine; the wait below outlasts it twice.
		"ALTER ROLE " + role + " SET statement_timeout = '1s'",
		"ALTER ROLE " + role + " SET lock_timeout = '10ms'",
	} {
		if !pg14 && strings.Contains(q, "idle_session_timeout") {
			continue
		}
		if _, err := sc.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		_, _ = sc.Exec(context.Background(), "DROP ROLE "+role)
	})
	o := testOpts()
	o.waitSlice = 5 * time.Second // one wait, longer than the role's timeouts
	o.ProbeInterval = o.waitSlice
	s := openSession(t, pool, o)

	s.sem <- struct{}{}
	got := map[string]string{}
	for _, name := range []string{"idle_session_timeout", "idle_in_transaction_session_timeout", "statement_timeout",
		"lock_timeout", "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout"} {
		if !pg14 && name == "idle_session_timeout" {
			continue
		}
		var v string
		if err := s.conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			<-s.sem
			t.Fatal(err)
		}
		got[name] = v
	}
	<-s.sem
	want := map[string]string{
		"idle_session_timeout": "25s", "idle_in_transaction_session_timeout": "0", "statement_timeout": "0",
		"lock_timeout": "5s", "tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5",
		"tcp_keepalives_count": "4", "tcp_user_timeout": "25000",
	}
	if !pg14 {
		delete(want, "idle_session_timeout") // the server has none: the Session sets it only where it exists
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}

	// Behaviour: a wait longer than the role's statement_timeout and
	// lock_timeout succeeds.
	other := openSession(t, pool, o)
	k := randKey()
	lh, ok, err := other.TryLock(ctx, k)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	done := make(chan error, 1)
	go func() {
		l, err := s.Lock(ctx, k)
		if err == nil {
			err = l.Release(ctx)
		}
		done <- err
	}()
	var firstSeen time.Time // the wait's start where pg_locks has no waitstart (before 14): a lower bound
	waitFor(t, "the waiter to wait past the role's timeouts", func() bool {
		infos, err := Inspect(ctx, sc, nil) // not the hostile role's pool: its statement_timeout applies
		if err != nil {
			t.Fatal(err)
		}
		for _, li := range infos {
			if li.PID == s.BackendPID() && !li.Granted {
				since := li.WaitStart
				if since.IsZero() {
					if firstSeen.IsZero() {
						firstSeen = time.Now()
					}
					since = firstSeen
				}
				if time.Since(since) > 2*time.Second {
					return true
				}
			}
		}
		return false
	})
	_ = lh.Release(ctx)
	if err := <-done; err != nil {
		t.Fatalf("Lock under hostile role defaults: %v", err)
	}
	if s.Err() != nil {
		t.Fatal(s.Err())
	}
}

// TestBackendPIDChangeIsLoss: white-box — when the probe sees another
// backend pid (a transaction-mode pooler switched server connections),
// the session ends as lost and its connection is closed, freeing the
// locks on the server.
func TestBackendPIDChangeIsLoss(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s, other := openSession(t, pool, testOpts()), openSession(t, pool, testOpts())
	ctx := ctxT(t, 15*time.Second)
	k := randKey()
	l, ok, err := s.TryLock(ctx, k)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	s.sem <- struct{}{}
	s.pid ^= 1 // as if the first check had seen another backend
	<-s.sem
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("pid change not detected")
	}
	c := context.Cause(l.Context())
	if !errors.Is(c, pglease.ErrLockLost) || !errors.Is(c, errPooler) {
		t.Fatalf("cause = %v", c)
	}
	lo, err := other.Lock(ctx, k)
	if err != nil {
		t.Fatalf("lock not freed on the server: %v", err)
	}
	_ = lo.Release(ctx)
}
