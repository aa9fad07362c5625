package advisory

import (
	"context"
	"reflect"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgerr"
)

// Querier runs a query: *pgxpool.Pool, *pgx.Conn and pgx.Tx all are.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// LockInfo is one advisory lock held or awaited in the current database,
// as Inspect reports it.
type LockInfo struct {
	// PID is the backend holding or awaiting the lock; 0 for a prepared
	// transaction.
	PID int32
	// Key is the lock's key (space and id).
	Key Key
	// Name is the key's name in the Registry given to Inspect, or "".
	Name string
	// Mode is the pg_locks mode, for holders and waiters alike:
	// "ExclusiveLock" (Lock, TryLock, XactLock, …) or "ShareLock"
	// (LockShared, TryLockShared, XactLockShared, TryXactLockShared).
	Mode string
	// Granted is true for a holder, false for a waiter.
	Granted bool
	// WaitStart is when a waiter began waiting (PostgreSQL 14+); zero for
	// holders and on older servers.
	WaitStart time.Time
	// BlockingPIDs lists the backends a waiter waits for
	// (pg_blocking_pids); nil for holders.
	BlockingPIDs []int32
	// ApplicationName and User come from pg_stat_activity; any role may
	// see them.
	ApplicationName string
	User            string
	// State is pg_stat_activity.state ("idle", "active", …), or "" when
	// the inspecting role may not see it: another role's session, without
	// pg_read_all_stats (or pg_monitor) or superuser.
	State string
}

// inspectSQL reads pg_locks, which every role may read in full, and joins
// pg_stat_activity, whose per-session detail PostgreSQL hides from roles
// without pg_read_all_stats. waitstart is read through to_jsonb so the
// query also runs on servers older than 14, which lack the column.
const inspectSQL = `SELECT l.pid, l.classid, l.objid, l.objsubid, l.mode, l.granted,
	(to_jsonb(l) ->> 'waitstart')::timestamptz,
	CASE WHEN l.granted OR l.pid IS NULL THEN NULL ELSE pg_blocking_pids(l.pid) END,
	a.application_name, a.usename, a.state
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// Inspect lists the advisory locks held and awaited in q's current
// database (advisory keys are per database), sorted by key, holders
// first, then waiters by wait start. reg, if not nil, names the keys it
// knows: its fixed keys, and the pattern keys it derived (see "Registry
// and inspection" in the package documentation). It needs no privilege
// beyond connecting; without
// pg_read_all_stats, State is empty for other roles' sessions.
func Inspect(ctx context.Context, q Querier, reg *Registry) ([]LockInfo, error) {
	const op = "advisory.Inspect"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if isNilQuerier(q) {
		return nil, invalid(op, "nil querier")
	}
	rows, err := q.Query(ctx, inspectSQL)
	if err != nil {
		return nil, mapErr(ctx, op, err)
	}
	var out []LockInfo
	for rows.Next() {
		var (
			pid              *int32
			classid, objid   uint32
			objsubid         int16
			li               LockInfo
			waitStart        *time.Time
			app, user, state *string
		)
		if err := rows.Scan(&pid, &classid, &objid, &objsubid, &li.Mode, &li.Granted, &waitStart,
			&li.BlockingPIDs, &app, &user, &state); err != nil {
			rows.Close()
			return nil, mapErr(ctx, op, err)
		}
		k, ok := keyFromPgLocks(classid, objid, objsubid)
		if !ok {
			continue
		}
		li.Key = k
		if pid != nil {
			li.PID = *pid
		}
		if waitStart != nil {
			li.WaitStart = *waitStart
		}
		li.ApplicationName, li.User, li.State = deref(app), deref(user), deref(state)
		if reg != nil {
			li.Name, _ = reg.Name(k)
		}
		out = append(out, li)
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr(ctx, op, err)
	}
	slices.SortStableFunc(out, func(a, b LockInfo) int {
		if c := a.Key.compare(b.Key); c != 0 {
			return c
		}
		if a.Granted != b.Granted {
			if a.Granted {
				return -1
			}
			return 1
		}
		if c := a.WaitStart.Compare(b.WaitStart); c != 0 {
			return c
		}
		return int(a.PID) - int(b.PID)
	})
	return out, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// isNilQuerier reports whether q is nil or a nil pointer (a nil
// *pgxpool.Pool or *pgx.Conn passed as a Querier).
func isNilQuerier(q Querier) bool {
	if q == nil {
		return true
	}
	v := reflect.ValueOf(q)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}
