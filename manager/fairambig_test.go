package manager

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager/internal/kernel"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/retry"
)

// fairSyncManager returns a fair-queue Manager with test signals and hooks
// on a pool of its own configured by pg.NewPool (so the server's warning
// about a cancelled wait for the synchronous standby makes the write
// Ambiguous), closed when the test ends.
func fairSyncManager(t *testing.T, url string, cfg Config, hooks kernel.TestHooks) (*Manager, *kernel.Signals) {
	t.Helper()
	pool, err := pg.NewPool(harnessCtx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg.FairQueue = true
	return managerOn(t, pool, cfg, hooks)
}

// cancelSyncRepUntil cancels every wait for the synchronous standby, every
// 50 ms, until done is closed; it reports how many it cancelled, and calls
// onCancel (if set) after each. It runs on a goroutine of its own, on a
// connection of its own to url.
func cancelSyncRepUntil(t *testing.T, ctx context.Context, url string, done <-chan struct{}, onCancel func()) int {
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Error(err)
		return 0
	}
	defer admin.Close(context.Background())
	n := 0
	for {
		select {
		case <-done:
			return n
		case <-time.After(50 * time.Millisecond):
		}
		pids, err := syncRepWaiters(ctx, admin)
		if err != nil {
			t.Error(err)
			return n
		}
		for _, pid := range pids {
			if _, err := admin.Exec(ctx, "SELECT pg_cancel_backend($1)", pid); err != nil {
				t.Error(err)
				return n
			}
			n++
			if onCancel != nil {
				onCancel()
			}
		}
	}
}

// waitOneTicket waits (30 s at most) until key's queue holds one ticket.
func waitOneTicket(t *testing.T, ctx context.Context, admin *pgx.Conn, key string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM syncguard_locks_queue WHERE key = $1`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter's ticket was not queued within 30 s")
		}
	}
}

// TestFairUnknownGrantNotAnsweredByARead: with the synchronous standby
// gone, a fair Acquire's first QueueWait grants its ticket and waits for
// the standby; the wait is cancelled, so the grant is committed on the
// primary alone, and that statement's answer (Ambiguous: the server
// warned) is held back, as a dead connection's would be. The attempt is
// stuck, so it is hedged with the same ticket, and the waiter's later
// attempts carry it too: each finds the ticket already granted. That
// answer must not be a grant (ambiguity is never success): it waits for
// the standby like any grant, and its wait cancelled too is Ambiguous. So
// no Acquire may succeed while the standby is down.
func TestFairUnknownGrantNotAnsweredByARead(t *testing.T) {
	t.Parallel()
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{Sync: true})
	url := failoverURL(r)
	ctx := harnessCtx(t)
	hold := make(chan struct{})
	var once sync.Once
	hooks := kernel.TestHooks{
		StuckAfter: 300 * time.Millisecond,
		AfterAcquire: func() {
			first := false
			once.Do(func() { first = true })
			if first {
				<-hold // the first attempt's answer is lost for now
			}
		},
	}
	m, sig := fairSyncManager(t, url, Config{StatementTimeout: 30 * time.Second, TTL: time.Minute}, hooks)
	if err := m.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	admin := stopStandby(t, ctx, r)

	type result struct {
		lk  *Lock
		err error
	}
	res := make(chan result, 1)
	go func() {
		lk, err := m.Acquire(ctx, "fambig:k", WithAcquireTimeout(6*time.Second))
		res <- result{lk, err}
	}()
	done := make(chan struct{})
	cancelled := make(chan int, 1)
	go func() { cancelled <- cancelSyncRepUntil(t, ctx, r.Nodes[0].URL, done, nil) }()
	var got result
	select {
	case got = <-res:
	case <-time.After(time.Minute):
		t.Fatal("Acquire did not end within a minute")
	}
	close(hold)
	if got.err == nil {
		close(done)
		t.Fatalf("Acquire granted fence %d with the synchronous standby down (%d commit waits cancelled): "+
			"an already-granted answer to a ticket whose grant is on the primary alone, never a grant", got.lk.Fence(), <-cancelled)
	}
	// The clean-up of the ambiguous grants commits on the primary (its
	// waits for the standby cancelled as they come).
	noLiveLeases(t, ctx, admin, "fambig:", 1, 20*time.Second)
	closeCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := m.Close(closeCtx); err != nil {
		t.Logf("Close: %v", err)
	}
	close(done)
	t.Logf("Acquire: %v (%d commit waits cancelled, %d stuck batches hedged)", got.err, <-cancelled, len(sig.Stuck.Ch))
}

// TestFairAttemptAfterTurnFreesTheKey: a waiter's attempt is in flight
// (held before it is sent) when a release grants the waiter's ticket by a
// turn; the caller takes the lock and releases it. Then the attempt
// runs: the lockId has neither ticket nor lease any more. The attempt
// only refreshes the ticket (an earlier statement queued it), so it is
// answered gone: it neither queues the lockId again nor grants it anew,
// writes nothing, and its commit does not wait for the synchronous
// standby, which is stopped. (Before, it was queued again and, the key
// being free, granted anew — a lease for nobody, whose commit waited for
// the standby: an unknown outcome, which the Manager answers by leaving
// the lockId, fairLanded.) A caller of another Manager that comes next
// gets the key.
func TestFairAttemptAfterTurnFreesTheKey(t *testing.T) {
	t.Parallel()
	fairAttemptAfterTurn(t, "fambig:turn", false)
}

// TestFairAttemptAfterTurnQueuesNothing: as
// TestFairAttemptAfterTurnFreesTheKey, but the caller's release granted
// the key to a waiter of another Manager: the attempt must not queue the
// lockId again, for nobody, ahead of the next caller (kept, the holder's
// release would grant it to nobody, for its TTL, 2 min).
func TestFairAttemptAfterTurnQueuesNothing(t *testing.T) {
	t.Parallel()
	fairAttemptAfterTurn(t, "fambig:queued", true)
}

// fairAttemptAfterTurn runs the two tests above: with queued, a waiter of
// another Manager is granted the key by the caller's release and holds it
// while the attempt runs.
func fairAttemptAfterTurn(t *testing.T, key string, queued bool) {
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{Sync: true})
	url := failoverURL(r)
	ctx := harnessCtx(t)
	var armed, watching atomic.Bool
	blocked := make(chan struct{})
	unblock := make(chan struct{})
	answered := make(chan struct{})
	hooks := kernel.TestHooks{
		StuckAfter: time.Minute, // no hedge: the attempt held is the one that runs
		BeforeBatch: func(kind kernel.BatchKind, n int) {
			if kind == kernel.KindAcquire && armed.CompareAndSwap(true, false) {
				close(blocked)
				<-unblock
			}
		},
		AfterAcquire: func() {
			if watching.CompareAndSwap(true, false) {
				close(answered) // the held attempt (the only acquire batch then)
			}
		},
	}
	cfg := Config{StatementTimeout: time.Minute, TTL: 2 * time.Minute}
	m0, _ := fairSyncManager(t, url, cfg, kernel.TestHooks{})
	m1, _ := fairSyncManager(t, url, cfg, hooks)
	m2, _ := fairSyncManager(t, url, cfg, kernel.TestHooks{})
	if err := m0.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, r.Nodes[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	waitQueued := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			var n int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM syncguard_locks_queue WHERE key = $1`, key).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d tickets queued for the key, want %d", n, want)
			}
		}
	}
	acquire := func(m *Manager) <-chan *Lock {
		got := make(chan *Lock, 1)
		go func() {
			lk, err := m.Acquire(ctx, key, WithAcquireTimeout(time.Minute))
			if err != nil {
				t.Error(err)
			}
			got <- lk
		}()
		return got
	}

	l0, err := m0.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got1 := acquire(m1)
	waitQueued(1)
	// The waiter's next attempt (a retry while the key is held) is held
	// before it is sent.
	armed.Store(true)
	select {
	case <-blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter made no attempt within 30 s")
	}
	var got2 <-chan *Lock
	if queued {
		got2 = acquire(m2)
		waitQueued(2)
	}
	// The release grants the waiter's ticket (a turn); the caller
	// releases that grant (with queued, to the waiter of m2).
	if err := l0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l1 := <-got1
	if l1 == nil {
		t.FailNow()
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var l2 *Lock
	if queued {
		if l2 = <-got2; l2 == nil {
			t.FailNow()
		}
	}
	// The standby goes; the attempt runs. Answered gone, it wrote
	// nothing: it is answered without waiting for the standby. (Granted
	// anew or queued again, its commit would wait for the standby until
	// the statement timeout, 1 min.)
	if err := r.Nodes[1].StopServer(false); err != nil {
		t.Fatal(err)
	}
	watching.Store(true)
	close(unblock)
	select {
	case <-answered:
	case <-time.After(30 * time.Second):
		pids, _ := syncRepWaiters(ctx, admin)
		cancelSyncRepWaits(t, ctx, admin)
		t.Fatalf("the held attempt was not answered within 30 s (%d commits waiting for the stopped standby): it wrote, queuing or granting the lockId again", len(pids))
	}
	waitQueued(0) // nothing queued again, for nobody
	// Commits no longer wait for the standby.
	if _, err := admin.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = ''"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	// The next caller, of another Manager, gets the key: the lockId the
	// attempt granted (or queued, then granted by l2's release) for nobody
	// would hold it for 2 min.
	var seq int64
	if err := admin.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM syncguard_locks_queue`).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	got3 := acquire(m2)
	if queued {
		// It waits behind l2 (and, kept, the queued lockId: its 3 s of
		// life outlast this).
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			var n int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM syncguard_locks_queue WHERE key = $1 AND seq > $2`, key, seq).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the next caller was not queued within 30 s")
			}
		}
		if err := l2.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case lk := <-got3:
		if lk == nil {
			t.FailNow()
		}
		t.Logf("the next caller got fence %d", lk.Fence())
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the next caller after an ambiguous attempt of a waiter granted by a turn and released did not get the key " +
			"within 30 s (a lease the attempt made for nobody holds it until its TTL, 2 min)")
	}
}

// TestFairUnknownGrantNotAnsweredByARefresh: as
// TestFairUnknownGrantNotAnsweredByARead, for the ticket refresh. A reader
// waits in the queue behind a lease of the SQL API; the standby goes, and
// the lease is released by the SQL API (which serves no queue: the
// reader's own attempt takes the key). That attempt's commit waits for the
// standby until the wait is cancelled (committed on the primary alone),
// and its answer is held back, as a dead connection's would be. The
// waiter's ticket refresh then finds the ticket granted: that answer must
// wait for the standby as a grant does (its wait cancelled too, it is
// Ambiguous, not a grant). A reader, because a waiting writer tries again
// every second to keep its mark, and each of those commits would wait
// too.
func TestFairUnknownGrantNotAnsweredByARefresh(t *testing.T) {
	t.Parallel()
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{Sync: true})
	url := failoverURL(r)
	ctx := harnessCtx(t)
	var cancels atomic.Int32
	var held atomic.Bool
	hold := make(chan struct{})
	hooks := kernel.TestHooks{
		StuckAfter: time.Minute, // no hedge: only the refresh asks again
		AfterAcquire: func() {
			// The first answer after a cancelled commit wait is held back.
			if cancels.Load() > 0 && held.CompareAndSwap(false, true) {
				<-hold
			}
		},
	}
	// No retries before the takeover time (or the release's notice).
	cfg := Config{StatementTimeout: time.Minute, TTL: 2 * time.Minute, Retry: retry.Policy{Base: time.Minute}}
	m, _ := fairSyncManager(t, url, cfg, hooks)
	if err := m.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, r.Nodes[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	const key = "fambig:refresh"
	var leaseID string
	if err := admin.QueryRow(ctx, `SELECT lock_id FROM syncguard_locks_acquire($1, 6000)`, key).Scan(&leaseID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		lk  *Lock
		err error
	}
	res := make(chan result, 1)
	go func() {
		lk, err := m.Acquire(ctx, key, Shared(), WithAcquireTimeout(20*time.Second))
		res <- result{lk, err}
	}()
	waitOneTicket(t, ctx, admin, key)
	if err := r.Nodes[1].StopServer(false); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	cancelled := make(chan int, 1)
	go func() { cancelled <- cancelSyncRepUntil(t, ctx, r.Nodes[0].URL, done, func() { cancels.Add(1) }) }()
	// The SQL API's release commits without waiting for the standby.
	if _, err := admin.Exec(ctx, `SELECT syncguard_locks_release($1)`, leaseID); err != nil {
		t.Fatal(err)
	}
	var got result
	select {
	case got = <-res:
	case <-time.After(time.Minute):
		t.Fatal("Acquire did not end within a minute")
	}
	close(hold)
	if got.err == nil {
		close(done)
		t.Fatalf("Acquire granted fence %d with the synchronous standby down (%d commit waits cancelled, the attempt's answer held: %v): "+
			"a refresh's already-granted answer to a ticket whose grant is on the primary alone, never a grant", got.lk.Fence(), <-cancelled, held.Load())
	}
	if !held.Load() {
		t.Errorf("no attempt's answer was held back after a cancelled commit: the test did not make the fault (%v)", got.err)
	}
	noLiveLeases(t, ctx, admin, key, 1, 20*time.Second)
	closeCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := m.Close(closeCtx); err != nil {
		t.Logf("Close: %v", err)
	}
	close(done)
	t.Logf("Acquire: %v (%d commit waits cancelled)", got.err, <-cancelled)
}

// TestFairTurnToAnotherProcessWaitsForTheStandby: a release that serves the
// queue grants the key to the head ticket, of another Manager, in its own
// transaction and notifies that Manager. With the synchronous standby
// gone, the release's commit waits for it until the wait is cancelled:
// the grant is then on the primary alone, the releaser's answer is
// Ambiguous, and PostgreSQL still delivers the notice. The waiter must not
// take that notice as a grant (a failover to the standby would hand the
// same fence out again): it confirms the grant with a commit of its own,
// which waits for the standby too. So no Acquire may succeed while the
// standby is down.
func TestFairTurnToAnotherProcessWaitsForTheStandby(t *testing.T) {
	t.Parallel()
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{Sync: true})
	url := failoverURL(r)
	ctx := harnessCtx(t)
	cfg := Config{StatementTimeout: time.Minute, TTL: 2 * time.Minute, Retry: retry.Policy{Base: time.Minute}}
	holder, _ := fairSyncManager(t, url, cfg, kernel.TestHooks{})
	waiter, sig := fairSyncManager(t, url, cfg, kernel.TestHooks{StuckAfter: time.Minute})
	if err := holder.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	const key = "fambig:turn"
	lk, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lk  *Lock
		err error
	}
	res := make(chan result, 1)
	go func() {
		lk, err := waiter.Acquire(ctx, key, WithAcquireTimeout(8*time.Second))
		res <- result{lk, err}
	}()
	admin := stopStandby(t, ctx, r)
	waitOneTicket(t, ctx, admin, key)
	done := make(chan struct{})
	cancelled := make(chan int, 1)
	go func() { cancelled <- cancelSyncRepUntil(t, ctx, r.Nodes[0].URL, done, nil) }()
	relErr := lk.Release(ctx)
	t.Logf("the holder's Release: %v", relErr)
	var granted int64
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM syncguard_locks WHERE key = $1`, key).Scan(&granted); err != nil {
		t.Fatal(err)
	}
	var got result
	select {
	case got = <-res:
	case <-time.After(time.Minute):
		t.Fatal("Acquire did not end within a minute")
	}
	close(done)
	n := <-cancelled
	if got.err == nil {
		_ = got.lk.Release(ctx)
		t.Fatalf("the waiter was granted fence %d with the synchronous standby down (%d commit waits cancelled): "+
			"a turn's notice from a commit on the primary alone, never a grant", got.lk.Fence(), n)
	}
	if granted == 0 || n == 0 {
		t.Errorf("the release made no grant on the primary (%d rows) or no commit wait was cancelled (%d): the test did not make the fault", granted, n)
	}
	notices := 0
	for len(sig.Turn.Ch) > 0 {
		if <-sig.Turn.Ch {
			notices++
		}
	}
	if notices == 0 {
		t.Errorf("the waiter's process heard no grant notice: the test did not make the fault")
	}
	t.Logf("Acquire: %v (%d commit waits cancelled, %d grant notices heard)", got.err, n, notices)
	// Commits no longer wait for the standby, so the Managers close.
	if _, err := admin.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = ''"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
}
