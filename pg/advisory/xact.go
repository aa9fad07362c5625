package advisory

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

func xactSQL(k Key, try bool) (string, []any) {
	fn := "pg_advisory_xact_lock"
	if try {
		fn = "pg_try_advisory_xact_lock"
	}
	if a, b, ok := k.Pair(); ok {
		return "SELECT " + fn + "($1::int4, $2::int4)::text", []any{a, b}
	}
	id, _ := k.Int64()
	return "SELECT " + fn + "($1::int8)::text", []any{id}
}

func checkXact(op string, ctx context.Context, tx pgx.Tx, k Key) error {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if tx == nil {
		return invalid(op, "nil transaction")
	}
	if !k.Valid() {
		return invalid(op, "invalid key")
	}
	return nil
}

// XactLock takes k for the rest of tx (pg_advisory_xact_lock), waiting as
// long as ctx, the transaction's lock_timeout and statement_timeout
// allow. The lock ends at COMMIT or ROLLBACK; there is no unlock. Writes
// made in tx while it holds the lock are safe: a holder that lost its
// connection cannot commit.
//
// ctx runs on the caller's transaction: if it ends, pgx cancels the
// statement or closes the connection, and the transaction is over either
// way (Aborted). A lock_timeout (55P03) or statement_timeout (57014) is
// NetworkTimeout; 53200 (lock table full) is ResourceExhausted.
func XactLock(ctx context.Context, tx pgx.Tx, k Key) error {
	const op = "advisory.XactLock"
	if err := checkXact(op, ctx, tx, k); err != nil {
		return err
	}
	q, args := xactSQL(k, false)
	_, err := tx.Exec(ctx, q, args...)
	return mapErr(ctx, op, err)
}

// TryXactLock takes k for the rest of tx if it is free, without waiting
// (pg_try_advisory_xact_lock). Errors as XactLock.
func TryXactLock(ctx context.Context, tx pgx.Tx, k Key) (bool, error) {
	const op = "advisory.TryXactLock"
	if err := checkXact(op, ctx, tx, k); err != nil {
		return false, err
	}
	q, args := xactSQL(k, true)
	var res string
	if err := tx.QueryRow(ctx, q, args...).Scan(&res); err != nil {
		return false, mapErr(ctx, op, err)
	}
	return res == "true", nil
}

// Beginner starts transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// (a savepoint) all are.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// rollbackTimeout bounds the rollback WithXactLock runs after a failure.
const rollbackTimeout = 5 * time.Second

// WithXactLock begins a transaction on db, takes k with XactLock, runs fn
// and commits; if anything fails (or fn panics) it rolls back, so the
// lock is released either way. fn's error is returned as is. A COMMIT
// that fails with a server error is a definite failure (mapped); one whose
// reply was lost is Ambiguous: the transaction may have committed.
func WithXactLock(ctx context.Context, db Beginner, k Key, fn func(pgx.Tx) error) (err error) {
	const op = "advisory.WithXactLock"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if isNil(db) {
		return invalid(op, "nil db")
	}
	if fn == nil {
		return invalid(op, "nil fn")
	}
	if !k.Valid() {
		return invalid(op, "invalid key")
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return mapErr(ctx, op, err)
	}
	committed := false
	defer func() {
		if !committed {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()
	if err := XactLock(ctx, tx, k); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	committed = true
	if err := tx.Commit(ctx); err != nil {
		var pe *pgconn.PgError
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			return pgerr.New(pglease.CodeInternal, op, "transaction had failed; COMMIT rolled it back", err)
		}
		if errors.As(err, &pe) {
			return mapErr(ctx, op, err)
		}
		return pgerr.New(pglease.CodeAmbiguous, op, "commit outcome unknown", mapErr(ctx, op, err))
	}
	return nil
}

func isNil(db Beginner) bool {
	switch v := db.(type) {
	case nil:
		return true
	case *pgxpool.Pool:
		return v == nil
	case *pgx.Conn:
		return v == nil
	}
	return false
}
