package manager

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// The TestPgBouncerManager… tests run the Manager with its pool through a
// real PgBouncer (pgtest.PgBouncerForTest), with the settings docs/poolers.md
// gives: default_query_exec_mode=exec in transaction mode, and the lease
// tables named with their schema (PgBouncer refuses the search_path
// start-up parameter).

// bouncerURL adds default_query_exec_mode=exec to b's URL.
func bouncerURL(b *pgtest.Bouncer) string { return withExecMode(b.URL) }

// withExecMode adds default_query_exec_mode=exec to a URL.
func withExecMode(url string) string {
	if strings.Contains(url, "?") {
		return url + "&default_query_exec_mode=exec"
	}
	return url + "?default_query_exec_mode=exec"
}

// bouncerManager returns a Manager with test signals whose pool goes to
// url, with its tables in schema; closed when the test ends.
func bouncerManager(t *testing.T, url, schema string, cfg Config) (*Manager, *kernel.Signals, *pgxpool.Pool) {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg.LockTable, cfg.FenceTable = schema+".locks", schema+".fences"
	sig := &kernel.Signals{}
	sig.Init()
	m, err := newManager("test", pool, false, cfg, func(m *Manager) { m.k.Sig = sig })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m, sig, pool
}

// TestPgBouncerManagerTransactionMode: through PgBouncer in transaction
// mode, with default_query_exec_mode=exec, the Manager acquires,
// heartbeats, releases, and signals a loss; its listener finds that it
// goes through a transaction-mode pooler, stops listening with one Warn
// log record and pglease.listener.polling = 1, and waiters still learn of
// another process's release, by polling.
func TestPgBouncerManagerTransactionMode(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction, PoolSize: 2})
	schema := pgtest.Schema(t)
	r := newRig(t)
	m, sig, pool := bouncerManager(t, bouncerURL(b), schema, Config{Telemetry: r.opts})
	ctx := ctxT(t)
	if err := m.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	wait(t, &sig.Polling)
	if n := strings.Count(r.logs.String(), "not listening for release notifications"); n != 1 {
		t.Fatalf("%d log records about the fallback to polling, want 1:\n%s", n, r.logs)
	}
	if !strings.Contains(r.logs.String(), "ListenConnString") {
		t.Fatalf("the fallback's log record does not name the fix:\n%s", r.logs)
	}
	if got := sumOf(t, r.metrics(t)["pglease.listener.polling"]); got != 1 {
		t.Fatalf("pglease.listener.polling = %d, want 1", got)
	}

	// Acquire, heartbeat (1 s TTL: an extend every ~330 ms), release.
	lk, err := m.Acquire(ctx, "pgb:hb", WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	extends := 0
	for extends < 4 {
		select {
		case n := <-sig.Extended.Ch:
			extends += n
		case <-lk.Done():
			t.Fatalf("lost after %d extends through PgBouncer: %v", extends, lk.Err())
		case <-time.After(waitTimeout()):
			t.Fatalf("only %d extends through PgBouncer", extends)
		}
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lk2, err := m.Acquire(ctx, "pgb:hb", WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if lk2.Fence() <= lk.Fence() {
		t.Fatalf("fence %d after %d", lk2.Fence(), lk.Fence())
	}

	// Loss: the row disappears behind the Manager's back; the next extend
	// is refused and the lock's context ends with ErrLockLost.
	if _, err := pool.Exec(ctx, "DELETE FROM "+schema+".locks WHERE key = 'pgb:hb'"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk2.Done():
	case <-time.After(waitTimeout()):
		t.Fatal("loss not signalled through PgBouncer")
	}
	if !errors.Is(lk2.Err(), pglease.ErrLockLost) {
		t.Fatalf("cause = %v", lk2.Err())
	}
	if err := lk2.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("Release of the lost lock = %v", err)
	}

	// Another process's release reaches a waiter here by polling.
}

// TestPgBouncerManagerListenDirect: the pools of two Managers go through
// PgBouncer in transaction mode, and their listening connections go
// directly to PostgreSQL (Config.ListenConnString): a release in one
// wakes a waiter in the other at once, though the waiter polls only every
// 20 s, and neither falls back to polling.
func TestPgBouncerManagerListenDirect(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction, PoolSize: 2})
	schema := pgtest.Schema(t)
	direct := pgtest.URL(t)
	a, asig, _ := bouncerManager(t, bouncerURL(b), schema, Config{ListenConnString: direct})
	w, wsig, _ := bouncerManager(t, bouncerURL(b), schema, Config{ListenConnString: direct, Retry: pollingTooSlow})
	ctx := ctxT(t)
	if err := a.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	wait(t, &asig.Listening)
	wait(t, &wsig.Listening)
	for round := range 3 {
		held, err := a.Acquire(ctx, "pgb:wake")
		if err != nil {
			t.Fatal(err)
		}
		took := handOver(t, ctx, held, w, wsig, "pgb:wake", fmt.Sprintf("round %d: waiter not woken: the direct listening connection got no notification", round))
		t.Logf("round %d: woken and granted %v after the release", round, took.Round(time.Millisecond))
	}
	for _, s := range []*kernel.Signals{asig, wsig} {
		select {
		case <-s.Polling.Ch:
			t.Fatal("a Manager with a direct listening connection fell back to polling")
		default:
		}
	}
}

// TestPgBouncerManagerSessionMode: through PgBouncer in session mode the
// Manager needs no special settings: it listens (no fallback) and a
// release in another Manager wakes its waiter.
func TestPgBouncerManagerSessionMode(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolSession})
	schema := pgtest.Schema(t)
	a, _, _ := bouncerManager(t, b.URL, schema, Config{})
	w, wsig, _ := bouncerManager(t, b.URL, schema, Config{Retry: pollingTooSlow})
	ctx := ctxT(t)
	if err := a.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	wait(t, &wsig.Listening)
	held, err := a.Acquire(ctx, "pgb:session")
	if err != nil {
		t.Fatal(err)
	}
	handOver(t, ctx, held, w, wsig, "pgb:session", "waiter not woken through a session-mode PgBouncer")
	select {
	case <-wsig.Polling.Ch:
		t.Fatal("fell back to polling behind a session-mode pooler")
	default:
	}
}

// TestListenConnStringValidated: a bad ListenConnString, or one with
// DisableNotify, is InvalidArgument from New, before any I/O, and the
// message does not quote the string (it may hold a password).
func TestListenConnStringValidated(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://u:secret@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, cfg := range []Config{
		{ListenConnString: "postgres://u:secret@host:notaport/db"},
		{ListenConnString: "postgres://u:secret@127.0.0.1/db", DisableNotify: true},
	} {
		_, err := New(pool, cfg)
		var e *pglease.Error
		if !errors.As(err, &e) || e.Code != pglease.CodeInvalidArgument {
			t.Fatalf("New(%+v) = %v, want InvalidArgument", cfg, err)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Fatalf("error quotes the connection string: %v", err)
		}
	}
}

// BenchmarkPgBouncer measures lease cycles (acquire + release of a key no
// one else wants) through PgBouncer in transaction mode against direct,
// in one run: pg.Store's two round trips ("store") and the Manager's
// ("manager", ListenConnString direct), each with 8 callers on distinct
// keys (b.RunParallel with parallelism 8/GOMAXPROCS) on a 10-connection
// pool. It reports cycles/s. For the figures in docs/poolers.md, on a quiet machine
// with a durable throwaway server:
//
//	go run ./internal/cmd/withpg -durable -- go test -run '^$' -bench BenchmarkPgBouncer -benchtime 3s -count 3 ./manager/
func BenchmarkPgBouncer(b *testing.B) {
	bouncer := pgtest.PgBouncerForTest(b, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction})
	direct := pgtest.URL(b)
	for _, path := range []struct{ name, url string }{
		{"direct", withExecMode(direct)},
		{"pgbouncer-tx", bouncerURL(bouncer)},
	} {
		pcfg, err := pgxpool.ParseConfig(path.url)
		if err != nil {
			b.Fatal(err)
		}
		pcfg.MaxConns = 10
		pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		schema := pgtest.Schema(b)
		scfg := pg.Config{LockTable: schema + ".locks", FenceTable: schema + ".fences"}
		mg, err := migrate.New(pool, scfg)
		if err != nil {
			b.Fatal(err)
		}
		if err := mg.Up(context.Background()); err != nil {
			b.Fatal(err)
		}
		st, err := pg.New(pool, scfg)
		if err != nil {
			b.Fatal(err)
		}
		m, err := New(pool, Config{Config: pg.Config{LockTable: schema + ".locks", FenceTable: schema + ".fences"}, ListenConnString: direct})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close(context.Background()) })
		cycle := map[string]func(ctx context.Context, key string) error{
			"store": func(ctx context.Context, key string) error {
				r, err := st.Acquire(ctx, key, 30*time.Second)
				if err == nil && !r.OK {
					err = errors.New("uncontended key was locked")
				}
				if err == nil {
					_, err = st.Release(ctx, r.LockID)
				}
				return err
			},
			"manager": func(ctx context.Context, key string) error {
				lk, err := m.Acquire(ctx, key, WithTTL(30*time.Second))
				if err == nil {
					err = lk.Release(ctx)
				}
				return err
			},
		}
		for _, impl := range []string{"store", "manager"} {
			b.Run(path.name+"/"+impl, func(b *testing.B) {
				var next atomic.Int64
				b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					key := "bench:" + strconv.FormatInt(next.Add(1), 10)
					ctx := context.Background()
					for pb.Next() {
						if err := cycle[impl](ctx, key); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cycles/s")
			})
		}
	}
}

// TestPgBouncerWatch: behind a transaction-mode pooler the Manager stops
// listening for good: a watch started before that has its channel closed,
// and one started after is refused (InvalidArgument). (An election's
// candidates then learn of a new leader by reading the lease: package
// election's TestPgBouncerElection.)
func TestPgBouncerWatch(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction, PoolSize: 2})
	schema := pgtest.Schema(t)
	m, sig, _ := bouncerManager(t, bouncerURL(b), schema, Config{})
	ctx := ctxT(t)
	if err := m.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	early, err := m.Watch(ctx, "pgb:watch")
	if err != nil && !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("Watch = %v", err)
	}
	wait(t, &sig.Polling)
	if err == nil {
		for range early { // closed once the listener stopped
		}
	}
	if _, err := m.Watch(ctx, "pgb:watch"); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("Watch after the listener stopped = %v", err)
	}

}
