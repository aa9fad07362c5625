package manager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// Operator mistakes on the lock tables: a VACUUM FULL stuck behind a long
// reader (every statement on the table queues behind its ACCESS EXCLUSIVE
// lock), a DELETE FROM of the lock table (and of the fence counters),
// max_connections exhausted, and role-level statement_timeout and
// default_transaction_isolation.

// opLoad returns a faultLoad on the bundle's Manager and a peer, with the
// resource and lock-table reads on the superuser pool of the same schema.
func opLoad(t *testing.T, b *bundle, prefix string) *faultLoad {
	t.Helper()
	peer, _ := b.newPeer(t, Config{StatementTimeout: 2 * time.Second})
	return &faultLoad{ms: []*Manager{b.m, peer}, res: newFencedResource(t, ctxT(t), b.admin), direct: b.admin,
		lockTable: "syncguard_locks", ttl: 1500 * time.Millisecond, keys: 3, prefix: prefix}
}

// TestOperatorVacuumFull: VACUUM FULL of the lock table waits 3 s (twice
// the TTL) behind a transaction that read the table, and every statement
// on the table waits behind it: acquires and extends time out
// (StatementTimeout) with a code, held leases are signalled lost at the
// end of their trust window and never trusted while the server lacks
// them, and lease cycles resume once the VACUUM is done. The negative
// control: a holder that ignores its loss signal is caught.
func TestOperatorVacuumFull(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: Config{StatementTimeout: 2 * time.Second}})
	l := opLoad(t, b, "vac")
	ctx := ctxT(t)
	lctx, stop := context.WithCancel(ctx)
	wg := l.run(lctx, 2)
	defer func() { stop(); wg.Wait() }()
	time.Sleep(time.Second)

	broken, err := l.brokenHolder(ctx, b.m, "vac:broken")
	if err != nil {
		t.Fatal(err)
	}
	// Connections of their own: the load keeps b.admin's busy.
	readerConn, err := b.admin.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer readerConn.Release()
	vacConn, err := b.admin.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer vacConn.Release()
	var vacPID int
	if err := vacConn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&vacPID); err != nil {
		t.Fatal(err)
	}
	reader, err := readerConn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := reader.QueryRow(ctx, "SELECT count(*) FROM syncguard_locks").Scan(&n); err != nil {
		t.Fatal(err)
	}
	vacuumed := make(chan error, 1)
	go func() {
		_, err := vacConn.Exec(ctx, "VACUUM FULL syncguard_locks")
		vacuumed <- err
	}()
	// The block starts when the VACUUM waits for its lock.
	for waiting := false; !waiting; {
		if err := b.admin.QueryRow(ctx, "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", vacPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	if err := reader.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-vacuumed; err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	t.Logf("VACUUM FULL done; the next acquire succeeded %v later", l.recovery(t, healed, waitTimeout()).Round(time.Millisecond))
	time.Sleep(time.Second)
	if !broken() {
		t.Error("negative control: a holder that ignores its loss signal trusted its lease through a 3 s VACUUM FULL wait, and the check did not catch it")
	}
	stop()
	wg.Wait()
	l.report(t)
	if v, n := fencedLogViolations(t, ctx, b.admin); len(v) != 0 {
		t.Errorf("resource log: %d writes, violations %v", n, v)
	}
}

// TestOperatorDeleteLockRows: DELETE FROM the lock table (superuser) ends
// every lease at once on the server. The holder is told at its next
// extend (ErrLockLost), not before: meanwhile another process can be
// granted the key, with a higher fence (the fence counters are another
// table), so the fence, not the lease, keeps the old holder's write out.
// DELETE FROM the fence counters too (the runtime role cannot: no DELETE
// privilege; the owner can) restarts a key's fences at 1: the Manager
// that saw a higher fence refuses the grant (FenceRegression), and a
// fenced resource refuses a new holder's writes (they are below its
// stored fence, or equal to it: then only a guard WithGrantColumn tells it
// from a retry and refuses it), so a stale writer still cannot write, but
// the resource is stuck until the counters are restored above its fence. The negative
// control: an unfenced writer's stale write is caught by the log check.
func TestOperatorDeleteLockRows(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: Config{StatementTimeout: 2 * time.Second}})
	ctx := ctxT(t)
	res := newFencedResource(t, ctx, b.admin)
	peer, _ := b.newPeer(t, Config{})
	a, err := b.m.Acquire(ctx, "del:k", WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := res.write(ctx, b.admin, "r", a.Fence(), 1); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, err := b.admin.Exec(ctx, "DELETE FROM syncguard_locks"); err != nil {
		t.Fatal(err)
	}
	lk, ok, err := peer.TryAcquire(ctx, "del:k")
	if err != nil || !ok {
		t.Fatalf("key not granted after its row was deleted: %v %v", ok, err)
	}
	t.Logf("after DELETE FROM the lock table, the key was granted again while the old holder trusted its lease: %v", a.Err() == nil)
	if lk.Fence() <= a.Fence() {
		t.Fatalf("fence %d after %d", lk.Fence(), a.Fence())
	}
	if ok, err := res.write(ctx, b.admin, "r", lk.Fence(), 2); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// The same writes to a guard that keeps the writer's grant (for the
	// fence counters' deletion below).
	if _, err := b.admin.Exec(ctx, "CREATE TABLE fault_res_g (id text PRIMARY KEY, fence bigint, fence_grant text, val bigint)"); err != nil {
		t.Fatal(err)
	}
	gg, err := pg.NewFenceGuard("fault_res_g", "id", "fence")
	if err != nil {
		t.Fatal(err)
	}
	if gg, err = gg.WithGrantColumn("fence_grant"); err != nil {
		t.Fatal(err)
	}
	gwrite := func(l *Lock, v int64) (bool, error) {
		return gg.Upsert(ctx, b.admin, "r", l.Fence(), pg.Set{Column: "fence_grant", Value: l.GrantID()}, pg.Set{Column: "val", Value: v})
	}
	if ok, err := gwrite(lk, 2); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := res.write(ctx, b.admin, "r", a.Fence(), 3); ok || err != nil {
		t.Fatalf("old holder's fenced write: accepted=%v err=%v, want refused", ok, err)
	}
	select {
	case <-a.Done():
	case <-time.After(waitTimeout()):
		t.Fatal("old holder not told of the loss")
	}
	if !errors.Is(a.Err(), pglease.ErrLockLost) {
		t.Fatalf("old holder's cause = %v", a.Err())
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The fence counters deleted as well.
	if _, err := b.pool.Exec(ctx, "DELETE FROM syncguard_fence_counters"); err == nil {
		t.Fatal("the runtime role deleted the fence counters")
	} else if pglease.CodeOf(err) != 0 {
		t.Logf("runtime role's DELETE of the fence counters: %v", err)
	}
	if _, err := b.admin.Exec(ctx, "DELETE FROM syncguard_fence_counters"); err != nil {
		t.Fatal(err)
	}
	_, _, err = peer.TryAcquire(ctx, "del:k")
	if pglease.CodeOf(err) != pglease.CodeFenceRegression {
		t.Fatalf("the Manager that saw fence %d took the key again after the counters were deleted: %v", lk.Fence(), err)
	}
	fresh, _ := b.newPeer(t, Config{})
	// The refused grant's row is released by the peer in the background:
	// wait for the key.
	lk2, err := fresh.Acquire(ctx, "del:k", WithAcquireTimeout(waitTimeout()))
	if err != nil {
		t.Fatal(err)
	}
	if lk2.Fence() > lk.Fence() {
		t.Fatalf("fence %d after the counters were deleted, want it restarted (≤ %d)", lk2.Fence(), lk.Fence())
	}
	// A restarted fence is below the resource's (refused) or equal to it:
	// a plain guard ("≤") cannot tell an equal fence from a retry; the
	// grant column can.
	if ok, err := gwrite(lk2, 4); ok || (err != nil && !errors.Is(err, pg.ErrFenceRepeated)) {
		t.Fatalf("a grant with a restarted fence (%d) wrote over fence %d: accepted=%v err=%v", lk2.Fence(), lk.Fence(), ok, err)
	}
	if err := lk2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v, n := fencedLogViolations(t, ctx, b.admin); len(v) != 0 || n != 2 {
		t.Fatalf("resource log: %d writes, violations %v", n, v)
	}
	if err := writeIgnoringFence(ctx, b.admin, "r", a.Fence(), 5); err != nil {
		t.Fatal(err)
	}
	if v, _ := fencedLogViolations(t, ctx, b.admin); len(v) != 1 {
		t.Fatalf("negative control: %d violations after an unfenced stale write, want 1: %v", len(v), v)
	}
}

// appRole creates a LOGIN role without superuser (which would use the
// reserved connection slots) on the test's own server, with the runtime
// privileges on pglease's tables and the resource, and returns its URL.
func appRole(t *testing.T, cl *pgtest.Cluster, pool *pgxpool.Pool, name string) string {
	t.Helper()
	ctx := ctxT(t)
	for _, q := range []string{
		"CREATE ROLE " + name + " LOGIN",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + name,
		"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO " + name,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return strings.Replace(cl.URL, "postgres://postgres@", "postgres://"+name+"@", 1)
}

// TestOperatorMaxConnections: another client takes every connection slot
// (max_connections 20; the 3 reserved for superusers stay free). A Manager
// that already has its connections keeps its lease extended; a Manager
// that needs a new connection fails with ResourceExhausted (53300), typed,
// and acquires once the slots are free again. The negative control: the
// load's check counts a raw driver error (no code) as a violation.
func TestOperatorMaxConnections(t *testing.T) {
	t.Parallel()
	cl, pool := ownServer(t, pgtest.Options{MaxConnections: 20})
	url := appRole(t, cl, pool, "app")
	hogURL := appRole(t, cl, pool, "hog")
	ctx := ctxT(t)
	held := faultManager(t, serverPool(t, url, 2), Config{StatementTimeout: 2 * time.Second})
	lk, err := held.Acquire(ctx, "maxconn:held", WithTTL(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var hogs []*pgx.Conn
	defer func() {
		for _, c := range hogs {
			_ = c.Close(context.Background())
		}
	}()
	var refused error
	for range 40 {
		c, err := pgx.Connect(ctx, hogURL)
		if err != nil {
			refused = err
			break
		}
		hogs = append(hogs, c)
	}
	var pgErr *pgconn.PgError
	if !errors.As(refused, &pgErr) || pgErr.Code != "53300" {
		t.Fatalf("after %d connections, want 53300 too_many_connections, got %v", len(hogs), refused)
	}
	// Through three TTLs of exhaustion the held lease stays extended.
	fresh := faultManager(t, serverPool(t, url, 2), Config{StatementTimeout: 2 * time.Second})
	_, ok, err := fresh.TryAcquire(ctx, "maxconn:new")
	if ok || pglease.CodeOf(err) != pglease.CodeResourceExhausted {
		t.Fatalf("TryAcquire needing a new connection with every slot taken: ok=%v err=%v, want ResourceExhausted", ok, err)
	}
	t.Logf("with every slot taken: %v", err)
	_, err = fresh.Acquire(ctx, "maxconn:new", WithAcquireTimeout(time.Second))
	if pglease.CodeOf(err) == 0 {
		t.Fatalf("Acquire with every slot taken failed without a code: %v", err)
	}
	time.Sleep(3 * lk.TTL())
	if err := lk.Err(); err != nil {
		t.Fatalf("a lease whose Manager had its connections was lost while the slots were taken: %v", err)
	}
	for _, c := range hogs {
		_ = c.Close(ctx)
	}
	hogs = nil
	freed := time.Now()
	lk2, err := fresh.Acquire(ctx, "maxconn:new", WithAcquireTimeout(waitTimeout()))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("slots freed: the new Manager acquired %v later", time.Since(freed).Round(time.Millisecond))
	for _, x := range []*Lock{lk, lk2} {
		if err := x.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Negative control: the load's outcome check flags an error without a
	// code (here the driver's own, as a wrapper that dropped pglease's
	// classification would pass on).
	var l faultLoad
	l.record("acquire", refused)
	if len(l.untyped) != 1 {
		t.Fatal("negative control: a raw driver error was not counted as untyped")
	}
}

// TestOperatorRoleSettings: role-level settings an operator sets on the
// application's role (ALTER ROLE … SET), which reach every new session:
//   - statement_timeout = 1ms: statements are cancelled (57014), every
//     operation fails typed (NetworkTimeout) or succeeds, held leases are
//     signalled lost, never trusted while the server lacks them;
//   - default_transaction_isolation = repeatable read / serializable:
//     contended acquires may hit serialization failures (40001, typed
//     ServiceUnavailable, retried by a waiting Acquire); exclusivity and
//     fences hold (trusted-implies-live, the resource log).
//
// After RESET and new sessions, lease cycles resume.
func TestOperatorRoleSettings(t *testing.T) {
	t.Parallel()
	cl, pool := ownServer(t, pgtest.Options{})
	url := appRole(t, cl, pool, "app")
	ctx := ctxT(t)
	res := newFencedResource(t, ctx, pool)
	if _, err := pool.Exec(ctx, "GRANT SELECT, INSERT, UPDATE ON fault_res, fault_res_log TO app; GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO app"); err != nil {
		t.Fatal(err)
	}
	mcfg := Config{StatementTimeout: 2 * time.Second}
	pools := []*pgxpool.Pool{serverPool(t, url, 4), serverPool(t, url, 4)}
	l := &faultLoad{ms: []*Manager{faultManager(t, pools[0], mcfg), faultManager(t, pools[1], mcfg)},
		res: res, direct: pool, lockTable: "syncguard_locks", ttl: 1500 * time.Millisecond, keys: 2, prefix: "role"}
	// New sessions for the app's pools: role settings apply at connect.
	renew := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'app'"); err != nil {
			t.Fatal(err)
		}
	}
	lctx, stop := context.WithCancel(ctx)
	wg := l.run(lctx, 2)
	defer func() { stop(); wg.Wait() }()
	time.Sleep(time.Second)
	for _, setting := range []string{
		"statement_timeout = '1ms'",
		"default_transaction_isolation = 'repeatable read'",
		"default_transaction_isolation = 'serializable'",
	} {
		if _, err := pool.Exec(ctx, "ALTER ROLE app SET "+setting); err != nil {
			t.Fatal(err)
		}
		renew()
		before := l.snapshot()
		time.Sleep(2 * time.Second)
		t.Logf("ALTER ROLE app SET %s: %s", setting, l.since(before))
		if _, err := pool.Exec(ctx, "ALTER ROLE app RESET ALL"); err != nil {
			t.Fatal(err)
		}
		renew()
		healed := time.Now()
		t.Logf("reset: the next acquire succeeded %v later", l.recovery(t, healed, waitTimeout()).Round(time.Millisecond))
	}
	stop()
	wg.Wait()
	l.report(t)
	if v, n := fencedLogViolations(t, ctx, pool); len(v) != 0 {
		t.Errorf("resource log: %d writes, violations %v", n, v)
	}
}
