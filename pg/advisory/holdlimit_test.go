package advisory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease"
)

// TestHoldLimit: at the session's HoldLimit a lock's Context
// ends with its own cause (ErrHoldLimitExceeded, not ErrLockLost), no
// earlier; the lock is still held on the server until the holder
// releases it, and then it is free.
func TestHoldLimit(t *testing.T) {
	t.Parallel()
	const limit = 300 * time.Millisecond
	o := testOpts()
	o.HoldLimit = limit
	pool := newPool(t)
	s, other := openSession(t, pool, o), openSession(t, pool, testOpts())
	ctx := ctxT(t, 20*time.Second)
	k := randKey()
	start := time.Now()
	l, ok, err := s.TryLock(ctx, k)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("the hold limit did not end the lock's context")
	}
	if took := time.Since(start); took < limit {
		t.Fatalf("context ended %v after the grant, before the %v limit", took, limit)
	}
	cause := context.Cause(l.Context())
	var e *pglease.Error
	if !errors.Is(cause, pglease.ErrHoldLimitExceeded) || errors.Is(cause, pglease.ErrLockLost) || !errors.As(cause, &e) {
		t.Fatalf("cause = %v, want a *pglease.Error matching ErrHoldLimitExceeded and not ErrLockLost", cause)
	}
	// Not released early: the server still holds it for s.
	if !heldBy(t, pool, s.BackendPID(), k) {
		t.Fatal("the lock was released at the hold limit, before the holder returned")
	}
	if _, ok, err := other.TryLock(ctx, k); ok || err != nil {
		t.Fatalf("another session took the lock past the limit: %v %v", ok, err)
	}
	if s.Err() != nil {
		t.Fatalf("the hold limit ended the session: %v", s.Err())
	}
	// The holder returns: now it is released, and the cause stays.
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after the hold limit = %v, want nil", err)
	}
	if !errors.Is(context.Cause(l.Context()), pglease.ErrHoldLimitExceeded) {
		t.Errorf("cause after Release = %v", context.Cause(l.Context()))
	}
	lo, ok, err := other.TryLock(ctx, k)
	if !ok || err != nil {
		t.Fatalf("lock not free after the holder released it: %v %v", ok, err)
	}
	_ = lo.Release(ctx)

	// A lock released before its limit keeps its own cause: the limit's
	// timer is stopped.
	l2, err := s.Lock(ctx, randKey())
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * limit) // past the limit: nothing may change
	if c := context.Cause(l2.Context()); errors.Is(c, pglease.ErrHoldLimitExceeded) {
		t.Errorf("a lock released before its limit reports %v", c)
	}
}
