package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// A synchronous standby lost, then the wait for it cancelled. With the
// standby down, every commit on the primary waits for it (wait event
// SyncRep) holding its row locks, invisible to other sessions. When that
// wait is cancelled (pg_cancel_backend, which operators use to unblock a
// primary, or a statement_timeout), PostgreSQL commits locally, sends a
// WARNING ("canceling wait for synchronous replication … The transaction
// has already committed locally, but might not have been replicated to
// the standby") and answers the statement with success: the client cannot
// tell such a commit from a replicated one, except by that warning.

// syncRepWaiters returns the pids of the backends on conn's server waiting
// for the synchronous standby.
// stopStandby stops r's synchronous standby, so that commits wait for it
// from now on, and returns a connection to the primary, closed when the
// test ends.
func stopStandby(t *testing.T, ctx context.Context, r *pgtest.Replicated) *pgx.Conn {
	t.Helper()
	if err := r.Nodes[1].StopServer(false); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, r.Nodes[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	return admin
}

// cancelSyncRepWaits cancels every backend waiting for the synchronous
// standby: PostgreSQL then commits its transaction locally.
func cancelSyncRepWaits(t *testing.T, ctx context.Context, admin *pgx.Conn) {
	t.Helper()
	pids, err := syncRepWaiters(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if _, err := admin.Exec(ctx, "SELECT pg_cancel_backend($1)", pid); err != nil {
			t.Fatal(err)
		}
	}
}

// noLiveLeases waits until none of the n keys starting with prefix has a
// live lease on the server, and fails the test after within: a failed
// acquire must leave no key held by no caller.
func noLiveLeases(t *testing.T, ctx context.Context, admin *pgx.Conn, prefix string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var live int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM syncguard_locks WHERE starts_with(user_key, $1)
			AND expires_at_ms > floor(extract(epoch FROM clock_timestamp())*1000)`, prefix).Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d keys held on the server by no caller %v after their acquires failed (TTL 1 min)", live, n, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func syncRepWaiters(ctx context.Context, conn *pgx.Conn) ([]int, error) {
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// TestSyncCommitCancelled shows what a cancelled synchronous commit does to
// a grant, and what pglease does about it.
//
//  1. Key "sc:kept" is granted (fence K) while the standby streams: the
//     commit returns only once the standby has it.
//  2. The standby stops. An Acquire of "sc:cut" then waits in the
//     primary's commit. The wait is cancelled (pg_cancel_backend): the
//     Acquire, on a pool the caller configured, succeeds (fence C),
//     committed on the primary alone: the warning PostgreSQL sends with
//     it reaches only an OnNotice the caller set, and pglease reports the
//     grant as it would a replicated one. On a pool configured by
//     pg.ConfigurePool (pg.NewPool) the warning is recorded and the
//     attempt is Ambiguous: never a grant, its lockId released.
//  3. A Manager whose own statement timeout ends the wait first gets a
//     typed error, never a grant: pgx closes the socket, the backend goes on
//     waiting (its commit lands when the wait ends) and the key is held
//     on the server by no caller until the lease's TTL.
//  4. The primary crashes and the standby is promoted. The fence of the
//     cancelled commit is issued again to another process (C repeated),
//     while the replicated grant's is not (the next is above K): the
//     check that catches the repeat is shown not to fire on a replicated
//     grant (the negative control). The process that saw C refuses the
//     repeat (FenceRegression); at the resource, a plain FenceGuard
//     accepts the repeat of the last written fence, a guard made
//     WithGrantColumn refuses it (pg.ErrFenceRepeated).
func TestSyncCommitCancelled(t *testing.T) {
	t.Parallel()
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{Sync: true})
	url := failoverURL(r)
	// a's pool records the server's notices, as a user's can (pgx drops
	// them unless ConnConfig.OnNotice is set).
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var noticeMu sync.Mutex
	var notices []*pgconn.Notice
	pcfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		noticeMu.Lock()
		defer noticeMu.Unlock()
		notices = append(notices, n)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	a := faultManager(t, pool, Config{StatementTimeout: 30 * time.Second})
	ctx := harnessCtx(t)
	if err := a.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	// The resource lives in the package's own database, so it keeps every
	// write across the lock database's failover.
	res, _ := pgtest.Pool(t)
	if _, err := res.Exec(ctx, `CREATE TABLE sc_plain (k text PRIMARY KEY, fence bigint, v int);
		CREATE TABLE sc_granted (k text PRIMARY KEY, fence bigint, fence_grant text, v int)`); err != nil {
		t.Fatal(err)
	}
	plain, err := pg.NewFenceGuard("sc_plain", "k", "fence")
	if err != nil {
		t.Fatal(err)
	}
	gg, err := pg.NewFenceGuard("sc_granted", "k", "fence")
	if err == nil {
		gg, err = gg.WithGrantColumn("fence_grant")
	}
	if err != nil {
		t.Fatal(err)
	}
	write := func(lk *Lock, v int) (plainOK bool, grantErr error) {
		t.Helper()
		ok, err := plain.Upsert(ctx, res, lk.Key(), lk.Fence(), pg.Set{Column: "v", Value: v})
		if err != nil {
			t.Fatal(err)
		}
		ok2, err := gg.Upsert(ctx, res, lk.Key(), lk.Fence(), pg.Set{Column: "fence_grant", Value: lk.GrantID()}, pg.Set{Column: "v", Value: v})
		if err == nil && !ok2 {
			err = errors.New("refused (older fence)")
		}
		return ok, err
	}

	// 1. A replicated grant.
	kept, err := a.Acquire(ctx, "sc:kept")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := write(kept, 1); !ok || err != nil {
		t.Fatalf("write under the replicated grant: %v %v", ok, err)
	}
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitReplayed(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}

	// 2. The standby stops; an Acquire waits in the commit; the wait is
	// cancelled.
	admin := stopStandby(t, ctx, r)
	// cancelled runs op, cancelling every wait for the standby until it
	// returns.
	cancelled := func(op func() error) error {
		t.Helper()
		res := make(chan error, 1)
		go func() { res <- op() }()
		waited := false
		for {
			select {
			case err := <-res:
				if !waited {
					t.Fatalf("answered without waiting for the standby: %v", err)
				}
				return err
			case <-time.After(50 * time.Millisecond):
			}
			pids, err := syncRepWaiters(ctx, admin)
			if err != nil {
				t.Fatal(err)
			}
			for _, pid := range pids {
				waited = true
				if _, err := admin.Exec(ctx, "SELECT pg_cancel_backend($1)", pid); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// What a monitor sees meanwhile: a synchronous standby is named, none
	// is connected.
	var names string
	var syncs int
	if err := admin.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names'),
		(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))`).Scan(&names, &syncs); err != nil {
		t.Fatal(err)
	}
	if names == "" || syncs != 0 {
		t.Fatalf("synchronous_standby_names %q with %d synchronous standbys connected, want a name and none", names, syncs)
	}
	// "sc:cut" is taken again after the failover by another process,
	// "sc:seen" by this one.
	locks := map[string]*Lock{}
	for _, key := range []string{"sc:cut", "sc:seen"} {
		var lk *Lock
		if err := cancelled(func() (err error) { lk, err = a.Acquire(ctx, key); return err }); err != nil {
			t.Fatalf("Acquire of %s whose commit wait was cancelled: %v; this test shows it granted (committed locally)", key, err)
		}
		if ok, err := write(lk, 2); !ok || err != nil {
			t.Fatalf("write under the locally committed grant: %v %v", ok, err)
		}
		// A release commits with synchronous_commit = off: it does not
		// wait for the standby.
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
		locks[key] = lk
	}
	cut, seen := locks["sc:cut"], locks["sc:seen"]
	noticeMu.Lock()
	var warned []string
	for _, n := range notices {
		if n.Severity == "WARNING" {
			warned = append(warned, n.Message+" ("+n.Detail+")")
		}
	}
	noticeMu.Unlock()
	if len(warned) != 2 {
		t.Fatalf("the server's warnings to the pool: %q, want one per cancelled commit", warned)
	}
	t.Logf("what a pool's OnNotice sees: %s", warned[0])

	// On a pool configured by pg.ConfigurePool (pg.NewPool, manager.Open)
	// the warning is recorded, and the cancelled commit is not reported
	// as a grant: the attempt is Ambiguous, its lockId released, and the
	// waiting Acquire ends with an error when every retry meets the same.
	npool, err := pg.NewPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(npool.Close)
	d := faultManager(t, npool, Config{StatementTimeout: 30 * time.Second})
	err = cancelled(func() error {
		lk, err := d.Acquire(ctx, "sc:noticed", WithAcquireTimeout(3*time.Second))
		if err == nil {
			return fmt.Errorf("granted fence %d", lk.Fence())
		}
		return err
	})
	var de *pglease.Error
	if !errors.As(err, &de) || de.Code == 0 {
		t.Fatalf("Acquire on a configured pool whose commit waits were cancelled: %v, want a typed error, never a grant", err)
	}
	var left int
	t2 := time.Now()
	for {
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM syncguard_locks WHERE user_key = 'sc:noticed'
			AND expires_at_ms > floor(extract(epoch FROM clock_timestamp())*1000)`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 || time.Since(t2) > 5*time.Second {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if left != 0 {
		t.Errorf("%d leases of sc:noticed left on the primary 5 s after the refused grants: the Manager did not release them", left)
	}
	t.Logf("configured pool: the cancelled commits were refused (%v) and released", de.Code)
	t.Logf("cancelled synchronous commit: Acquire granted fence %d, committed on the primary only", cut.Fence())

	// 3. The Manager's own statement timeout ends the wait first.
	c, _ := failoverManager(t, url, Config{StatementTimeout: time.Second}, kernel.TestHooks{})
	t0 := time.Now()
	_, err = c.Acquire(ctx, "sc:timeout", WithAcquireTimeout(3*time.Second))
	var pe *pglease.Error
	if !errors.As(err, &pe) || pe.Code == 0 {
		t.Fatalf("Acquire whose commit outlived the statement timeout: %v, want a typed error", err)
	}
	t.Logf("statement timeout during the commit wait: %v after %v", pe.Code, time.Since(t0).Round(time.Millisecond))
	// The backends left waiting (the orphaned acquire, any release) commit
	// locally when their wait is cancelled.
	waiting, err := syncRepWaiters(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range waiting {
		if _, err := admin.Exec(ctx, "SELECT pg_cancel_backend($1)", pid); err != nil {
			t.Fatal(err)
		}
	}
	// The grant that committed when pgconn's cancel request (sent as it
	// closed the timed-out connection) ended the wait: a lease on the
	// server that no caller was told of, cleaned up by the Manager's
	// retried release of the ambiguous attempt, or else at its expiry.
	var orphan int
	t1 := time.Now()
	for {
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM syncguard_locks WHERE user_key = 'sc:timeout'`).Scan(&orphan); err != nil {
			t.Fatal(err)
		}
		if orphan == 0 || time.Since(t1) > 5*time.Second {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d backends still waited for the standby after the client gave up; a lease of sc:timeout no caller holds: %d after %v",
		len(waiting), orphan, time.Since(t1).Round(time.Millisecond))

	// 4. Failover.
	if err := r.Crash(0); err != nil {
		t.Fatal(err)
	}
	if err := r.Nodes[1].StartServer(harnessCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := r.Promote(harnessCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	b, _ := failoverManager(t, url, Config{}, kernel.TestHooks{})
	repeated := func(key string, told pglease.Fence) (*Lock, bool) {
		t.Helper()
		lk, err := b.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return lk, lk.Fence() <= told
	}
	// The negative control: a replicated grant's fence is not repeated.
	lk, rep := repeated("sc:kept", kept.Fence())
	if rep {
		t.Fatalf("replicated grant's fence %d issued again after the failover (fence %d)", kept.Fence(), lk.Fence())
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lk, rep = repeated("sc:cut", cut.Fence())
	if !rep {
		t.Fatalf("after the failover, sc:cut got fence %d above the cancelled commit's %d: the grant was replicated after all?", lk.Fence(), cut.Fence())
	}
	plainOK, gerr := write(lk, 3)
	if !plainOK {
		t.Errorf("plain guard refused the repeated fence %d; this test shows it accepting it", lk.Fence())
	}
	if !errors.Is(gerr, pg.ErrFenceRepeated) || !errors.Is(gerr, pglease.ErrFenceRegression) {
		t.Errorf("grant guard on the repeated fence %d: %v, want FenceRegression / ErrFenceRepeated", lk.Fence(), gerr)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The process that saw the cancelled commit's fence refuses its repeat.
	_, err = a.Acquire(ctx, "sc:seen")
	if !errors.As(err, &pe) || pe.Code != pglease.CodeFenceRegression {
		t.Fatalf("Acquire by the process that saw fence %d: %v, want CodeFenceRegression", seen.Fence(), err)
	}
	t.Logf("after the failover: sc:kept fence above %d (replicated), sc:cut fence %d issued again to another process; "+
		"plain guard accepted it, grant guard refused it; the process that saw it: %v", kept.Fence(), cut.Fence(), pe.Code)
}

// TestSyncCommitTimeoutLeavesNoLease: with the synchronous standby gone,
// acquires whose commit wait outlives the Manager's statement timeout
// fail (typed), and the grants their cancelled waits commit afterwards
// (pgconn sends a cancel request as it closes the timed-out connection)
// must be released by the Manager's clean-up of those ambiguous attempts,
// not left holding their keys for no one until the TTL.
func TestSyncCommitTimeoutLeavesNoLease(t *testing.T) {
	t.Parallel()
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{Sync: true})
	url := failoverURL(r)
	ctx := harnessCtx(t)
	c, _ := failoverManager(t, url, Config{StatementTimeout: time.Second, TTL: time.Minute}, kernel.TestHooks{})
	if err := c.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	admin := stopStandby(t, ctx, r)
	keys := []string{"orphan:a", "orphan:b", "orphan:c"}
	for _, key := range keys {
		_, err := c.Acquire(ctx, key, WithAcquireTimeout(2*time.Second))
		var pe *pglease.Error
		if !errors.As(err, &pe) || pe.Code == 0 {
			t.Fatalf("Acquire of %s whose commit outlived the statement timeout: %v, want a typed error", key, err)
		}
		cancelSyncRepWaits(t, ctx, admin) // commits whatever still waits, as pgconn's cancel request does
	}
	noLiveLeases(t, ctx, admin, "orphan:", len(keys), 10*time.Second)
}
