package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

// bouncerStore returns a Store on a pool that reaches the package database
// through b with the given pgx query exec mode ("" = pgx's default, the
// statement cache), with its tables in a fresh schema (named explicitly:
// PgBouncer does not pass search_path on).
func bouncerStore(t *testing.T, b *pgtest.Bouncer, execMode string, maxConns int32) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	u := b.URL
	if execMode != "" {
		u = withParam(u, "default_query_exec_mode", execMode)
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := pgtest.Schema(t)
	s, err := store.New("pg.New", pool, store.Config{LockTable: schema + ".locks", FenceTable: schema + ".fences"})
	if err != nil {
		t.Fatal(err)
	}
	if err := setupSchema(s, ctx(t)); err != nil {
		t.Fatalf("SetupSchema through PgBouncer: %v", err)
	}
	return s, pool
}

func withParam(u, k, v string) string {
	if strings.Contains(u, "?") {
		return u + "&" + k + "=" + v
	}
	return u + "?" + k + "=" + v
}

// storeRoundTrip runs every lease operation once and checks its result.
func storeRoundTrip(t *testing.T, s *store.Store) {
	t.Helper()
	c := ctx(t)
	key := pgtest.RandomName("k")
	r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 10 * time.Second})
	if err != nil || !r.OK {
		t.Fatalf("Acquire: %+v %v", r, err)
	}
	if r2, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 10 * time.Second}); err != nil || r2.OK {
		t.Fatalf("second Acquire of a held key: %+v %v", r2, err)
	}
	if ok, err := s.IsLocked(c, key); err != nil || !ok {
		t.Fatalf("IsLocked: %v %v", ok, err)
	}
	if info, err := s.LookupByKey(c, key); err != nil || info == nil || info.Fence != r.Fence {
		t.Fatalf("LookupByKey: %v %v", info, err)
	}
	if e, err := s.Extend(c, r.LockID, 20*time.Second); err != nil || !e.OK || !e.ExpiresAt.After(r.ExpiresAt) {
		t.Fatalf("Extend: %+v %v", e, err)
	}
	if ok, err := s.Release(c, r.LockID); err != nil || !ok {
		t.Fatalf("Release: %v %v", ok, err)
	}
	r3, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 10 * time.Second})
	if err != nil || !r3.OK || r3.Fence <= r.Fence {
		t.Fatalf("re-Acquire: %+v %v (fence must grow from %s)", r3, err, r.Fence)
	}
	keys := []string{key + "a", key + "b", key + "c"}
	reqs := make([]store.AcquireRequest, len(keys))
	for i, k := range keys {
		reqs[i] = store.AcquireRequest{Key: k, TTL: 10 * time.Second}
	}
	rs, err := s.AcquireMany(c, reqs)
	if err != nil {
		t.Fatalf("AcquireMany: %v", err)
	}
	ids := []string{r3.LockID}
	ext := []store.ExtendRequest{{LockID: r3.LockID, TTL: 10 * time.Second}}
	for i, x := range rs {
		if !x.OK {
			t.Fatalf("AcquireMany item %d: %+v", i, x)
		}
		ids = append(ids, x.LockID)
		ext = append(ext, store.ExtendRequest{LockID: x.LockID, TTL: 10 * time.Second})
	}
	es, err := s.ExtendMany(c, ext)
	if err != nil {
		t.Fatalf("ExtendMany: %v", err)
	}
	for i, e := range es {
		if !e.OK {
			t.Fatalf("ExtendMany item %d not extended", i)
		}
	}
	oks, err := s.ReleaseMany(c, ids)
	if err != nil {
		t.Fatalf("ReleaseMany: %v", err)
	}
	for i, ok := range oks {
		if !ok {
			t.Fatalf("ReleaseMany item %d not released", i)
		}
	}
}

// hammer runs acquire/extend/release cycles from n goroutines at once
// (more clients than server connections, so PgBouncer moves each
// transaction between server connections) and returns the first error.
func hammer(t *testing.T, s *store.Store, n, cycles int) error {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for i := range cycles {
				key := fmt.Sprintf("hammer-%d-%d", g, i%3)
				r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 10 * time.Second})
				if err == nil && r.OK {
					_, err = s.Extend(c, r.LockID, 10*time.Second)
					if err == nil {
						_, err = s.Release(c, r.LockID)
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// TestPgBouncerTransactionModeStore: through PgBouncer in transaction mode,
// every lease operation works with each pgx exec mode that keeps a
// statement within one round trip; the docs recommend
// default_query_exec_mode=exec (one round trip, nothing cached on a server
// connection). Not describe_exec: it describes the unnamed statement in one
// round trip and binds it in the next, which PgBouncer may send to another
// server connection ("bind message supplies 5 parameters, but prepared
// statement "" requires 2", SQLSTATE 08P01, seen here) — or, worse, to
// another client's unnamed statement with the same parameter count.
func TestPgBouncerTransactionModeStore(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction, PoolSize: 2})
	for _, mode := range []string{"exec", "cache_describe", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			s, _ := bouncerStore(t, b, mode, 8)
			storeRoundTrip(t, s)
			if err := hammer(t, s, 8, 15); err != nil {
				t.Fatalf("concurrent cycles through PgBouncer (exec mode %s): %v\n%s", mode, err, b.Log())
			}
		})
	}
}

// TestPgBouncerSessionModeStore: session mode keeps a server connection per
// client, so pgx's default statement cache works.
func TestPgBouncerSessionModeStore(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolSession})
	s, _ := bouncerStore(t, b, "", 4)
	storeRoundTrip(t, s)
	if err := hammer(t, s, 4, 10); err != nil {
		t.Fatal(err)
	}
}

// TestPgBouncerStatementCacheError: pgx's default statement cache behind a
// transaction pooler fails with one clear *pglease.Error that says what is
// wrong and how to fix it. Two clients share PgBouncer's single server
// connection: the second prepares the same stmtcache_ statement there
// (42P05).
func TestPgBouncerStatementCacheError(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction, PoolSize: 1})
	schema := pgtest.Schema(t)
	cfg := store.Config{LockTable: schema + ".locks", FenceTable: schema + ".fences"}
	stores := make([]*store.Store, 2)
	for i := range stores {
		conn, err := pgx.Connect(ctx(t), b.URL) // pgx default: cache_statement
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		if stores[i], err = store.New("pg.New", conn, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := setupSchema(stores[0], ctx(t)); err != nil {
		t.Fatal(err)
	}
	if r, err := stores[0].Acquire(ctx(t), store.AcquireRequest{Key: "a", TTL: 10 * time.Second}); err != nil || !r.OK {
		t.Fatalf("first client: %+v %v", r, err)
	}
	_, err := stores[1].Acquire(ctx(t), store.AcquireRequest{Key: "b", TTL: 10 * time.Second})
	if err == nil {
		t.Fatal("second client's Acquire succeeded; want the statement-cache collision on the shared server connection")
	}
	var pe *pglease.Error
	if !errors.As(err, &pe) || pe.Code != pglease.CodeInvalidArgument {
		t.Fatalf("error = %v (%T), want a *pglease.Error with CodeInvalidArgument", err, err)
	}
	if pglease.Retryable(err) {
		t.Fatal("a configuration error must not be retryable")
	}
	msg := err.Error()
	for _, want := range []string{"transaction-mode pooler", "default_query_exec_mode=exec", "max_prepared_statements", "42P05"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error text %q does not mention %q", msg, want)
		}
	}
	var st interface{ SQLState() string }
	if !errors.As(err, &st) || st.SQLState() != "42P05" {
		t.Errorf("SQLSTATE not reachable as 42P05: %v", err)
	}
	if strings.Count(msg, "pglease:") != 1 {
		t.Errorf("want one *pglease.Error, not a chain of them: %q", msg)
	}
}

// TestPgBouncerStatementCacheUnderConcurrency measures when pgx's default
// statement cache breaks behind PgBouncer in transaction mode
// (docs/poolers.md): one client at a time on one pgx connection passes
// (PgBouncer keeps handing it a server connection that has its
// statements), and several clients at once, more than the server
// connections, fail — every failure the InvalidArgument that names the
// fix, never a wrong answer.
func TestPgBouncerStatementCacheUnderConcurrency(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction, PoolSize: 2})
	s, _ := bouncerStore(t, b, "", 8)
	cycle := func(c context.Context, key string) error {
		r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 10 * time.Second})
		if err == nil && r.OK {
			_, err = s.Release(c, r.LockID)
		}
		return err
	}
	c := ctx(t)
	for i := range 40 {
		if err := cycle(c, fmt.Sprintf("serial-%d", i)); err != nil {
			t.Fatalf("one client at a time, cycle %d: %v", i, err)
		}
	}
	const clients, cycles = 8, 10
	var mu sync.Mutex
	failed, other := 0, []error{}
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range cycles {
				err := cycle(c, fmt.Sprintf("conc-%d-%d", g, i))
				if err == nil {
					continue
				}
				mu.Lock()
				failed++
				if pglease.CodeOf(err) != pglease.CodeInvalidArgument || !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
					other = append(other, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("default statement cache through PgBouncer (transaction mode, 2 server connections): 0 of 40 serial cycles failed; %d of %d cycles of %d concurrent clients failed", failed, clients*cycles, clients)
	if failed == 0 {
		t.Errorf("no concurrent cycle failed: the statement cache did not meet another client's server connection")
	}
	for _, err := range other {
		t.Errorf("a failure that is not the statement-cache InvalidArgument: %v", err)
	}
}
