package manager

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease"
)

// TestAdvisoryHoldLimit (issue 15.2): WithHoldLimit ends an advisory
// lock's Context at the limit with ErrHoldLimitExceeded (not LockLost),
// no earlier; the lock stays held (another Manager cannot take it, this
// one refuses it as held) until Release, which returns nil and frees it.
// Past its limit, a lock that Close releases is freed too.
func TestAdvisoryHoldLimit(t *testing.T) {
	t.Parallel()
	const limit = 300 * time.Millisecond
	b := setup(t, setupOpts{noSignals: true})
	m := b.m
	peer, _ := b.newPeer(t, Config{})
	ctx := ctxT(t)

	key := advKey()
	start := time.Now()
	l, ok, err := m.TryLockAdvisory(ctx, key, WithHoldLimit(limit))
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	waitDone(t, l)
	if took := time.Since(start); took < limit {
		t.Fatalf("context ended %v after the grant, before the %v limit", took, limit)
	}
	var e *pglease.Error
	if err := l.Err(); !errors.Is(err, pglease.ErrHoldLimitExceeded) || errors.Is(err, pglease.ErrLockLost) || !errors.As(err, &e) {
		t.Fatalf("Err = %v, want a *pglease.Error matching ErrHoldLimitExceeded", err)
	}
	if _, ok, err := peer.TryLockAdvisory(ctx, key); ok || err != nil {
		t.Fatalf("another Manager took the lock past the limit: %v %v", ok, err)
	}
	if _, _, err := m.TryLockAdvisory(ctx, key); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("this Manager's TryLockAdvisory past the limit = %v, want InvalidArgument (still held)", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release past the limit = %v, want nil", err)
	}
	if !errors.Is(l.Err(), pglease.ErrHoldLimitExceeded) {
		t.Errorf("Err after Release = %v", l.Err())
	}
	pl, ok, err := peer.TryLockAdvisory(ctx, key)
	if !ok || err != nil {
		t.Fatalf("not free after Release: %v %v", ok, err)
	}
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Past its limit at Close: Close releases it with the session.
	key2 := advKey()
	l2, err := m.LockAdvisory(ctx, key2, WithHoldLimit(limit))
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, l2)
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	pl2, ok, err := peer.TryLockAdvisory(ctx, key2)
	if !ok || err != nil {
		t.Fatalf("not free after Close: %v %v", ok, err)
	}
	if err := pl2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatalf("Release after Close = %v, want nil", err)
	}
}

// TestAdvisoryHoldLimitOptions: only WithHoldLimit applies to advisory
// locks, and it must be positive; refused with no session opened.
func TestAdvisoryHoldLimitOptions(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noSignals: true})
	m := b.m
	ctx := ctxT(t)
	for name, opts := range map[string][]AcquireOption{
		"zero limit":     {WithHoldLimit(0)},
		"negative limit": {WithHoldLimit(-time.Second)},
		"TTL":            {WithTTL(time.Second)},
		"timeout":        {WithAcquireTimeout(time.Second)},
		"manual":         {WithoutAutoExtend()},
		"nil":            {nil},
	} {
		if _, err := m.LockAdvisory(ctx, advKey(), opts...); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
		if _, _, err := m.TryLockAdvisory(ctx, advKey(), opts...); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("try %s: %v, want InvalidArgument", name, err)
		}
	}
	if pid := advPID(m); pid != 0 {
		t.Fatalf("bad options opened a session (pid %d)", pid)
	}
}
