package manager

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// nextEvent returns the next event of ch, failing after waitTimeout.
func nextEvent(t testing.TB, ch <-chan Event) Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return ev
	case <-time.After(waitTimeout()):
		t.Fatal("no watch event")
		panic("unreachable")
	}
}

// expectEvent fails unless ev is of kind with fence (fence < 0: any).
func expectEvent(t testing.TB, ev Event, kind EventKind, fence pglease.Fence) {
	t.Helper()
	if ev.Kind != kind || (fence >= 0 && ev.Fence != fence) {
		t.Fatalf("event %+v, want %s of fence %v", ev, kind, fence)
	}
}

// TestWatchSequence: a watcher in one Manager sees every change another
// Manager makes to the key, in order, with fences, the holder and the
// expiry: its state first (free), a grant, its release, a grant and its
// revoke, a grant that expires (found a second after its expiry), then a
// takeover of an expired lease (Expired, then Granted). Nothing more
// comes (no duplicate).
func TestWatchSequence(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	actor, asig := b.newPeer(t, Config{Config: pg.Config{Holder: "actor[1]@test"}})
	wait(t, &asig.Listening)
	const key = "watch:seq"
	ch, err := b.m.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventReleased, 0)

	lk, err := actor.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, ch)
	expectEvent(t, ev, EventGranted, lk.Fence())
	if ev.Holder != "actor[1]@test" || !ev.ExpiresAt.Equal(lk.ExpiresAt()) {
		t.Fatalf("granted %+v: holder or expiry wrong (lock expires %v)", ev, lk.ExpiresAt())
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ev = nextEvent(t, ch)
	expectEvent(t, ev, EventReleased, lk.Fence())
	if ev.Holder != "actor[1]@test" {
		t.Fatalf("released %+v: holder", ev)
	}

	lk, err = actor.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventGranted, lk.Fence())
	if n, _, err := b.m.Revoke(ctx, key); err != nil || n != 1 {
		t.Fatalf("Revoke = %v, %v", n, err)
	}
	expectEvent(t, nextEvent(t, ch), EventRevoked, lk.Fence())

	lk, err = actor.Acquire(ctx, key, WithTTL(200*time.Millisecond), WithoutAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventGranted, lk.Fence())
	ev = nextEvent(t, ch)
	expectEvent(t, ev, EventExpired, lk.Fence())
	if late := time.Until(ev.ExpiresAt.Add(time.Second)); late > 0 {
		t.Fatalf("expired reported %v before expiry + 1 s", late)
	}
	// The expired lease is taken over: its row is replaced.
	expired := lk.Fence()
	lk, err = actor.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if lk.Fence() <= expired {
		t.Fatal("fence")
	}
	expectEvent(t, nextEvent(t, ch), EventGranted, lk.Fence())
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventReleased, lk.Fence())
	select {
	case ev := <-ch:
		t.Fatalf("unexpected event %+v", ev)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestWatchExtended: a watched lease that is extended past its first
// expiry is not reported expired: the confirming read finds it extended.
func TestWatchExtended(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	const key = "watch:extended"
	ch, err := b.m.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventReleased, 0)
	const ttl = time.Second
	lk, err := b.m.Acquire(ctx, key, WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventGranted, lk.Fence())
	// Three expiries' worth: auto-extended all along.
	select {
	case ev := <-ch:
		if lk.Err() == nil {
			t.Fatalf("unexpected event %+v while extended", ev)
		}
		// A machine too loaded to extend a 1 s lease in time: the lease
		// did expire (the holder was told first), and the event is right.
		t.Skipf("the lease was lost (%v): %+v", lk.Err(), ev)
	case <-time.After(3 * (ttl + time.Second)):
	}
	if lk.Err() != nil {
		t.Skipf("the lease was lost on a loaded machine: %v", lk.Err())
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventReleased, lk.Fence())
}

// TestWatchReconnect: the watcher's listening connection is terminated
// and held down while the key changes several times; after it reconnects
// the watcher gets the final state (the last grant, held), and the watch
// goes on. Fences never go back.
func TestWatchReconnect(t *testing.T) {
	t.Parallel()
	app := pgtest.RandomName("watchlis_")
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
	const key = "watch:reconnect"
	ch, err := b.m.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventReleased, 0)
	first, err := actor.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventGranted, first.Fence())

	release := make(chan struct{})
	mu.Lock()
	hold = release
	mu.Unlock()
	admin, _ := pgtest.Pool(t)
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminated %d listener backends: %v", n, err)
	}
	// While the listener is down: release, a grant and its release, and
	// a last grant that stays.
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mid, err := actor.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := mid.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last, err := actor.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	hold = nil
	mu.Unlock()
	close(release)
	wait(t, &b.sig.Listening)
	prev := first.Fence()
	for {
		ev := nextEvent(t, ch)
		if ev.Fence != 0 && ev.Fence < prev {
			t.Fatalf("fence went back: %+v after %v", ev, prev)
		}
		prev = max(prev, ev.Fence)
		if ev.Kind == EventGranted && ev.Fence == last.Fence() {
			break
		}
	}
	// And the watch goes on. The state may be announced twice after a
	// reconnect (the watch lock taken again, then the resync: Watch's doc
	// says the state may repeat), so a repeat of the last grant may come
	// before the release.
	if err := last.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, ch)
	for ev.Kind == EventGranted && ev.Fence == last.Fence() {
		ev = nextEvent(t, ch)
	}
	expectEvent(t, ev, EventReleased, last.Fence())
}

// TestWatchMany: many watchers of one key in two Managers all see the
// same events; a watcher whose context ends gets its channel closed and
// the others go on; Close closes the rest.
func TestWatchMany(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	other, osig := b.newPeer(t, Config{})
	wait(t, &osig.Listening)
	const key = "watch:many"
	const n = 20
	var chans []<-chan Event
	cctx, cancel := context.WithCancel(ctx)
	for i := range n {
		m, c := b.m, ctx
		if i%2 == 1 {
			m = other
		}
		if i == 0 {
			c = cctx
		}
		ch, err := m.Watch(c, key)
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	for _, ch := range chans {
		expectEvent(t, nextEvent(t, ch), EventReleased, 0)
	}
	lk, err := b.m.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chans {
		expectEvent(t, nextEvent(t, ch), EventGranted, lk.Fence())
	}
	cancel()
	for {
		if _, ok := <-chans[0]; !ok {
			break
		}
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ch := range chans[1:] {
		expectEvent(t, nextEvent(t, ch), EventReleased, lk.Fence())
	}
	// A late watcher of a watched key gets the state at once.
	ch, err := b.m.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventReleased, lk.Fence())
	if err := other.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n; i += 2 {
		if _, ok := <-chans[i]; ok {
			t.Fatalf("watcher %d: channel not closed by Close", i)
		}
	}
}

// TestWatchSlowReader: a reader that does not read while many changes
// happen never blocks the Manager (its grants and releases go on, and
// another watcher of the key keeps up), and when it reads it finds the
// latest events, the last one last, in order.
func TestWatchSlowReader(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	const key = "watch:slow"
	slow, err := b.m.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := b.m.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, fast), EventReleased, 0)
	var last pglease.Fence
	for range 3 * kernel.WatchBuffer {
		lk, err := b.m.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		last = lk.Fence()
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for {
		ev := nextEvent(t, fast)
		if ev.Kind == EventReleased && ev.Fence == last {
			break
		}
	}
	if len(slow) != kernel.WatchBuffer {
		t.Fatalf("slow reader holds %d events, want %d", len(slow), kernel.WatchBuffer)
	}
	var evs []Event
	for len(slow) > 0 {
		evs = append(evs, <-slow)
	}
	if e := evs[len(evs)-1]; e.Kind != EventReleased || e.Fence != last {
		t.Fatalf("last event %+v, want released %v", e, last)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Fence < evs[i-1].Fence {
			t.Fatalf("out of order: %+v", evs)
		}
	}
}
