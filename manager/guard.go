package manager

import (
	"context"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// Guard ties the caller's transaction tx to this lock, in one statement
// on tx: it checks on the server that the lease is live and still this
// grant's, and then, until tx commits or rolls back:
//
//   - a takeover of the key waits for tx: the lease's row is locked
//     FOR KEY SHARE, which the next grant's FOR UPDATE must wait for, so
//     tx's writes are ordered before anything the next holder does, even
//     if the lease expires while tx runs (commit within the TTL anyway:
//     everyone else waits for you meanwhile);
//   - the heartbeat is not blocked (an extend locks FOR NO KEY UPDATE), nor
//     are other processes' refused attempts; a release or revoke of the
//     lease waits for tx, so release the lock after tx ends (inside tx it
//     would also hold up the Manager's other releases batched with it);
//   - the database guard accepts tx's writes to the guarded tables'
//     rows of this key (the lease's lockId joins tx's pglease.lock_ids):
//     migrate.Migrator.Guard(ctx, table, keyColumn) installs it once per
//     table, after which a write of a row whose keyColumn is the key needs
//     a transaction that called Guard for a live lease of that key, and
//     writers that never call pglease are refused (SQLSTATE PGL10).
//
// Guard is for exclusive leases (Acquire, AcquireAll): a shared lock
// (Shared, WithLimit) is InvalidArgument, as are a nil tx or ctx; a lock
// that has ended returns its cause's code (ErrReleased, ErrLockLost,
// ErrClosed, ErrHoldLimitExceeded) before any I/O. When the server no
// longer has the grant (released, expired, revoked, taken over) the error
// is CodeLockLost and tx is left as it was (no error inside it); the
// lock's own loss signal comes from its heartbeat. In a REPEATABLE READ
// or SERIALIZABLE transaction, call Guard first: a snapshot taken before
// the grant or its last extend makes the check fail.
func (l *Lock) Guard(ctx context.Context, tx pgx.Tx) error {
	const op = "manager.Guard"
	if l == nil || l.hd == nil || l.hd.M == nil {
		return errNilLock
	}
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if store.IsNilDB(tx) {
		return kernel.Invalid(op, "nil transaction")
	}
	if l.hd.Shared {
		return kernel.Invalid(op, "Guard ties a transaction to an exclusive lease; a shared lock (Shared, WithLimit) has none")
	}
	if c := l.Err(); c != nil {
		code := pglease.CodeOf(c)
		if code == 0 {
			code = pglease.CodeInternal
		}
		return pgerr.New(code, op, "the lock is no longer held", c)
	}
	if _, err := l.hd.M.Store.Guard(ctx, tx, l.hd.ID); err != nil {
		return kernel.Reop(op, err)
	}
	return nil
}
