package pgleasetest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager"
)

// Conformance runs, as subtests of t, the rules every pglease.Locker
// keeps: typed errors on bad input, one holder per key, strictly
// increasing fences, FIFO waiters, a lease's Context ending once with the
// cause of its end (release, loss, TTL, revocation), Release's answers,
// Do's (a lease lost or revoked under a successful fn is Do's error). NewFake's Locker passes it, and so does a Manager's; run it on a
// Locker of your own (a wrapper that adds logging or metrics, say) to
// check that it keeps them too.
//
// newLocker returns the Locker to check, made for ttl: 0 for leases kept
// until they are released, lost or revoked (a Manager's default,
// automatically extended), or a positive ttl for leases that end with
// ErrLockLost ttl after their grant (a Manager's Locker made with
// manager.WithTTL(ttl) and manager.WithoutAutoExtend()). Each subtest uses
// keys of its own, so one Manager may serve them all. The loss subtests
// need leases Lose can lose, and the revocation subtests a Locker Revoke
// can revoke on; they are skipped for others.
//
// The suite waits: it takes about ten seconds on a Manager.
func Conformance(t *testing.T, newLocker func(t *testing.T, ttl time.Duration) pglease.Locker) {
	t.Run("BadInput", func(t *testing.T) { confBadInput(t, newLocker(t, 0)) })
	t.Run("OneHolder", func(t *testing.T) { confOneHolder(t, newLocker(t, 0)) })
	t.Run("Fences", func(t *testing.T) { confFences(t, newLocker(t, 0)) })
	t.Run("FIFO", func(t *testing.T) { confFIFO(t, newLocker(t, 0)) })
	t.Run("Release", func(t *testing.T) { confRelease(t, newLocker(t, 0)) })
	t.Run("Lose", func(t *testing.T) { confLose(t, newLocker(t, 0)) })
	t.Run("TTL", func(t *testing.T) { confTTL(t, newLocker(t, 1500*time.Millisecond)) })
	t.Run("Revoke", func(t *testing.T) { confRevoke(t, newLocker(t, 0)) })
	t.Run("Do", func(t *testing.T) { confDo(t, newLocker(t, 0)) })
	t.Run("DoRevoke", func(t *testing.T) { confDoRevoke(t, newLocker(t, 0)) })
}

// wait bounds every wait of the suite: generous, for loaded machines.
const wait = time.Minute

func confKey() string { return pgtest.RandomName("conformance-") }

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

// wantCode fails t unless err is a *pglease.Error matching want.
func wantCode(t *testing.T, what string, err error, want *pglease.Error) {
	t.Helper()
	var pe *pglease.Error
	if !errors.As(err, &pe) || !errors.Is(err, want) {
		t.Errorf("%s: got %v (%T), want a *pglease.Error with code %v", what, err, err, want.Code)
	}
}

func mustAcquire(t *testing.T, l pglease.Locker, key string) pglease.Lease {
	t.Helper()
	lease, err := l.Acquire(waitCtx(t), key)
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v, %v", lease, err)
	}
	return lease
}

func release(t *testing.T, lease pglease.Lease) {
	t.Helper()
	if err := lease.Release(waitCtx(t)); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// waitEnd waits for lease's Context to end and checks its cause, Err and
// Release's answer against want.
func waitEnd(t *testing.T, lease pglease.Lease, want *pglease.Error) {
	t.Helper()
	select {
	case <-lease.Done():
	case <-time.After(wait):
		t.Fatalf("the lease was still held %v later, want it ended with %v", wait, want.Code)
	}
	wantCode(t, "context.Cause", context.Cause(lease.Context()), want)
	wantCode(t, "Err", lease.Err(), want)
	if want.Code == pglease.CodeReleased {
		return
	}
	wantCode(t, "Release after the end", lease.Release(waitCtx(t)), want)
	if err := lease.Release(waitCtx(t)); err != nil && !errors.Is(err, want) {
		t.Errorf("second Release: %v", err)
	}
}

func confBadInput(t *testing.T, l pglease.Locker) {
	ctx := waitCtx(t)
	key := confKey()
	var nilCtx context.Context
	fn := func(context.Context, pglease.Lease) error { return nil }
	inv := pglease.ErrInvalidArgument
	_, err := l.Acquire(nilCtx, key)
	wantCode(t, "Acquire(nil ctx)", err, inv)
	_, _, err = l.TryAcquire(nilCtx, key)
	wantCode(t, "TryAcquire(nil ctx)", err, inv)
	wantCode(t, "Do(nil ctx)", l.Do(nilCtx, key, fn), inv)
	wantCode(t, "Do(nil fn)", l.Do(ctx, key, nil), inv)
	for name, bad := range map[string]string{"empty": "", "invalid UTF-8": "a\xffb", "NUL": "a\x00b", "too long": strings.Repeat("k", 513)} {
		_, err := l.Acquire(ctx, bad)
		wantCode(t, "Acquire("+name+" key)", err, inv)
		_, _, err = l.TryAcquire(ctx, bad)
		wantCode(t, "TryAcquire("+name+" key)", err, inv)
		wantCode(t, "Do("+name+" key)", l.Do(ctx, bad, fn), inv)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = l.Acquire(ended, key)
	wantCode(t, "Acquire(ended ctx)", err, pglease.ErrAborted)
	_, _, err = l.TryAcquire(ended, key)
	wantCode(t, "TryAcquire(ended ctx)", err, pglease.ErrAborted)
	wantCode(t, "Do(ended ctx)", l.Do(ended, key, fn), pglease.ErrAborted)

	// None of them took the key; a Release with a nil context changes
	// nothing.
	lease := mustAcquire(t, l, key)
	wantCode(t, "Release(nil ctx)", lease.Release(nilCtx), inv)
	if err := lease.Err(); err != nil {
		t.Errorf("after Release(nil ctx), Err = %v, want the lease still held", err)
	}
	release(t, lease)
}

func confOneHolder(t *testing.T, l pglease.Locker) {
	key := confKey()
	lease := mustAcquire(t, l, key)
	got, ok, err := l.TryAcquire(waitCtx(t), key)
	if got != nil || ok || err != nil {
		t.Errorf("TryAcquire of a held key = %v, %v, %v, want nil, false, nil", got, ok, err)
	}
	// NFC-equal keys are one lock.
	nfc := mustAcquire(t, l, key+"\u00e9")
	if got, ok, err := l.TryAcquire(waitCtx(t), key+"e\u0301"); got != nil || ok || err != nil {
		t.Errorf("TryAcquire of the NFD spelling of a held key = %v, %v, %v, want nil, false, nil", got, ok, err)
	}
	release(t, nfc)

	dctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = l.Acquire(dctx, key)
	wantCode(t, "Acquire of a held key until a deadline", err, pglease.ErrAcquisitionTimeout)
	cctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err = l.Acquire(cctx, key)
	wantCode(t, "Acquire of a held key until a cancel", err, pglease.ErrAborted)
	err = l.Do(dctx, key, func(context.Context, pglease.Lease) error {
		t.Error("Do ran fn on a held key")
		return nil
	})
	wantCode(t, "Do of a held key with an ended deadline", err, pglease.ErrAborted)

	release(t, lease)
	next, ok, err := l.TryAcquire(waitCtx(t), key)
	if !ok || err != nil || next == nil {
		t.Fatalf("TryAcquire after the release = %v, %v, %v, want the lease", next, ok, err)
	}
	if next.Fence() <= lease.Fence() {
		t.Errorf("fence after the release %v, want > %v", next.Fence(), lease.Fence())
	}
	release(t, next)
}

func confFences(t *testing.T, l pglease.Locker) {
	key := confKey()
	var last pglease.Fence
	for i := range 4 {
		var lease pglease.Lease
		if i%2 == 0 {
			lease = mustAcquire(t, l, key)
		} else {
			var ok bool
			var err error
			if lease, ok, err = l.TryAcquire(waitCtx(t), key); !ok || err != nil {
				t.Fatalf("TryAcquire of a free key: %v, %v", ok, err)
			}
		}
		if f := lease.Fence(); f <= last {
			t.Errorf("grant %d: fence %v, want > %v", i, f, last)
		} else {
			last = f
		}
		release(t, lease)
	}
}

func confFIFO(t *testing.T, l pglease.Locker) {
	key := confKey()
	holder := mustAcquire(t, l, key)
	const n = 3
	var (
		mu     sync.Mutex
		order  []int
		fences []pglease.Fence
		wg     sync.WaitGroup
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease, err := l.Acquire(waitCtx(t), key)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order, fences = append(order, i), append(fences, lease.Fence())
			mu.Unlock()
			if err := lease.Release(waitCtx(t)); err != nil {
				t.Errorf("waiter %d: Release: %v", i, err)
			}
		}()
		// Waiters come one after another: each is waiting before the next
		// starts (a second is ample even on a loaded machine).
		time.Sleep(time.Second)
	}
	release(t, holder)
	wg.Wait()
	for i := range order {
		if order[i] != i {
			t.Fatalf("waiters were served in the order %v, want FIFO", order)
		}
		prev := holder.Fence()
		if i > 0 {
			prev = fences[i-1]
		}
		if fences[i] <= prev {
			t.Errorf("waiter %d: fence %v, want > %v", i, fences[i], prev)
		}
	}
}

func confRelease(t *testing.T, l pglease.Locker) {
	lease := mustAcquire(t, l, confKey())
	if lease.Fence() <= 0 {
		t.Errorf("Fence = %v, want > 0", lease.Fence())
	}
	select {
	case <-lease.Done():
		t.Fatalf("the lease's Context ended while held: %v", context.Cause(lease.Context()))
	default:
	}
	if err := lease.Err(); err != nil {
		t.Errorf("Err while held = %v", err)
	}
	release(t, lease)
	waitEnd(t, lease, pglease.ErrReleased)
	if err := lease.Release(waitCtx(t)); err != nil {
		t.Errorf("second Release = %v, want nil", err)
	}
}

// canLose reports whether Lose applies to lease.
func canLose(lease pglease.Lease) bool {
	switch lease.(type) {
	case *fakeLease, *manager.Lock:
		return true
	}
	return false
}

func confLose(t *testing.T, l pglease.Locker) {
	key := confKey()
	lease := mustAcquire(t, l, key)
	if !canLose(lease) {
		release(t, lease)
		t.Skipf("Lose does not apply to a %T", lease)
	}
	Lose(t, lease)
	waitEnd(t, lease, pglease.ErrLockLost)
	next := mustAcquire(t, l, key)
	if next.Fence() <= lease.Fence() {
		t.Errorf("fence after the loss %v, want > %v", next.Fence(), lease.Fence())
	}
	release(t, next)
}

func confTTL(t *testing.T, l pglease.Locker) {
	key := confKey()
	lease := mustAcquire(t, l, key)
	waitEnd(t, lease, pglease.ErrLockLost)
	next := mustAcquire(t, l, key)
	if next.Fence() <= lease.Fence() {
		t.Errorf("fence after the expiry %v, want > %v", next.Fence(), lease.Fence())
	}
	release(t, next)
}

func confRevoke(t *testing.T, l pglease.Locker) {
	if _, ok := l.(revoker); !ok {
		t.Skipf("Revoke does not apply to a %T", l)
	}
	key := confKey()
	if Revoke(t, l, key) {
		t.Errorf("Revoke of a free key = true")
	}
	lease := mustAcquire(t, l, key)
	if !Revoke(t, l, key) {
		t.Fatalf("Revoke of a held key = false")
	}
	waitEnd(t, lease, pglease.ErrRevoked)
	next := mustAcquire(t, l, key)
	if next.Fence() <= lease.Fence() {
		t.Errorf("fence after the revocation %v, want > %v", next.Fence(), lease.Fence())
	}
	release(t, next)
}

func confDo(t *testing.T, l pglease.Locker) {
	key := confKey()
	errWork := errors.New("the work failed")
	var got pglease.Lease
	err := l.Do(waitCtx(t), key, func(ctx context.Context, lease pglease.Lease) error {
		got = lease
		if ctx.Err() != nil || lease.Err() != nil || lease.Fence() <= 0 {
			t.Errorf("in Do: ctx %v, Err %v, Fence %v", ctx.Err(), lease.Err(), lease.Fence())
		}
		if _, ok, err := l.TryAcquire(ctx, key); ok || err != nil {
			t.Errorf("TryAcquire inside Do = %v, %v, want false, nil", ok, err)
		}
		return errWork
	})
	if !errors.Is(err, errWork) {
		t.Errorf("Do = %v, want fn's error", err)
	}
	if got == nil {
		t.Fatal("Do did not run fn")
	}
	waitEnd(t, got, pglease.ErrReleased)

	// A panic in fn releases the lease, then goes on.
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Do swallowed fn's panic")
			}
		}()
		_ = l.Do(waitCtx(t), key, func(context.Context, pglease.Lease) error { panic("in fn") })
	}()
	if lease, ok, err := l.TryAcquire(waitCtx(t), key); !ok || err != nil {
		t.Errorf("TryAcquire after Do's panic = %v, %v, want the key free", ok, err)
	} else {
		release(t, lease)
	}

	// fn succeeds but the lease was lost under it: Do returns the loss.
	err = l.Do(waitCtx(t), key, func(ctx context.Context, lease pglease.Lease) error {
		if !canLose(lease) {
			return errSkip
		}
		Lose(t, lease)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			t.Error("fn's context did not end with the loss")
		}
		wantCode(t, "fn's context.Cause after the loss", context.Cause(ctx), pglease.ErrLockLost)
		return nil
	})
	if errors.Is(err, errSkip) {
		t.Skipf("Lose does not apply to the leases")
	}
	wantCode(t, "Do of a lease lost under fn", err, pglease.ErrLockLost)
}

// confDoRevoke: fn succeeds but the lease was revoked under it: Do
// returns the revocation, as it does a loss.
func confDoRevoke(t *testing.T, l pglease.Locker) {
	if _, ok := l.(revoker); !ok {
		t.Skipf("Revoke does not apply to a %T", l)
	}
	key := confKey()
	err := l.Do(waitCtx(t), key, func(ctx context.Context, lease pglease.Lease) error {
		if !Revoke(t, l, key) {
			t.Error("Revoke of the key Do holds = false")
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			t.Error("fn's context did not end with the revocation")
		}
		wantCode(t, "fn's context.Cause after the revocation", context.Cause(ctx), pglease.ErrRevoked)
		return nil
	})
	wantCode(t, "Do of a lease revoked under fn", err, pglease.ErrRevoked)
}

var errSkip = errors.New("skip")
