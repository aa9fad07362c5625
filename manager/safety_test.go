package manager

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease"
)

// TestLostLeaseRowKept (issue 9.4, S4): a lease the Manager declared lost
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
	waitFor(t, &b.sig.lost, func(k string) bool { return k == "kept" }) // the loop has handled the loss
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
	if id, ok := lockRow(t, b.pool, "kept"); !ok || id != lk.id {
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
