package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
)

// LeaseRow is one row of the lock table as an operator sees it
// (ListLeases, cmd/pglease): the lease, live or expired, with its raw
// key and lockId. Its String, Format and LogValue show only the
// sanitized fields, as RawLockInfo's do.
type LeaseRow struct {
	RawLockInfo
	// Live is SyncGuard's liveness rule on the server clock:
	// expires_at + 1000 ms > now. An expired row stays until the key's
	// next grant overwrites it.
	Live bool
	// AdvisoryKey is hashtext(key): the bigint advisory lock every
	// acquire of the key (pglease's and SyncGuard's) takes while it runs,
	// so a backend waiting for it in pg_locks is an acquire of this key
	// in progress.
	AdvisoryKey int64
}

// LeaseList is the answer of ListLeases.
type LeaseList struct {
	// Rows are the listed leases: live ones first, each group by
	// acquisition time, newest first; at most the limit given.
	Rows []LeaseRow
	// Total and Live count every row of the table, listed or not.
	Total, Live int
	// Now is the server's clock when the rows were read.
	Now time.Time
	// HolderKnown is false when the schema has no holder table (a schema
	// version before 2, or SyncGuard's tables alone): Holder is then
	// always empty.
	HolderKnown bool
}

// ListOptions selects what ListLeases reads.
type ListOptions struct {
	// Limit caps the rows returned, 1..MaxBatch; 0 means 100.
	Limit int
	// Key, if set, selects that key's row only (NFC-normalized and
	// validated like every key). Key and LockID are exclusive.
	Key string
	// LockID, if set, selects the row of that lockId only.
	LockID string
}

// ListLeases reads the lock table: up to opts.Limit rows, live ones
// first, and the counts of all rows (of the selected ones with Key or
// LockID). It works on any schema that has the lock table (also
// SyncGuard's alone, or an older pglease schema), and is read-only: it
// needs SELECT on the lock table (and on the holder table, when there is
// one). The rows hold raw keys and lockIds: treat them as secret. Bad
// options are InvalidArgument before any I/O. Two round trips.
func (s *Store) ListLeases(ctx context.Context, opts ListOptions) (*LeaseList, error) {
	const op = "pg.ListLeases"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	limit := opts.Limit
	if limit == 0 {
		limit = 100
	}
	if limit < 1 || limit > MaxBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, fmt.Sprintf("Limit must be 0..%d", MaxBatch), nil)
	}
	if opts.Key != "" && opts.LockID != "" {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "Key and LockID are exclusive", nil)
	}
	where, arg := "true", ""
	if opts.Key != "" {
		k, err := keys.NormalizeKey(opts.Key)
		if err != nil {
			return nil, WithOp(op, err)
		}
		where, arg = "l.key = $2", k
	}
	if opts.LockID != "" {
		if err := keys.ValidateLockID(opts.LockID); err != nil {
			return nil, WithOp(op, err)
		}
		where, arg = "l.lock_id = $2", opts.LockID
	}
	out := &LeaseList{}
	err := s.run(ctx, op, false, "SELECT to_regclass($1) IS NOT NULL", []any{s.n.Holders}, func(r pgx.Rows) error {
		return r.Scan(&out.HolderKnown)
	})
	if err != nil {
		return nil, err
	}
	holder, join := "NULL::text", ""
	if out.HolderKnown {
		holder = "h.holder"
		join = " LEFT JOIN " + s.n.Holders + " AS h ON h.key = l.key AND h.lock_id = l.lock_id"
	}
	const now = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
	live := fmt.Sprintf("l.expires_at_ms + %d > n.now", keys.TimeToleranceMs)
	sql := "WITH n AS (SELECT " + now + " AS now), c AS (SELECT count(*) AS total, count(*) FILTER (WHERE " + live + ") AS live FROM " +
		s.n.Lock + " AS l, n WHERE " + where + ") " +
		"SELECT l.key, l.lock_id, l.expires_at_ms, l.acquired_at_ms, l.fence, l.user_key, " + holder + ", " + live +
		", hashtext(l.key)::bigint, n.now, c.total, c.live FROM n, c LEFT JOIN LATERAL (SELECT l.* FROM " + s.n.Lock +
		" AS l WHERE " + where + " ORDER BY l.expires_at_ms + " + fmt.Sprint(keys.TimeToleranceMs) + " > (SELECT now FROM n) DESC, l.acquired_at_ms DESC, l.key LIMIT $1) AS l ON true" +
		join + " ORDER BY 8 DESC, 4 DESC, 1"
	args := []any{limit}
	if arg != "" {
		args = append(args, arg)
	}
	err = s.run(ctx, op, false, sql, args, func(rows pgx.Rows) error {
		var key, id, fence, userKey, holder *string
		var exp, acq, adv *int64
		var isLive *bool
		var nowMs, total, liveN int64
		if err := rows.Scan(&key, &id, &exp, &acq, &fence, &userKey, &holder, &isLive, &adv, &nowMs, &total, &liveN); err != nil {
			return err
		}
		out.Now, out.Total, out.Live = time.UnixMilli(nowMs), int(total), int(liveN)
		if key == nil { // the empty table's one row from the LEFT JOIN
			return nil
		}
		f, err := keys.ParseFence(*fence)
		if err != nil {
			return pgerr.New(pglease.CodeInternal, op, "stored fence is not 15 digits", nil)
		}
		r := LeaseRow{
			RawLockInfo: RawLockInfo{
				LockInfo: LockInfo{KeyHash: pglease.HashKey(*userKey), LockIDHash: pglease.HashKey(*id),
					AcquiredAt: time.UnixMilli(*acq), ExpiresAt: time.UnixMilli(*exp), Fence: f},
				Key: *userKey, LockID: *id,
			},
			Live: *isLive, AdvisoryKey: *adv,
		}
		if holder != nil {
			r.Holder = *holder
		}
		out.Rows = append(out.Rows, r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// FenceCounter returns key's fence counter: the last fence granted for
// it (by pglease or SyncGuard), and false when the key was never granted.
// Read-only, one round trip.
func (s *Store) FenceCounter(ctx context.Context, key string) (pglease.Fence, bool, error) {
	const op = "pg.FenceCounter"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return 0, false, err
	}
	k, err := keys.NormalizeKey(key)
	if err != nil {
		return 0, false, WithOp(op, err)
	}
	fk, err := keys.MakeStorageKey("", "fence:"+k, keys.PostgresLimitBytes, keys.PostgresReserveBytes)
	if err != nil {
		return 0, false, WithOp(op, err)
	}
	var f *int64
	err = s.run(ctx, op, false, "SELECT (SELECT fence FROM "+s.n.Fence+" WHERE fence_key = $1)", []any{fk}, func(r pgx.Rows) error {
		return r.Scan(&f)
	})
	if err != nil || f == nil {
		return 0, false, err
	}
	return pglease.Fence(*f), true, nil
}
