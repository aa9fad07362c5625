package manager

import (
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5"

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
	wait(t, &b.sig.Listening)
	holder, hsig := b.newPeer(t, Config{})
	wait(t, &hsig.Listening)
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
		drain(&hsig.Queued) // the first caller's
		got := make(chan *Lock, 1)
		go func() {
			lk, err := holder.Acquire(ctx, key, WithTTL(30*time.Second))
			if err != nil {
				t.Error(err)
			}
			got <- lk
		}()
		if k := wait(t, &hsig.Queued); k != key {
			t.Fatalf("queued %q", k)
		}
		drain(&hsig.BatchSent)
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		second := <-got
		if second == nil {
			return
		}
		handedOff := false
		var kinds []kernel.BatchKind
		for done := false; !done; {
			select {
			case bi := <-hsig.BatchSent.Ch:
				kinds = append(kinds, bi.Kind)
				handedOff = handedOff || bi.Kind == kernel.KindHandOff
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
	wait(t, &b.sig.Listening)
	own, osig := b.newPeer(t, Config{Config: pg.Config{NotifyChannel: pgtest.RandomName("own_")}})
	wait(t, &osig.Listening)
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

// TestWatchBlockedKeyDoesNotStallOthers: a watched key whose read is held
// up (a takeover of it waits for the commit of a transaction that guards
// the expired lease, holding the key's lock meanwhile) does not hold up
// another watched key's events: a grant and a release of the other key
// are reported while the takeover still waits. Once the guard commits,
// the first key's state comes too. (The watcher's statement timeout is
// long, so that a read that waits is not cut short by it: it would wait
// for the commit, which comes only after the other key's events.)
func TestWatchBlockedKeyDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: Config{StatementTimeout: time.Minute}})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	holder, _ := b.newPeer(t, Config{})
	taker, _ := b.newPeer(t, Config{StatementTimeout: time.Minute}) // its takeover waits for the commit
	const blocked, free = "watch:blocked", "watch:free"
	freeCh, err := b.m.Watch(ctx, free)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, freeCh), EventReleased, 0)

	lk, err := holder.Acquire(ctx, blocked, WithTTL(time.Second), WithoutAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := lk.Guard(ctx, tx); err != nil {
		t.Fatal(err)
	}
	// Past the expiry and the server's 1 s tolerance: a takeover may come,
	// and waits for tx.
	time.Sleep(time.Until(lk.ExpiresAt().Add(1500 * time.Millisecond)))
	took := make(chan *Lock, 1)
	go func() {
		l, err := taker.Acquire(ctx, blocked)
		if err != nil {
			t.Error(err)
		}
		took <- l
	}()
	select {
	case l := <-took:
		if l != nil {
			_ = l.Release(ctx)
		}
		t.Skip("the takeover did not wait for the guarding transaction")
	case <-time.After(time.Second):
	}
	// Watching the blocked key now reads it: held up behind the takeover.
	blockedCh, err := b.m.Watch(ctx, blocked)
	if err != nil {
		t.Fatal(err)
	}
	other, err := holder.Acquire(ctx, free)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, freeCh), EventGranted, other.Fence())
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, freeCh), EventReleased, other.Fence())
	select {
	case l := <-took:
		t.Fatalf("the takeover ended (%v) before the other key's events: the test proved nothing", l != nil)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	next := <-took
	if next == nil {
		return
	}
	defer func() { _ = next.Release(ctx) }()
	for {
		ev := nextEvent(t, blockedCh)
		if ev.Kind == EventGranted && ev.Fence == next.Fence() {
			break
		}
		if ev.Fence > next.Fence() {
			t.Fatalf("event %+v beyond the takeover's fence %v", ev, next.Fence())
		}
	}
	_ = lk.Release(ctx)
}

// TestWatchReconnectTellsOnce: after the listening connection is
// replaced, watchers are told what changed while it was down, once, and
// nothing when nothing did: no repeat of the last event, no "released"
// of fence 0 for a key that was free or had been released. A lease that
// ended unseen is told as EventResync with its fence.
func TestWatchReconnectTellsOnce(t *testing.T) {
	t.Parallel()
	app := pgtest.RandomName("watchonce_")
	var mu sync.Mutex
	var hold chan struct{} // non-nil: the listener's next connect waits for it
	b := setup(t, setupOpts{hooks: kernel.TestHooks{ListenConfig: func(c *pgx.ConnConfig) {
		c.RuntimeParams["application_name"] = app
		mu.Lock()
		h := hold
		mu.Unlock()
		if h != nil {
			<-h
		}
	}}})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	actor, _ := b.newPeer(t, Config{})
	const never, held, ended = "watch:once:never", "watch:once:held", "watch:once:ended"
	chs := map[string]<-chan Event{}
	for _, k := range []string{never, held, ended} {
		ch, err := b.m.Watch(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		expectEvent(t, nextEvent(t, ch), EventReleased, 0)
		chs[k] = ch
	}
	hl, err := actor.Acquire(ctx, held, WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, chs[held]), EventGranted, hl.Fence())
	el, err := actor.Acquire(ctx, ended)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, chs[ended]), EventGranted, el.Fence())
	if err := el.Release(ctx); err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, chs[ended]), EventReleased, el.Fence())

	admin, _ := pgtest.Pool(t)
	reconnect := func(during func()) {
		t.Helper()
		release := make(chan struct{})
		mu.Lock()
		hold = release
		mu.Unlock()
		var n int
		if err := admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil || n != 1 {
			t.Fatalf("terminated %d listener backends: %v", n, err)
		}
		during()
		mu.Lock()
		hold = nil
		mu.Unlock()
		drain(&b.sig.WatchRead)
		close(release)
		wait(t, &b.sig.Listening)
		// The keys are read again (the watch locks taken again, and the
		// resync): give both reads time to come back.
		wait(t, &b.sig.WatchRead)
		time.Sleep(500 * time.Millisecond)
	}
	quiet := func(when string) {
		t.Helper()
		for k, ch := range chs {
			select {
			case ev := <-ch:
				t.Fatalf("%s: %s told %+v", when, k, ev)
			default:
			}
		}
	}

	// Nothing changes while the listener is down: nothing is told.
	reconnect(func() {})
	quiet("after a reconnect with no change")

	// The held lease is released while the listener is down: told once,
	// as ended unseen, with its fence.
	reconnect(func() {
		if err := hl.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
	ev := nextEvent(t, chs[held])
	expectEvent(t, ev, EventResync, hl.Fence())
	quiet("after the resync of a released lease")

	// And the watch goes on.
	nl, err := actor.Acquire(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, chs[held]), EventGranted, nl.Fence())
	if err := nl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, chs[held]), EventReleased, nl.Fence())
	quiet("at the end")
}
