package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// printStatus is status's text view of a snapshot; prev (key hash →
// fence, of the last refresh of --watch) marks the grants made since.
func printStatus(w io.Writer, v *snapshotView, prev map[string]string) {
	printHeader(w, v)
	printLeases(w, v, prev)
	printShared(w, v)
	printMarks(w, v)
	printQueue(w, v)
	printManagers(w, v.WaitingManagers, "WAITING MANAGERS", "pglease Managers whose callers wait for a lease held elsewhere")
	printManagers(w, v.WatchingManagers, "WATCHING MANAGERS", "pglease Managers told of every change of the key as it commits (watchers)")
	printGuarded(w, v)
	printAdvisory(w, v)
	printContention(w, contention(v))
}

// printHeader prints the time, the schema's state, its missing parts and
// the release trigger.
func printHeader(w io.Writer, v *snapshotView) {
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
}

// printLeases prints the exclusive leases.
func printLeases(w io.Writer, v *snapshotView, prev map[string]string) {
	if !v.Schema.LockTable {
		fmt.Fprintln(w, "LEASES  none: no lock table (only advisory locks are shown)")
	} else {
		fmt.Fprintf(w, "LEASES  %d live, %d expired", v.Leases.Live, v.Leases.Total-v.Leases.Live)
		if len(v.Leases.Rows) < v.Leases.Total {
			fmt.Fprintf(w, "  (showing %d)", len(v.Leases.Rows))
		}
		fmt.Fprintln(w)
	}
	if len(v.Leases.Rows) == 0 {
		return
	}
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

// printGuarded prints the guarded tables.
func printGuarded(w io.Writer, v *snapshotView) {
	switch {
	case !v.Schema.LockTable:
		return
	case len(v.GuardedTables) == 0:
		fmt.Fprintln(w, "\nGUARDED TABLES  none (migrate.Migrator.Guard makes a table's writes need a live lease of the row's key)")
		return
	}
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

// printAdvisory prints the advisory locks, held and waited for.
func printAdvisory(w io.Writer, v *snapshotView) {
	held, waiting := 0, 0
	for _, a := range v.Advisory {
		if a.Granted {
			held++
		} else {
			waiting++
		}
	}
	fmt.Fprintf(w, "\nADVISORY LOCKS  %d held, %d waiting\n", held, waiting)
	if len(v.Advisory) == 0 {
		return
	}
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

// contended is one key (or advisory lock) someone waits for.
type contended struct {
	what              string
	waiters, managers int
	longest           int64 // ms
	writer            bool  // an exclusive waiting mark
	// queued counts the key's tickets in the fair queue; inLine is the
	// longest of their waits (ms).
	queued int
	inLine int64
}

// weight orders contention: the most waiters first.
func (c contended) weight() int {
	if c.writer {
		return c.waiters + c.managers + c.queued + 1
	}
	return c.waiters + c.managers + c.queued
}

// contention is contention at a glance: the keys someone waits for, the
// most waited for first.
func contention(v *snapshotView) []contended {
	var cs []contended
	idx := map[string]int{}
	at := func(what string) *contended {
		i, ok := idx[what]
		if !ok {
			i = len(cs)
			idx[what] = i
			cs = append(cs, contended{what: what})
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
	for _, g := range v.Queue.Rows {
		c := at("lease " + g.KeyHash)
		c.queued += g.Length
		for _, t := range g.Tickets {
			c.inLine = max(c.inLine, t.WaitingMs)
		}
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
	slices.SortStableFunc(cs, func(a, b contended) int { return b.weight() - a.weight() })
	return cs
}

// printContention prints the contended keys.
func printContention(w io.Writer, cs []contended) {
	fmt.Fprintln(w)
	if len(cs) == 0 {
		fmt.Fprintln(w, "CONTENTION  none: nobody waits")
		return
	}
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
		if c.queued > 0 {
			parts = append(parts, fmt.Sprintf("%d in line (fair queue), longest %s", c.queued, short(time.Duration(c.inLine)*time.Millisecond)))
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
