package manager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestLostLeaseRowKept (timely loss signal): a lease the Manager declared lost
// on its own clock stays on the server until its holder calls Release or
// it expires: the loss margin and the takeover tolerance protect a holder
// slow to notice. Neither this Manager nor another process gets the key in
// between; Release (the holder has stopped) frees it at once, well before
// the expiry; Close frees the kept row of a holder that never released.
func TestLostLeaseRowKept(t *testing.T) {
	t.Parallel()
	// TTL 10 s, margin 9 s: lost here after 1 s, live on the server for
	// 9 s more (10 s for acquirers).
	cfg := Config{LossMargin: 9 * time.Second, DisableNotify: true}
	b := setup(t, setupOpts{cfg: cfg})
	peer, _ := b.newPeer(t, cfg)
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "kept", WithTTL(10*time.Second), WithoutAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	<-lk.Done()
	if !errors.Is(lk.Err(), pglease.ErrLockLost) {
		t.Fatalf("cause = %v", lk.Err())
	}
	waitFor(t, &b.sig.Lost, func(k string) bool { return k == "kept" }) // the loop has handled the loss
	// A TryAcquire of the same Manager is sent after anything the loss
	// queued for the key (a release of the lost lockId would be answered
	// first): the row must still be there.
	if l2, ok, err := b.m.TryAcquire(ctx, "kept"); ok || err != nil {
		if ok {
			_ = l2.Release(ctx)
		}
		t.Fatalf("TryAcquire here after the loss = %v, %v: the lost lease was released", ok, err)
	}
	if _, ok, err := peer.TryAcquire(ctx, "kept"); ok || err != nil {
		t.Fatalf("TryAcquire elsewhere after the loss = %v, %v", ok, err)
	}
	if id, ok := lockRow(t, b.pool, "kept"); !ok || id != lk.hd.ID {
		t.Fatal("the lost lease's row is gone before its expiry")
	}
	// The holder stops: its Release reports the loss and frees the row.
	if err := lk.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("Release of the lost lock = %v", err)
	}
	if _, ok := lockRow(t, b.pool, "kept"); ok {
		t.Fatal("Release of the lost lock left its row")
	}
	l3, ok, err := peer.TryAcquire(ctx, "kept")
	if !ok || err != nil {
		t.Fatalf("TryAcquire after the holder's Release = %v, %v", ok, err)
	}
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); !errors.Is(err, pglease.ErrLockLost) { // twice: no second release
		t.Fatalf("second Release = %v", err)
	}

	// A holder that never releases: Close frees the kept row.
	lk2, err := peer.Acquire(ctx, "kept2", WithTTL(10*time.Second), WithoutAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	<-lk2.Done()
	if _, ok, _ := b.m.TryAcquire(ctx, "kept2"); ok {
		t.Fatal("kept2 released at its loss")
	}
	if err := peer.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := lockRow(t, b.pool, "kept2"); ok {
		t.Fatal("Close left a lost lock's kept row")
	}
}

// TestStatementTimeoutIsRetryable: when the Manager's own
// statement timeout ends an attempt while the caller's context is alive,
// the caller gets a retryable CodeNetworkTimeout, not CodeAborted (which
// means the caller's context ended), and the error's Op is the call the
// user made, not the Store's batch call. A retry then works.
func TestStatementTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	app := pgtest.RandomName("stmt_")
	b := setup(t, setupOpts{cfg: Config{StatementTimeout: 300 * time.Millisecond},
		pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app }}})
	ctx := ctxT(t)
	blocker, _ := pgtest.Pool(t)
	// The acquire function waits for the lock table, locked here by
	// another transaction (a key's locks held by another transaction are
	// waited for only briefly, then answered held: not a timeout).
	tx, err := b.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "LOCK TABLE syncguard_locks IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	for _, try := range []bool{true, false} {
		var err error
		if try {
			_, _, err = b.m.TryAcquire(ctx, "stuck")
		} else {
			// The waiter's attempts time out until its wait ends: its wait
			// ended on the database not answering, not on a holder, so the
			// error is the last attempt's NetworkTimeout (not
			// AcquisitionTimeout), with that attempt as its cause.
			_, err = b.m.Acquire(ctx, "stuck", WithAcquireTimeout(time.Second))
			if errors.Is(err, pglease.ErrAcquisitionTimeout) {
				t.Fatalf("Acquire = %v: a wait that ended on timeouts is not contention", err)
			}
		}
		var e *pglease.Error
		if !errors.As(err, &e) || e.Code != pglease.CodeNetworkTimeout || !pglease.Retryable(err) {
			t.Fatalf("try=%v: %v: want a retryable NetworkTimeout", try, err)
		}
		if want := map[bool]string{true: "manager.TryAcquire", false: "manager.Acquire"}[try]; e.Op != want {
			t.Fatalf("Op = %q, want %s", e.Op, want)
		}
	}
	// Hygiene, not the property under test: the server backends still
	// waiting for the table lock (their clients gave up, or their
	// attempts were superseded by hedges still in flight) would grant after
	// the blocker ends, and such a late grant stays until it is released
	// or expires. End them until none of the Manager's statements is in
	// flight (no new attempt starts: nobody waits for the key any more).
	deadline := time.Now().Add(waitTimeout())
	for idle := 0; idle < 2; {
		if _, err := blocker.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", app); err != nil {
			t.Fatal(err)
		}
		if b.pool.Stat().AcquiredConns() == 0 {
			idle++
		} else {
			idle = 0
		}
		if time.Now().After(deadline) {
			t.Fatal("the Manager's statements are still in flight")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	lk, ok, err := b.m.TryAcquire(ctx, "stuck")
	if !ok || err != nil {
		t.Fatalf("retry: %v %v", ok, err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClosedPoolFailsAtOnce: a pool closed under the Manager
// is not a retryable ServiceUnavailable that makes Acquire wait its whole
// timeout: the wait ends at once with CodeClosed.
func TestClosedPoolFailsAtOnce(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Pool(t)
	m, err := New(pool, Config{DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	ctx := ctxT(t)
	if err := m.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	start := time.Now()
	_, err = m.Acquire(ctx, "k", WithAcquireTimeout(waitTimeout()))
	var e *pglease.Error
	if !errors.As(err, &e) || e.Code != pglease.CodeClosed || e.Op != "manager.Acquire" || pglease.Retryable(err) {
		t.Fatalf("Acquire on a closed pool = %v", err)
	}
	if d := time.Since(start); d > waitTimeout()/2 {
		t.Fatalf("took %v: waited for the acquire timeout", d)
	}
	if _, _, err := m.TryAcquire(ctx, "k"); pglease.CodeOf(err) != pglease.CodeClosed {
		t.Fatalf("TryAcquire on a closed pool = %v", err)
	}
}

// TestUnassignedCodePointKeyNoIO: a key with a code point
// unassigned in pglease's Unicode version is InvalidArgument, with a
// message that says why, before any query.
func TestUnassignedCodePointKeyNoIO(t *testing.T) {
	t.Parallel()
	qc, qn := queryCounter("", "")
	b := setup(t, setupOpts{pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc }}})
	ctx := ctxT(t)
	key := "\U000105D2\u0307"
	if _, err := keys.NormalizeKey(key); err == nil {
		t.Skipf("U+105D2 is assigned in Unicode %s: nothing to refuse", keys.UnicodeVersion)
	}
	before := qn.Load()
	_, err := b.m.Acquire(ctx, key)
	var e *pglease.Error
	if !errors.As(err, &e) || e.Code != pglease.CodeInvalidArgument || e.Op != "manager.Acquire" || !strings.Contains(e.Msg, "unassigned in Unicode") {
		t.Fatalf("Acquire = %v", err)
	}
	if _, _, err := b.m.TryAcquire(ctx, key); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Fatalf("TryAcquire = %v", err)
	}
	if n := qn.Load() - before; n != 0 {
		t.Fatalf("%d queries", n)
	}
}
