package manager

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg/advisory"
)

// Tests of the handle shape shared by Lock and advisory.Lock (one release
// method, Context/Done/Err with a typed cause, safe on nil), of Do with
// the lock, of waiting as long as the context allows, and of Extend and
// the lease's expiry on the Lock.

// TestDoReleasesOnPanic: a panicking fn does not leave the
// lock held and heartbeated until Close: Do releases it, then the panic
// goes on with its original value.
func TestDoReleasesOnPanic(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	var fnLock *Lock
	got := func() (p any) {
		defer func() { p = recover() }()
		_ = b.m.Do(ctx, "panics", func(_ context.Context, lk *Lock) error {
			fnLock = lk
			panic("boom")
		})
		return nil
	}()
	if got != "boom" {
		t.Fatalf("recovered %v, want the original panic value", got)
	}
	if !errors.Is(fnLock.Err(), pglease.ErrReleased) {
		t.Fatalf("lock after the panic: Err = %v, want ErrReleased", fnLock.Err())
	}
	if _, ok := lockRow(t, b.pool, "panics"); ok {
		t.Fatal("row still live after Do panicked")
	}
	lk, ok, err := b.m.TryAcquire(ctx, "panics")
	if err != nil || !ok {
		t.Fatalf("TryAcquire after the panic = %v, %v; want the key free", ok, err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDoReleasesOnGoexit: runtime.Goexit inside fn (t.FailNow in a test
// helper) releases the lock too.
func TestDoReleasesOnGoexit(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	done := make(chan *Lock, 1)
	go func() {
		var lk *Lock
		defer func() { done <- lk }()
		_ = b.m.Do(ctx, "goexit", func(_ context.Context, l *Lock) error {
			lk = l
			runtime.Goexit()
			return nil
		})
	}()
	lk := <-done
	if !errors.Is(lk.Err(), pglease.ErrReleased) {
		t.Fatalf("Err after Goexit = %v, want ErrReleased", lk.Err())
	}
	if _, ok := lockRow(t, b.pool, "goexit"); ok {
		t.Fatal("row still live after Goexit")
	}
}

// TestNilHandles: the nil a TryAcquire or TryLockAdvisory
// returns with ok=false answers every method without a panic and without
// I/O: errors are InvalidArgument, the context has ended.
func TestNilHandles(t *testing.T) {
	t.Parallel()
	qc, qn := queryCounter("", "")
	b := setup(t, setupOpts{cfg: Config{DisableNotify: true},
		pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc }}})
	ctx := ctxT(t)
	held, err := b.m.Acquire(ctx, "taken")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	lk, ok, err := b.m.TryAcquire(ctx, "taken")
	if ok || err != nil || lk != nil {
		t.Fatalf("TryAcquire of a held key = %v, %v, %v", lk, ok, err)
	}
	before := qn.Load()
	var adv *advisory.Lock
	for _, h := range []pglease.Handle{lk, adv, &Lock{}, &advisory.Lock{}} { // nil, and zero values
		if err := h.Release(ctx); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("%T Release = %v, want InvalidArgument", h, err)
		}
		if err := h.Err(); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("%T Err = %v, want InvalidArgument", h, err)
		}
		select {
		case <-h.Done():
		default:
			t.Errorf("%T Done not closed", h)
		}
		if c := context.Cause(h.Context()); !errors.Is(c, pglease.ErrInvalidArgument) {
			t.Errorf("%T Context cause = %v", h, c)
		}
	}
	if err := lk.Extend(ctx); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("Extend = %v, want InvalidArgument", err)
	}
	if err := (&Lock{}).Extend(ctx); !errors.Is(err, pglease.ErrInvalidArgument) || (&Lock{}).Remaining() != 0 || !(&Lock{}).ExpiresAt().IsZero() {
		t.Errorf("zero Lock Extend = %v", err)
	}
	if lk.Key() != "" || lk.Fence() != 0 || lk.TTL() != 0 || !lk.ExpiresAt().IsZero() || lk.Remaining() != 0 || !lk.AcquiredAt().IsZero() {
		t.Error("nil Lock accessors are not zero")
	}
	if adv.Key() != (advisory.Key{}) {
		t.Error("nil advisory.Lock Key is valid")
	}
	if n := qn.Load() - before; n != 0 {
		t.Errorf("methods on nil handles sent %d queries", n)
	}
}

// TestReleasedCauseIsError: the cause after Release is a
// *pglease.Error with CodeReleased, for both Manager handles, matched by
// errors.Is(pglease.ErrReleased) and by nothing else.
func TestReleasedCauseIsError(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "released")
	if err != nil {
		t.Fatal(err)
	}
	adv, err := b.m.LockAdvisory(ctx, advKey())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []pglease.Handle{lk, adv} {
		if err := h.Err(); err != nil {
			t.Fatalf("%T Err while held = %v", h, err)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatalf("%T Release = %v", h, err)
		}
		var e *pglease.Error
		c := context.Cause(h.Context())
		if !errors.As(c, &e) || e.Code != pglease.CodeReleased {
			t.Errorf("%T cause %v (%T) is not a *pglease.Error with CodeReleased", h, c, c)
		}
		if !errors.Is(h.Err(), pglease.ErrReleased) || errors.Is(h.Err(), pglease.ErrLockLost) || errors.Is(h.Err(), pglease.ErrClosed) {
			t.Errorf("%T Err = %v: want ErrReleased only", h, h.Err())
		}
		if pglease.Retryable(h.Err()) {
			t.Errorf("%T Released is retryable", h)
		}
	}
}

// TestAcquireWaitsAsLongAsContext: by default (no Config.AcquireTimeout,
// no WithAcquireTimeout) Acquire waits until the holder releases; the
// context alone bounds the wait (cancel: Aborted; deadline:
// AcquisitionTimeout). A configured cap ends the same wait sooner.
func TestAcquireWaitsAsLongAsContext(t *testing.T) {
	t.Parallel()
	const bound = 200 * time.Millisecond
	b := setup(t, setupOpts{cfg: Config{AcquireTimeout: bound}})
	ctx := ctxT(t)
	// The holder's acquire is not under test: the short bound is for the
	// waiters (a first acquire can take longer on a loaded machine).
	holder, err := b.m.Acquire(ctx, "long-wait", WithAcquireTimeout(waitTimeout()))
	if err != nil {
		t.Fatal(err)
	}
	// The control: the configured cap applies.
	_, err = b.m.Acquire(ctx, "long-wait")
	if !errors.Is(err, pglease.ErrAcquisitionTimeout) {
		t.Fatalf("Acquire with the configured cap = %v, want AcquisitionTimeout", err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The default: no cap.
	m2 := setup(t, setupOpts{})
	holder, err = m2.m.Acquire(ctx, "long-wait")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lk  *Lock
		err error
	}
	res := make(chan result, 1)
	drain(&m2.sig.Queued)
	go func() {
		lk, err := m2.m.Acquire(context.WithoutCancel(ctx), "long-wait")
		res <- result{lk, err}
	}()
	waitFor(t, &m2.sig.Queued, func(k string) bool { return k == "long-wait" })
	select {
	case r := <-res:
		t.Fatalf("Acquire without a bound returned early: %v, %v", r.lk, r.err)
	case <-time.After(5 * bound):
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-res:
	case <-time.After(waitTimeout()):
		t.Fatal("the unbounded waiter was not granted after the release")
	}
	if r.err != nil {
		t.Fatalf("unbounded Acquire = %v", r.err)
	}

	// The context's end decides the error.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(5*bound, cancel)
	start := time.Now()
	if _, err := m2.m.Acquire(cctx, "long-wait"); !errors.Is(err, pglease.ErrAborted) {
		t.Fatalf("cancelled wait = %v, want Aborted", err)
	}
	if d := time.Since(start); d < 5*bound {
		t.Fatalf("cancelled wait returned after %v, before the cancel", d)
	}
	dctx, dcancel := context.WithTimeout(ctx, 2*bound)
	defer dcancel()
	if _, err := m2.m.Acquire(dctx, "long-wait"); !errors.Is(err, pglease.ErrAcquisitionTimeout) {
		t.Fatalf("deadline wait = %v, want AcquisitionTimeout", err)
	}
	if err := r.lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAcquireTimeoutValidation: a cap must be positive (WithAcquireTimeout)
// or zero for none (Config.AcquireTimeout); anything else is
// InvalidArgument.
func TestAcquireTimeoutValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	if _, err := b.m.Acquire(ctx, "k", WithAcquireTimeout(-time.Second)); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("WithAcquireTimeout(-1s) = %v", err)
	}
	if _, err := b.m.Acquire(ctx, "k", WithAcquireTimeout(0)); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("WithAcquireTimeout(0) = %v", err)
	}
	if _, err := New(b.pool, Config{AcquireTimeout: -time.Second}); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("Config.AcquireTimeout -1s = %v", err)
	}
}

// rowExpiry returns the expires_at_ms of key's row.
func rowExpiry(t testing.TB, pool *pgxpool.Pool, key string) int64 {
	t.Helper()
	var ms int64
	if err := pool.QueryRow(context.Background(), "SELECT expires_at_ms FROM syncguard_locks WHERE key = $1", key).Scan(&ms); err != nil {
		t.Fatalf("row expiry: %v", err)
	}
	return ms
}

// TestExtendKeepsManualLease: a WithoutAutoExtend lease kept by Extend
// alone outlives several TTLs; each Extend moves the server's expiry
// (ExpiresAt equals the row's) and the trust window (Remaining), and goes
// out as an extend batch of the loop.
func TestExtendKeepsManualLease(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	const ttl = 1500 * time.Millisecond
	lk, err := b.m.Acquire(ctx, "manual", WithTTL(ttl), WithoutAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	if r := lk.Remaining(); r <= 0 || r > ttl {
		t.Fatalf("Remaining after grant = %v, want in (0, %v]", r, ttl)
	}
	if got, want := lk.ExpiresAt().UnixMilli(), rowExpiry(t, b.pool, "manual"); got != want {
		t.Fatalf("ExpiresAt = %d, row = %d", got, want)
	}
	if !lk.ExpiresAt().After(lk.AcquiredAt()) {
		t.Fatalf("ExpiresAt %v not after AcquiredAt %v", lk.ExpiresAt(), lk.AcquiredAt())
	}
	drain(&b.sig.BatchSent)
	start := time.Now()
	prev := lk.ExpiresAt()
	for time.Since(start) < 2*ttl {
		time.Sleep(ttl / 5)
		if err := lk.Extend(ctx); err != nil {
			t.Fatalf("Extend after %v: %v", time.Since(start), err)
		}
		waitFor(t, &b.sig.BatchSent, func(bi kernel.BatchInfo) bool { return bi.Kind == kernel.KindExtend })
		if lk.ExpiresAt().Before(prev) {
			t.Fatalf("ExpiresAt went back: %v < %v", lk.ExpiresAt(), prev)
		}
		prev = lk.ExpiresAt()
		if got, want := prev.UnixMilli(), rowExpiry(t, b.pool, "manual"); got != want {
			t.Fatalf("ExpiresAt = %d, row = %d", got, want)
		}
		if r := lk.Remaining(); r <= ttl/2 || r > ttl {
			t.Fatalf("Remaining right after Extend = %v", r)
		}
	}
	if err := lk.Err(); err != nil {
		t.Fatalf("manual lease kept by Extend for %v (TTL %v) ended: %v", time.Since(start), ttl, err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if lk.Remaining() != 0 {
		t.Error("Remaining after Release not 0")
	}
	if err := lk.Extend(ctx); !errors.Is(err, pglease.ErrReleased) {
		t.Errorf("Extend after Release = %v, want ErrReleased", err)
	}
}

// TestExtendLostLease: Extend of a lease the server no longer has answers
// LockLost and ends the lock with that cause; so does Extend of a manual
// lease whose trust window ran out, and Extend after Close is Closed.
func TestExtendLostLease(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "gone", WithTTL(10*time.Second), WithoutAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, "DELETE FROM syncguard_locks WHERE key = $1", "gone"); err != nil {
		t.Fatal(err)
	}
	if err := lk.Extend(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("Extend of a deleted lease = %v, want LockLost", err)
	}
	if !errors.Is(lk.Err(), pglease.ErrLockLost) {
		t.Fatalf("Err after the refused extend = %v", lk.Err())
	}
	if err := lk.Extend(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("second Extend = %v, want LockLost", err)
	}

	short, err := b.m.Acquire(ctx, "expires", WithTTL(100*time.Millisecond), WithoutAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-short.Done():
	case <-time.After(waitTimeout()):
		t.Fatal("manual lease not lost after its TTL")
	}
	if err := short.Extend(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("Extend of an expired manual lease = %v, want LockLost", err)
	}

	held, err := b.m.Acquire(ctx, "closed", WithoutAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := held.Extend(ctx); !errors.Is(err, pglease.ErrClosed) {
		t.Fatalf("Extend after Close = %v, want Closed", err)
	}
}

// TestExtendJoinsInFlight: Extend calls while an extend of the same lease
// is in flight are answered by the next round trip, not lost; concurrent
// calls share one; an auto-extended lock can be extended by hand too.
func TestExtendJoinsInFlight(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	var block sync.Once
	blocked := make(chan struct{})
	b := setup(t, setupOpts{hooks: kernel.TestHooks{BeforeBatch: func(kind kernel.BatchKind, n int) {
		if kind == kernel.KindExtend {
			block.Do(func() { close(blocked); <-gate })
		}
	}}})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "joins", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- lk.Extend(ctx) }()
	<-blocked // the first extend is in flight, held at the gate
	const n = 4
	later := make(chan error, n)
	for range n {
		go func() { later <- lk.Extend(ctx) }()
	}
	// They reach the loop while the first is in flight; then let it finish.
	for range n {
		wait(t, &b.sig.ExtendAsked)
	}
	close(gate)
	if err := <-first; err != nil {
		t.Fatalf("first Extend = %v", err)
	}
	for range n {
		select {
		case err := <-later:
			if err != nil {
				t.Fatalf("later Extend = %v", err)
			}
		case <-time.After(waitTimeout()):
			t.Fatal("an Extend that came during an extend in flight was never answered")
		}
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestExtendBadInput: nil or ended context, before any I/O.
func TestExtendBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "bad")
	if err != nil {
		t.Fatal(err)
	}
	var nilCtx context.Context
	if err := lk.Extend(nilCtx); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("Extend(nil) = %v", err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := lk.Extend(ended); !errors.Is(err, pglease.ErrAborted) {
		t.Errorf("Extend(ended) = %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
