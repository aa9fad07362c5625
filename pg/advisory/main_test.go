package advisory

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(holderEnv) != "" {
		os.Exit(holderProcess()) // a child started by a test: not a test run
	}
	pgtest.Main(m)
}

// testOpts probe fast so loss tests finish quickly.
func testOpts() *Options {
	return &Options{ProbeInterval: 100 * time.Millisecond, ProbeTimeout: time.Second}
}

// randKey returns a key no other test uses (the package shares one
// database across parallel tests).
func randKey() Key { return Int64(rand.Int64()) }

// newPool returns a pool connecting as the runtime role of roles.sql
// (migrate.RolesSQL: lock operations run without superuser, DDL or
// pg_signal_backend; advisory locks need nothing beyond what every role
// has), closed when the test ends. Fault injection goes through superConn.
func newPool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.RuntimeRoleURL(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func openSession(t testing.TB, pool *pgxpool.Pool, o *Options) *Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Open(ctx, pool, o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// superConn connects to the package database as the harness's role
// (superuser on the throwaway cluster).
func superConn(t testing.TB) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// serverMajor returns the server's PostgreSQL major version (tests skip
// or adapt what older servers lack: idle_session_timeout,
// client_connection_check_interval and pg_locks.waitstart are 14+).
func serverMajor(t testing.TB) int {
	t.Helper()
	var num int
	if err := superConn(t).QueryRow(context.Background(), "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
		t.Fatal(err)
	}
	return num / 10000
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// heldBy reports whether backend pid holds k, according to pg_locks.
func heldBy(t testing.TB, q Querier, pid int32, k Key) bool {
	t.Helper()
	infos, err := Inspect(ctxT(t, 5*time.Second), q, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, li := range infos {
		if li.PID == pid && li.Key == k && li.Granted {
			return true
		}
	}
	return false
}

// waitFor polls cond (a server-side state with no signal to wait on)
// until it holds or 10 s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for d := time.Millisecond; !cond(); d = min(2*d, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(d)
	}
}

func wantCode(t testing.TB, err error, code pglease.Code) {
	t.Helper()
	if pglease.CodeOf(err) != code {
		t.Fatalf("error %v: code %v, want %v", err, pglease.CodeOf(err), code)
	}
	var e *pglease.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not a *pglease.Error", err)
	}
}
