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
	ManagersWaiting int     `json:"managers_waiting"`
	FenceCounter    *string `json:"fence_counter,omitempty"`
	advisoryKey     int64
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
// while callers of its wait for the key and someone else holds it.
type waitersView struct {
	// Hashtext is the lock's second key: hashtext of the key (in NFC).
	Hashtext int32 `json:"hashtext"`
	// KeyHashes are the hashes of the lease keys with this hashtext in
	// the lock table: one, none when the key has no lease row (it was
	// just released), several only on a hashtext collision.
	KeyHashes []string `json:"key_hashes"`
	Keys      []string `json:"keys,omitempty"` // with --show-keys
	Managers  int      `json:"managers"`
	PIDs      []int32  `json:"pids"`
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
	WaitingManagers []waitersView  `json:"waiting_managers"`
	Advisory        []advisoryView `json:"advisory"`
}

// quoteTable quotes a validated table name, ident or schema.ident, as
// package pg does.
func quoteTable(name string) string {
	return pgx.Identifier(strings.Split(name, ".")).Sanitize()
}

// collect reads one snapshot: leases (optionally one key's), the schema's
// state, and advisory locks, with lease acquires in progress (waiters on a
// key's hashtext advisory lock) and waiting Managers (holders of a key's
// waiter lock) counted on their lease. It needs none of the lease tables:
// what is missing is reported in Schema, and advisory locks are listed
// whatever exists.
func collect(ctx context.Context, pool *pgxpool.Pool, st *store.Store, reg *advisory.Registry, o *viewOpts, lo store.ListOptions, c *common) (*snapshotView, error) {
	v := &snapshotView{}
	v.Leases.Rows = []leaseView{}
	v.WaitingManagers = []waitersView{}
	v.Advisory = []advisoryView{}
	s := &v.Schema
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
	byAdv := map[int64]int{}
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
			byAdv[r.AdvisoryKey] = len(v.Leases.Rows)
			v.Leases.Rows = append(v.Leases.Rows, lv)
		}
		if s.ReleaseTrigger, err = st.ReleaseTriggerInstalled(ctx, o.notifyChannel); err != nil {
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
	if ver < migrate.Latest {
		s.Missing = append(s.Missing, fmt.Sprintf("pglease functions (schema version %d)", migrate.Latest))
	}
	if !s.ReleaseTrigger {
		s.Missing = append(s.Missing, "release trigger (channel "+o.notifyChannel+")")
	}
	if s.Missing == nil {
		s.Missing = []string{}
	}

	locks, err := advisory.Inspect(ctx, pool, reg)
	if err != nil {
		return nil, err
	}
	// The waiter locks: one group per key, its holders the Managers.
	waiterIdx := map[int32]int{}
	for _, l := range locks {
		if a, b, ok := l.Key.Pair(); ok && a == store.WaiterLockClass && l.Granted {
			i, ok := waiterIdx[b]
			if !ok {
				i = len(v.WaitingManagers)
				waiterIdx[b] = i
				v.WaitingManagers = append(v.WaitingManagers, waitersView{Hashtext: b, KeyHashes: []string{}, PIDs: []int32{}})
			}
			v.WaitingManagers[i].Managers++
			v.WaitingManagers[i].PIDs = append(v.WaitingManagers[i].PIDs, l.PID)
		}
	}
	if len(waiterIdx) > 0 && s.LockTable {
		if err := resolveWaiters(ctx, pool, lockName, v, waiterIdx, o.showKeys); err != nil {
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
			if i, ok := byAdv[id]; ok && av.Name == "" {
				av.Name = "lease acquire " + v.Leases.Rows[i].KeyHash
				if !l.Granted {
					v.Leases.Rows[i].AcquiresWaiting++
				}
			}
		}
		if a, b, ok := l.Key.Pair(); ok && a == store.WaiterLockClass && av.Name == "" {
			av.Name = "waiting Manager"
			if i, ok := waiterIdx[b]; ok {
				av.Name += ": " + v.WaitingManagers[i].what()
			}
		}
		v.Advisory = append(v.Advisory, av)
	}
	for _, w := range v.WaitingManagers {
		for _, h := range w.KeyHashes {
			for i := range v.Leases.Rows {
				if v.Leases.Rows[i].KeyHash == h {
					v.Leases.Rows[i].ManagersWaiting += w.Managers
				}
			}
		}
	}
	return v, nil
}

// resolveWaiters finds the lease keys of the waiter locks' hashtexts in
// the lock table (their user_key, the NFC key the lock was taken for):
// one scan of the table, only when some Manager waits.
func resolveWaiters(ctx context.Context, pool *pgxpool.Pool, lockTable string, v *snapshotView, idx map[int32]int, showKeys bool) error {
	hs := make([]int32, 0, len(idx))
	for h := range idx {
		hs = append(hs, h)
	}
	rows, err := pool.Query(ctx, "SELECT DISTINCT hashtext(user_key), user_key FROM "+quoteTable(lockTable)+
		" WHERE hashtext(user_key) = ANY($1::int4[]) ORDER BY 2", hs)
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
		w := &v.WaitingManagers[idx[h]]
		w.KeyHashes = append(w.KeyHashes, pglease.HashKey(key))
		if showKeys {
			w.Keys = append(w.Keys, key)
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
		fmt.Fprintf(w, "RELEASE TRIGGER  not installed for channel %s: SyncGuard processes' releases wake pglease waiters only "+
			"by polling (migrate.Migrator.SetupReleaseTrigger installs it; --notify-channel for another channel)\n", s.NotifyChannel)
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
			exp := "in " + short(time.Duration(l.ExpiresInMs)*time.Millisecond)
			if !l.Live {
				exp = "expired " + short(-time.Duration(l.ExpiresInMs)*time.Millisecond) + " ago"
			} else if l.ExpiresInMs <= 0 {
				exp = "expired, in tolerance"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\n", key, dash(l.Holder), fence,
				ago(v.Time.Sub(l.AcquiredAt)), exp, l.AcquiresWaiting, l.ManagersWaiting)
		}
		tw.Flush()
	}
	if len(v.WaitingManagers) > 0 {
		n := 0
		for _, m := range v.WaitingManagers {
			n += m.Managers
		}
		fmt.Fprintf(w, "\nWAITING MANAGERS  %d on %d key(s): pglease Managers whose callers wait for a lease held elsewhere\n", n, len(v.WaitingManagers))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tMANAGERS\tPIDS")
		for _, m := range v.WaitingManagers {
			fmt.Fprintf(tw, "%s\t%d\t%s\n", strings.TrimPrefix(m.what(), "lease "), m.Managers, pids(m.PIDs))
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
	for _, l := range v.Leases.Rows {
		if l.AcquiresWaiting > 0 {
			at("lease " + l.KeyHash).waiters += l.AcquiresWaiting
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
	slices.SortStableFunc(cs, func(a, b cont) int { return (b.waiters + b.managers) - (a.waiters + a.managers) })
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
		fmt.Fprintf(w, "  %s: %s\n", c.what, strings.Join(parts, "; "))
	}
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
