package advisory

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

func xactSQL(k Key, try, shared bool) (string, []any) {
	fn := "pg_advisory_xact_lock"
	if try {
		fn = "pg_try_advisory_xact_lock"
	}
	if shared {
		fn += "_shared"
	}
	return keyCall(fn, k)
}

func checkXact(op string, ctx context.Context, tx pgx.Tx, k Key) error {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if tx == nil {
		return invalid(op, "nil transaction")
	}
	if !k.valid() {
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
	return xactLock(ctx, "advisory.XactLock", tx, k, false)
}

// TryXactLock takes k for the rest of tx if it is free, without waiting
// (pg_try_advisory_xact_lock). Errors as XactLock.
func TryXactLock(ctx context.Context, tx pgx.Tx, k Key) (bool, error) {
	return tryXactLock(ctx, "advisory.TryXactLock", tx, k, false)
}

// XactLockShared takes k in shared mode for the rest of tx
// (pg_advisory_xact_lock_shared), waiting as XactLock does. Any number of
// transactions and sessions may hold a key shared at once; a shared hold
// excludes every exclusive one (XactLock, Session.Lock, …) and waits for
// it. A shared request also waits behind another transaction's or
// session's waiting exclusive request: PostgreSQL does not let shared
// holders starve an exclusive taker. Errors as XactLock.
func XactLockShared(ctx context.Context, tx pgx.Tx, k Key) error {
	return xactLock(ctx, "advisory.XactLockShared", tx, k, true)
}

// TryXactLockShared takes k in shared mode for the rest of tx if it can
// without waiting (pg_try_advisory_xact_lock_shared): false when the key
// is held exclusively or an exclusive request waits for it (see
// XactLockShared). Errors as XactLock.
func TryXactLockShared(ctx context.Context, tx pgx.Tx, k Key) (bool, error) {
	return tryXactLock(ctx, "advisory.TryXactLockShared", tx, k, true)
}

func xactLock(ctx context.Context, op string, tx pgx.Tx, k Key, shared bool) error {
	if err := checkXact(op, ctx, tx, k); err != nil {
		return err
	}
	q, args := xactSQL(k, false, shared)
	_, err := tx.Exec(ctx, q, args...)
	return mapErr(ctx, op, err)
}

func tryXactLock(ctx context.Context, op string, tx pgx.Tx, k Key, shared bool) (bool, error) {
	if err := checkXact(op, ctx, tx, k); err != nil {
		return false, err
	}
	q, args := xactSQL(k, true, shared)
	var res string
	if err := tx.QueryRow(ctx, q, args...).Scan(&res); err != nil {
		return false, mapErr(ctx, op, err)
	}
	return res == "true", nil
}

// xactAllSQL takes every key of the arrays in array order, in one
// statement: an aggregate over a function scan of unnest, which returns
// the rows in array order and evaluates the call once per row as it
// reads it (EXPLAIN: Aggregate -> Function Scan; TestXactLockAllOrder
// checks the order on the server). $1 is the bigint id, or a pair's
// first int4; $2 is NULL, or a pair's second int4.
const xactAllSQL = `SELECT count(CASE WHEN u.b IS NULL THEN pg_advisory_xact_lock(u.a)
	ELSE pg_advisory_xact_lock(u.a::int4, u.b) END)
FROM unnest($1::int8[], $2::int4[]) AS u(a, b)`

// tryXactAllSQL tries every key in array order and stops at the first
// one that is busy (EXISTS ends its scan at the first row it finds): true
// when all were taken. The keys taken before a busy one stay held until
// the caller rolls back to its savepoint.
const tryXactAllSQL = `SELECT NOT EXISTS (SELECT FROM unnest($1::int8[], $2::int4[]) AS u(a, b)
	WHERE NOT CASE WHEN u.b IS NULL THEN pg_try_advisory_xact_lock(u.a)
	ELSE pg_try_advisory_xact_lock(u.a::int4, u.b) END)`

// tryAllSavepoint is the savepoint TryXactLockAll rolls back to. A
// caller's savepoint of the same name is shadowed only while
// TryXactLockAll runs (RELEASE and ROLLBACK TO act on the newest one).
const tryAllSavepoint = "pglease_try_xact_lock_all"

// checkXactSet validates a set of keys (no I/O) and returns them sorted
// by Key.compare without duplicates, as the arrays of xactAllSQL.
func checkXactSet(op string, ctx context.Context, tx pgx.Tx, keys []Key) (sorted []Key, a []int64, b []*int32, err error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, nil, nil, err
	}
	if tx == nil {
		return nil, nil, nil, invalid(op, "nil transaction")
	}
	if len(keys) == 0 {
		return nil, nil, nil, invalid(op, "no keys")
	}
	for _, k := range keys {
		if !k.valid() {
			return nil, nil, nil, invalid(op, "invalid key")
		}
	}
	sorted = slices.Clone(keys)
	slices.SortFunc(sorted, Key.compare)
	sorted = slices.Compact(sorted)
	a, b = make([]int64, len(sorted)), make([]*int32, len(sorted))
	for i, k := range sorted {
		if x, y, ok := k.Pair(); ok {
			a[i], b[i] = int64(x), &y
		} else {
			a[i], _ = k.Int64()
		}
	}
	return sorted, a, b, nil
}

// XactLockAll takes every key exclusively for the rest of tx, in one
// statement (one round trip), waiting as XactLock does. The keys are
// taken in ascending Key order (Key.compare: int64 space first, then by
// id; duplicates once), whatever order they are given in, so
// transactions taking overlapping sets with XactLockAll (or sessions with
// Session.LockAll, which uses the same order) cannot deadlock each other.
// Taking the same key twice is harmless in a transaction (the lock ends
// at COMMIT or ROLLBACK either way), so duplicates are dropped, where
// Session.LockAll, which returns one Lock per key, refuses them.
//
// If it fails (ctx, lock_timeout, statement_timeout, a deadlock with a
// transaction that takes the keys in another order), the transaction is
// failed, as after a failed XactLock: the keys taken so far are held
// until the caller rolls back, and nothing can be committed. A nil tx, no
// keys and an invalid key are InvalidArgument with no I/O; errors
// otherwise as XactLock.
func XactLockAll(ctx context.Context, tx pgx.Tx, keys ...Key) error {
	const op = "advisory.XactLockAll"
	sorted, a, b, err := checkXactSet(op, ctx, tx, keys)
	if err != nil {
		return err
	}
	var n int64
	if err := tx.QueryRow(ctx, xactAllSQL, a, b).Scan(&n); err != nil {
		return mapErr(ctx, op, err)
	}
	if n != int64(len(sorted)) {
		return pgerr.New(pglease.CodeInternal, op, "the server took "+strconv.FormatInt(n, 10)+" of "+strconv.Itoa(len(sorted))+" keys", nil)
	}
	return nil
}

// TryXactLockAll takes every key exclusively for the rest of tx if all
// are free, without waiting: either it returns true and tx holds them
// all, or none of them is left held by this call (a key tx held before
// stays held). It tries the keys in ascending Key order and stops at the
// first busy one; duplicates are dropped (see XactLockAll).
//
// A transaction lock cannot be unlocked, so the keys already taken when
// one is busy are given back by rolling back to a savepoint: SAVEPOINT
// and the tries are sent together (one round trip), then RELEASE
// SAVEPOINT when all were taken, or ROLLBACK TO SAVEPOINT and RELEASE
// SAVEPOINT (one more round trip) when one was busy: two round trips
// either way. A single key (after dropping duplicates) needs no
// savepoint: one round trip, as TryXactLock. (Counts are for a
// connection that has run the call before: pgx's default statement cache
// spends one more round trip preparing a statement the first time.) The savepoint is
// invisible to the caller: tx is in the state it was in before, plus the
// locks. It does count as a subtransaction on the server while it lasts.
//
// If the tries fail with a server error (53200, statement_timeout) the
// savepoint is rolled back too, so tx stays usable and holds none of the
// keys; if the connection broke or ctx ended, the transaction is over
// anyway. The first call on a connection prepares the tries statement
// before the savepoint exists: a statement_timeout that expires right
// then fails the call with the transaction aborted, as after any failed
// statement, and no key taken. A nil tx, no keys and an invalid key are InvalidArgument with
// no I/O; errors otherwise as XactLock.
func TryXactLockAll(ctx context.Context, tx pgx.Tx, keys ...Key) (bool, error) {
	const op = "advisory.TryXactLockAll"
	sorted, a, b, err := checkXactSet(op, ctx, tx, keys)
	if err != nil {
		return false, err
	}
	if len(sorted) == 1 {
		return tryXactLock(ctx, op, tx, sorted[0], false)
	}
	batch := &pgx.Batch{}
	batch.Queue("SAVEPOINT " + tryAllSavepoint)
	batch.Queue(tryXactAllSQL, a, b)
	br := tx.SendBatch(ctx, batch)
	_, spErr := br.Exec()
	var all bool
	var tryErr error
	if spErr == nil {
		tryErr = br.QueryRow().Scan(&all)
	}
	if cerr := br.Close(); spErr == nil && tryErr == nil {
		tryErr = cerr
	}
	if spErr != nil { // no savepoint was made
		return false, mapErr(ctx, op, spErr)
	}
	if tryErr == nil && all {
		_, tryErr = tx.Exec(ctx, "RELEASE SAVEPOINT "+tryAllSavepoint)
		if tryErr == nil {
			return true, nil
		}
	}
	// A key was busy, or a statement failed: give back what was taken,
	// even if ctx has ended (pgx would not send the rollback, and the
	// transaction would go on holding the keys).
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_, rbErr := tx.Exec(rctx, "ROLLBACK TO SAVEPOINT "+tryAllSavepoint+"; RELEASE SAVEPOINT "+tryAllSavepoint)
	if tryErr != nil {
		return false, mapErr(ctx, op, tryErr)
	}
	return false, mapErr(ctx, op, rbErr)
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
	if !k.valid() {
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
