package manager

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/pgtest/pgrec"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	if os.Getenv(pauseChildEnv) != "" {
		os.Exit(pauseChild())
	}
	if os.Getenv(holdChildEnv) != "" {
		os.Exit(holdChild())
	}
	if os.Getenv(revokeChildEnv) != "" {
		os.Exit(revokeChild())
	}
	if os.Getenv(primChildEnv) != "" {
		os.Exit(primChild())
	}
	pgtest.Main(m)
}

// waitTimeout is how long a test waits for a signal; scaled in CI.
func waitTimeout() time.Duration {
	if os.Getenv("CI") != "" {
		return 30 * time.Second
	}
	return 15 * time.Second
}

// eventually polls cond every 10 ms until it holds, failing the test
// after within (waitTimeout() for most waits). It is the one polling
// helper of the package's tests: a test that can wait for a signal
// (wait, waitFor) does that instead.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wait returns the next value of s, failing the test after waitTimeout.
func wait[T any](t testing.TB, s *kernel.TestSignal[T]) T {
	t.Helper()
	select {
	case v := <-s.Ch:
		return v
	case <-time.After(waitTimeout()):
		t.Fatalf("timed out waiting for a signal")
		panic("unreachable")
	}
}

// handOver checks a hand-over between Managers: it starts waiter's
// Acquire of key (waiting as long as ctx allows), releases held once that
// Acquire is retrying (wsig is waiter's signals), and fails the test with
// notWoken unless the waiter is granted within waitTimeout. It returns how
// long after the release the grant came.
func handOver(t *testing.T, ctx context.Context, held *Lock, waiter *Manager, wsig *kernel.Signals, key, notWoken string) time.Duration {
	t.Helper()
	got := acquireAndRelease(ctx, waiter, key)
	waitFor(t, &wsig.Retrying, func(k string) bool { return k == key })
	t0 := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	expectGrant(t, got, notWoken)
	return time.Since(t0)
}

// acquireAndRelease starts m.Acquire of key (waiting as long as ctx
// allows) and its Release; the channel gets the first error, or nil.
func acquireAndRelease(ctx context.Context, m *Manager, key string) <-chan error {
	got := make(chan error, 1)
	go func() {
		lk, err := m.Acquire(ctx, key)
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	return got
}

// expectGrant fails the test unless got (from acquireAndRelease) reports
// success within waitTimeout; notWoken says what it means if not.
func expectGrant(t testing.TB, got <-chan error, notWoken string) {
	t.Helper()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitTimeout()):
		t.Fatal(notWoken)
	}
}

// waitFor consumes values of s until one satisfies ok.
func waitFor[T any](t testing.TB, s *kernel.TestSignal[T], ok func(T) bool) T {
	t.Helper()
	deadline := time.After(waitTimeout())
	for {
		select {
		case v := <-s.Ch:
			if ok(v) {
				return v
			}
		case <-deadline:
			t.Fatalf("timed out waiting for a signal")
		}
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout())
	t.Cleanup(cancel)
	return ctx
}

// queryCounter returns the tests' one statement recorder (pgrec), to
// install as a pool's tracer, and the count of the statements it saw whose
// SQL contains match ("": every one; e.g. the acquire functions' name, so
// that the heartbeat's extends running meanwhile are not counted) and not
// skip ("": none; e.g. the advisory session's probe, which runs on its own
// schedule).
func queryCounter(match, skip string) (*pgrec.Recorder, *atomic.Int64) {
	n := new(atomic.Int64)
	r := &pgrec.Recorder{OnStart: func(st pgrec.Statement) {
		if (match == "" || strings.Contains(st.SQL, match)) && (skip == "" || !strings.Contains(st.SQL, skip)) {
			n.Add(1)
		}
	}}
	return r, n
}

type bundle struct {
	pool   *pgxpool.Pool // the Manager's: the runtime role's
	admin  *pgxpool.Pool // superuser, same schema: fault injection and DDL only
	schema string
	m      *Manager
	sig    *kernel.Signals
}

type setupOpts struct {
	cfg       Config
	pool      []func(*pgxpool.Config)
	hooks     kernel.TestHooks
	noSignals bool
}

// setup returns a Manager with test signals on a pool whose search_path
// is a fresh schema with the lease tables. The schema was set up by the
// owner role of roles.sql and the pool connects as its runtime role (no
// DDL, no DELETE on the fence table, not superuser), so every
// lock operation of these tests runs as production's runtime role; b.admin
// is the superuser's pool on the same schema, for fault injection. The
// Manager is closed, and the lease table checked empty, when the test
// ends.
func setup(t testing.TB, o setupOpts) *bundle {
	t.Helper()
	pool, rs := pgtest.RuntimePool(t, o.pool...)
	b := &bundle{pool: pool, admin: rs.AdminPool(t), schema: rs.Schema}
	// A connection ready for fault injection: a test's first statement
	// through b.admin must not wait for a connect.
	if err := b.admin.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if !o.noSignals {
		b.sig = &kernel.Signals{}
		b.sig.Init()
	}
	m, err := newManager("test", pool, false, o.cfg, func(m *Manager) {
		m.k.Sig = b.sig
		m.k.Test = o.hooks
	})
	if err != nil {
		t.Fatal(err)
	}
	b.m = m
	// The owner set the schema up; on a current schema SetupSchema only
	// checks its version (no DDL), which the runtime role may do. It also
	// opens the pool's first connection before the test's first acquire.
	if err := m.SetupSchema(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		if n := countLocks(t, pool); n != 0 && !t.Failed() {
			t.Errorf("%d lock rows left after Close", n)
		}
	})
	return b
}

// newPeer returns a second Manager on the same schema (another "process"
// as far as locking goes: own loop, own pool, own listener), with the
// test hooks hooks[0] if given.
func (b *bundle) newPeer(t testing.TB, cfg Config, hooks ...kernel.TestHooks) (*Manager, *kernel.Signals) {
	t.Helper()
	pcfg := b.pool.Config().Copy()
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sig := &kernel.Signals{}
	sig.Init()
	m, err := newManager("test", pool, false, cfg, func(m *Manager) {
		m.k.Sig = sig
		if len(hooks) > 0 {
			m.k.Test = hooks[0]
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("peer Close: %v", err)
		}
	})
	return m, sig
}

// countLocks counts unexpired lease rows. An expired row is not a leak:
// a lease whose holder was declared lost (e.g. a 50 ms lease without
// auto-extend) may find its best-effort release refused after server expiry,
// and its row then stays until the next acquire of the key overwrites it.
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

// lockRow returns whether key has a live row, and its lockId.
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

// waitExtended waits until the heartbeat has moved lk's expiry at least
// by past its expiry from, failing the test after waitTimeout.
func waitExtended(t testing.TB, lk *Lock, from time.Time, by time.Duration) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout())
	for !lk.ExpiresAt().After(from.Add(by)) {
		if err := lk.Err(); err != nil {
			t.Fatalf("lock %q lost while waiting for its heartbeat: %v", lk.Key(), err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock %q: expiry %v, was %v: not extended by %v", lk.Key(), lk.ExpiresAt(), from, by)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drain discards the values s holds now.
func drain[T any](s *kernel.TestSignal[T]) {
	for {
		select {
		case <-s.Ch:
		default:
			return
		}
	}
}
