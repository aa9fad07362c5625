package pglease

import "context"

// Locker is the everyday surface of a lease lock manager: wait for a key,
// try it once, or run a function under it. Code that takes a Locker rather
// than a *manager.Manager can be unit-tested with pgleasetest.NewFake, an
// in-memory Locker with the same rules, and checked against the real one
// with pgleasetest.Conformance. A Manager gives its Locker with
// (*manager.Manager).Locker; the options it is given there apply to every
// call.
//
// The methods behave as the Manager's methods of the same names: see
// manager.Manager.Acquire, TryAcquire and Do. A TryAcquire that does not
// get the key returns a nil Lease (an untyped nil interface), ok false and
// a nil error.
type Locker interface {
	Acquire(ctx context.Context, key string) (Lease, error)
	TryAcquire(ctx context.Context, key string) (lease Lease, ok bool, err error)
	Do(ctx context.Context, key string, fn func(ctx context.Context, lease Lease) error) error
}

// Lease is a held lease lock as a Locker hands it out: a Handle (Release,
// Context, Done, Err, with the causes Handle lists) with the fencing
// token of its grant. *manager.Lock is one.
type Lease interface {
	Handle
	// Fence returns the lease's fencing token, strictly greater than
	// that of every earlier grant of the same key.
	Fence() Fence
}
