package manager

import (
	"context"
	"testing"
	"time"

	"github.com/pglease/pglease/pg"
)

// TestKeyHeldByOpenTransaction: a key another transaction holds the lock
// of (pg.New(tx) acquired it and has not committed) is "held" to a
// Manager, not an outage: TryAcquire answers ok=false with no error, an
// Acquire keeps waiting and is granted once the transaction ends, and no
// acquire statement of the Manager waits long enough to count as stuck
// (which is what delayed the Manager's other keys by about a second: a
// batch waiting on the key's lock held the acquire lane).
func TestKeyHeldByOpenTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	st, err := pg.New(tx, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := st.Acquire(ctx, "held", time.Minute); err != nil || !r.OK {
		t.Fatalf("acquire in the transaction = %v, %v", r, err)
	}
	drain(&b.sig.Stuck)

	// A waiting Acquire of the key, in the acquire lane while the other
	// calls below run.
	waiting := make(chan error, 1)
	go func() {
		lk, err := b.m.Acquire(ctx, "held")
		if err == nil {
			err = lk.Release(ctx)
		}
		waiting <- err
	}()

	for i := range 3 {
		t0 := time.Now()
		_, ok, err := b.m.TryAcquire(ctx, "held")
		if err != nil || ok {
			t.Fatalf("TryAcquire %d of a key held by an open transaction = %t, %v after %v; want held (false, nil)", i, ok, err, time.Since(t0))
		}
		t.Logf("TryAcquire %d: held after %v", i, time.Since(t0))
		t0 = time.Now()
		lk, err := b.m.Acquire(ctx, "free")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Acquire of a free key %d: %v", i, time.Since(t0))
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case kind := <-b.sig.Stuck.Ch:
		t.Fatalf("an acquire statement got no answer for a second (a %v batch): it waited on the key's lock", kind)
	default:
	}
	select {
	case err := <-waiting:
		t.Fatalf("the waiting Acquire ended while the transaction holds the key: %v", err)
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	expectGrant(t, waiting, "the waiting Acquire was not granted after the transaction ended")
}

// TestHandOffWhileTransactionKeepsKeyLocked: a transaction tried a key
// this Manager holds (refused, it keeps the key's advisory lock until it
// ends); the Manager's release of the key to a caller of its own waiting
// for it (a handoff: release and grant in one statement) releases the
// lease at once and answers the grant held, instead of the statement
// waiting for the transaction. The waiting caller is granted after the
// transaction ends.
func TestHandOffWhileTransactionKeepsKeyLocked(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "handed")
	if err != nil {
		t.Fatal(err)
	}
	drain(&b.sig.Queued) // the holder's own Acquire was queued too
	waiting := acquireAndRelease(ctx, b.m, "handed")
	waitFor(t, &b.sig.Queued, func(k string) bool { return k == "handed" })
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	st, err := pg.New(tx, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := st.Acquire(ctx, "handed", time.Minute); err != nil || r.OK {
		t.Fatalf("acquire of a held key in the transaction = %v, %v; want held", r, err)
	}
	drain(&b.sig.Stuck)
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("Release handing the key over: %v", err)
	}
	if _, ok := lockRow(t, b.pool, "handed"); ok {
		t.Fatal("the released lease's row is still live")
	}
	select {
	case kind := <-b.sig.Stuck.Ch:
		t.Fatalf("a %v batch got no answer for a second: it waited for the transaction", kind)
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	expectGrant(t, waiting, "the waiting caller was not granted after the transaction ended")
}
