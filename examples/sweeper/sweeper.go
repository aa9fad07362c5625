// Package sweeper is the code under test of docs/testing.md: a job that
// must run on one instance at a time. It takes a pglease.Locker, not a
// *manager.Manager, so that its unit tests can give it
// pgleasetest.NewFake and its integration tests a Manager's Locker.
package sweeper

import (
	"context"

	"github.com/pglease/pglease"
)

// Sweeper deletes expired rows in batches, on one instance at a time.
type Sweeper struct {
	locks pglease.Locker
	batch func(ctx context.Context, fence pglease.Fence) (more bool, err error)
}

// New returns a Sweeper whose batch deletes one batch, fenced with the
// lock's fence, and says whether there is more to do.
func New(locks pglease.Locker, batch func(ctx context.Context, fence pglease.Fence) (more bool, err error)) *Sweeper {
	return &Sweeper{locks: locks, batch: batch}
}

// Sweep runs batches under the "sweeper" lock until none is left. It stops
// at once when the lock ends (lost, revoked) and returns why.
func (s *Sweeper) Sweep(ctx context.Context) error {
	return s.locks.Do(ctx, "sweeper", func(ctx context.Context, lease pglease.Lease) error {
		for {
			more, err := s.batch(ctx, lease.Fence())
			if err != nil || !more {
				return err
			}
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
		}
	})
}

// SweepIfFree sweeps unless another instance is sweeping (then it returns
// false at once).
func (s *Sweeper) SweepIfFree(ctx context.Context) (swept bool, err error) {
	lease, ok, err := s.locks.TryAcquire(ctx, "sweeper")
	if err != nil || !ok {
		return false, err
	}
	defer lease.Release(context.WithoutCancel(ctx))
	for more := true; more && err == nil; {
		if lease.Err() != nil {
			return false, lease.Err()
		}
		more, err = s.batch(lease.Context(), lease.Fence())
	}
	return err == nil, err
}
