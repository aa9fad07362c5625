package manager

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/pglease/pglease"
)

// suspendClock is a Manager clock (testHooks.clock) on a machine that a
// test suspends: Go's monotonic clock (time.Now) plus the suspended time
// the boot clock counts, as heartbeat.Now is. suspend moves the boot
// clock and not the monotonic one, as a real suspend does.
type suspendClock struct{ slept atomic.Int64 }

func (c *suspendClock) Now() time.Time          { return time.Now().Add(time.Duration(c.slept.Load())) }
func (c *suspendClock) suspend(d time.Duration) { c.slept.Add(int64(d)) }

// TestTrustCountsSuspendedTime suspends the holder's machine for a minute
// in the middle of a 30 s lease: the server's clock goes on (the row's
// expiry is moved back by the minute, which is what the server sees), the
// server gives the key to a peer, and the machine resumes. Go's monotonic
// clock says that a moment passed; the Manager's clock counts the suspend,
// so the holder's Err reports the loss at once, without waiting for a
// timer (which, on the monotonic clock, would fire only 27 s later), and
// two holders never both trust the key. With the Manager on time.Now (the
// clock before), Err answers nil while the peer holds the key.
func TestTrustCountsSuspendedTime(t *testing.T) {
	t.Parallel()
	clk := &suspendClock{}
	b := setup(t, setupOpts{hooks: kernel.TestHooks{Clock: clk.Now}})
	peer, _ := b.newPeer(t, Config{})
	ctx := ctxT(t)
	const key = "suspend:trust"

	l, err := b.m.Acquire(ctx, key, WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// The suspend, as the server sees it: a minute later, the lease ran
	// out long ago.
	if _, err := b.admin.Exec(ctx, "UPDATE syncguard_locks SET expires_at_ms = expires_at_ms - 60000 WHERE key = $1", key); err != nil {
		t.Fatal(err)
	}
	pl, ok, err := peer.TryAcquire(ctx, key)
	if err != nil || !ok {
		t.Fatalf("the peer did not get the expired key: ok %v, err %v", ok, err)
	}
	defer pl.Release(ctx)
	// The machine resumes: its boot clock counted the minute, its
	// monotonic clock did not.
	clk.suspend(time.Minute)

	if err := l.Err(); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("after a 1-minute suspend in a 30 s lease, while a peer holds the key, Err = %v, want ErrLockLost", err)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Err reported the loss but the lock's Context is still open")
	}
	if r := l.Remaining(); r != 0 {
		t.Errorf("Remaining = %v after the loss", r)
	}
	if err := pl.Err(); err != nil {
		t.Errorf("the peer's lock: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Errorf("Release of the lost lock = %v, want ErrLockLost", err)
	}
}

// TestTrustAfterSuspendStillExtends: after a suspend, the leases taken
// since are extended on time and kept. Every time the Manager keeps is on
// its clock, which counts the suspend, so its timers are armed for the
// right moment (a timer armed with time.Until of such a time would wait
// the suspended time longer, and a 1 s lease would be lost at 0.9 s).
func TestTrustAfterSuspendStillExtends(t *testing.T) {
	t.Parallel()
	clk := &suspendClock{}
	b := setup(t, setupOpts{hooks: kernel.TestHooks{Clock: clk.Now}})
	ctx := ctxT(t)
	clk.suspend(time.Hour)

	l, err := b.m.Acquire(ctx, "suspend:extend", WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	// Three extends at least (one each third of the TTL).
	for range 3 {
		waitFor(t, &b.sig.Extended, func(n int) bool { return n > 0 })
	}
	if err := l.Err(); err != nil {
		t.Fatalf("a 1 s lease taken after a suspend was lost: %v", err)
	}
}
