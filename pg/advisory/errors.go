package advisory

import (
	"context"
	"errors"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// sqlState returns the SQLSTATE of the first *pgconn.PgError in err's
// chain, or "".
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func invalid(op, msg string) error {
	return pgerr.New(pglease.CodeInvalidArgument, op, msg, nil)
}

// mapErr maps a pgx/PostgreSQL error with pgerr.Map (which drops server
// Detail/Where/Hint) and gives the advisory-lock SQLSTATEs a clearer
// message. ctx is the caller's context (context.Background() when the
// caller's context is not what bounded the statement).
func mapErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	m := pgerr.Map(ctx, op, err)
	var e *pglease.Error
	if errors.As(m, &e) && e.Code == pglease.CodeAborted && (ctx == nil || ctx.Err() == nil) &&
		(errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)) {
		// Not the caller's context (it is alive, or was not what bounded
		// the statement): the session's own bound on the statement passed
		// without an answer. The connection is dead (half-open,
		// blackholed) or the server stopped answering: an outage, which a
		// new session may get past.
		return pgerr.New(pglease.CodeNetworkTimeout, op, "no answer from the server within the statement's bound: the connection is dead or the server does not answer", err)
	}
	if !errors.As(m, &e) || e.Code == pglease.CodeAborted {
		return m
	}
	msg := ""
	switch sqlState(err) {
	case pgerrcode.OutOfMemory:
		msg = "lock table full (53200 out of shared memory): hold fewer advisory locks or raise max_locks_per_transaction"
	case pgerrcode.LockNotAvailable:
		msg = "lock_timeout expired while waiting for the advisory lock (55P03)"
	case pgerrcode.QueryCanceled:
		msg = "wait for the advisory lock cancelled by the server: statement_timeout or pg_cancel_backend (57014)"
	default:
		return m
	}
	return pgerr.New(e.Code, e.Op, msg, e.Err)
}
