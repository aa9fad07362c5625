package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
)

// The kinds of holds and marks of schema version 4, read by status and
// inspect with their own read-only SQL (no locks taken: a read never
// waits for an acquire in progress, unlike store.Snapshot): shared holds
// ({lock}_shared), the holder table's exclusive-waiting mark and lock
// delays, and the tables Migrator.Guard guards. Each is read only when
// its table or columns exist, so older schemas show what they have.

const nowMsSQL = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

// probeV4 reports whether the shared-hold table and the holder table's
// columns for marks and lock delays (schema version 4) exist.
func probeV4(ctx context.Context, pool *pgxpool.Pool, n store.Names) (shared, marks bool, err error) {
	err = pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, (SELECT count(*) = 3 FROM pg_attribute AS a WHERE a.attrelid = to_regclass($2) "+
		"AND a.attname IN ('excl_wait_until_ms', 'lock_delay_ms', 'delay_until_ms') AND a.attnum > 0 AND NOT a.attisdropped)",
		n.Shared, n.Holders).Scan(&shared, &marks)
	return shared, marks, err
}

// readShared reads the live shared holds (of key only, if not ""): at
// most limit holds, grouped by key, and the counts of all of them.
func readShared(ctx context.Context, pool *pgxpool.Pool, n store.Names, key string, limit int, showKeys bool) (sharedSection, error) {
	sec := sharedSection{Rows: []sharedKeyView{}}
	where, args := "", []any{limit}
	if key != "" {
		where, args = " AND s.key = $2", append(args, key)
	}
	live := fmt.Sprintf("s.expires_at_ms + %d > n.now", keys.TimeToleranceMs)
	sql := "WITH n AS (SELECT " + nowMsSQL + " AS now), s AS (SELECT s.* FROM " + n.Shared + " AS s, n WHERE " + live + where + ") " +
		"SELECT x.key, x.lim, x.holder, x.fence, x.acquired_at_ms, x.expires_at_ms, x.cnt, x.klim, hashtext(x.key)::bigint, n.now, x.lock_id, " +
		"(SELECT count(*) FROM s), (SELECT count(DISTINCT s.key) FROM s) " +
		"FROM n LEFT JOIN LATERAL (SELECT s.*, count(*) OVER w AS cnt, max(s.lim) OVER w AS klim FROM s WINDOW w AS (PARTITION BY s.key) " +
		"ORDER BY s.key, s.expires_at_ms DESC, s.acquired_at_ms DESC LIMIT $1) AS x ON true ORDER BY x.key, x.expires_at_ms DESC, x.acquired_at_ms DESC"
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return sec, err
	}
	defer rows.Close()
	for rows.Next() {
		var k, holder, id *string
		var lim, klim *int32
		var fence, acq, exp, cnt, adv *int64
		var now, total, nkeys int64
		if err := rows.Scan(&k, &lim, &holder, &fence, &acq, &exp, &cnt, &klim, &adv, &now, &id, &total, &nkeys); err != nil {
			return sec, err
		}
		sec.Live, sec.Keys = int(total), int(nkeys)
		if k == nil { // no hold: the one row of the LEFT JOIN
			continue
		}
		h := pglease.HashKey(*k)
		if len(sec.Rows) == 0 || sec.Rows[len(sec.Rows)-1].KeyHash != h {
			g := sharedKeyView{KeyHash: h, Kind: "readers", Count: int(*cnt), Limit: int(*klim), Holders: []sharedHoldView{}, advisoryKey: *adv}
			if g.Limit > 0 {
				g.Kind = "permits"
			}
			if showKeys {
				g.Key = *k
			}
			sec.Rows = append(sec.Rows, g)
		}
		hv := sharedHoldView{
			Fence: pglease.Fence(*fence).String(), AcquiredAt: time.UnixMilli(*acq).UTC(), ExpiresAt: time.UnixMilli(*exp).UTC(),
			ExpiresInMs: *exp - now, LockIDHash: pglease.HashKey(*id), lockID: *id,
		}
		if holder != nil {
			hv.Holder = *holder
		}
		g := &sec.Rows[len(sec.Rows)-1]
		g.Holders = append(g.Holders, hv)
	}
	return sec, rows.Err()
}

// keyMarks is what readMarks found for one key.
type keyMarks struct {
	marks       []markView
	lockDelayMs int64 // the lock delay of the key's exclusive row's grant (0: none)
	advisoryKey int64
}

// readMarks reads the keys (key only, if not "") with an exclusive-waiting
// mark or a lock delay in force, and the lock delays of the lock table's
// grants, from the holder table (one row per key ever granted, with an
// identity or a mark). The mark of a lapsed writer and a delay that ended
// are not marks.
func readMarks(ctx context.Context, pool *pgxpool.Pool, n store.Names, key string, showKeys bool) (map[string]*keyMarks, error) {
	where, args := "", []any{}
	if key != "" {
		where, args = " AND h.key = $1", append(args, key)
	}
	sql := "WITH n AS (SELECT " + nowMsSQL + " AS now) SELECT h.key, h.excl_wait_until_ms, h.delay_until_ms, " +
		"CASE WHEN l.lock_id = h.lock_id THEN h.lock_delay_ms END, l.expires_at_ms, hashtext(h.key)::bigint, n.now " +
		"FROM n, " + n.Holders + " AS h LEFT JOIN " + n.Lock + " AS l ON l.key = h.key " +
		"WHERE (h.excl_wait_until_ms > n.now OR h.delay_until_ms > n.now OR (l.lock_id = h.lock_id AND h.lock_delay_ms > 0))" + where
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]*keyMarks{}
	for rows.Next() {
		var k string
		var wait, until, delay, exp *int64
		var adv, now int64
		if err := rows.Scan(&k, &wait, &until, &delay, &exp, &adv, &now); err != nil {
			return nil, err
		}
		km := &keyMarks{advisoryKey: adv}
		mark := func(what, source string, at int64) {
			m := markView{KeyHash: pglease.HashKey(k), Mark: what, Until: time.UnixMilli(at).UTC(), InMs: at - now, Source: source}
			if showKeys {
				m.Key = k
			}
			km.marks = append(km.marks, m)
		}
		if wait != nil && *wait > now {
			mark(markExclusiveWaiting, "", *wait)
		}
		// A lock delay: a revoke's, or the expired lease's own (its row
		// is past SyncGuard's tolerance but not past expiry + delay).
		var at int64
		var source string
		if until != nil && *until > now {
			at, source = *until, "revoke"
		}
		if delay != nil && *delay > 0 {
			km.lockDelayMs = *delay
			if exp != nil && *exp+keys.TimeToleranceMs <= now && *exp+*delay > now && *exp+*delay > at {
				at, source = *exp+*delay, "expired_lease"
			}
		}
		if at > 0 {
			mark(markLockDelay, source, at)
		}
		out[pglease.HashKey(k)] = km
	}
	return out, rows.Err()
}

// readGuarded reads the tables the database guard of this lock table
// guards: the triggers Migrator.Guard creates (named for the lock and
// fence tables, calling the guard function of the lock table's schema).
func readGuarded(ctx context.Context, pool *pgxpool.Pool, n store.Names) ([]guardedView, error) {
	rows, err := pool.Query(ctx, "SELECT format('%I.%I', ns.nspname, c.relname), "+
		"convert_from(substring(t.tgargs FROM 1 FOR greatest(position('\\x00'::bytea IN t.tgargs) - 1, 0)), 'UTF8'), t.tgenabled <> 'D' "+
		"FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid JOIN pg_class AS c ON c.oid = t.tgrelid "+
		"JOIN pg_namespace AS ns ON ns.oid = c.relnamespace "+
		"WHERE t.tgname = $1 AND p.proname = $2 AND p.pronamespace = (SELECT lc.relnamespace FROM pg_class AS lc WHERE lc.oid = to_regclass($3)) "+
		"ORDER BY 1", n.GuardTrigger, n.FnGuardTrigger, n.Lock)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []guardedView{}
	for rows.Next() {
		var g guardedView
		if err := rows.Scan(&g.Table, &g.KeyColumn, &g.Enabled); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, rows.Err()
}

// sortedMarks flattens marks in key hash order.
func sortedMarks(m map[string]*keyMarks) []markView {
	out := []markView{}
	hs := make([]string, 0, len(m))
	for h := range m {
		hs = append(hs, h)
	}
	slices.Sort(hs)
	for _, h := range hs {
		out = append(out, m[h].marks...)
	}
	return out
}
