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
	k := &collector{pool: pool, st: st, n: st.Names(), reg: reg, o: o, c: c, lo: lo, v: newSnapshot(),
		acquireOf: map[int64]string{}, waiterIdx: map[int32]int{}, watchIdx: map[int32]int{}}
	if lo.Key != "" {
		k.key = mustNFC(lo.Key)
	}
	if err := k.schema(ctx); err != nil {
		return nil, err
	}
	if k.v.Schema.LockTable {
		if err := k.leaseTables(ctx); err != nil {
			return nil, err
		}
	}
	k.v.Time = k.now.UTC()
	k.v.Schema.Missing = missingParts(&k.v.Schema, c)
	if err := k.advisoryLocks(ctx); err != nil {
		return nil, err
	}
	k.countOnKeys()
	return k.v, nil
}

// newSnapshot is an empty snapshot: its lists are empty, not null, in
// JSON.
func newSnapshot() *snapshotView {
	v := &snapshotView{}
	v.Leases.Rows = []leaseView{}
	v.Shared.Rows = []sharedKeyView{}
	v.Marks = []markView{}
	v.WaitingManagers = []waitersView{}
	v.WatchingManagers = []waitersView{}
	v.GuardedTables = []guardedView{}
	v.Advisory = []advisoryView{}
	v.Queue.Rows = []queueKeyView{}
	v.acquiresWaiting = map[string]int{}
	return v
}

// collector is one run of collect: each step reads a part of the
// snapshot and leaves what the next steps need in its fields.
type collector struct {
	pool *pgxpool.Pool
	st   *store.Store
	n    store.Names
	reg  *advisory.Registry
	o    *viewOpts
	c    *common
	lo   store.ListOptions
	key  string // lo.Key in NFC, "" for every key
	v    *snapshotView

	now      time.Time // the server's clock
	setupKey int64     // the advisory lock SetupSchema and the migrations take
	// acquireOf names the key of an acquire in progress: hashtext(key) →
	// the key's hash, for the keys of lease rows, shared holds and marks.
	acquireOf map[int64]string
	// waiterIdx and watchIdx index v.WaitingManagers and
	// v.WatchingManagers by the hashtext of their key.
	waiterIdx, watchIdx map[int32]int
}

// schema reads the schema's version, which lease tables exist, the
// server's clock and the setup lock's key.
func (k *collector) schema(ctx context.Context) error {
	s := &k.v.Schema
	ver, from, err := k.st.ReadVersion(ctx, "migrate.Version")
	if err != nil {
		return err
	}
	s.Version, s.Needs, s.NotifyChannel = ver, migrate.Latest, k.o.notifyChannel
	s.Current = ver >= migrate.Latest && from <= migrate.Latest
	var nowMs int64
	err = k.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL, "+
		"floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, hashtext('pglease.SetupSchema')::bigint",
		quoteTable(lockTableName(k.c)), quoteTable(fenceTableName(k.c))).
		Scan(&s.LockTable, &s.FenceTable, &nowMs, &k.setupKey)
	if err != nil {
		return err
	}
	k.now = time.UnixMilli(nowMs)
	return nil
}

func lockTableName(c *common) string  { return cmp.Or(c.lockTable, store.DefaultLockTable) }
func fenceTableName(c *common) string { return cmp.Or(c.fenceTable, store.DefaultFenceTable) }

// leaseTables reads what the lock table and the tables beside it hold:
// leases, the release trigger, shared holds, marks, guarded tables.
func (k *collector) leaseTables(ctx context.Context) error {
	s := &k.v.Schema
	if err := k.leases(ctx); err != nil {
		return err
	}
	var err error
	if s.ReleaseTrigger, err = k.st.ReleaseTriggerInstalled(ctx, k.o.notifyChannel); err != nil {
		return err
	}
	if s.SharedTable, s.MarkColumns, err = probeV4(ctx, k.pool, k.n); err != nil {
		return err
	}
	if s.SharedTable {
		if err := k.shared(ctx); err != nil {
			return err
		}
	}
	if s.MarkColumns {
		if err := k.marks(ctx); err != nil {
			return err
		}
	}
	if s.QueueTable, err = probeQueue(ctx, k.pool, k.n); err != nil {
		return err
	}
	if s.QueueTable {
		if err := k.queue(ctx); err != nil {
			return err
		}
	}
	k.v.GuardedTables, err = readGuarded(ctx, k.pool, k.n)
	return err
}

// leases reads the lease rows (at most lo.Limit, or lo.Key's).
func (k *collector) leases(ctx context.Context) error {
	list, err := k.st.ListLeases(ctx, k.lo)
	if err != nil {
		return err
	}
	k.now = list.Now
	k.v.Schema.HolderTable = list.HolderKnown
	k.v.Leases.Total, k.v.Leases.Live = list.Total, list.Live
	for _, r := range list.Rows {
		lv := leaseView{
			KeyHash: r.KeyHash, Holder: r.Holder, Fence: r.Fence.String(),
			AcquiredAt: r.AcquiredAt.UTC(), ExpiresAt: r.ExpiresAt.UTC(),
			ExpiresInMs: r.ExpiresAt.Sub(list.Now).Milliseconds(), Live: r.Live, advisoryKey: r.AdvisoryKey,
		}
		if k.o.showKeys {
			lv.Key = r.Key
		}
		k.acquireOf[r.AdvisoryKey] = r.KeyHash
		k.v.Leases.Rows = append(k.v.Leases.Rows, lv)
	}
	return nil
}

// shared reads the live shared holds.
func (k *collector) shared(ctx context.Context) error {
	sec, err := readShared(ctx, k.pool, k.n, k.key, k.o.limit, k.o.showKeys)
	if err != nil {
		return err
	}
	k.v.Shared = sec
	for _, g := range sec.Rows {
		k.acquireOf[g.advisoryKey] = g.KeyHash
	}
	return nil
}

// queue reads the fair queue's live tickets.
func (k *collector) queue(ctx context.Context) error {
	sec, err := readQueue(ctx, k.pool, k.n, k.key, k.o.limit, k.o.showKeys)
	if err != nil {
		return err
	}
	k.v.Queue = sec
	for _, g := range sec.Rows {
		k.acquireOf[g.advisoryKey] = g.KeyHash
	}
	return nil
}

// marks reads the marks and lock delays, and gives each lease row its
// grant's lock delay.
func (k *collector) marks(ctx context.Context) error {
	marks, err := readMarks(ctx, k.pool, k.n, k.key, k.o.showKeys)
	if err != nil {
		return err
	}
	k.v.Marks = sortedMarks(marks)
	for i := range k.v.Leases.Rows {
		if m, ok := marks[k.v.Leases.Rows[i].KeyHash]; ok {
			k.v.Leases.Rows[i].LockDelayMs = m.lockDelayMs
		}
	}
	for _, m := range marks {
		if len(m.marks) > 0 {
			k.acquireOf[m.advisoryKey] = m.marks[0].KeyHash
		}
	}
	return nil
}

// missingParts names the missing parts of the schema s, the lease tables
// first (countTables counts on it); none is an empty list.
func missingParts(s *schemaView, c *common) []string {
	missing := []string{}
	if !s.LockTable {
		missing = append(missing, "lock table "+lockTableName(c))
	}
	if !s.FenceTable {
		missing = append(missing, "fence counter table "+fenceTableName(c))
	}
	if s.LockTable && !s.HolderTable {
		missing = append(missing, "holder table (schema version 2)")
	}
	if s.LockTable && !s.SharedTable {
		missing = append(missing, "shared-hold table (schema version 4)")
	}
	if s.LockTable && !s.QueueTable {
		missing = append(missing, "queue table (schema version 4)")
	}
	if s.HolderTable && !s.MarkColumns {
		missing = append(missing, "lock delay and exclusive-waiting columns of the holder table (schema version 4)")
	}
	if s.Version < migrate.Latest {
		missing = append(missing, fmt.Sprintf("pglease functions (schema version %d)", migrate.Latest))
	}
	return missing
}

// advisoryLocks reads every advisory lock: the Managers waiting and
// watching (the holders of waiter and watch locks), with their keys, and
// each lock named.
func (k *collector) advisoryLocks(ctx context.Context) error {
	locks, err := advisory.Inspect(ctx, k.pool, k.reg)
	if err != nil {
		return err
	}
	for _, l := range locks {
		k.groupManager(l)
	}
	if (len(k.waiterIdx) > 0 || len(k.watchIdx) > 0) && k.v.Schema.LockTable {
		if err := resolveWaiters(ctx, k.pool, k.n, &k.v.Schema, k.v, k.waiterIdx, k.watchIdx, k.o.showKeys); err != nil {
			return err
		}
	}
	for _, l := range locks {
		k.v.Advisory = append(k.v.Advisory, k.advisoryRow(l))
	}
	return nil
}

// groupManager counts a held waiter or watch lock on its key's group
// (one per key), whose holders are the Managers.
func (k *collector) groupManager(l advisory.LockInfo) {
	a, b, ok := l.Key.Pair()
	if !ok || !l.Granted {
		return
	}
	groups, idx := &k.v.WaitingManagers, k.waiterIdx
	switch a {
	case store.WaiterLockClass:
	case store.WatchLockClass:
		groups, idx = &k.v.WatchingManagers, k.watchIdx
	default:
		return
	}
	i, ok := idx[b]
	if !ok {
		i = len(*groups)
		idx[b] = i
		*groups = append(*groups, waitersView{Hashtext: b, KeyHashes: []string{}, PIDs: []int32{}, Applications: []string{}})
	}
	g := &(*groups)[i]
	g.Managers++
	g.PIDs = append(g.PIDs, l.PID)
	g.Applications = append(g.Applications, l.ApplicationName)
}

// advisoryRow is one advisory lock as the snapshot shows it.
func (k *collector) advisoryRow(l advisory.LockInfo) advisoryView {
	av := advisoryView{
		Key: l.Key.String(), Name: l.Name, PID: l.PID, Granted: l.Granted, Mode: l.Mode,
		Application: l.ApplicationName, User: l.User, State: l.State, BlockedBy: l.BlockingPIDs,
	}
	if !l.WaitStart.IsZero() {
		av.WaitingSince = l.WaitStart.UTC()
		av.WaitingMs = k.now.Sub(l.WaitStart).Milliseconds()
	}
	if av.Name == "" {
		av.Name = k.lockName(l)
	}
	return av
}

// lockName names a lock the registry does not name, when it is one of
// pglease's: the schema setup's, a lease acquire in progress (counted on
// its key when it waits), a waiting or watching Manager's; "" otherwise.
func (k *collector) lockName(l advisory.LockInfo) string {
	if id, ok := l.Key.Int64(); ok {
		if id == k.setupKey {
			return "pglease schema setup or migration"
		}
		if h, ok := k.acquireOf[id]; ok {
			if !l.Granted {
				k.v.acquiresWaiting[h]++
			}
			return "lease acquire " + h
		}
	}
	a, b, ok := l.Key.Pair()
	if !ok {
		return ""
	}
	switch a {
	case store.WaiterLockClass:
		if i, ok := k.waiterIdx[b]; ok {
			return "waiting Manager: " + k.v.WaitingManagers[i].what()
		}
		return "waiting Manager"
	case store.WatchLockClass:
		if i, ok := k.watchIdx[b]; ok {
			return "watching Manager: " + k.v.WatchingManagers[i].what()
		}
		return "watching Manager"
	}
	return ""
}

// countOnKeys counts the acquires in progress, the Managers waiting and
// watching, and the queued tickets, on the lease rows and shared holds of
// their keys.
func (k *collector) countOnKeys() {
	v := k.v
	queued := map[string]int{}
	for _, g := range v.Queue.Rows {
		queued[g.KeyHash] = g.Length
	}
	for i := range v.Leases.Rows {
		l := &v.Leases.Rows[i]
		l.AcquiresWaiting = v.acquiresWaiting[l.KeyHash]
		l.Queued = queued[l.KeyHash]
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
		v.Shared.Rows[i].Queued = queued[v.Shared.Rows[i].KeyHash]
	}
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
