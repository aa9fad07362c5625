package manager

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/advisory"
)

// A demoted primary that keeps its sockets: the server a Manager's
// connections are open to turns read-only under them (here
// default_transaction_read_only with a reload, which every open session
// takes at its next statement; a cloud database that flips roles without
// closing connections does the same) while another server becomes the
// writer. Every write on those connections then fails with SQLSTATE 25006
// (read_only_sql_transaction), while pgxpool's liveness ping and a
// listener's probe still succeed there.

// setReadOnly turns the server of pool read-only (default_transaction_read_only
// on, reloaded) or back.
func setReadOnly(t *testing.T, ctx context.Context, pool *pgxpool.Pool, on bool) {
	t.Helper()
	q := "ALTER SYSTEM RESET default_transaction_read_only"
	if on {
		q = "ALTER SYSTEM SET default_transaction_read_only = on"
	}
	if _, err := pool.Exec(ctx, q); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
}

// managerBackends counts the client sessions on pool's server other than
// pool's own (those of the Managers under test).
func managerBackends(t *testing.T, ctx context.Context, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND application_name LIKE 'ro-%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// grantedBy waits (up to bound) until m grants a fresh key, and returns
// how long that took.
func grantedBy(t *testing.T, ctx context.Context, m *Manager, key string, bound time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	var last error
	for time.Since(t0) < bound {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		lk, err := m.Acquire(actx, key, WithAcquireTimeout(2*time.Second))
		cancel()
		if err == nil {
			d := time.Since(t0)
			if err := lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
			return d
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no grant of %s within %v (last error: %v)", key, bound, last)
	return 0
}

// TestDemotedPrimaryKeepsSockets: under load from two Managers (one on
// pg.NewPool, one on a plain pgxpool) on a multi-host URL
// (target_session_attrs=read-write), the primary turns read-only for
// twice the TTL while keeping every connection open, then the standby is
// promoted with the old primary left up, read-only. What must hold:
//   - every operation succeeds or fails typed (25006 is ServiceUnavailable);
//     trusted ⇒ live on the writer; no fenced write refused while
//     trusted; no stale write; every grant a caller was told of is on the
//     new primary (none came from the read-only server);
//   - each Manager is granted locks on the new primary within seconds,
//     with the old primary still up: its connections that met 25006 are
//     dropped, and the pool's new ones find the writer;
//   - each Manager's listener leaves the read-only server and listens on
//     the new primary: a release in one Manager wakes a waiter in another
//     that only a notification can wake in time;
//   - a read-only flip of the new primary with no promotion (1 s) is
//     recovered from within a second of the flip back.
//
// The negative control: a holder that ignores its loss signal is caught
// trusting a lease the writer no longer has.
func TestDemotedPrimaryKeepsSockets(t *testing.T) {
	t.Parallel()
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{Sync: true})
	ctx := harnessCtx(t)
	// The Managers' sessions are named ro-… (application_name), so that
	// the test can count those left on each server.
	url := r.URL("", "connect_timeout=2", "application_name=ro-m")
	p0 := serverPool(t, r.NodeURL(0, ""), 4)
	p1 := serverPool(t, r.NodeURL(1, ""), 4)
	own, err := pg.NewPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	cfg := Config{StatementTimeout: 2 * time.Second}
	m0 := faultManager(t, own, cfg)
	m1 := faultManager(t, serverPool(t, url, 6), cfg)
	if err := m0.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	res := newFencedResource(t, ctx, p0)
	wa, asig := failoverManager(t, url, Config{StatementTimeout: 2 * time.Second}, kernel.TestHooks{})
	wb, bsig := failoverManager(t, url, Config{Retry: pollingTooSlow, StatementTimeout: 2 * time.Second}, kernel.TestHooks{})
	wait(t, &asig.Listening)
	wait(t, &bsig.Listening)

	l := &faultLoad{ms: []*Manager{m0, m1}, res: res, direct: p0, lockTable: "syncguard_locks",
		ttl: 1500 * time.Millisecond, keys: 3, prefix: "ro"}
	lctx, stop := context.WithCancel(ctx)
	wg := l.run(lctx, 2)
	defer func() { stop(); wg.Wait() }()
	time.Sleep(time.Second)
	broken, err := l.brokenHolder(ctx, m0, "ro:broken")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.WaitReplayed(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}
	// An advisory session holding a key on the old primary.
	advKey, err := advisory.NamespacedKey("ro", "adv")
	if err != nil {
		t.Fatal(err)
	}
	// Its pool keeps idle connections to the old primary, as a Manager's
	// does (Manager.Advisory opens sessions from the Manager's pool).
	advPool := serverPool(t, url, 3)
	var idle []*pgxpool.Conn
	for range 3 {
		c, err := advPool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	for _, c := range idle {
		c.Release()
	}
	oldSess, err := advisory.Open(ctx, advPool, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = oldSess.Close(context.Background()) })
	advLock, err := oldSess.Lock(ctx, advKey)
	if err != nil {
		t.Fatal(err)
	}
	before := l.snapshot()
	drain(&asig.Listening)
	drain(&bsig.Listening)

	// 1. The primary turns read-only under its open connections, for
	// twice the TTL with no writer anywhere.
	onOld := managerBackends(t, ctx, p0)
	setReadOnly(t, ctx, p0, true)
	flipped := time.Now()
	// The resource and the trust checks move to node 1 before it is
	// promoted (a grant there must not be looked for on node 0), once it
	// has replayed what node 0 committed: with node 0 read-only, the two
	// have the same lock tables.
	if err := r.WaitReplayed(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}
	l.writer.Store(p1)
	select {
	case <-advLock.Done():
		t.Logf("advisory lock on the old primary told lost %v after it turned read-only: %v",
			time.Since(flipped).Round(time.Millisecond), advLock.Err())
	case <-time.After(10 * time.Second):
		t.Fatal("an advisory lock on a primary that turned read-only was still trusted 10 s later; " +
			"a session on the promoted standby can take its key")
	}
	time.Sleep(time.Until(flipped.Add(2 * l.ttl)))
	t.Logf("read-only primary, no writer, %v (%d Manager sessions on it): %s", 2*l.ttl, onOld, l.since(before))

	// 2. The standby is promoted; the old primary stays up, read-only.
	before = l.snapshot()
	if err := r.Promote(ctx, 1); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	for i, m := range []*Manager{m0, m1} {
		d := grantedBy(t, ctx, m, fmt.Sprintf("ro:probe%d", i), 20*time.Second)
		t.Logf("Manager %d: first grant on the new primary %v after the promotion", i, d.Round(time.Millisecond))
	}
	t.Logf("load after the promotion: first grant %v after it", l.recovery(t, promoted, 20*time.Second).Round(time.Millisecond))
	// The advisory key, on the new primary: another session gets it (the
	// old server's session lock excludes no one there), after the old
	// holder was told.
	newSess, err := advisory.Open(ctx, advPool, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = newSess.Close(context.Background()) })
	var onNew int
	if err := p1.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", newSess.BackendPID()).Scan(&onNew); err != nil {
		t.Fatal(err)
	}
	if onNew != 1 {
		t.Fatal("an advisory session opened after the promotion from a pool with idle connections to the old primary is not on the new primary")
	}
	if _, ok, err := newSess.TryLock(ctx, advKey); err != nil || !ok {
		t.Fatalf("advisory key on the new primary: %v %v", ok, err)
	}
	if advLock.Err() == nil {
		t.Fatal("two advisory holders of a key trust it: the old primary's was not told")
	}
	for _, s := range []*kernel.Signals{asig, bsig} {
		select {
		case <-s.Listening.Ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("a listener did not subscribe again within 10 s of the promotion: it stays on the read-only server")
		}
	}
	t.Logf("both listeners subscribed again %v after the promotion", time.Since(promoted).Round(time.Millisecond))
	lk, err := wa.Acquire(ctx, "ro:wake")
	if err != nil {
		t.Fatal(err)
	}
	handOver(t, ctx, lk, wb, bsig, "ro:wake", "waiter in another Manager not woken after the promotion: its listener is not on the new primary")
	time.Sleep(2 * time.Second)
	t.Logf("on the old primary, %d Manager sessions before it turned read-only, %d 2 s after the hand-over; load since the promotion: %s",
		onOld, managerBackends(t, ctx, p0), l.since(before))

	// 3. The new primary turns read-only for 1 s with no promotion, and
	// back.
	before = l.snapshot()
	setReadOnly(t, ctx, p1, true)
	time.Sleep(time.Second)
	setReadOnly(t, ctx, p1, false)
	back := time.Now()
	t.Logf("read-only flip of the writer for 1 s: first grant %v after the flip back; load: %s",
		l.recovery(t, back, 20*time.Second).Round(time.Millisecond), l.since(before))

	time.Sleep(time.Second)
	stop()
	wg.Wait()
	if !broken() {
		t.Error("negative control: a holder that ignored its loss signal was not caught trusting a lease the writer no longer has")
	}
	l.report(t)
	if v, n := fencedLogViolations(t, ctx, p1); len(v) != 0 {
		t.Errorf("%d stale writes of %d, e.g. %v", len(v), n, v[:min(3, len(v))])
	}
	lost, n := lostGrants(t, ctx, p1, &l.grants)
	if len(lost) > 0 {
		t.Errorf("%d of %d keys granted to a caller are not on the new primary, e.g. %v", len(lost), n, lost[:min(3, len(lost))])
	}
}
