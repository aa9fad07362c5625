package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg/advisory"
	"github.com/pglease/pglease/pg/migrate"
)

// quoteTable quotes a validated table name, ident or schema.ident, as
// package pg does.
func quoteTable(name string) string {
	return pgx.Identifier(strings.Split(name, ".")).Sanitize()
}

// collect reads one snapshot: leases (optionally one key's), shared
// holds, marks and lock delays, guarded tables, the schema's state, and
// advisory locks, with lease acquires in progress (waiters on a key's
// hashtext advisory lock), waiting Managers (holders of a key's waiter
// lock) and watching Managers (holders of its watch lock) counted on
// their lease. It needs none of the lease tables: what is missing is
// reported in Schema, each part is read when its tables exist, and
// advisory locks are listed whatever exists.
func collect(ctx context.Context, pool *pgxpool.Pool, st *store.Store, reg *advisory.Registry, o *viewOpts, lo store.ListOptions, c *common) (*snapshotView, error) {
	v := &snapshotView{}
	v.Leases.Rows = []leaseView{}
	v.Shared.Rows = []sharedKeyView{}
	v.Marks = []markView{}
	v.WaitingManagers = []waitersView{}
	v.WatchingManagers = []waitersView{}
	v.GuardedTables = []guardedView{}
	v.Advisory = []advisoryView{}
	v.acquiresWaiting = map[string]int{}
	s := &v.Schema
	n := st.Names()
	key := ""
	if lo.Key != "" {
		key = mustNFC(lo.Key)
	}
	ver, from, err := st.ReadVersion(ctx, "migrate.Version")
	if err != nil {
		return nil, err
	}
	s.Version, s.Needs, s.NotifyChannel = ver, migrate.Latest, o.notifyChannel
	s.Current = ver >= migrate.Latest && from <= migrate.Latest
	// setupKey is the advisory lock SetupSchema and the migrations take.
	var nowMs, setupKey int64
	err = pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL, "+
		"floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, hashtext('pglease.SetupSchema')::bigint",
		quoteTable(cmp.Or(c.lockTable, store.DefaultLockTable)), quoteTable(cmp.Or(c.fenceTable, store.DefaultFenceTable))).
		Scan(&s.LockTable, &s.FenceTable, &nowMs, &setupKey)
	if err != nil {
		return nil, err
	}
	now := time.UnixMilli(nowMs)
	// acquireOf names the key of an acquire in progress: hashtext(key) →
	// the key's hash, for the keys of lease rows, shared holds and marks.
	acquireOf := map[int64]string{}
	if s.LockTable {
		list, err := st.ListLeases(ctx, lo)
		if err != nil {
			return nil, err
		}
		now = list.Now
		s.HolderTable = list.HolderKnown
		v.Leases.Total, v.Leases.Live = list.Total, list.Live
		for _, r := range list.Rows {
			lv := leaseView{
				KeyHash: r.KeyHash, Holder: r.Holder, Fence: r.Fence.String(),
				AcquiredAt: r.AcquiredAt.UTC(), ExpiresAt: r.ExpiresAt.UTC(),
				ExpiresInMs: r.ExpiresAt.Sub(list.Now).Milliseconds(), Live: r.Live, advisoryKey: r.AdvisoryKey,
			}
			if o.showKeys {
				lv.Key = r.Key
			}
			acquireOf[r.AdvisoryKey] = r.KeyHash
			v.Leases.Rows = append(v.Leases.Rows, lv)
		}
		if s.ReleaseTrigger, err = st.ReleaseTriggerInstalled(ctx, o.notifyChannel); err != nil {
			return nil, err
		}
		if s.SharedTable, s.MarkColumns, err = probeV4(ctx, pool, n); err != nil {
			return nil, err
		}
		if s.SharedTable {
			if v.Shared, err = readShared(ctx, pool, n, key, o.limit, o.showKeys); err != nil {
				return nil, err
			}
			for _, g := range v.Shared.Rows {
				acquireOf[g.advisoryKey] = g.KeyHash
			}
		}
		if s.MarkColumns {
			marks, err := readMarks(ctx, pool, n, key, o.showKeys)
			if err != nil {
				return nil, err
			}
			v.Marks = sortedMarks(marks)
			for i := range v.Leases.Rows {
				if m, ok := marks[v.Leases.Rows[i].KeyHash]; ok {
					v.Leases.Rows[i].LockDelayMs = m.lockDelayMs
				}
			}
			for _, m := range marks {
				if len(m.marks) > 0 {
					acquireOf[m.advisoryKey] = m.marks[0].KeyHash
				}
			}
		}
		if v.GuardedTables, err = readGuarded(ctx, pool, n); err != nil {
			return nil, err
		}
	}
	v.Time = now.UTC()
	lockName, fenceName := cmp.Or(c.lockTable, store.DefaultLockTable), cmp.Or(c.fenceTable, store.DefaultFenceTable)
	if !s.LockTable {
		s.Missing = append(s.Missing, "lock table "+lockName)
	}
	if !s.FenceTable {
		s.Missing = append(s.Missing, "fence counter table "+fenceName)
	}
	if s.LockTable && !s.HolderTable {
		s.Missing = append(s.Missing, "holder table (schema version 2)")
	}
	if s.LockTable && !s.SharedTable {
		s.Missing = append(s.Missing, "shared-hold table (schema version 4)")
	}
	if s.HolderTable && !s.MarkColumns {
		s.Missing = append(s.Missing, "lock delay and exclusive-waiting columns of the holder table (schema version 4)")
	}
	if ver < migrate.Latest {
		s.Missing = append(s.Missing, fmt.Sprintf("pglease functions (schema version %d)", migrate.Latest))
	}
	if s.Missing == nil {
		s.Missing = []string{}
	}

	locks, err := advisory.Inspect(ctx, pool, reg)
	if err != nil {
		return nil, err
	}
	// The waiter and watch locks: one group per key, its holders the
	// Managers.
	waiterIdx, watchIdx := map[int32]int{}, map[int32]int{}
	for _, l := range locks {
		a, b, ok := l.Key.Pair()
		if !ok || !l.Granted {
			continue
		}
		groups, idx := &v.WaitingManagers, waiterIdx
		switch a {
		case store.WaiterLockClass:
		case store.WatchLockClass:
			groups, idx = &v.WatchingManagers, watchIdx
		default:
			continue
		}
		i, ok := idx[b]
		if !ok {
			i = len(*groups)
			idx[b] = i
			*groups = append(*groups, waitersView{Hashtext: b, KeyHashes: []string{}, PIDs: []int32{}, Applications: []string{}})
		}
		(*groups)[i].Managers++
		(*groups)[i].PIDs = append((*groups)[i].PIDs, l.PID)
		(*groups)[i].Applications = append((*groups)[i].Applications, l.ApplicationName)
	}
	if (len(waiterIdx) > 0 || len(watchIdx) > 0) && s.LockTable {
		if err := resolveWaiters(ctx, pool, n, s, v, waiterIdx, watchIdx, o.showKeys); err != nil {
			return nil, err
		}
	}
	for _, l := range locks {
		av := advisoryView{
			Key: l.Key.String(), Name: l.Name, PID: l.PID, Granted: l.Granted, Mode: l.Mode,
			Application: l.ApplicationName, User: l.User, State: l.State, BlockedBy: l.BlockingPIDs,
		}
		if !l.WaitStart.IsZero() {
			av.WaitingSince = l.WaitStart.UTC()
			av.WaitingMs = now.Sub(l.WaitStart).Milliseconds()
		}
		if id, ok := l.Key.Int64(); ok {
			if id == setupKey && av.Name == "" {
				av.Name = "pglease schema setup or migration"
			}
			if h, ok := acquireOf[id]; ok && av.Name == "" {
				av.Name = "lease acquire " + h
				if !l.Granted {
					v.acquiresWaiting[h]++
				}
			}
		}
		if a, b, ok := l.Key.Pair(); ok && av.Name == "" {
			switch a {
			case store.WaiterLockClass:
				av.Name = "waiting Manager"
				if i, ok := waiterIdx[b]; ok {
					av.Name += ": " + v.WaitingManagers[i].what()
				}
			case store.WatchLockClass:
				av.Name = "watching Manager"
				if i, ok := watchIdx[b]; ok {
					av.Name += ": " + v.WatchingManagers[i].what()
				}
			}
		}
		v.Advisory = append(v.Advisory, av)
	}
	for i := range v.Leases.Rows {
		l := &v.Leases.Rows[i]
		l.AcquiresWaiting = v.acquiresWaiting[l.KeyHash]
		for _, w := range v.WaitingManagers {
			if slices.Contains(w.KeyHashes, l.KeyHash) {
				l.ManagersWaiting += w.Managers
			}
		}
		for _, w := range v.WatchingManagers {
			if slices.Contains(w.KeyHashes, l.KeyHash) {
				l.ManagersWatching += w.Managers
			}
		}
	}
	for i := range v.Shared.Rows {
		v.Shared.Rows[i].AcquiresWaiting = v.acquiresWaiting[v.Shared.Rows[i].KeyHash]
	}
	return v, nil
}

// resolveWaiters finds the lease keys of the waiter and watch locks'
// hashtexts in the lock table (their user_key, the NFC key the lock was
// taken for), the shared-hold table and the holder table (one row per
// key ever held, so a key just released is still found), those that
// exist: one scan of each, only when some Manager waits or watches.
func resolveWaiters(ctx context.Context, pool *pgxpool.Pool, n store.Names, s *schemaView, v *snapshotView, waiterIdx, watchIdx map[int32]int, showKeys bool) error {
	hs := make([]int32, 0, len(waiterIdx)+len(watchIdx))
	for _, idx := range []map[int32]int{waiterIdx, watchIdx} {
		for h := range idx {
			hs = append(hs, h)
		}
	}
	src := "SELECT l.user_key AS k FROM " + n.Lock + " AS l"
	if s.SharedTable {
		src += " UNION SELECT s.key FROM " + n.Shared + " AS s"
	}
	if s.HolderTable {
		src += " UNION SELECT h.key FROM " + n.Holders + " AS h"
	}
	rows, err := pool.Query(ctx, "SELECT DISTINCT hashtext(x.k), x.k FROM ("+src+") AS x WHERE hashtext(x.k) = ANY($1::int4[]) ORDER BY 2", hs)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var h int32
		var key string
		if err := rows.Scan(&h, &key); err != nil {
			return err
		}
		for _, g := range []struct {
			groups []waitersView
			idx    map[int32]int
		}{{v.WaitingManagers, waiterIdx}, {v.WatchingManagers, watchIdx}} {
			i, ok := g.idx[h]
			if !ok {
				continue
			}
			w := &g.groups[i]
			w.KeyHashes = append(w.KeyHashes, pglease.HashKey(key))
			if showKeys {
				w.Keys = append(w.Keys, key)
			}
		}
	}
	return rows.Err()
}
