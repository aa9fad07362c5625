package manager

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/retry"
)

// TestAcquireAllLocksAreLeases: each lock of a set is an ordinary lease:
// its own fence, its own heartbeat, released alone. TryAcquireAll takes
// all or nothing: nothing of a set with one key held, here or elsewhere.
func TestAcquireAllLocksAreLeases(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	peer, _ := b.newPeer(t, Config{})
	// A TTL whose heartbeat keeps the leases on a loaded machine (see
	// TestSharedLocksLikeLeases).
	const ttl = 3 * time.Second
	locks, err := b.m.AcquireAll(ctx, []string{"set:x", "set:y", "set:z"}, WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{"set:x", "set:y", "set:z"} {
		if locks[i].Key() != k || locks[i].Fence() == 0 {
			t.Fatalf("lock %d: key %q fence %v", i, locks[i].Key(), locks[i].Fence())
		}
	}
	if err := locks[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Several heartbeats of the others, each its own lease.
	for _, i := range []int{0, 2} {
		waitExtended(t, locks[i], locks[i].ExpiresAt(), ttl/2)
	}
	// y is free again; x is held here, z elsewhere.
	for _, m := range []*Manager{b.m, peer} {
		if _, ok, err := m.TryAcquireAll(ctx, []string{"set:y", "set:x"}); ok || err != nil {
			t.Fatalf("TryAcquireAll with x held: %v %v", ok, err)
		}
	}
	if _, ok := lockRow(t, b.pool, "set:y"); ok {
		t.Fatal("a refused set left y held")
	}
	if err := locks[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	got, ok, err := peer.TryAcquireAll(ctx, []string{"set:y", "set:x"})
	if !ok || err != nil {
		t.Fatalf("TryAcquireAll with both free: %v %v", ok, err)
	}
	for _, lk := range append(got, locks[2]) {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAcquireAllWokenAcrossProcesses: a set waits for a key another
// process holds (polling would take a minute); the holder's release wakes
// it through the set's waiter lock on that key.
func TestAcquireAllWokenAcrossProcesses(t *testing.T) {
	t.Parallel()
	slow := retry.Policy{Multiplier: 1, Base: time.Minute}
	b := setup(t, setupOpts{cfg: Config{Retry: slow}})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	h := startHolder(t, b, "set:far", 2*time.Minute) // takeover far away too
	drain(&b.sig.Retrying)
	type result struct {
		locks []*Lock
		err   error
	}
	got := make(chan result, 1)
	go func() {
		locks, err := b.m.AcquireAll(ctx, []string{"set:near", "set:far"}, WithAcquireTimeout(40*time.Second))
		got <- result{locks, err}
	}()
	waitFor(t, &b.sig.Retrying, func(k string) bool { return k == "set:near" }) // refused; next try in a minute
	t0 := time.Now()
	h.stdin.Close() // the holder releases, then exits
	var r result
	select {
	case r = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("the set was not woken by the release in another process")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("set granted %v after the release in another process", time.Since(t0))
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("hold child: %v", err)
	}
	for _, lk := range r.locks {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAcquireAllDoesNotBlockSingleKeys: while a set waits for a key held
// elsewhere, callers of its other key come and go as if it were not
// there; the set gets both once they are free.
func TestAcquireAllDoesNotBlockSingleKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	peer, _ := b.newPeer(t, Config{})
	far, err := peer.Acquire(ctx, "set:held")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		locks, err := b.m.AcquireAll(ctx, []string{"set:free", "set:held"})
		for _, lk := range locks {
			lk.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, &b.sig.Retrying, func(k string) bool { return k == "set:free" })
	for range 3 {
		lk, err := b.m.Acquire(ctx, "set:free", WithAcquireTimeout(5*time.Second))
		if err != nil {
			t.Fatalf("single-key caller of the set's free key: %v", err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := far.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestAcquireAllNotStarvedByLocalCallers: single-key callers of this
// process keep both keys of a set busy (each key is always held or handed
// over); the set still gets them within a bounded time, by its turn.
func TestAcquireAllNotStarvedByLocalCallers(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var holds atomic.Int64
	for i := range 8 {
		key := []string{"set:busy1", "set:busy2"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				lk, err := b.m.Acquire(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				holds.Add(1)
				time.Sleep(2 * time.Millisecond)
				lk.Release(ctx)
			}
		}()
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()
	time.Sleep(300 * time.Millisecond)
	t0 := time.Now()
	locks, err := b.m.AcquireAll(ctx, []string{"set:busy1", "set:busy2"}, WithAcquireTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("set starved by local single-key callers (%d holds): %v", holds.Load(), err)
	}
	t.Logf("set granted after %v (%d single-key holds meanwhile)", time.Since(t0), holds.Load())
	for _, lk := range locks {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAcquireAllWaitEnds: a set whose wait ends says why as Acquire does
// (the holder elsewhere by name), leaves nothing held, and Close fails a
// waiting set with ErrClosed.
func TestAcquireAllWaitEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	peer, _ := b.newPeer(t, Config{})
	far, err := peer.Acquire(ctx, "set:w2")
	if err != nil {
		t.Fatal(err)
	}
	defer far.Release(ctx)
	_, err = b.m.AcquireAll(ctx, []string{"set:w1", "set:w2"}, WithAcquireTimeout(500*time.Millisecond))
	if !errors.Is(err, pglease.ErrAcquisitionTimeout) || !strings.Contains(err.Error(), "held by") {
		t.Fatalf("wait ended: %v", err)
	}
	if _, ok := lockRow(t, b.pool, "set:w1"); ok {
		t.Fatal("w1 left held")
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(200*time.Millisecond, cancel)
	if _, err := b.m.AcquireAll(cctx, []string{"set:w1", "set:w2"}); !errors.Is(err, pglease.ErrAborted) {
		t.Fatalf("cancelled wait: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := b.m.AcquireAll(ctx, []string{"set:w1", "set:w2"})
		got <- err
	}()
	waitFor(t, &b.sig.Retrying, func(k string) bool { return k == "set:w1" })
	if err := b.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, pglease.ErrClosed) {
		t.Fatalf("set waiting at Close: %v", err)
	}
}

// TestAcquireAllTurnLapses: a set's turn does not make callers of one of
// its keys wait for a long holder of another: while a caller of this
// process holds one key for seconds, the single-key callers of the other
// key wait once, about a second (setTurnMax), for the set's turn to lapse,
// and then no more until the set has tried again.
func TestAcquireAllTurnLapses(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	long, err := b.m.Acquire(ctx, "set:long")
	if err != nil {
		t.Fatal(err)
	}
	drain(&b.sig.Queued) // the holder's own Acquire was queued too
	set := make(chan error, 1)
	go func() {
		locks, err := b.m.AcquireAll(ctx, []string{"set:long", "set:short"})
		for _, lk := range locks {
			lk.Release(ctx)
		}
		set <- err
	}()
	waitFor(t, &b.sig.Queued, func(k string) bool { return k == "set:long" })
	var worst time.Duration
	turns := 0
	for stop := time.Now().Add(6 * time.Second); time.Now().Before(stop); {
		t0 := time.Now()
		lk, err := b.m.Acquire(ctx, "set:short", WithAcquireTimeout(20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d > 500*time.Millisecond {
			turns++
			worst = max(worst, d)
		}
		time.Sleep(time.Millisecond)
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d waits over 500 ms (turns), the longest %v", turns, worst)
	if worst > 4*time.Second || turns > 2 {
		t.Errorf("callers of the short key waited %d times behind the set's turn, up to %v", turns, worst)
	}
	if err := long.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-set; err != nil {
		t.Fatal(err)
	}
}
