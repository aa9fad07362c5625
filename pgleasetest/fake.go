package pgleasetest

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
)

// NewFake returns an in-memory pglease.Locker for unit tests without
// PostgreSQL, with the rules of a Manager's Locker (Conformance checks
// both against the same suite):
//
//   - keys are checked and normalized as the Manager does (empty, invalid
//     UTF-8 or too long: InvalidArgument; NFC-equal keys are one lock),
//     and a nil or ended context fails before anything else is done
//     (InvalidArgument, Aborted);
//   - a key has one holder at a time; Acquire waits for it in FIFO order,
//     and ends with Aborted when its context is cancelled or
//     AcquisitionTimeout when its deadline passes; TryAcquire answers ok
//     false while the key is held or callers are waiting for it;
//   - each grant's Fence is strictly greater than every earlier one of its
//     key;
//   - a lease's Context ends once, with a cause matching ErrReleased
//     (Release), ErrLockLost (Lose, or its TTL) or ErrRevoked (Revoke),
//     and Release then answers as the Manager's does (nil, or the loss).
//
// ttl 0 keeps every lease until it is released, lost or revoked, like
// the Manager's automatically extended leases; a positive ttl makes every
// lease end with ErrLockLost ttl after its grant, like a Manager's Locker
// made with WithTTL(ttl) and WithoutAutoExtend. A ttl the Manager would
// refuse (not a whole number of milliseconds, or too large) makes every
// call fail with InvalidArgument.
//
// Lose and Revoke end a fake's lease as a loss or a revocation would.
func NewFake(ttl time.Duration) pglease.Locker {
	f := &fake{ttl: ttl, keys: map[string]*fakeKey{}}
	if ttl < 0 {
		f.ttlErr = pgerr.New(pglease.CodeInvalidArgument, "pgleasetest.NewFake", "ttl must not be negative", nil)
	} else if ttl > 0 {
		f.ttlErr = keys.ValidateTTL(ttl)
	}
	return f
}

type fake struct {
	ttl    time.Duration
	ttlErr error

	mu   sync.Mutex
	keys map[string]*fakeKey
}

// fakeKey is one key's state: its holder, the last fence granted and the
// callers waiting, oldest first.
type fakeKey struct {
	holder  *fakeLease
	fence   pglease.Fence
	waiters []chan *fakeLease // each buffered (1): the grant is handed over without blocking
}

type fakeLease struct {
	f      *fake
	key    string
	fence  pglease.Fence
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer // the TTL's loss; nil when ttl is 0
}

var _ pglease.Lease = (*fakeLease)(nil)

const (
	opAcquire = "pgleasetest.Acquire"
	opTry     = "pgleasetest.TryAcquire"
	opDo      = "pgleasetest.Do"
	opRelease = "pgleasetest.Release"
	opRevoke  = "pgleasetest.Revoke"
)

// check validates a call's context and key before anything else, as the
// Manager does, and returns the normalized key.
func (f *fake) check(op string, ctx context.Context, key string) (string, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return "", err
	}
	nk, err := keys.NormalizeKey(key)
	if err != nil {
		return "", err
	}
	if f.ttlErr != nil {
		return "", f.ttlErr
	}
	return nk, nil
}

func (f *fake) key(nk string) *fakeKey {
	k := f.keys[nk]
	if k == nil {
		k = &fakeKey{}
		f.keys[nk] = k
	}
	return k
}

// grant makes k's next lease. Called with f.mu held and k free.
func (f *fake) grant(nk string, k *fakeKey) *fakeLease {
	k.fence++
	l := &fakeLease{f: f, key: nk, fence: k.fence}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	k.holder = l
	if f.ttl > 0 {
		l.timer = time.AfterFunc(f.ttl, func() {
			l.end(pgerr.New(pglease.CodeLockLost, "pgleasetest.Lease", "the lease expired (its TTL passed without an extend)", nil))
		})
	}
	return l
}

// end ends l with cause if it is still held, hands the key to the oldest
// waiter, and reports whether it ended it.
func (l *fakeLease) end(cause error) bool {
	f := l.f
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.keys[l.key]
	if k == nil || k.holder != l {
		return false
	}
	k.holder = nil
	l.cancel(cause)
	if l.timer != nil {
		l.timer.Stop()
	}
	if len(k.waiters) > 0 {
		w := k.waiters[0]
		k.waiters = k.waiters[1:]
		w <- f.grant(l.key, k)
	} // a free key stays: its fence goes on from where it is
	return true
}

func (f *fake) Acquire(ctx context.Context, key string) (pglease.Lease, error) {
	return f.acquire(opAcquire, ctx, key)
}

func (f *fake) acquire(op string, ctx context.Context, key string) (pglease.Lease, error) {
	nk, err := f.check(op, ctx, key)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	k := f.key(nk)
	if k.holder == nil && len(k.waiters) == 0 {
		l := f.grant(nk, k)
		f.mu.Unlock()
		return l, nil
	}
	w := make(chan *fakeLease, 1)
	k.waiters = append(k.waiters, w)
	f.mu.Unlock()
	select {
	case l := <-w:
		return l, nil
	case <-ctx.Done():
	}
	f.mu.Lock()
	for i, x := range k.waiters {
		if x == w {
			k.waiters = append(k.waiters[:i:i], k.waiters[i+1:]...)
			f.mu.Unlock()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, pgerr.New(pglease.CodeAcquisitionTimeout, op, "the wait for the lock timed out: the key was held", ctx.Err())
			}
			return nil, pgerr.New(pglease.CodeAborted, op, "context ended while waiting for the lock", ctx.Err())
		}
	}
	f.mu.Unlock()
	return <-w, nil // granted just as ctx ended: the caller has it
}

func (f *fake) TryAcquire(ctx context.Context, key string) (pglease.Lease, bool, error) {
	nk, err := f.check(opTry, ctx, key)
	if err != nil {
		return nil, false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.key(nk)
	if k.holder != nil || len(k.waiters) > 0 {
		return nil, false, nil
	}
	return f.grant(nk, k), true, nil
}

// Do is Manager.Do's rules: fn's error, or the loss or revocation when
// fn succeeded but the lease was lost or revoked before its release; the
// lease is released when fn returns or panics.
func (f *fake) Do(ctx context.Context, key string, fn func(ctx context.Context, lease pglease.Lease) error) (err error) {
	if fn == nil {
		return pgerr.New(pglease.CodeInvalidArgument, opDo, "nil function", nil)
	}
	l, err := f.acquire(opDo, ctx, key)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	returned := false
	defer func() {
		stop()
		cancel(nil)
		rerr := l.Release(context.WithoutCancel(ctx))
		if returned && err == nil && (errors.Is(rerr, pglease.ErrLockLost) || errors.Is(rerr, pglease.ErrRevoked)) {
			err = rerr
		}
	}()
	err = fn(fctx, l)
	returned = true
	return err
}

// Revoke ends key's lease as Manager.Revoke does and reports whether
// there was one.
func (f *fake) Revoke(ctx context.Context, key string) (bool, error) {
	nk, err := f.check(opRevoke, ctx, key)
	if err != nil {
		return false, err
	}
	f.mu.Lock()
	k := f.keys[nk]
	var l *fakeLease
	if k != nil {
		l = k.holder
	}
	f.mu.Unlock()
	if l == nil {
		return false, nil
	}
	return l.end(pgerr.New(pglease.CodeRevoked, "pgleasetest.Lease", "the lease was revoked", nil)), nil
}

func (l *fakeLease) Fence() pglease.Fence       { return l.fence }
func (l *fakeLease) Context() context.Context   { return l.ctx }
func (l *fakeLease) Done() <-chan struct{}      { return l.ctx.Done() }
func (l *fakeLease) Err() error                 { return context.Cause(l.ctx) }
func (l *fakeLease) lose(cause error) (ok bool) { return l.end(cause) }

// Release is Lock.Release's rules: nil if the lease was held until now
// (or released before), the loss or revocation if it had ended so,
// Aborted (the release done anyway) when ctx had ended.
func (l *fakeLease) Release(ctx context.Context) error {
	if ctx == nil {
		return pgerr.New(pglease.CodeInvalidArgument, opRelease, "nil context", nil)
	}
	l.end(pgerr.New(pglease.CodeReleased, "pgleasetest.Lease", "the lease was released", nil))
	if err := ctx.Err(); err != nil {
		return pgerr.New(pglease.CodeAborted, opRelease, "context ended; the lease was released", err)
	}
	switch c := context.Cause(l.ctx); {
	case errors.Is(c, pglease.ErrLockLost):
		return pgerr.New(pglease.CodeLockLost, opRelease, "the lease had been lost before it was released", c)
	case errors.Is(c, pglease.ErrRevoked):
		return pgerr.New(pglease.CodeRevoked, opRelease, "the lease had been revoked before it was released", c)
	}
	return nil
}
