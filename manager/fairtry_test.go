package manager

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager/internal/kernel"
)

// tryEveryKind makes one try of key of each kind through m (exclusive,
// reader, permit, a set of key and other) and returns the kinds that got
// it (released at once); a try that fails is a test failure.
func tryEveryKind(t *testing.T, m *Manager, key, other string) (took []string) {
	t.Helper()
	ctx := ctxT(t)
	for _, k := range []struct {
		name string
		opts []AcquireOption
	}{{"exclusive", nil}, {"reader", []AcquireOption{Shared()}}, {"permit", []AcquireOption{WithLimit(2)}}} {
		lk, ok, err := m.TryAcquire(ctx, key, k.opts...)
		if err != nil {
			t.Fatalf("%s try: %v", k.name, err)
		}
		if ok {
			took = append(took, k.name)
			if err := lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	locks, ok, err := m.TryAcquireAll(ctx, []string{key, other})
	if err != nil {
		t.Fatalf("set try: %v", err)
	}
	if ok {
		took = append(took, "set")
		for _, lk := range locks {
			if err := lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	return took
}

// liveLease reports whether key has a live exclusive lease or shared hold.
func liveLease(t *testing.T, b *bundle, key string) bool {
	t.Helper()
	shared, excl, err := liveCounts(ctxT(t), b.admin, key)
	if err != nil {
		t.Fatal(err)
	}
	return shared+excl > 0
}

// setTurn makes a set of key and key2 wait at the head of key's line with
// key free: holder takes both keys, waiter's AcquireAll of both queues a
// ticket on each, and holder lets key go. done lets key2 go and waits for
// the set's grant, then releases the set.
func setTurn(t *testing.T, b *bundle, holder, waiter *Manager, key, key2 string) (done func()) {
	t.Helper()
	ctx := ctxT(t)
	held, err := holder.AcquireAll(ctx, []string{key, key2})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var set []*Lock
	go func() {
		var err error
		set, err = waiter.AcquireAll(ctx, []string{key, key2}, WithAcquireTimeout(time.Minute))
		got <- err
	}()
	waitTickets(t, b.admin, key, 1)
	waitTickets(t, b.admin, key2, 1)
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := held[1].Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(waitTimeout()):
			t.Fatal("the set was not granted once both keys were free")
		}
		for _, lk := range set {
			if err := lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestFairTryYieldsToSetTurn: with the fair queue, a set waiting in one
// Manager is at the head of a key's line when the key's holder releases
// it; the release leaves the key free for the set (whose other key is
// still held). A third Manager's tries of that free key, of every kind
// and again and again, are answered "held": the set's ticket came first.
// A Manager without the queue (FairQueue off) ignores the tickets, as
// SyncGuard does: its try takes the key.
func TestFairTryYieldsToSetTurn(t *testing.T) {
	b, ms, _ := fairManagers(t, 3, true)
	const key, key2, other = "fair:try:a", "fair:try:b", "fair:try:c"
	done := setTurn(t, b, ms[0], ms[1], key, key2)
	// The key is free, its line holds the set's ticket.
	for i := range 20 {
		if liveLease(t, b, key) {
			t.Fatalf("round %d: the key is held; the set's turn should leave it free", i)
		}
		if took := tryEveryKind(t, ms[2], key, other); len(took) > 0 {
			t.Fatalf("round %d: tries of %v took the key while the set's ticket waits for it (live tickets: %d)", i, took, liveTickets(t, b.admin, key))
		}
	}
	// A Manager without the queue: tries ignore the tickets.
	plain, _ := b.newPeer(t, Config{})
	if took := tryEveryKind(t, plain, key, other); len(took) != 4 {
		t.Fatalf("a Manager without the queue took the key by %v, want every kind (it does not look at the tickets)", took)
	}
	done()
	waitTickets(t, b.admin, key, 0)
}

// TestFairTryYieldsToQueuedWaiter: a key freed without serving its queue
// (a release by pg.Store or SyncGuard, or an expiry) while a waiter of
// another Manager is queued for it: a third Manager polling the key with
// tries (exclusive and reader, alternately, with no pause) never gets it
// before the waiter, who is granted.
func TestFairTryYieldsToQueuedWaiter(t *testing.T) {
	b, ms, _ := fairManagers(t, 2, true)
	ctx := ctxT(t)
	const key = "fair:try:waiter"
	raw, holder := rawHold(t, b, key)
	got := make(chan error, 1)
	var lk *Lock
	go func() {
		var err error
		lk, err = ms[0].Acquire(ctx, key, WithAcquireTimeout(time.Minute))
		got <- err
	}()
	waitTickets(t, b.admin, key, 1)
	stop := make(chan struct{})
	polled := make(chan error, 1)
	var tries, took int
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				polled <- nil
				return
			default:
			}
			var opts []AcquireOption
			if i%2 == 1 {
				opts = append(opts, Shared())
			}
			l, ok, err := ms[1].TryAcquire(ctx, key, opts...)
			if err != nil {
				polled <- err
				return
			}
			tries++
			if ok {
				took++
				if err := l.Release(ctx); err != nil {
					polled <- err
					return
				}
			}
		}
	}()
	time.Sleep(50 * time.Millisecond) // the tries are going
	if ok, err := raw.ReleaseWaited(ctx, []store.ReleaseRequest{{LockID: holder, Key: key}}); err != nil || !ok[0] {
		t.Fatalf("release: %v %v", ok, err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(kernel.TicketLife + waitTimeout()):
		t.Fatal("the queued waiter was not granted")
	}
	close(stop)
	if err := <-polled; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d tries while the waiter was queued; %d took the key", tries, took)
	if took > 0 {
		t.Errorf("%d of %d tries took the key ahead of the queued waiter", took, tries)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFairTryOneRoundTrip: with the queue on, a try of a key nobody waits
// for still takes it in one statement, of every kind.
func TestFairTryOneRoundTrip(t *testing.T) {
	_, ms, sigs := fairManagers(t, 1, true)
	ctx := ctxT(t)
	for i, opts := range [][]AcquireOption{nil, {Shared()}, {WithLimit(2)}, nil} {
		key := fmt.Sprintf("fair:try:rt:%d", i)
		drain(&sigs[0].BatchSent)
		var locks []*Lock
		var ok bool
		var err error
		if i == 3 {
			locks, ok, err = ms[0].TryAcquireAll(ctx, []string{key, key + ":b"})
		} else {
			var lk *Lock
			lk, ok, err = ms[0].TryAcquire(ctx, key, opts...)
			locks = []*Lock{lk}
		}
		if err != nil || !ok {
			t.Fatalf("try %d: ok %v, %v", i, ok, err)
		}
		var sent []kernel.BatchInfo
	count:
		for {
			select {
			case bi := <-sigs[0].BatchSent.Ch:
				sent = append(sent, bi)
			default:
				break count
			}
		}
		if len(sent) != 1 || sent[0].Kind == kernel.KindRelease || sent[0].Kind == kernel.KindExtend {
			t.Errorf("try %d: statements sent %+v, want one acquire", i, sent)
		}
		for _, lk := range locks {
			if err := lk.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
}
