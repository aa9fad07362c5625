package manager

import (
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// TestWatchHandoff: a release that hands the key to a caller waiting in
// the same Manager, in one statement, is told as what it is: the old
// lease released, then the new one granted; never expired (the old lease
// was live, seconds from its expiry).
func TestWatchHandoff(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	wait(t, &b.sig.listening)
	holder, hsig := b.newPeer(t, Config{})
	wait(t, &hsig.listening)
	const key = "watch:handoff"
	ch, err := b.m.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventReleased, 0)
	for round := 0; round < 3; round++ {
		first, err := holder.Acquire(ctx, key, WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		expectEvent(t, nextEvent(t, ch), EventGranted, first.Fence())
		drain(&hsig.queued) // the first caller's
		got := make(chan *Lock, 1)
		go func() {
			lk, err := holder.Acquire(ctx, key, WithTTL(30*time.Second))
			if err != nil {
				t.Error(err)
			}
			got <- lk
		}()
		if k := wait(t, &hsig.queued); k != key {
			t.Fatalf("queued %q", k)
		}
		drain(&hsig.batchSent)
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		second := <-got
		if second == nil {
			return
		}
		handedOff := false
		var kinds []batchKind
		for done := false; !done; {
			select {
			case bi := <-hsig.batchSent.ch:
				kinds = append(kinds, bi.kind)
				handedOff = handedOff || bi.kind == kindHandOff
			default:
				done = true
			}
		}
		if !handedOff {
			t.Fatalf("round %d: the release was not a handoff: %v", round, kinds)
		}
		ev := nextEvent(t, ch)
		expectEvent(t, ev, EventReleased, first.Fence())
		expectEvent(t, nextEvent(t, ch), EventGranted, second.Fence())
		if err := second.Release(ctx); err != nil {
			t.Fatal(err)
		}
		expectEvent(t, nextEvent(t, ch), EventReleased, second.Fence())
	}
	select {
	case ev := <-ch:
		t.Fatalf("unexpected event %+v", ev)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestWatchStoreWithoutChannel: grants and releases made through a
// pg.Store with the zero Config (no notify channel), on the pool or on a
// caller's transaction, reach the key's watchers all the same, in a
// Manager on the default channel and in one on a channel of its own.
func TestWatchStoreWithoutChannel(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	wait(t, &b.sig.listening)
	own, osig := b.newPeer(t, Config{Config: pg.Config{NotifyChannel: pgtest.RandomName("own_")}})
	wait(t, &osig.listening)
	const key = "watch:nochannel"
	chs := make([]<-chan Event, 0, 2)
	for _, m := range []*Manager{b.m, own} {
		ch, err := m.Watch(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		expectEvent(t, nextEvent(t, ch), EventReleased, 0)
		chs = append(chs, ch)
	}
	st, err := pg.New(b.pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Acquire(ctx, key, time.Minute)
	if err != nil || !res.OK {
		t.Fatalf("Acquire = %v, %v", res, err)
	}
	for _, ch := range chs {
		expectEvent(t, nextEvent(t, ch), EventGranted, res.Fence)
	}
	if ok, err := st.Release(ctx, res.LockID); err != nil || !ok {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	for _, ch := range chs {
		expectEvent(t, nextEvent(t, ch), EventReleased, res.Fence)
	}

	// On a caller's transaction: told when it commits.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	txs, err := pg.New(tx, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	res, err = txs.Acquire(ctx, key, time.Minute)
	if err != nil || !res.OK {
		t.Fatalf("Acquire in tx = %v, %v", res, err)
	}
	if ok, err := txs.Release(ctx, res.LockID); err != nil || !ok {
		t.Fatalf("Release in tx = %v, %v", ok, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ch := range chs {
		expectEvent(t, nextEvent(t, ch), EventGranted, res.Fence)
		expectEvent(t, nextEvent(t, ch), EventReleased, res.Fence)
	}
}
