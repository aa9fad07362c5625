package pglease

import "context"

// Handle is what every held lock of pglease has in common, whatever kind
// it is: a lease lock (*manager.Lock), a session advisory lock
// (*advisory.Lock, whether taken on a Session, through an
// advisory.Client or through a Manager), or a leader's term in an
// election (*election.Term). Code that only needs to hold a lock, watch it
// and let it go can take a Handle and work with all of them.
//
// Each handle also has a Key method returning its own key type (a string
// for leases, an advisory.Key for advisory locks), and leases add Fence
// and their expiry; those are not part of Handle because their types
// differ or only some handles have them.
//
// The life of a handle: it is held from the moment the acquiring call
// returns it until Release, a loss, a hold limit or the close of its
// Manager or session. Then its Context is cancelled, once, and Err
// returns why.
//
// Every method is safe for concurrent use, and safe on a nil handle (the
// nil a TryAcquire or TryLock returns with ok=false): Release and Err
// return an error matching ErrInvalidArgument, Context returns a context
// that has already ended with that error as its cause, and Done a closed
// channel.
type Handle interface {
	// Release lets the lock go and returns once the server answered. It
	// returns nil if the lock was held until now (or until the close of
	// its Manager or session, which released it), an error matching
	// ErrLockLost if the lock had been lost before, and another error if
	// the outcome is unknown (the lock then ends on the server by itself:
	// its lease expires or its session's connection is closed). The
	// handle's Context is cancelled with a cause matching ErrReleased at
	// once. Releasing twice is a no-op that returns nil. If ctx ends
	// first, Release returns an error matching ErrAborted while the
	// release goes on in the background, so a deferred Release never
	// leaves the lock held.
	Release(ctx context.Context) error
	// Context returns a context that is cancelled when the lock stops
	// being held; context.Cause then returns the same error as Err. Run
	// the work the lock protects under it.
	Context() context.Context
	// Done is Context().Done().
	Done() <-chan struct{}
	// Err returns nil while the lock is held, and then why it ended,
	// always a *Error: one matching ErrReleased (Release), ErrLockLost
	// (lease expired or refused, session connection died), ErrRevoked (a
	// lease revoked on purpose), ErrClosed (its Manager or session was
	// closed), or the hold-limit error.
	Err() error
}
