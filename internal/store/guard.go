package store

import (
	"context"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
)

// GuardResult answers Guard: the guarded grant's fence and its expiry at
// the moment of the check.
type GuardResult struct {
	Fence     pglease.Fence
	ExpiresAt time.Time
}

// Guard ties the caller's transaction tx to the exclusive lease lockID
// holds, in one statement (one round trip) on tx, not on the Store's DB:
//   - it checks that the lease is live (expires_at after the server's
//     clock) and still lockID's; otherwise the error is CodeLockLost and
//     tx is left as it was (no error inside it);
//   - it locks the lease's row FOR KEY SHARE until tx ends: a takeover of
//     the lease (which locks the row FOR UPDATE once it has expired)
//     waits for tx's commit or rollback, so tx's writes are ordered before
//     the next grant's; the heartbeat's extend (FOR NO KEY UPDATE) and
//     other acquirers' refused attempts are not blocked by it; a release
//     or revoke of the lease waits for tx;
//   - it adds lockID to the transaction-local setting pglease.lock_ids
//     (comma-separated), which the database guard (migrate.Migrator.Guard)
//     checks on every write of a guarded table, and, for a lockId this
//     process generated (keys.NewLockID), its guard proof
//     (keys.LockProof) to pglease.lock_proofs, which the strict guard
//     (migrate.Migrator.GuardStrict) requires instead: a lockId read from
//     the lock table has no proof.
//
// tx must be a transaction (a pgx.Tx, or a connection inside BEGIN): on
// a connection outside one, the lock and the setting end with the
// statement. Guard keys in one order across transactions, as for any row
// locks: a transaction that guards a key another batch is taking over
// while holding a key this transaction then guards deadlocks with it
// (PostgreSQL ends one of them). An invalid lockId is InvalidArgument
// before any I/O.
func (s *Store) Guard(ctx context.Context, tx DB, lockID string) (GuardResult, error) {
	const op = "pg.Guard"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return GuardResult{}, err
	}
	if IsNilDB(tx) {
		return GuardResult{}, pgerr.New(pglease.CodeInvalidArgument, op, "nil transaction", nil)
	}
	if err := keys.ValidateLockID(lockID); err != nil {
		return GuardResult{}, WithOp(op, err)
	}
	var res GuardResult
	found := false
	err := func() error {
		proof, _ := keys.LockProof(lockID) // "" (none) for a lockId generated elsewhere
		rows, err := tx.Query(ctx, s.guardSQL, lockID, proof)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var fence string
			var exp int64
			var ids, proofs string
			if err := rows.Scan(&fence, &exp, &ids, &proofs); err != nil {
				return err
			}
			f, err := keys.ParseFence(fence)
			if err != nil {
				return pgerr.New(pglease.CodeInternal, op, "stored fence is not 15 digits", nil)
			}
			res, found = GuardResult{Fence: f, ExpiresAt: time.UnixMilli(exp)}, true
		}
		return rows.Err()
	}()
	if err != nil {
		return GuardResult{}, pgerr.MapSchema(ctx, op, err)
	}
	if !found {
		return GuardResult{}, pgerr.New(pglease.CodeLockLost, op, "the lease is no longer held (released, expired, revoked or taken over)", nil)
	}
	return res, nil
}
