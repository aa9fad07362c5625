package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
)

// WaiterLockClass is the first key of the advisory lock that marks a
// session as waiting for a lease key: a session waiting for key holds
// pg_advisory_lock_shared(WaiterLockClass, hashtext(key in NFC)),
// taken before its next try of the key and released when it stops
// waiting. ReleaseWaited notifies a released key only when some session
// holds that lock. The (int4, int4) advisory key space with this first
// key is pglease's: an exclusive advisory lock taken there by anything
// else only costs extra notifications, but it makes waiters' registrations
// fail (they then poll).
const WaiterLockClass int32 = 0x706c7777 // "plww"

// WatchLockClass is WaiterLockClass's counterpart for watchers: a
// session watching key holds pg_advisory_lock_shared(WatchLockClass,
// hashtext(key in NFC)) (RegisterWatchers), and the acquire, release,
// handoff and revoke functions notify "w:" payloads (see Notification)
// for a key only while some session holds it.
const WatchLockClass int32 = 0x706c7774 // "plwt"

// registerSQL takes the lock of class of each NFC key in $1 (without
// waiting: false when an exclusive holder has it), in order.
func registerSQL(class int32) string {
	return "SELECT pg_try_advisory_lock_shared(" + strconv.Itoa(int(class)) +
		", hashtext(u.k)) FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i) ORDER BY u.i"
}

// unregisterSQL releases one hold of the lock of class of each NFC key
// in $1.
func unregisterSQL(class int32) string {
	return "SELECT count(*) FILTER (WHERE pg_advisory_unlock_shared(" + strconv.Itoa(int(class)) +
		", hashtext(u.k))) FROM unnest($1::text[]) AS u(k)"
}

var (
	waiterRegisterSQL   = registerSQL(WaiterLockClass)
	waiterUnregisterSQL = unregisterSQL(WaiterLockClass)
	watchRegisterSQL    = registerSQL(WatchLockClass)
	watchUnregisterSQL  = unregisterSQL(WatchLockClass)
)

// ReleaseRequest is one item of ReleaseWaited: a lockId and the key it
// holds.
type ReleaseRequest struct {
	LockID string
	// Key is the key LockID holds. It is validated, and no longer used:
	// the release function notifies the key of the row it deletes.
	Key string
}

// Format never prints the key or the lockId.
func (r ReleaseRequest) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "store.ReleaseRequest{LockID:[redacted] Key:%s}", pglease.HashKey(r.Key))
}

// ReleaseWaited releases every item's lockId (exclusive or shared) like
// ReleaseMany (one statement, one round trip; results[i] answers
// reqs[i]), except for the notification: with Config.NotifyChannel set,
// a released key is notified only when some session waits for it, that
// is holds its waiter lock (WaiterLockClass). A notifying commit
// serializes with every other notifying commit of the server and wakes
// every listening session, so a release nobody waits for elsewhere (most
// of them) skips that cost. Watchers are notified as by every release.
//
// No wake-up is lost between a waiter and a release: the release checks
// for the waiter lock after deleting the row, while its row lock is held,
// and a waiter takes the lock before it tries the key again. Either the
// release sees the waiter and notifies, or the waiter's try comes after
// the check and finds the key free (or waits for the releasing
// transaction's row lock, then finds it free: the acquire functions lock
// the exclusive row FOR NO KEY UPDATE when a transaction has touched its
// version, as the release's delete has, and the shared rows FOR SHARE,
// which a delete's lock excludes).
//
// Invalid input anywhere fails the whole call before I/O.
func (s *Store) ReleaseWaited(ctx context.Context, reqs []ReleaseRequest) ([]bool, error) {
	const op = "pg.ReleaseWaited"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > MaxBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	ids := make([]string, len(reqs))
	for i, r := range reqs {
		if err := keys.ValidateLockID(r.LockID); err != nil {
			return nil, WithOp(op, err)
		}
		if _, err := keys.NormalizeKey(r.Key); err != nil {
			return nil, WithOp(op, err)
		}
		ids[i] = r.LockID
	}
	if len(reqs) == 0 {
		return []bool{}, nil
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	return s.runRelease(ctx, op, ids, wakeWaited)
}

// RegisterWaiters takes the waiter lock (WaiterLockClass) of each key on
// conn's session, so that ReleaseWaited notifies their releases; ok[i]
// is false when keys[i]'s lock could not be taken at once (an exclusive
// holder had it: a release checking it that instant, or something else
// using the lock space), in which case it is not held. Each lock taken
// stays held until UnregisterWaiters or the end of the session: register
// on a session of its own (a LISTENing connection), never on a pooled
// connection. One round trip. Bad keys are InvalidArgument before I/O.
//
// listen names channels to LISTEN on in the same round trip (the wake
// channels of the keys, WakeChannel), in the same implicit transaction:
// the subscriptions and the locks take effect together, when the answer
// comes, and the caller's next try of the keys comes after both.
func RegisterWaiters(ctx context.Context, conn *pgx.Conn, waited []string, listen ...string) (ok []bool, err error) {
	return register(ctx, "pg.RegisterWaiters", conn, waiterRegisterSQL, waited, listen)
}

// RegisterWatchers is RegisterWaiters for watchers: it takes the watch
// lock (WatchLockClass) of each key on conn's session, so that the
// acquire, release, handoff and revoke functions send the keys' "w:"
// notifications (see ParseNotification). Same rules: ok[i] false when the
// lock could not be taken at once; held until UnregisterWatchers or the
// session's end; register on the listening session; then read the keys'
// state with Snapshot, which misses no change committed before it. One
// round trip.
func RegisterWatchers(ctx context.Context, conn *pgx.Conn, watched []string) (ok []bool, err error) {
	return register(ctx, "pg.RegisterWatchers", conn, watchRegisterSQL, watched, nil)
}

// UnregisterWatchers releases one hold of each key's watch lock on conn's
// session (taken by RegisterWatchers). One round trip.
func UnregisterWatchers(ctx context.Context, conn *pgx.Conn, watched []string) error {
	return unregister(ctx, "pg.UnregisterWatchers", conn, watchUnregisterSQL, watched, nil)
}

// withListens appends "LISTEN c" (or UNLISTEN) for each channel to the
// statements of sql ("" for none), for one simple-protocol round trip.
func withListens(sql, verb string, channels []string) string {
	stmts := make([]string, 0, len(channels)+1)
	if sql != "" {
		stmts = append(stmts, sql)
	}
	for _, ch := range channels {
		stmts = append(stmts, verb+" "+pgx.Identifier{ch}.Sanitize())
	}
	return strings.Join(stmts, ";\n")
}

func register(ctx context.Context, op string, conn *pgx.Conn, sql string, raw []string, listen []string) (ok []bool, err error) {
	nks, err := waiterKeys(op, ctx, conn, raw)
	if err != nil || len(nks) == 0 {
		return []bool{}, err
	}
	ok = make([]bool, 0, len(nks))
	args := []any{nks}
	if len(listen) > 0 {
		// The SELECT first: pgx reads the rows of a simple-protocol
		// query's first result, and the LISTENs' (empty) results, and any
		// error, when the rows close.
		sql = withListens(sql, "LISTEN", listen)
		args = []any{pgx.QueryExecModeSimpleProtocol, nks}
	}
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, pgerr.Map(ctx, op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var b bool
		if err := rows.Scan(&b); err != nil {
			return nil, pgerr.Map(ctx, op, err)
		}
		ok = append(ok, b)
	}
	if err := rows.Err(); err != nil {
		return nil, pgerr.Map(ctx, op, err)
	}
	if len(ok) != len(nks) {
		return nil, pgerr.New(pglease.CodeInternal, op, "wrong row count", nil)
	}
	return ok, nil
}

// UnregisterWaiters releases one hold of each key's waiter lock on conn's
// session (taken by RegisterWaiters). One round trip. Bad keys are
// InvalidArgument before I/O.
//
// unlisten names channels to UNLISTEN in the same round trip (wake
// channels no key waited for here uses any longer); with no keys, the
// round trip only does that.
func UnregisterWaiters(ctx context.Context, conn *pgx.Conn, waited []string, unlisten ...string) error {
	return unregister(ctx, "pg.UnregisterWaiters", conn, waiterUnregisterSQL, waited, unlisten)
}

func unregister(ctx context.Context, op string, conn *pgx.Conn, sql string, raw []string, unlisten []string) error {
	nks, err := waiterKeys(op, ctx, conn, raw)
	if err != nil {
		return err
	}
	var args []any
	switch {
	case len(nks) == 0 && len(unlisten) == 0:
		return nil
	case len(nks) == 0:
		sql = withListens("", "UNLISTEN", unlisten)
	case len(unlisten) > 0:
		sql = withListens(sql, "UNLISTEN", unlisten)
		args = []any{pgx.QueryExecModeSimpleProtocol, nks}
	default:
		args = []any{nks}
	}
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return pgerr.Map(ctx, op, err)
	}
	return nil
}

func waiterKeys(op string, ctx context.Context, conn *pgx.Conn, raw []string) ([]string, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if conn == nil {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "nil conn", nil)
	}
	if len(raw) > MaxBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	nks := make([]string, len(raw))
	for i, k := range raw {
		nk, err := keys.NormalizeKey(k)
		if err != nil {
			return nil, WithOp(op, err)
		}
		nks[i] = nk
	}
	return nks, nil
}
