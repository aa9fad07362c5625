package manager

import (
	"context"
	"time"
)

// Close stops the Manager, in this order: new calls fail with ErrClosed;
// every waiting Acquire fails with ErrClosed; every held lock's Context
// is cancelled with cause ErrClosed; all held locks, and the rows kept for
// lost locks whose holders never called Release, are released in one
// round trip (detached from ctx, bounded by Config.CloseTimeout), and so is
// whatever an acquire batch still in flight grants (such a batch is let
// finish, bounded by Config.StatementTimeout, so its outcome is known); the
// listener and every database goroutine are stopped; the pool is closed
// if the Manager opened it (Open). No goroutine outlives a completed
// Close. (A pool connection that broke under a statement is cleaned up by
// pgx in a goroutine of the pool's, which pool.Close waits for: bounded
// by the connect timeout + 2 s on a pool configured by pg.ConfigurePool,
// as Open's is, and by pgx's 15 s on another.)
//
// ctx bounds only how long Close waits: if it ends first, Close returns
// CodeAborted and the shutdown goes on in the background (Done is closed
// when it has finished). Close is idempotent and safe to call
// concurrently; every call waits for the same shutdown.
//
// Close reports on the locks callers hold: it returns the first failure
// to release a lock handed to a caller and not released by it (held at
// Close, lost with its row kept, or whose Release had an unknown outcome
// still being retried), after retrying it until CloseTimeout; such a
// lock expires by itself at the end of its TTL. The clean-up of lockIds
// no caller ever got (an acquire whose answer was lost, a grant taken
// back from a caller who left) is best effort: each is sent once more,
// never retried, and never the error Close returns. So with the database
// down and no lock held, Close takes about one failed round trip; with
// locks held it takes up to CloseTimeout (5 s by default), on purpose: a
// release that gets through, say after a failover of a few seconds,
// spares every other process a wait of up to the lease's TTL + 1 s for
// the key, which a shutdown that gave up at once would impose. A service
// whose shutdown must be quicker sets CloseTimeout lower; its leases then
// expire by themselves at the end of their TTL.
func (m *Manager) Close(ctx context.Context) error { return m.k.Close(ctx) }

// Revoke deletes key's live holds on the server, whoever holds them
// (this process or another), in one durable statement: its exclusive
// lease, or its shared holds (readers, Shared; semaphore permits,
// WithLimit). With holds, only the holds named are revoked, each by its
// grant id (Lock.GrantID, which a holder may log) or by the hash of its
// lockId (pglease.HashKey: lock_id_hash in the {lock}_leases view and
// pglease status), for example one hung permit of a semaphore. A lease
// that has expired is not live: it is left in place, and with it its lock
// delay.
//
// The answer says what it did. revoked counts the live holds the revoke
// deleted: 1 for the key's exclusive lease, or the readers or permits
// revoked; 0: the key had no live hold (or none of those named), and
// nothing was changed. notBefore, when not zero, is the server time
// before which no acquire gets the key: the revoked lease's lock delay
// (WithLockDelay) after the revoke, or, when nothing was revoked, the
// delay of an expired lease still in force (a revoke leaves an expired
// lease and its delay in place: it never frees a key earlier than its
// expiry would). Zero: no delay keeps the key.
//
// Each revoked holder's Manager, which hears of it on its listening
// connection, ends the lock's Context at once with a cause matching
// pglease.ErrRevoked (typically within milliseconds of the revoke's
// commit); its Release then returns that error and nothing is extended or
// released any more. A holder that was not listening at that moment (its
// listening connection was being replaced) learns at its next extend,
// which finds the lease gone and, for an exclusive lease, the revoke
// recorded: pglease.ErrRevoked too (a revoked reader or permit that missed
// the notice learns pglease.ErrLockLost). Until the holder
// stops, only fencing protects the resource: the next holder's fence is
// higher (pg.FenceGuard refuses the revoked holder's later writes).
// Revoke waits for transactions that guard the lease (Lock.Guard), so
// their writes come before it.
//
// If the revoked lease was taken WithLockDelay, nobody gets the key
// before that delay has passed after the revoke (notBefore); otherwise
// its waiters may take it at once (they are woken). Bad input (a key, or
// a hold that is neither a grant id nor a lockId hash) is
// CodeInvalidArgument before any I/O; an outage is its code
// (pglease.Retryable; a revoke whose outcome is unknown may be repeated:
// it is idempotent).
func (m *Manager) Revoke(ctx context.Context, key string, holds ...string) (revoked int, notBefore time.Time, err error) {
	return m.k.Revoke(ctx, key, holds...)
}

// RequestRelease asks the holders of key to release it, without taking
// anything: one statement notifies every Manager listening on the notify
// channel, and each closes ReleaseRequested of the locks of key it holds
// (exclusive and shared: readers and permits), or, with holds, of the
// holds named (as Revoke names them); this Manager's own holders hear it
// at once. The holder decides whether and when to release; nothing else
// changes. A holder in another process that is not listening at that
// moment (its listening connection being replaced) does not hear it: ask
// again. It needs notifications: with Config.DisableNotify it is
// CodeInvalidArgument, like bad input, before any I/O.
func (m *Manager) RequestRelease(ctx context.Context, key string, holds ...string) error {
	return m.k.RequestRelease(ctx, key, holds...)
}
