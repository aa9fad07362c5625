package manager

import (
	"context"

	"github.com/pglease/pglease"
)

// Locker returns the Manager as a pglease.Locker, the interface that code
// under test can take instead of the Manager (pgleasetest.NewFake is an
// in-memory one). Every call of the Locker is the Manager's call of the
// same name with opts, which are checked then: an invalid option makes
// each call fail with InvalidArgument, as the Manager's own call would.
// (A *Manager cannot be a pglease.Locker itself: its methods return
// *Lock, and Go's interfaces need the exact result types.)
func (m *Manager) Locker(opts ...AcquireOption) pglease.Locker {
	return locker{m: m, opts: opts}
}

// locker is the pglease.Locker of a Manager. It also has Revoke, which
// pgleasetest.Conformance uses to check revocation.
type locker struct {
	m    *Manager
	opts []AcquireOption
}

func (l locker) Acquire(ctx context.Context, key string) (pglease.Lease, error) {
	lk, err := l.m.Acquire(ctx, key, l.opts...)
	if lk == nil {
		return nil, err // an untyped nil, not a nil *Lock in the interface
	}
	return lk, err
}

func (l locker) TryAcquire(ctx context.Context, key string) (pglease.Lease, bool, error) {
	lk, ok, err := l.m.TryAcquire(ctx, key, l.opts...)
	if lk == nil {
		return nil, ok, err
	}
	return lk, ok, err
}

func (l locker) Do(ctx context.Context, key string, fn func(ctx context.Context, lease pglease.Lease) error) error {
	if fn == nil {
		return l.m.Do(ctx, key, nil, l.opts...)
	}
	return l.m.Do(ctx, key, func(ctx context.Context, lk *Lock) error { return fn(ctx, lk) }, l.opts...)
}

func (l locker) Revoke(ctx context.Context, key string) (bool, error) {
	n, _, err := l.m.Revoke(ctx, key)
	return n > 0, err
}

var _ pglease.Lease = (*Lock)(nil)
