package manager

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg"
)

// TestRevokeEndsHolder: another Manager revokes a held lease. The holder's
// Context ends with ErrRevoked without waiting for an extend (the extend
// is 10 s away); Release and Extend then answer ErrRevoked, nothing is
// released or extended; a waiter of the holder's process gets the key at
// once with a higher fence; the revoked holder's fenced write after the
// next holder's is refused; a revoke of a free key reports false.
func TestRevokeEndsHolder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	peer, _ := b.newPeer(t, Config{})
	const key = "revoke:me"
	lk, err := b.m.Acquire(ctx, key, WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// A waiter here, behind the holder (whose own Acquire was queued too).
	drain(&b.sig.Queued)
	next := make(chan *Lock, 1)
	go func() {
		l2, err := b.m.Acquire(ctx, key, WithTTL(30*time.Second))
		if err != nil {
			t.Error(err)
		}
		next <- l2
	}()
	waitFor(t, &b.sig.Queued, func(k string) bool { return k == key })

	if _, err := b.admin.Exec(ctx, "CREATE TABLE revoked_res (id text PRIMARY KEY, fence bigint, v text); INSERT INTO revoked_res VALUES ('r', 0, ''); GRANT SELECT, UPDATE ON revoked_res TO PUBLIC"); err != nil {
		t.Fatal(err)
	}
	guard, err := pg.NewFenceGuard("revoked_res", "id", "fence")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := guard.Update(ctx, b.pool, "r", lk.Fence(), pg.Set{Column: "v", Value: "first"}); err != nil || !ok {
		t.Fatalf("first holder's write: %v %v", ok, err)
	}

	start := time.Now()
	revoked, _, err := peer.Revoke(ctx, key)
	if err != nil || revoked != 1 {
		t.Fatalf("Revoke = %v, %v", revoked, err)
	}
	select {
	case <-lk.Done():
	case <-time.After(waitTimeout()):
		t.Fatal("the holder was not told of the revoke")
	}
	t.Logf("holder told %v after the revoke began", time.Since(start))
	if err := lk.Err(); !errors.Is(err, pglease.ErrRevoked) {
		t.Fatalf("Err = %v, want ErrRevoked", err)
	}
	if c := context.Cause(lk.Context()); !errors.Is(c, pglease.ErrRevoked) {
		t.Fatalf("cause = %v", c)
	}
	var l2 *Lock
	select {
	case l2 = <-next:
	case <-time.After(waitTimeout()):
		t.Fatal("the waiter did not get the revoked key")
	}
	if l2 == nil {
		t.FailNow()
	}
	if l2.Fence() <= lk.Fence() {
		t.Fatalf("next fence %v not above the revoked %v", l2.Fence(), lk.Fence())
	}
	if ok, err := guard.Update(ctx, b.pool, "r", l2.Fence(), pg.Set{Column: "v", Value: "second"}); err != nil || !ok {
		t.Fatalf("next holder's write: %v %v", ok, err)
	}
	if ok, err := guard.Update(ctx, b.pool, "r", lk.Fence(), pg.Set{Column: "v", Value: "late"}); err != nil || ok {
		t.Fatalf("the revoked holder's late write was accepted: %v %v", ok, err)
	}
	if err := lk.Extend(ctx); !errors.Is(err, pglease.ErrRevoked) {
		t.Fatalf("Extend = %v, want ErrRevoked", err)
	}
	if err := lk.Release(ctx); !errors.Is(err, pglease.ErrRevoked) {
		t.Fatalf("Release = %v, want ErrRevoked", err)
	}
	// The revoked holder's Release did not touch the next holder's row.
	if id, ok := lockRow(t, b.pool, key); !ok || id != l2.hd.ID {
		t.Fatal("the next holder's row is gone")
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	revoked, _, err = peer.Revoke(ctx, key)
	if err != nil || revoked != 0 {
		t.Fatalf("Revoke of a free key = %v, %v", revoked, err)
	}
}

// TestRevokeHere: a revoke made by the holder's own Manager ends the lock
// even without a listener (DisableNotify): the Manager tells its loop.
func TestRevokeHere(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: Config{DisableNotify: true}})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "revoke:here")
	if err != nil {
		t.Fatal(err)
	}
	if n, _, err := b.m.Revoke(ctx, "revoke:here"); err != nil || n != 1 {
		t.Fatalf("Revoke = %v, %v", n, err)
	}
	select {
	case <-lk.Done():
	case <-time.After(waitTimeout()):
		t.Fatal("not ended")
	}
	if !errors.Is(lk.Err(), pglease.ErrRevoked) {
		t.Fatalf("Err = %v", lk.Err())
	}
}

// TestRevokeMissedNotification: a holder that never hears the revoke
// (no listener) learns at its next extend, which finds no row and the
// revoke's record of its lockId: revoked, not lost, even though the key
// was granted again before that extend.
func TestRevokeMissedNotification(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: Config{DisableNotify: true}})
	ctx := ctxT(t)
	peer, _ := b.newPeer(t, Config{DisableNotify: true})
	lk, err := b.m.Acquire(ctx, "revoke:missed", WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if n, _, err := peer.Revoke(ctx, "revoke:missed"); err != nil || n != 1 {
		t.Fatalf("Revoke = %v, %v", n, err)
	}
	next, err := peer.Acquire(ctx, "revoke:missed")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Done():
	case <-time.After(waitTimeout()):
		t.Fatal("not ended")
	}
	if !errors.Is(lk.Err(), pglease.ErrRevoked) {
		t.Fatalf("Err = %v, want ErrRevoked", lk.Err())
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseRequested: RequestRelease from another Manager closes the
// holder's ReleaseRequested, and nothing else happens.
func TestReleaseRequested(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	peer, _ := b.newPeer(t, Config{})
	lk, err := b.m.Acquire(ctx, "request:me")
	if err != nil {
		t.Fatal(err)
	}
	other, err := b.m.Acquire(ctx, "request:other")
	if err != nil {
		t.Fatal(err)
	}
	if err := peer.RequestRelease(ctx, "request:me"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.ReleaseRequested():
	case <-time.After(waitTimeout()):
		t.Fatal("the request did not reach the holder")
	}
	select {
	case <-other.ReleaseRequested():
		t.Fatal("another key's holder was asked")
	default:
	}
	if lk.Err() != nil {
		t.Fatalf("the request ended the lock: %v", lk.Err())
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var nilLock *Lock
	if nilLock.ReleaseRequested() != nil {
		t.Fatal("nil Lock's channel")
	}
}

// TestRevokeBadInput: bad input is InvalidArgument before any query.
func TestRevokeBadInput(t *testing.T) {
	t.Parallel()
	qc, qn := queryCounter("", "")
	b := setup(t, setupOpts{pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc }}})
	ctx := ctxT(t)
	before := qn.Load()
	var nilCtx context.Context
	calls := map[string]error{}
	_, _, calls["Revoke nil ctx"] = b.m.Revoke(nilCtx, "k")
	_, _, calls["Revoke bad key"] = b.m.Revoke(ctx, "")
	calls["RequestRelease nil ctx"] = b.m.RequestRelease(nilCtx, "k")
	calls["RequestRelease bad key"] = b.m.RequestRelease(ctx, "bad\x00key")
	_, calls["Watch nil ctx"] = b.m.Watch(nilCtx, "k")
	_, calls["Watch bad key"] = b.m.Watch(ctx, "")
	_, calls["Acquire negative delay"] = b.m.Acquire(ctx, "k", WithLockDelay(-time.Second))
	_, calls["Acquire fractional delay"] = b.m.Acquire(ctx, "k", WithLockDelay(1500*time.Microsecond))
	_, calls["LockAdvisory delay"] = b.m.LockAdvisory(ctx, advKey(), WithLockDelay(time.Second))
	for name, err := range calls {
		if !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("%s = %v, want InvalidArgument", name, err)
		}
	}
	if n := qn.Load() - before; n != 0 {
		t.Errorf("%d queries for bad input", n)
	}
	off := setup(t, setupOpts{cfg: Config{DisableNotify: true}})
	if err := off.m.RequestRelease(ctx, "k"); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("RequestRelease with DisableNotify = %v", err)
	}
	if _, err := off.m.Watch(ctx, "k"); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("Watch with DisableNotify = %v", err)
	}
}

// TestLockDelay: a lease taken WithLockDelay keeps the key from the next
// holder for the delay after a revoke, and for max(1 s, delay) after its
// expiry, and no longer: a waiter that never polls (its retry policy
// waits 20 s) gets the key when the server's answer said it could.
func TestLockDelay(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	waiter, wsig := b.newPeer(t, Config{Retry: pollingTooSlow})
	wait(t, &wsig.Listening)
	const delay = 1500 * time.Millisecond
	const slack = time.Second

	// Revoked: the key stays free for the delay.
	lk, err := b.m.Acquire(ctx, "delay:revoke", WithLockDelay(delay))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		l2, err := waiter.Acquire(ctx, "delay:revoke")
		got <- time.Now()
		if err != nil {
			t.Error(err)
			return
		}
		_ = l2.Release(ctx)
	}()
	waitFor(t, &wsig.Retrying, func(k string) bool { return k == "delay:revoke" })
	before := time.Now()
	if n, _, err := waiter.Revoke(ctx, "delay:revoke"); err != nil || n != 1 {
		t.Fatalf("Revoke = %v, %v", n, err)
	}
	after := time.Now()
	granted := <-got
	t.Logf("revoked: granted %v after the revoke (delay %v)", granted.Sub(after), delay)
	if granted.Sub(before) < delay {
		t.Fatalf("granted %v after the revoke began: within the lock delay %v", granted.Sub(before), delay)
	}
	if granted.Sub(after) > delay+slack {
		t.Fatalf("granted %v after the revoke: the delay held it longer than %v", granted.Sub(after), delay)
	}
	if !errors.Is(lk.Err(), pglease.ErrRevoked) {
		t.Fatalf("holder: %v", lk.Err())
	}

	// Expired: nobody takes the key before expiry + the delay (2.5 s:
	// above the usual 1 s).
	const long = 2500 * time.Millisecond
	lk, err = b.m.Acquire(ctx, "delay:expire", WithTTL(300*time.Millisecond), WithoutAutoExtend(), WithLockDelay(long))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		l2, err := waiter.Acquire(ctx, "delay:expire")
		got <- time.Now()
		if err != nil {
			t.Error(err)
			return
		}
		_ = l2.Release(ctx)
	}()
	expiry := lk.ExpiresAt() // server time; same machine's clock
	granted = <-got
	t.Logf("expired: granted %v after expiry (delay %v)", granted.Sub(expiry), long)
	if granted.Sub(expiry) < long {
		t.Fatalf("granted %v after expiry: within the lock delay %v", granted.Sub(expiry), long)
	}
	if granted.Sub(expiry) > long+slack {
		t.Fatalf("granted %v after expiry: held longer than the delay %v", granted.Sub(expiry), long)
	}
	_ = lk.Release(ctx)
}

// TestRevokeBeforeGrantAnswer: the revoke's notification reaches the
// holder's Manager before the answer of the acquire it revokes (the
// answer is held back here). The grant still ends as revoked as soon as
// it is made, not at its next extend (its TTL is 30 s).
func TestRevokeBeforeGrantAnswer(t *testing.T) {
	t.Parallel()
	granted := make(chan struct{}) // the acquire statement was answered
	proceed := make(chan struct{}) // let its answer reach the loop
	var once sync.Once
	b := setup(t, setupOpts{hooks: kernel.TestHooks{AfterAcquire: func() {
		once.Do(func() {
			close(granted)
			<-proceed
		})
	}}})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	peer, _ := b.newPeer(t, Config{})
	const key = "revoke:early"
	got := make(chan *Lock, 1)
	go func() {
		lk, err := b.m.Acquire(ctx, key, WithTTL(30*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	<-granted
	if n, _, err := peer.Revoke(ctx, key); err != nil || n != 1 {
		t.Fatalf("Revoke = %v, %v", n, err)
	}
	wait(t, &b.sig.RevokeKept) // heard before the grant was answered
	close(proceed)
	lk := <-got
	if lk == nil {
		t.FailNow()
	}
	select {
	case <-lk.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the revoked grant is still held")
	}
	if !errors.Is(lk.Err(), pglease.ErrRevoked) {
		t.Fatalf("Err = %v", lk.Err())
	}
}

// TestDoRevoked: a lease revoked while Do's fn runs is reported by Do as
// the revocation, as a loss is: fn's context ends with ErrRevoked, and
// when fn then returns nil Do returns an ErrRevoked error (the work may
// not have been protected), not nil. Revoked by another Manager (its
// notification) and by the holder's own.
func TestDoRevoked(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	peer, _ := b.newPeer(t, Config{})
	for name, revoker := range map[string]*Manager{"another Manager": peer, "its own Manager": b.m} {
		t.Run(name, func(t *testing.T) {
			key := "revoke:do:" + name
			ran := false
			err := b.m.Do(ctx, key, func(fctx context.Context, lk *Lock) error {
				ran = true
				if n, _, err := revoker.Revoke(ctx, key); err != nil || n != 1 {
					t.Fatalf("Revoke = %v, %v", n, err)
				}
				select {
				case <-fctx.Done():
				case <-time.After(waitTimeout()):
					t.Fatal("fn's context did not end with the revoke")
				}
				if c := context.Cause(fctx); !errors.Is(c, pglease.ErrRevoked) {
					t.Errorf("fn's context.Cause = %v, want ErrRevoked", c)
				}
				return nil
			})
			if !ran {
				t.Fatal("fn did not run")
			}
			var pe *pglease.Error
			if !errors.Is(err, pglease.ErrRevoked) || !errors.As(err, &pe) || pe.Code != pglease.CodeRevoked {
				t.Fatalf("Do = %v, want an ErrRevoked error", err)
			}
			// fn's own error still comes first.
			boom := errors.New("boom")
			err = b.m.Do(ctx, key, func(fctx context.Context, lk *Lock) error {
				if _, _, err := revoker.Revoke(ctx, key); err != nil {
					t.Fatal(err)
				}
				<-fctx.Done()
				return boom
			})
			if err != boom {
				t.Fatalf("Do with fn failing = %v, want fn's error", err)
			}
		})
	}
}
