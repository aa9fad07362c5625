package manager

import (
	"testing"
	"time"
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
