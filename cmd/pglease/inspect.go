package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
)

func (a *app) inspect(ctx context.Context, args []string) error {
	fs := a.flags("inspect", "KEY")
	var o viewOpts
	a.viewFlags(fs, &o)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fail(exitUsage, "inspect takes one KEY (got %d arguments)", fs.NArg())
	}
	key := fs.Arg(0)
	if _, err := keys.NormalizeKey(key); err != nil {
		return fail(exitUsage, "%v", err)
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
	cctx, cancel := a.withTimeout(ctx)
	defer cancel()
	v, err := collect(cctx, pool, st, reg, &o, store.ListOptions{Key: key}, &a.c)
	if err != nil {
		return err
	}
	if !v.Schema.LockTable || !v.Schema.FenceTable {
		return fail(exitSchema, "no lease tables (missing: %s): %s", strings.Join(v.Schema.Missing[:countTables(&v.Schema)], ", "), howToSetup)
	}
	fc, ok, err := st.FenceCounter(cctx, key)
	if err != nil {
		return err
	}
	var counter *string
	if ok {
		s := fc.String()
		counter = &s
	}
	if len(v.Leases.Rows) == 1 {
		v.Leases.Rows[0].FenceCounter = counter
	}
	nk := mustNFC(key)
	hash := pglease.HashKey(nk)
	// The acquires waiting for this key: waiters on its advisory lock.
	waiters := []advisoryView{}
	for _, l := range v.Advisory {
		if l.Name == "lease acquire "+hash {
			waiters = append(waiters, l)
		}
	}
	// The Managers waiting for it and watching it: holders of its waiter
	// and watch locks.
	var ht int32
	if err := pool.QueryRow(cctx, "SELECT hashtext($1)", nk).Scan(&ht); err != nil {
		return err
	}
	managers, watchers := []int32{}, []int32{}
	for _, w := range v.WaitingManagers {
		if w.Hashtext == ht {
			managers = w.PIDs
		}
	}
	for _, w := range v.WatchingManagers {
		if w.Hashtext == ht {
			watchers = w.PIDs
		}
	}
	shared := sharedKeyView{KeyHash: hash, Kind: "none", Holders: []sharedHoldView{}}
	if len(v.Shared.Rows) == 1 {
		shared = v.Shared.Rows[0]
	}
	if o.showKeys {
		shared.Key = nk
	}
	if o.json {
		out := struct {
			KeyHash          string         `json:"key_hash"`
			Key              string         `json:"key,omitempty"`
			Lease            *leaseView     `json:"lease"`
			FenceCounter     *string        `json:"fence_counter"`
			Shared           sharedKeyView  `json:"shared"`
			Marks            []markView     `json:"marks"`
			Acquires         []advisoryView `json:"acquires_in_progress"`
			WaitingManagers  []int32        `json:"waiting_manager_pids"`
			WatchingManagers []int32        `json:"watching_manager_pids"`
			GuardedTables    []guardedView  `json:"guarded_tables"`
			Schema           schemaView     `json:"schema"`
		}{KeyHash: hash, FenceCounter: counter, Shared: shared, Marks: v.Marks, Acquires: waiters,
			WaitingManagers: managers, WatchingManagers: watchers, GuardedTables: v.GuardedTables, Schema: v.Schema}
		if o.showKeys {
			out.Key = nk
		}
		if len(v.Leases.Rows) == 1 {
			out.Lease = &v.Leases.Rows[0]
		}
		if err := json.NewEncoder(a.stdout).Encode(out); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		name := hash
		if o.showKeys {
			name = fmt.Sprintf("%q (hash %s)", nk, name)
		}
		fmt.Fprintf(tw, "key\t%s\n", name)
		if counter != nil {
			fmt.Fprintf(tw, "fence counter\t%s (the last fence granted; the next grant gets a higher one)\n", strings.TrimLeft(*counter, "0"))
		} else {
			fmt.Fprintln(tw, "fence counter\tnone (never granted)")
		}
		var delay *markView
		for i, m := range v.Marks {
			if m.Mark == markLockDelay {
				delay = &v.Marks[i]
			}
		}
		// free is what an absent or expired lease leaves the key as.
		free := "free"
		switch {
		case delay != nil:
			free = "no holder, but a lock delay holds the key off (see lock delay)"
		case shared.Count > 0:
			free = "no exclusive holder (see shared holds)"
		}
		if len(v.Leases.Rows) == 0 {
			fmt.Fprintf(tw, "lease\tnone: %s\n", free)
		} else {
			l := v.Leases.Rows[0]
			state := "live, expires in " + short(time.Duration(l.ExpiresInMs)*time.Millisecond)
			switch {
			case !l.Live && delay != nil:
				state = "expired " + short(-time.Duration(l.ExpiresInMs)*time.Millisecond) + " ago: " + free
			case !l.Live:
				state = "expired " + short(-time.Duration(l.ExpiresInMs)*time.Millisecond) + " ago: " + free + ", the next acquire overwrites it"
			case l.ExpiresInMs <= 0 && l.LockDelayMs > keys.TimeToleranceMs:
				state = "expired, inside its lock delay: not grantable before " +
					until(l.ExpiresAt.Add(time.Duration(l.LockDelayMs)*time.Millisecond), v.Time)
			case l.ExpiresInMs <= 0:
				state = "expired, within the 1 s tolerance: free for acquirers in under a second"
			}
			fmt.Fprintf(tw, "lease\t%s\n", state)
			fmt.Fprintf(tw, "holder\t%s\n", dash(l.Holder))
			fmt.Fprintf(tw, "fence\t%s\n", strings.TrimLeft(l.Fence, "0"))
			fmt.Fprintf(tw, "acquired\t%s (%s)\n", l.AcquiredAt.Format(time.RFC3339Nano), ago(v.Time.Sub(l.AcquiredAt)))
			fmt.Fprintf(tw, "expires\t%s\n", l.ExpiresAt.Format(time.RFC3339Nano))
		}
		switch {
		case !v.Schema.SharedTable:
			fmt.Fprintf(tw, "shared holds\tnot shown: no shared-hold table (schema v%d; readers and semaphore permits need v4)\n", v.Schema.Version)
		default:
			fmt.Fprintf(tw, "shared holds\t%s\n", shared.held())
			for _, h := range shared.Holders {
				kind := "reader"
				if shared.Limit > 0 {
					kind = "permit"
				}
				fmt.Fprintf(tw, "  %s\tid %s, holder %s, fence %s, acquired %s, expires %s\n", kind, h.LockIDHash, dash(h.Holder), fenceNum(h.Fence),
					ago(v.Time.Sub(h.AcquiredAt)), expires(h.ExpiresInMs, true))
			}
		}
		if !v.Schema.MarkColumns {
			fmt.Fprintf(tw, "exclusive waiting\tnot shown (schema v%d; needs v4)\n", v.Schema.Version)
			fmt.Fprintf(tw, "lock delay\tnot shown (schema v%d; needs v4)\n", v.Schema.Version)
		} else {
			ew := "no"
			for _, m := range v.Marks {
				if m.Mark == markExclusiveWaiting {
					ew = "yes: a writer waits for the key; new shared holds are refused until " + until(m.Until, v.Time) + ", unless it tries again"
				}
			}
			fmt.Fprintf(tw, "exclusive waiting\t%s\n", ew)
			ld := "none in force"
			switch {
			case delay != nil && delay.Source == "revoke":
				ld = "not grantable before " + until(delay.Until, v.Time) + ": a revoke's delay"
			case delay != nil:
				ld = "not grantable before " + until(delay.Until, v.Time) + ": the expired lease's lock delay"
			}
			if len(v.Leases.Rows) == 1 && v.Leases.Rows[0].LockDelayMs > 0 && v.Leases.Rows[0].Live {
				ld += fmt.Sprintf("; the lease's lock delay is %s (if it expires unreleased, the key is not grantable before its expiry + %[1]s)",
					short(time.Duration(v.Leases.Rows[0].LockDelayMs)*time.Millisecond))
			}
			fmt.Fprintf(tw, "lock delay\t%s\n", ld)
		}
		acq := fmt.Sprintf("%d waiting in the database", len(waiters))
		for _, x := range waiters {
			acq += fmt.Sprintf("; pid %d (%s) since %s", x.PID, dash(x.Application), short(time.Duration(x.WaitingMs)*time.Millisecond))
		}
		fmt.Fprintf(tw, "acquires in progress\t%s\n", acq)
		wm := "none"
		if len(managers) > 0 {
			wm = fmt.Sprintf("%d (listening sessions' pids %s)", len(managers), pids(managers))
		}
		fmt.Fprintf(tw, "waiting Managers\t%s\n", wm)
		wm = "none"
		if len(watchers) > 0 {
			wm = fmt.Sprintf("%d (listening sessions' pids %s)", len(watchers), pids(watchers))
		}
		fmt.Fprintf(tw, "watching Managers\t%s\n", wm)
		gt := "none"
		if len(v.GuardedTables) > 0 {
			gt = joinGuarded(v.GuardedTables) + ": writes of the key's rows need its live exclusive lease"
		}
		fmt.Fprintf(tw, "guarded tables\t%s\n", gt)
		tw.Flush()
		fmt.Fprintln(a.stdout, "(a pglease Manager queues its callers in process: it shows up among the waiting Managers while they wait,\n"+
			"and among the acquires in progress only while an attempt runs)")
	}
	if len(v.Leases.Rows) == 0 && shared.Count == 0 {
		return fail(exitNotFound, "")
	}
	return nil
}

// countTables is how many of s.Missing's first entries are lease tables
// (collect lists the lock and fence counter tables first).
func countTables(s *schemaView) int {
	n := 0
	if !s.LockTable {
		n++
	}
	if !s.FenceTable {
		n++
	}
	return n
}

func mustNFC(key string) string {
	k, err := keys.NormalizeKey(key)
	if err != nil {
		return key
	}
	return k
}
