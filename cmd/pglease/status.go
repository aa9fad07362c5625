package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/advisory"
	"github.com/pglease/pglease/pg/migrate"
)

// multiFlag collects a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// viewOpts are the flags of status and inspect.
type viewOpts struct {
	json, showKeys bool
	registry       string
	names, derive  multiFlag
	deriveStdin    string // a pattern name: one input per line of stdin
	deriveSep      string // splits an input into the pattern's parts
	limit          int
	notifyChannel  string // the release trigger's channel
}

func (a *app) viewFlags(fs *flag.FlagSet, o *viewOpts) {
	fs.BoolVar(&o.json, "json", false, "print JSON (for scripts)")
	fs.BoolVar(&o.showKeys, "show-keys", false, "show keys as stored (user_key) instead of their hashes")
	fs.StringVar(&o.registry, "registry", "", "advisory lock registry file (JSON, see advisory.LoadRegistry) to name advisory locks")
	fs.Var(&o.names, "name", "name an advisory key: NAME=int64:N or NAME=pair:A,B (repeatable)")
	fs.Var(&o.derive, "derive", "name the key a registry pattern derives from an input: NAME=INPUT (repeatable; the input is not shown).\n"+
		"For a pattern of several placeholders, INPUT is the parts joined by the template's text between them\n"+
		"(booking=t1:2025-01-15 for {tenantId}:{date}), or joined by --derive-sep")
	fs.StringVar(&o.deriveStdin, "derive-stdin", "", "like --derive NAME=INPUT for each line of stdin (one input per line), so that inputs\n"+
		"such as e-mail addresses stay out of the command line (ps, shell history)")
	fs.StringVar(&o.deriveSep, "derive-sep", "", "split each --derive/--derive-stdin INPUT into the pattern's parts on this separator")
	fs.IntVar(&o.limit, "limit", 100, fmt.Sprintf("show at most this many leases (live first), 1..%d", store.MaxBatch))
	fs.StringVar(&o.notifyChannel, "notify-channel", manager.DefaultNotifyChannel, "the channel the Managers listen on (manager.Config.NotifyChannel), for the release trigger's check")
}

// check checks the flags of status and inspect, without any I/O.
func (o *viewOpts) check(c *common) error {
	if o.limit < 1 || o.limit > store.MaxBatch {
		return fail(exitUsage, "--limit must be 1..%d", store.MaxBatch)
	}
	if _, err := migrate.SQL(pg.Config{LockTable: c.lockTable, FenceTable: c.fenceTable, NotifyChannel: o.notifyChannel}); err != nil {
		return fail(exitUsage, "--notify-channel: %v", err)
	}
	return nil
}

// loadRegistry builds the registry status and inspect name advisory locks
// with; --derive-stdin reads its inputs from stdin (a hint goes to stderr
// when stdin is a terminal).
func (a *app) loadRegistry(o *viewOpts) (*advisory.Registry, error) {
	reg := advisory.NewRegistry()
	if o.registry != "" {
		f, err := os.Open(o.registry)
		if err != nil {
			return nil, fail(exitUsage, "--registry: %v", err)
		}
		defer f.Close()
		if reg, err = advisory.LoadRegistry(f); err != nil {
			return nil, fail(exitUsage, "--registry: %v", err)
		}
	}
	for _, n := range o.names {
		name, key, ok := strings.Cut(n, "=")
		if !ok {
			return nil, fail(exitUsage, "--name wants NAME=KEY, e.g. scheduler=int64:42424242")
		}
		k, err := advisory.ParseKey(key)
		if err != nil {
			return nil, fail(exitUsage, "--name %s: %v", name, err)
		}
		if err := reg.Fixed(name, k, ""); err != nil {
			return nil, fail(exitUsage, "--name %s: %v", name, err)
		}
	}
	for _, d := range o.derive {
		name, input, ok := strings.Cut(d, "=")
		if !ok {
			return nil, fail(exitUsage, "--derive wants NAME=INPUT for a pattern of the registry")
		}
		if err := derive(reg, name, input, o.deriveSep); err != nil {
			return nil, fail(exitUsage, "--derive %s: %v", name, err)
		}
	}
	if name := o.deriveStdin; name != "" {
		if a.stdinTerminal {
			fmt.Fprintf(a.stderr, "reading inputs for %s from stdin, one per line; end with Ctrl-D\n", name)
		}
		sc := bufio.NewScanner(a.stdin)
		sc.Buffer(make([]byte, 0, 4096), 1<<20)
		n := 0
		for line := 1; sc.Scan(); line++ {
			input := strings.TrimSuffix(sc.Text(), "\r")
			if input == "" {
				continue
			}
			if err := derive(reg, name, input, o.deriveSep); err != nil {
				return nil, fail(exitUsage, "--derive-stdin %s: line %d: %v", name, line, err)
			}
			n++
		}
		if err := sc.Err(); err != nil {
			return nil, fail(exitUsage, "--derive-stdin %s: reading stdin: %v", name, err)
		}
		if n == 0 {
			return nil, fail(exitUsage, "--derive-stdin %s: no input on stdin (one per line)", name)
		}
	}
	return reg, nil
}

// derive names in reg the key the pattern name derives from input: the
// pattern's parts split on sep, or, without sep, split on the template's
// text between its placeholders (any split of input on it gives the same
// key: the pattern hashes the filled-in template). Errors never contain
// the input.
func derive(reg *advisory.Registry, name, input, sep string) error {
	e, ok := reg.Lookup(name)
	if !ok {
		return errors.New("no such name in the registry (--registry FILE)")
	}
	if e.Template == "" {
		return errors.New("is a fixed key, not a pattern")
	}
	between := templateSeparators(e.Template)
	var parts []string
	switch {
	case sep != "":
		parts = strings.Split(input, sep)
		if len(parts) != len(between)+1 {
			return fmt.Errorf("%d parts split on --derive-sep for the %d placeholders of %s", len(parts), len(between)+1, e.Template)
		}
	default:
		rest := input
		for _, lit := range between {
			i := strings.Index(rest, lit)
			if i < 0 {
				return fmt.Errorf("the input does not read as %s: want the parts joined by the template's text between them, or use --derive-sep", e.Template)
			}
			parts = append(parts, rest[:i])
			rest = rest[i+len(lit):]
		}
		parts = append(parts, rest)
	}
	if _, err := reg.Derive(name, parts...); err != nil {
		return err
	}
	return nil
}

// templateSeparators returns the text between a template's placeholders:
// for "{tenantId}:{date}", [":"]; none for one placeholder. The text
// before the first and after the last placeholder is not part of an input.
func templateSeparators(t string) []string {
	var lits []string
	for {
		i := strings.IndexByte(t, '{')
		j := strings.IndexByte(t[max(i, 0):], '}')
		if i < 0 || j < 0 {
			lits = append(lits, t)
			break
		}
		lits = append(lits, t[:i])
		t = t[i+j+1:]
	}
	if len(lits) <= 2 {
		return nil
	}
	return lits[1 : len(lits)-1]
}

// leaseView is one lease as status and inspect print it.
type leaseView struct {
	KeyHash         string    `json:"key_hash"`
	Key             string    `json:"key,omitempty"`
	Holder          string    `json:"holder"`
	Fence           string    `json:"fence"`
	AcquiredAt      time.Time `json:"acquired_at"`
	ExpiresAt       time.Time `json:"expires_at"`
	ExpiresInMs     int64     `json:"expires_in_ms"`
	Live            bool      `json:"live"`
	AcquiresWaiting int       `json:"acquires_waiting"`
	// ManagersWaiting counts the pglease Managers (processes) waiting
	// for the key: the holders of its waiter lock.
	ManagersWaiting int `json:"managers_waiting"`
	// ManagersWatching counts the pglease Managers watching the key (the
	// holders of its watch lock).
	ManagersWatching int `json:"managers_watching"`
	// LockDelayMs is the grant's lock delay (manager.WithLockDelay; 0:
	// none): when the lease expires unreleased, nobody takes the key
	// before its expiry + the delay.
	LockDelayMs  int64   `json:"lock_delay_ms"`
	FenceCounter *string `json:"fence_counter,omitempty"`
	advisoryKey  int64
}

// advisoryView is one advisory lock holder or waiter.
type advisoryView struct {
	Key          string    `json:"key"`
	Name         string    `json:"name,omitempty"`
	PID          int32     `json:"pid"`
	Granted      bool      `json:"granted"`
	Mode         string    `json:"mode"`
	Application  string    `json:"application"`
	User         string    `json:"user"`
	State        string    `json:"state,omitempty"`
	WaitingSince time.Time `json:"waiting_since,omitzero"`
	WaitingMs    int64     `json:"waiting_ms,omitempty"`
	BlockedBy    []int32   `json:"blocked_by,omitempty"`
}

// waitersView is one lease key that pglease Managers wait for: the
// holders of its waiter lock, pair:store.WaiterLockClass,hashtext(key)
// (the store's RegisterWaiters). A Manager holds it on its listening session
// while callers of its wait for the key and someone else holds it. The
// Managers watching a key (store.RegisterWatchers) hold its watch lock,
// pair:store.WatchLockClass,hashtext(key), and are listed the same way.
type waitersView struct {
	// Hashtext is the lock's second key: hashtext of the key (in NFC).
	Hashtext int32 `json:"hashtext"`
	// KeyHashes are the hashes of the lease keys with this hashtext in
	// the lock, shared-hold and holder tables: one, none when the key
	// was never held (or was just released, with no holder table), several
	// only on a hashtext collision.
	KeyHashes []string `json:"key_hashes"`
	Keys      []string `json:"keys,omitempty"` // with --show-keys
	Managers  int      `json:"managers"`
	PIDs      []int32  `json:"pids"`
	// Applications are the application_name of each of PIDs' sessions:
	// a Manager names its listening session by its holder identity
	// ("program[pid]@host" unless manager.Config.Holder or the
	// connection string says otherwise).
	Applications []string `json:"applications"`
}

func (w *waitersView) what() string {
	switch len(w.KeyHashes) {
	case 0:
		return fmt.Sprintf("key with hashtext %d (no lease row)", w.Hashtext)
	case 1:
		if len(w.Keys) == 1 {
			return "lease " + w.Keys[0]
		}
		return "lease " + w.KeyHashes[0]
	}
	ks := w.KeyHashes
	if len(w.Keys) == len(ks) {
		ks = w.Keys
	}
	return "lease " + strings.Join(ks, " or ") + " (same hashtext)"
}

// schemaView is the state of the pglease schema: what exists, what is
// missing.
type schemaView struct {
	Version int  `json:"version"`
	Needs   int  `json:"needs"`
	Current bool `json:"current"`
	// The lease tables: SyncGuard's lock and fence counter tables, and
	// pglease's holder table (schema version 2).
	LockTable   bool `json:"lock_table"`
	FenceTable  bool `json:"fence_table"`
	HolderTable bool `json:"holder_table"`
	// SharedTable: the shared-hold table (schema version 4); MarkColumns:
	// the holder table's columns for the exclusive-waiting mark and lock
	// delays (schema version 4). Without them, no shared hold, mark or
	// lock delay is shown.
	SharedTable bool `json:"shared_table"`
	MarkColumns bool `json:"mark_columns"`
	// ReleaseTrigger: the lock table has the release trigger for
	// NotifyChannel (migrate.Migrator.SetupReleaseTrigger), which makes
	// SyncGuard processes' releases wake pglease waiters.
	ReleaseTrigger bool   `json:"release_trigger"`
	NotifyChannel  string `json:"notify_channel"`
	// Missing names each missing part, for people.
	Missing []string `json:"missing"`
}

// snapshotView is what status prints.
type snapshotView struct {
	Time   time.Time  `json:"time"`
	Schema schemaView `json:"schema"`
	Leases struct {
		Total int         `json:"total"`
		Live  int         `json:"live"`
		Rows  []leaseView `json:"rows"`
	} `json:"leases"`
	// Shared are the live shared holds: readers and semaphore permits.
	Shared sharedSection `json:"shared"`
	// Marks are the keys with an exclusive-waiting mark or a lock delay
	// in force.
	Marks            []markView     `json:"marks"`
	WaitingManagers  []waitersView  `json:"waiting_managers"`
	WatchingManagers []waitersView  `json:"watching_managers"`
	GuardedTables    []guardedView  `json:"guarded_tables"`
	Advisory         []advisoryView `json:"advisory"`
	// acquiresWaiting counts, by key hash, the acquires waiting in the
	// database for a key of a lease row or a shared hold.
	acquiresWaiting map[string]int
}

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

func (a *app) status(ctx context.Context, args []string) error {
	fs := a.flags("status", "")
	var o viewOpts
	a.viewFlags(fs, &o)
	watch := fs.Duration("watch", 0, "refresh every D (e.g. 2s) until interrupted")
	count := fs.Int("count", 0, "with --watch: stop after N refreshes (0: until interrupted)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fail(exitUsage, "status takes no arguments (got %q)", fs.Arg(0))
	}
	if *watch < 0 || (*watch > 0 && *watch < 100*time.Millisecond) {
		return fail(exitUsage, "--watch must be at least 100ms")
	}
	if *count < 0 || (*count > 0 && *watch == 0) {
		return fail(exitUsage, "--count must be positive, and only with --watch")
	}
	if err := o.check(&a.c); err != nil {
		return err
	}
	reg, err := a.loadRegistry(&o)
	if err != nil {
		return err
	}
	pool, st, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var prev map[string]string // key hash → fence, for grants since the last refresh
	for n := 1; ; n++ {
		cctx, cancel := a.withTimeout(ctx)
		v, err := collect(cctx, pool, st, reg, &o, store.ListOptions{Limit: o.limit}, &a.c)
		cancel()
		if err != nil {
			if ctx.Err() != nil && n > 1 {
				return nil // interrupted while watching
			}
			return err
		}
		if *watch > 0 && a.isTerminal && !o.json {
			fmt.Fprint(a.stdout, "\033[H\033[2J")
		}
		if o.json {
			if err := json.NewEncoder(a.stdout).Encode(v); err != nil {
				return err
			}
		} else {
			printStatus(a.stdout, v, prev)
		}
		prev = map[string]string{}
		for _, l := range v.Leases.Rows {
			prev[l.KeyHash] = l.Fence
		}
		if *watch == 0 {
			if !v.Schema.Current {
				return fail(exitSchema, "%s", schemaAdvice(&v.Schema))
			}
			return nil
		}
		if *count > 0 && n >= *count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*watch):
		}
		if !o.json {
			fmt.Fprintln(a.stdout)
		}
	}
}

func ago(d time.Duration) string {
	if d < 0 {
		return "in " + short(-d)
	}
	return short(d) + " ago"
}

func short(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return d.Round(time.Minute).String()
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// schemaAdvice says how a schema that is not current is wrong and what
// to run.
func schemaAdvice(s *schemaView) string {
	if s.Version >= s.Needs {
		return fmt.Sprintf("schema v%d is newer than this pglease serves (it needs v%d): upgrade pglease", s.Version, s.Needs)
	}
	return fmt.Sprintf("schema v%d, this pglease needs v%d: %s", s.Version, s.Needs, howToSetup)
}

func printStatus(w io.Writer, v *snapshotView, prev map[string]string) {
	s := &v.Schema
	schema := fmt.Sprintf("schema v%d (current)", s.Version)
	if !s.Current {
		schema = fmt.Sprintf("schema v%d, this pglease needs v%d: run `pglease setup`", s.Version, s.Needs)
		if s.Version >= s.Needs {
			schema = fmt.Sprintf("schema v%d, newer than this pglease serves (v%d): upgrade pglease", s.Version, s.Needs)
		}
	}
	fmt.Fprintf(w, "pglease status  %s  %s\n", v.Time.Format("2006-01-02 15:04:05 MST"), schema)
	if len(s.Missing) > 0 {
		fmt.Fprintf(w, "MISSING  %s\n", strings.Join(s.Missing, ", "))
	}
	switch {
	case !s.LockTable:
		fmt.Fprintln(w, "RELEASE TRIGGER  none (no lock table)")
	case s.ReleaseTrigger:
		fmt.Fprintf(w, "RELEASE TRIGGER  installed (channel %s)\n", s.NotifyChannel)
	default:
		fmt.Fprintf(w, "RELEASE TRIGGER  not installed for channel %s (optional: needed only when SyncGuard processes share the tables, "+
			"whose releases would wake pglease waiters only by polling; migrate.Migrator.SetupReleaseTrigger installs it; "+
			"--notify-channel for another channel)\n", s.NotifyChannel)
	}
	fmt.Fprintln(w)
	if !s.LockTable {
		fmt.Fprintln(w, "LEASES  none: no lock table (only advisory locks are shown)")
	} else {
		fmt.Fprintf(w, "LEASES  %d live, %d expired", v.Leases.Live, v.Leases.Total-v.Leases.Live)
		if len(v.Leases.Rows) < v.Leases.Total {
			fmt.Fprintf(w, "  (showing %d)", len(v.Leases.Rows))
		}
		fmt.Fprintln(w)
	}
	if len(v.Leases.Rows) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tHOLDER\tFENCE\tACQUIRED\tEXPIRES\tACQUIRES WAITING\tMANAGERS WAITING")
		for _, l := range v.Leases.Rows {
			key := l.KeyHash
			if l.Key != "" {
				key = l.Key
			}
			fence := strings.TrimLeft(l.Fence, "0")
			if p, ok := prev[l.KeyHash]; ok && p != l.Fence {
				fence += fmt.Sprintf(" (+%d)", atoi(l.Fence)-atoi(p))
			}
			exp := expires(l.ExpiresInMs, l.Live)
			if l.LockDelayMs > 0 {
				exp += ", lock delay " + short(time.Duration(l.LockDelayMs)*time.Millisecond)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\n", key, dash(l.Holder), fence,
				ago(v.Time.Sub(l.AcquiredAt)), exp, l.AcquiresWaiting, l.ManagersWaiting)
		}
		tw.Flush()
	}
	printShared(w, v)
	printMarks(w, v)
	printManagers(w, v.WaitingManagers, "WAITING MANAGERS", "pglease Managers whose callers wait for a lease held elsewhere")
	printManagers(w, v.WatchingManagers, "WATCHING MANAGERS", "pglease Managers told of every change of the key as it commits (watchers)")
	switch {
	case !s.LockTable:
	case len(v.GuardedTables) == 0:
		fmt.Fprintln(w, "\nGUARDED TABLES  none (migrate.Migrator.Guard makes a table's writes need a live lease of the row's key)")
	default:
		fmt.Fprintf(w, "\nGUARDED TABLES  %d: a write of a row needs a live exclusive lease of its key (the key column's value), guarded in the writing transaction\n", len(v.GuardedTables))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TABLE\tKEY COLUMN\tTRIGGER")
		for _, g := range v.GuardedTables {
			state := "enabled"
			if !g.Enabled {
				state = "disabled: writes not checked"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", g.Table, g.KeyColumn, state)
		}
		tw.Flush()
	}
	held, waiting := 0, 0
	for _, a := range v.Advisory {
		if a.Granted {
			held++
		} else {
			waiting++
		}
	}
	fmt.Fprintf(w, "\nADVISORY LOCKS  %d held, %d waiting\n", held, waiting)
	if len(v.Advisory) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tNAME\tPID\tSTATE\tAPPLICATION\tWAITING SINCE\tBLOCKED BY")
		for _, a := range v.Advisory {
			state, since, by := "held", "-", "-"
			if !a.Granted {
				state = "waiting"
				if !a.WaitingSince.IsZero() {
					since = short(time.Duration(a.WaitingMs)*time.Millisecond) + " ago"
				}
				by = dash(pids(a.BlockedBy))
			}
			if a.Mode == "ShareLock" {
				state += " (shared)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", a.Key, dash(a.Name), a.PID, state, dash(a.Application), since, by)
		}
		tw.Flush()
	}
	// Contention at a glance: the keys someone waits for.
	type cont struct {
		what              string
		waiters, managers int
		longest           int64
		writer            bool // an exclusive waiting mark
	}
	var cs []cont
	idx := map[string]int{}
	at := func(what string) *cont {
		i, ok := idx[what]
		if !ok {
			i = len(cs)
			idx[what] = i
			cs = append(cs, cont{what: what})
		}
		return &cs[i]
	}
	hs := make([]string, 0, len(v.acquiresWaiting))
	for h := range v.acquiresWaiting {
		hs = append(hs, h)
	}
	slices.Sort(hs)
	for _, h := range hs {
		at("lease " + h).waiters += v.acquiresWaiting[h]
	}
	for _, m := range v.Marks {
		if m.Mark == markExclusiveWaiting {
			at("lease " + m.KeyHash).writer = true
		}
	}
	for _, m := range v.WaitingManagers {
		what := m.what()
		if len(m.KeyHashes) == 1 {
			what = "lease " + m.KeyHashes[0] // the same entry as its acquires'
		}
		at(what).managers += m.Managers
	}
	for _, a := range v.Advisory {
		if a.Granted || strings.HasPrefix(a.Name, "lease acquire ") {
			continue
		}
		what := a.Key
		if a.Name != "" {
			what += " (" + a.Name + ")"
		}
		c := at(what)
		c.waiters++
		c.longest = max(c.longest, a.WaitingMs)
	}
	fmt.Fprintln(w)
	if len(cs) == 0 {
		fmt.Fprintln(w, "CONTENTION  none: nobody waits")
		return
	}
	weight := func(c cont) int {
		if c.writer {
			return c.waiters + c.managers + 1
		}
		return c.waiters + c.managers
	}
	slices.SortStableFunc(cs, func(a, b cont) int { return weight(b) - weight(a) })
	fmt.Fprintln(w, "CONTENTION")
	for _, c := range cs {
		var parts []string
		if c.waiters > 0 {
			p := fmt.Sprintf("%d waiting", c.waiters)
			if c.longest > 0 {
				p += ", longest " + short(time.Duration(c.longest)*time.Millisecond)
			}
			parts = append(parts, p)
		}
		if c.managers > 0 {
			parts = append(parts, fmt.Sprintf("%d waiting Manager(s)", c.managers))
		}
		if c.writer {
			parts = append(parts, "a writer waits for the key (exclusive waiting)")
		}
		fmt.Fprintf(w, "  %s: %s\n", c.what, strings.Join(parts, "; "))
	}
}

// processes lists backends as "pid application_name", comma-separated
// ("pid -" for a session without application_name).
func processes(ps []int32, apps []string) string {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteString(", ")
		}
		app := ""
		if i < len(apps) {
			app = apps[i]
		}
		fmt.Fprintf(&b, "%d %s", p, dash(app))
	}
	return b.String()
}

// pids joins process ids with commas.
func pids(ps []int32) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, ",")
}

func atoi(s string) int64 {
	var n int64
	for _, c := range s {
		n = n*10 + int64(c-'0')
	}
	return n
}

// printManagers prints the Managers waiting for or watching keys.
func printManagers(w io.Writer, ms []waitersView, title, what string) {
	if len(ms) == 0 {
		return
	}
	n := 0
	for _, m := range ms {
		n += m.Managers
	}
	fmt.Fprintf(w, "\n%s  %d on %d key(s): %s\n", title, n, len(ms), what)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tMANAGERS\tPROCESSES (backend pid, application_name)")
	for _, m := range ms {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", strings.TrimPrefix(m.what(), "lease "), m.Managers, processes(m.PIDs, m.Applications))
	}
	tw.Flush()
}

// printShared prints the shared holds: one row per hold.
func printShared(w io.Writer, v *snapshotView) {
	s := &v.Schema
	switch {
	case !s.LockTable:
		return
	case !s.SharedTable:
		fmt.Fprintf(w, "\nSHARED HOLDS  not shown: no shared-hold table (schema v%d; readers and semaphore permits need v4)\n", s.Version)
		return
	case v.Shared.Live == 0:
		fmt.Fprintln(w, "\nSHARED HOLDS  none")
		return
	}
	fmt.Fprintf(w, "\nSHARED HOLDS  %d live on %d key(s): readers of reader-writer leases, permits of counting semaphores", v.Shared.Live, v.Shared.Keys)
	shown := 0
	for _, g := range v.Shared.Rows {
		shown += len(g.Holders)
	}
	if shown < v.Shared.Live {
		fmt.Fprintf(w, "  (showing %d)", shown)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tKIND\tHELD\tHOLDER\tFENCE\tACQUIRED\tEXPIRES\tACQUIRES WAITING")
	for _, g := range v.Shared.Rows {
		key := g.KeyHash
		if g.Key != "" {
			key = g.Key
		}
		kind := "reader"
		if g.Limit > 0 {
			kind = "permit"
		}
		for _, h := range g.Holders {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", key, kind, g.held(), dash(h.Holder), fenceNum(h.Fence),
				ago(v.Time.Sub(h.AcquiredAt)), expires(h.ExpiresInMs, true), g.AcquiresWaiting)
		}
	}
	tw.Flush()
}

// printMarks prints the keys with an exclusive waiting mark or a lock
// delay in force.
func printMarks(w io.Writer, v *snapshotView) {
	s := &v.Schema
	switch {
	case !s.LockTable:
		return
	case s.HolderTable && !s.MarkColumns:
		fmt.Fprintf(w, "\nMARKS  not shown: the holder table has no columns for lock delays and exclusive waiting (schema v%d; they need v4)\n", s.Version)
		return
	case len(v.Marks) == 0:
		return
	}
	fmt.Fprintf(w, "\nMARKS  %d: keys held off by a waiting writer (exclusive waiting: new shared holds are refused) or a lock delay (no grant at all)\n", len(v.Marks))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tMARK\tUNTIL\tMEANING")
	for _, m := range v.Marks {
		key := m.KeyHash
		if m.Key != "" {
			key = m.Key
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", key, m.what(), until(m.Until, v.Time), m.meaning())
	}
	tw.Flush()
}

// expires says when a hold expires (ms from now), by SyncGuard's rule
// when live is the answer of that rule (expired holds within the 1 s
// tolerance are still live).
func expires(inMs int64, live bool) string {
	switch {
	case !live:
		return "expired " + short(-time.Duration(inMs)*time.Millisecond) + " ago"
	case inMs <= 0:
		return "expired, in tolerance"
	}
	return "in " + short(time.Duration(inMs)*time.Millisecond)
}
