package manager

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
)

// TestAdvisoryHoldLimit: WithHoldLimit ends an advisory
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
	if _, ok, err := m.TryLockAdvisory(ctx, key); ok || err != nil {
		t.Fatalf("this Manager's TryLockAdvisory past the limit = %v, %v, want ok=false (still held)", ok, err)
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

// expiresAtMs reads key's expires_at_ms, or 0 without a row.
func expiresAtMs(t *testing.T, b *bundle, key string) int64 {
	t.Helper()
	var ms int64
	err := b.pool.QueryRow(context.Background(), "SELECT expires_at_ms FROM syncguard_locks WHERE key = $1", key).Scan(&ms)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// TestLeaseHoldLimit: an auto-extended lease with
// WithHoldLimit has its Context ended at the limit with
// ErrHoldLimitExceeded (not LockLost), no earlier; from then on it is
// not extended (Extend is refused too), but its row stays: another
// Manager cannot take the key until the lease expires (a holder that
// never returns cannot keep it forever), and a holder that does return
// releases it at once with a nil error.
func TestLeaseHoldLimit(t *testing.T) {
	t.Parallel()
	const ttl, limit = time.Second, 700 * time.Millisecond
	b := setup(t, setupOpts{noSignals: true})
	peer, _ := b.newPeer(t, Config{})
	ctx := ctxT(t)

	t.Run("stuck holder", func(t *testing.T) {
		key := "holdlimit-stuck-" + t.Name()
		start := time.Now()
		lk, err := b.m.Acquire(ctx, key, WithTTL(ttl), WithHoldLimit(limit))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-lk.Done():
		case <-time.After(waitTimeout()):
			t.Fatal("the hold limit did not end the lock's context")
		}
		if took := time.Since(start); took < limit {
			t.Fatalf("context ended %v after the grant, before the %v limit", took, limit)
		}
		if err := lk.Err(); !errors.Is(err, pglease.ErrHoldLimitExceeded) || errors.Is(err, pglease.ErrLockLost) {
			t.Fatalf("Err = %v, want ErrHoldLimitExceeded", err)
		}
		if err := lk.Extend(ctx); !errors.Is(err, pglease.ErrHoldLimitExceeded) {
			t.Errorf("Extend past the limit = %v, want ErrHoldLimitExceeded", err)
		}
		// Not extended any more: the expiry stays put for longer than
		// the heartbeat period (TTL/3), while the row is still there.
		exp := expiresAtMs(t, b, key)
		if exp == 0 {
			t.Fatal("the row was deleted at the hold limit")
		}
		if _, ok, err := peer.TryAcquire(ctx, key, WithTTL(ttl)); ok || err != nil {
			t.Fatalf("another Manager took the key past the limit, before expiry: %v %v", ok, err)
		}
		time.Sleep(ttl / 2) // two heartbeat periods: nothing to wait for but the absence of an extend
		if got := expiresAtMs(t, b, key); got != exp {
			t.Fatalf("the lease was extended past the hold limit (expires_at_ms %d → %d)", exp, got)
		}
		// The holder never returns; the peer gets the key once the lease
		// has expired (+ the 1 s takeover tolerance).
		pl, err := peer.Acquire(ctx, key, WithTTL(ttl), WithAcquireTimeout(10*time.Second))
		if err != nil {
			t.Fatalf("peer after expiry: %v", err)
		}
		if nowMs := time.Now().UnixMilli(); nowMs < exp {
			t.Fatalf("peer granted %d ms before the stuck holder's lease expired", exp-nowMs)
		}
		if err := pl.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
			t.Errorf("Release after the lease expired = %v, want LockLost", err)
		}
	})

	t.Run("holder returns", func(t *testing.T) {
		key := "holdlimit-returns-" + t.Name()
		lk, err := b.m.Acquire(ctx, key, WithTTL(ttl), WithHoldLimit(limit))
		if err != nil {
			t.Fatal(err)
		}
		<-lk.Done()
		if err := lk.Release(ctx); err != nil {
			t.Fatalf("Release past the limit, before expiry = %v, want nil", err)
		}
		if !errors.Is(lk.Err(), pglease.ErrHoldLimitExceeded) {
			t.Errorf("Err after Release = %v", lk.Err())
		}
		pl, ok, err := peer.TryAcquire(ctx, key, WithTTL(ttl))
		if !ok || err != nil {
			t.Fatalf("the key is not free after Release: %v %v", ok, err)
		}
		if err := pl.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Do", func(t *testing.T) {
		key := "holdlimit-do-" + t.Name()
		err := b.m.Do(ctx, key, func(ctx context.Context, _ *Lock) error {
			<-ctx.Done()
			return context.Cause(ctx)
		}, WithTTL(ttl), WithHoldLimit(limit))
		if !errors.Is(err, pglease.ErrHoldLimitExceeded) {
			t.Fatalf("Do = %v, want the hold-limit cause from fn", err)
		}
		if _, held := lockRow(t, b.pool, key); held {
			t.Fatal("Do left the row after fn returned at the hold limit")
		}
	})
}
