package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
)

// fairManagers returns n Managers with Config.FairQueue set to fair on
// one schema, each its own process for the server (its own pool and
// listener), with their test signals, once each listens.
func fairManagers(t *testing.T, n int, fair bool) (*bundle, []*Manager, []*kernel.Signals) {
	t.Helper()
	cfg := Config{FairQueue: fair}
	b := setup(t, setupOpts{cfg: cfg})
	ms, sigs := []*Manager{b.m}, []*kernel.Signals{b.sig}
	for range n - 1 {
		m, sig := b.newPeer(t, cfg)
		ms, sigs = append(ms, m), append(sigs, sig)
	}
	for _, sig := range sigs {
		wait(t, &sig.Listening)
	}
	return b, ms, sigs
}

// liveTickets counts the live tickets of key in the fair queue.
func liveTickets(t testing.TB, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(),
		"SELECT count(*) FROM syncguard_locks_queue WHERE key = $1 AND expires_at_ms > floor(extract(epoch FROM clock_timestamp())*1000)", key).Scan(&n)
	if err != nil {
		t.Fatalf("count tickets: %v", err)
	}
	return n
}

// waitTickets polls until key has n live tickets.
func waitTickets(t testing.TB, pool *pgxpool.Pool, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout())
	for liveTickets(t, pool, key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("key %q: %d live tickets, want %d", key, liveTickets(t, pool, key), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFairOrderAcrossManagers: callers of three Managers wait for one
// key, arriving one after another (each queued before the next comes:
// its ticket is in the queue), in an order that interleaves the Managers
// and puts two callers of the holder's own Manager among them. Each
// holds the key briefly. They are granted in arrival order: a release
// hands the key to the head of the queue, whichever process it is in (a
// Manager that raced, or handed over locally, would serve its own
// callers first).
func TestFairOrderAcrossManagers(t *testing.T) {
	testFairOrder(t, true)
}

func testFairOrder(t *testing.T, fair bool) {
	b, ms, sigs := fairManagers(t, 3, fair)
	ctx := ctxT(t)
	const key = "fair:order"
	held, err := ms[0].Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	arrivals := []int{1, 2, 0, 1, 0, 2, 2, 1} // which Manager each caller uses
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	errc := make(chan error, len(arrivals))
	for i, mi := range arrivals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, err := ms[mi].Acquire(ctx, key, WithAcquireTimeout(time.Minute))
			if err != nil {
				errc <- fmt.Errorf("caller %d: %w", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			if err := lk.Release(ctx); err != nil {
				errc <- fmt.Errorf("caller %d release: %w", i, err)
			}
		}()
		wait(t, &sigs[mi].Queued)
		if fair {
			waitTickets(t, b.admin, key, i+1) // its place taken before the next comes
		} else {
			time.Sleep(300 * time.Millisecond)
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	for i := range order {
		if order[i] != i {
			t.Fatalf("grants in order %v, want arrival order 0..%d", order, len(arrivals)-1)
		}
	}
	if fair {
		waitTickets(t, b.admin, key, 0)
	}
}

// TestFairReleaseNotifiesOnlyHead: a release with waiters of two other
// Managers queued hands the key to the head in its own transaction and
// tells the head's Manager alone: the Manager of the second waiter gets
// no notice at all (neither a turn on its queue channel nor a release
// wake-up), nor does the releasing one. Counted on the Managers' test
// signals, after a quiet period.
func TestFairReleaseNotifiesOnlyHead(t *testing.T) {
	b, ms, sigs := fairManagers(t, 3, true)
	ctx := ctxT(t)
	const key = "fair:notify"
	held, err := ms[0].Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got1 := make(chan *Lock, 1)
	go func() {
		lk, _ := ms[1].Acquire(ctx, key, WithAcquireTimeout(time.Minute))
		got1 <- lk
	}()
	waitTickets(t, b.admin, key, 1)
	got2 := make(chan *Lock, 1)
	go func() {
		lk, _ := ms[2].Acquire(ctx, key, WithAcquireTimeout(time.Minute))
		got2 <- lk
	}()
	waitTickets(t, b.admin, key, 2)
	for _, s := range sigs {
		drain(&s.Turn)
		drain(&s.Woken)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var lk1 *Lock
	select {
	case lk1 = <-got1:
	case <-time.After(waitTimeout()):
		t.Fatal("the head was not granted")
	}
	if lk1 == nil {
		t.Fatal("the head's Acquire failed")
	}
	time.Sleep(300 * time.Millisecond) // a quiet period: a stray notice would come in it
	count := func(s *kernel.TestSignal[bool]) int { n := len(s.Ch); drain(s); return n }
	turns := []int{count(&sigs[0].Turn), count(&sigs[1].Turn), count(&sigs[2].Turn)}
	woken := []int{len(sigs[0].Woken.Ch), len(sigs[1].Woken.Ch), len(sigs[2].Woken.Ch)}
	t.Logf("turn notices per Manager %v, release wake-ups %v", turns, woken)
	if turns[1] != 1 || turns[0] != 0 || turns[2] != 0 {
		t.Errorf("turn notices per Manager %v, want [0 1 0]: only the head's process is told", turns)
	}
	if woken[2] != 0 || woken[0] != 0 {
		t.Errorf("release wake-ups per Manager %v: a Manager without the head woke", woken)
	}
	if n := liveTickets(t, b.admin, key); n != 1 {
		t.Errorf("%d tickets after the handoff, want 1 (the second waiter's)", n)
	}
	if err := lk1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case lk2 := <-got2:
		if lk2 == nil {
			t.Fatal("the second waiter's Acquire failed")
		}
		if err := lk2.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitTimeout()):
		t.Fatal("the second waiter was not granted")
	}
}

// TestFairDeadTicketBound: a process that queued for a key and died (its
// ticket is never refreshed again) holds up the waiters behind it at
// most ticketLife after its last refresh: the key is freed without
// serving (a non-queuing release), the dead ticket is the head, and the
// Manager's waiter behind it is granted once the ticket expired, not
// before (its place is respected while it lives).
func TestFairDeadTicketBound(t *testing.T) {
	b, ms, _ := fairManagers(t, 1, true)
	ctx := ctxT(t)
	const key = "fair:dead"
	raw, holder := rawHold(t, b, key)
	// The dead process: one enqueue, never refreshed, never leaving.
	dead := keys.NewLockID()
	wr, err := raw.QueueWait(ctx, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: dead}}, store.QueueChannel(), kernel.TicketLife)
	if err != nil || wr[0].OK || wr[0].Position != 1 {
		t.Fatalf("dead enqueue: %+v %v", wr, err)
	}
	enqueued := time.Now()
	got := make(chan error, 1)
	var lk *Lock
	go func() {
		var err error
		lk, err = ms[0].Acquire(ctx, key, WithAcquireTimeout(time.Minute))
		got <- err
	}()
	waitTickets(t, b.admin, key, 2)
	// Freed without serving the queue (SyncGuard's or pg.Store's release).
	if ok, err := raw.ReleaseWaited(ctx, []store.ReleaseRequest{{LockID: holder, Key: key}}); err != nil || !ok[0] {
		t.Fatalf("release: %v %v", ok, err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(kernel.TicketLife + waitTimeout()):
		t.Fatalf("the waiter behind a dead ticket was not granted within %v", kernel.TicketLife+waitTimeout())
	}
	waited := time.Since(enqueued)
	t.Logf("granted %v after the dead ticket's enqueue (its life %v)", waited.Round(time.Millisecond), kernel.TicketLife)
	if waited < kernel.TicketLife-100*time.Millisecond {
		t.Errorf("granted %v after the dead ticket's enqueue: before it expired (%v), the queue was jumped", waited, kernel.TicketLife)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFairWaiterLeaves: a waiter that times out takes its ticket out of
// the queue at once (the next waiter is not held up by it), and a grant
// that a release made to its ticket while it was giving up is released,
// not left with a caller who left: the waiter's Manager hears no notice
// (DisableNotify), the release grants its ticket, and its caller leaves
// before the refresh finds the grant.
func TestFairWaiterLeaves(t *testing.T) {
	b, ms, _ := fairManagers(t, 1, true)
	ctx := ctxT(t)
	const key = "fair:leave"
	held, err := ms[0].Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// A timeout leaves the queue.
	_, err = ms[0].Acquire(ctx, key, WithAcquireTimeout(300*time.Millisecond))
	if !errors.Is(err, pglease.ErrAcquisitionTimeout) {
		t.Fatalf("Acquire of a held key = %v, want a timeout", err)
	}
	waitTickets(t, b.admin, key, 0)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A grant that raced with the leaving is released.
	deaf, dsig := b.newPeer(t, Config{FairQueue: true, DisableNotify: true})
	raced := 0
	for try := 0; try < 5 && raced == 0; try++ {
		held, err := ms[0].Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		got := make(chan error, 1)
		go func() {
			lk, err := deaf.Acquire(wctx, key)
			if err == nil {
				err = lk.Release(ctx)
				if err == nil {
					err = errors.New("granted") // the refresh found the grant first: try again
				}
			}
			got <- err
		}()
		waitTickets(t, b.admin, key, 1)
		drain(&dsig.LeftGranted)
		if err := held.Release(ctx); err != nil { // grants the deaf Manager's ticket
			cancel()
			t.Fatal(err)
		}
		cancel()
		err = <-got
		switch {
		case errors.Is(err, context.Canceled):
			select {
			case <-dsig.LeftGranted.Ch:
				raced++
			case <-time.After(waitTimeout()):
				t.Fatal("the leaving waiter's leave did not report its grant released")
			}
		case err.Error() == "granted":
		default:
			t.Fatalf("the leaving waiter's Acquire = %v", err)
		}
		waitTickets(t, b.admin, key, 0)
		if _, ok := lockRow(t, b.pool, key); ok {
			t.Fatal("a lock row is left after the waiter left")
		}
	}
	if raced == 0 {
		t.Fatal("the refresh found the grant before the leave in 5 tries: the race was not exercised")
	}
}

// TestFairForeignPollerGetsHotKey: with the fair queue, a SyncGuard
// process that polls (it never queues) still gets a hot key: a release
// in the foreign window does not serve the queue.
func TestFairForeignPollerGetsHotKey(t *testing.T) {
	testForeignPoller(t, Config{Config: pg.Config{NotifyChannel: "pglease_foreign_test"}, FairQueue: true})
}

// rawHold takes key for a minute with a store of its own on b's pool (a
// holder that is not a Manager and does not serve the queue), and
// returns that store and the lease's lockId.
func rawHold(t *testing.T, b *bundle, key string) (*store.Store, string) {
	t.Helper()
	raw, err := store.New("test", b.pool, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	holder := keys.NewLockID()
	if r, err := raw.AcquireMany(ctxT(t), []store.AcquireRequest{{Key: key, TTL: time.Minute, LockID: holder}}); err != nil || !r[0].OK {
		t.Fatalf("hold: %+v %v", r, err)
	}
	return raw, holder
}

// TestFairLocalHandoffWithoutNotice: with the fair queue, a release whose
// queue head is a waiter of the same Manager hands the key over in its
// own answer: the waiter is granted with no notice on the Manager's queue
// channel (a handoff within a process is one statement, as without the
// queue), in arrival order, and the next release goes on to the next
// waiter here the same way.
func TestFairLocalHandoffWithoutNotice(t *testing.T) {
	b, ms, sigs := fairManagers(t, 1, true)
	ctx := ctxT(t)
	const key = "fair:local"
	held, err := ms[0].Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 3
	got := make([]chan *Lock, waiters)
	for i := range got {
		got[i] = make(chan *Lock, 1)
		go func() {
			lk, _ := ms[0].Acquire(ctx, key, WithAcquireTimeout(time.Minute))
			got[i] <- lk
		}()
		waitTickets(t, b.admin, key, i+1)
	}
	drain(&sigs[0].Turn)
	prev := held
	for i := range got {
		if err := prev.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case lk := <-got[i]:
			if lk == nil {
				t.Fatalf("waiter %d: Acquire failed", i)
			}
			if lk.Fence() <= prev.Fence() {
				t.Fatalf("waiter %d: fence %d not above %d", i, lk.Fence(), prev.Fence())
			}
			prev = lk
		case <-time.After(waitTimeout()):
			t.Fatalf("waiter %d was not granted in arrival order", i)
		}
	}
	if err := prev.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a quiet period: a notice would come in it
	if n := len(sigs[0].Turn.Ch); n != 0 {
		t.Errorf("%d turn notices reached the Manager, want 0: its own releases served its waiters", n)
	}
	waitTickets(t, b.admin, key, 0)
}
