package pgleasetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager"
)

// server is what Start made for one test.
type server struct {
	cluster   *pgtest.Cluster // nil on DATABASE_URL
	base      string          // the server's connection string (no schema)
	appName   string          // the application_name of the pool's connections
	lockTable string
	pool      *pgxpool.Pool // the Manager's

	mu      sync.Mutex
	stopped sync.WaitGroup // StopFor's restarts still to come
}

// servers maps each live Manager made by Start to its server, for the
// fault helpers.
var servers sync.Map // *manager.Manager → *server

// Start gives the test a Manager (made with cfg: the zero Config is fine)
// on a PostgreSQL of its own with pglease's tables and functions set up
// (SetupSchema), and a pool on the same database and schema for the
// test's own tables (not the Manager's: CutConnections leaves it alone, so
// the test's own statements do not fail from a cut aimed at the Manager;
// StopFor stops the server under both). When the
// test ends, t.Cleanup closes the Manager and the pool and removes
// everything Start made.
//
// When DATABASE_URL is set, Start uses that database, in a schema of its
// own (the pool's search_path) that it drops at the end; the role needs
// the CREATE privilege on the database. Otherwise Start runs a throwaway
// server of the test's own: initdb and postgres found on PATH or under
// /usr/lib/postgresql/*/bin, a data directory in a temporary directory
// (copied from one initdb'd once per test binary), a free loopback port;
// run as root, the server runs as the "postgres" (or "nobody") user. It
// stops when the test ends, and with the test process if that is killed.
// Without server binaries Start fails the test saying what to install.
func Start(tb testing.TB, cfg manager.Config) (*manager.Manager, *pgxpool.Pool) {
	tb.Helper()
	ctx := context.Background()
	s := &server{base: os.Getenv("DATABASE_URL"), lockTable: cfg.LockTable}
	if s.lockTable == "" {
		s.lockTable = "syncguard_locks"
	}
	if s.base == "" {
		c, err := pgtest.Start(ctx, pgtest.Options{Template: true, MaxConnections: 100})
		if err != nil {
			tb.Fatalf("pgleasetest: %v", err)
		}
		tb.Cleanup(c.Stop)
		s.cluster, s.base = c, c.URL
	}
	schema := pgtest.RandomName("pgleasetest_")
	s.appName = schema
	if err := s.exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("pgleasetest: create schema: %v", err)
	}
	tb.Cleanup(func() {
		s.stopped.Wait()
		if err := s.exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			tb.Errorf("pgleasetest: drop schema: %v", err)
		}
	})
	// Two pools on the schema: the Manager's, whose connections
	// CutConnections cuts (found by their application_name), and the
	// test's own.
	newPool := func(app string) *pgxpool.Pool {
		pcfg, err := pgxpool.ParseConfig(s.base)
		if err != nil {
			tb.Fatalf("pgleasetest: %v", err)
		}
		pcfg.ConnConfig.RuntimeParams["search_path"] = schema
		pcfg.ConnConfig.RuntimeParams["application_name"] = app
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			tb.Fatalf("pgleasetest: %v", err)
		}
		tb.Cleanup(pool.Close)
		return pool
	}
	s.pool = newPool(s.appName)
	userPool := newPool(schema + "_test")
	m, err := manager.New(s.pool, cfg)
	if err != nil {
		tb.Fatalf("pgleasetest: %v", err)
	}
	servers.Store(m, s)
	tb.Cleanup(func() {
		servers.Delete(m)
		s.stopped.Wait()
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := m.Close(cctx); err != nil && !errors.Is(err, pglease.ErrClosed) {
			tb.Logf("pgleasetest: close: %v", err)
		}
	})
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := m.SetupSchema(sctx); err != nil {
		tb.Fatalf("pgleasetest: set up the schema: %v", err)
	}
	return m, userPool
}

// exec runs sql on a connection of its own to the server.
func (s *server) exec(ctx context.Context, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.base)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

func serverOf(tb testing.TB, m *manager.Manager) *server {
	tb.Helper()
	s, ok := servers.Load(m)
	if !ok {
		tb.Fatalf("pgleasetest: the Manager was not made by pgleasetest.Start (or its test has ended)")
	}
	return s.(*server)
}

// CutConnections closes every connection of m, a Manager made by Start
// (its pool's and its listener's; not those of the pool Start returned),
// on the server side now (pg_terminate_backend), as a network cut or a
// server-side kill would: its statements in flight fail, and it
// reconnects. Leases survive when it reconnects before their trust
// windows end, as they would in production.
func CutConnections(tb testing.TB, m *manager.Manager) {
	tb.Helper()
	s := serverOf(tb, m)
	if err := s.exec(context.Background(),
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()",
		s.appName); err != nil {
		tb.Fatalf("pgleasetest: cut connections: %v", err)
	}
}

// StopFor stops the server of m, a Manager made by Start, at once (an
// immediate shutdown, like a crash) and starts it again d later, in the
// background; it returns once the server is down. Committed data
// survives; the Manager sees an outage. The test's cleanup waits for the
// restart. It needs the throwaway server: with DATABASE_URL set it skips
// the test.
func StopFor(tb testing.TB, m *manager.Manager, d time.Duration) {
	tb.Helper()
	s := serverOf(tb, m)
	if s.cluster == nil {
		tb.Skip("pgleasetest: StopFor needs the throwaway server; DATABASE_URL is set")
	}
	s.mu.Lock() // one stop at a time
	if err := s.cluster.StopServer(true); err != nil {
		s.mu.Unlock()
		tb.Fatalf("pgleasetest: stop the server: %v", err)
	}
	s.stopped.Add(1)
	go func() {
		defer s.stopped.Done()
		defer s.mu.Unlock()
		time.Sleep(d)
		if err := s.cluster.StartServer(context.Background()); err != nil {
			tb.Errorf("pgleasetest: start the server again: %v", err)
		}
	}()
}

// Lose makes lease lost now, as if its lease had expired and been taken
// over: its Context ends with a cause matching pglease.ErrLockLost, its
// Release returns that error, and the key is free for the next holder.
// lease is a lease of NewFake's Locker, or a *manager.Lock of a Manager
// made by Start (Lose deletes its row and makes the Manager extend it at
// once, so the Manager finds it gone). Lose returns once the lease's
// Context has ended.
func Lose(tb testing.TB, lease pglease.Lease) {
	tb.Helper()
	if err := lose(lease); err != nil {
		tb.Fatalf("pgleasetest: %v", err)
	}
}

func lose(lease pglease.Lease) error {
	switch l := lease.(type) {
	case *fakeLease:
		if !l.lose(pgerr.New(pglease.CodeLockLost, "pgleasetest.Lease", "the lease was lost (pgleasetest.Lose)", nil)) {
			return errors.New("Lose: the lease had already ended")
		}
		return nil
	case *manager.Lock:
		return loseReal(l)
	}
	return fmt.Errorf("Lose: a %T is neither a lease of NewFake nor a *manager.Lock", lease)
}

// loseReal deletes l's row, found by its grant's identity, in the
// databases of the live Start servers, and has its Manager extend it
// now: the extend finds no row, so the Manager declares the lease lost.
func loseReal(l *manager.Lock) error {
	if l == nil {
		return errors.New("Lose: a nil *manager.Lock")
	}
	if l.Err() != nil {
		return errors.New("Lose: the lease had already ended")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	deleted := false
	var lastErr error
	servers.Range(func(_, v any) bool {
		s := v.(*server)
		tag, err := s.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier(strings.Split(s.lockTable, ".")).Sanitize()+
			" WHERE encode(sha256(convert_to('pglease grant v1', 'UTF8') || decode('00', 'hex') || convert_to(lock_id, 'UTF8')), 'hex') = $1",
			l.GrantID())
		if err != nil {
			lastErr = err
			return true
		}
		deleted = tag.RowsAffected() == 1
		return !deleted
	})
	if !deleted {
		if lastErr != nil {
			return fmt.Errorf("Lose: delete the lease's row: %w", lastErr)
		}
		return errors.New("Lose: the lease's row is in no database of a live pgleasetest.Start")
	}
	_ = l.Extend(ctx) // finds no row: the lease is lost (or the loss came first)
	select {
	case <-l.Done():
	case <-ctx.Done():
		return errors.New("Lose: the Manager did not declare the lease lost within a minute")
	}
	if c := context.Cause(l.Context()); !errors.Is(c, pglease.ErrLockLost) {
		return fmt.Errorf("Lose: the lease ended for another reason first: %v", c)
	}
	return nil
}

// revoker is a Locker that can revoke: NewFake's and a Manager's.
type revoker interface {
	Revoke(ctx context.Context, key string) (bool, error)
}

// Revoke revokes key's lease on l, a Locker of NewFake or of a Manager
// ((*manager.Manager).Locker), as Manager.Revoke does: the holder's
// Context ends with a cause matching pglease.ErrRevoked (on a Manager,
// once its listener hears of it), its Release returns that error, and the
// key is free. It reports whether there was a lease to revoke.
func Revoke(tb testing.TB, l pglease.Locker, key string) bool {
	tb.Helper()
	r, ok := l.(revoker)
	if !ok {
		tb.Fatalf("pgleasetest: Revoke: a %T can not revoke (it is neither NewFake's Locker nor a Manager's)", l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	revoked, err := r.Revoke(ctx, key)
	if err != nil {
		tb.Fatalf("pgleasetest: Revoke: %v", err)
	}
	return revoked
}
