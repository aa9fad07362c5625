package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
)

// inspectCmd is pglease inspect KEY: one key's snapshot.
type inspectCmd struct {
	a *app
	o viewOpts
}

func inspectFlags(a *app, fs *flag.FlagSet) runFunc {
	c := &inspectCmd{a: a}
	a.viewFlags(fs, &c.o)
	return c.run
}

func (c *inspectCmd) run(ctx context.Context, args []string) error {
	a, o := c.a, &c.o
	if len(args) != 1 {
		return fail(exitUsage, "inspect takes one KEY (got %d arguments)", len(args))
	}
	key := args[0]
	if _, err := keys.NormalizeKey(key); err != nil {
		return fail(exitUsage, "%v", err)
	}
	if err := o.check(&a.c); err != nil {
		return err
	}
	reg, err := a.loadRegistry(o)
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
	v, err := collect(cctx, pool, st, reg, o, store.ListOptions{Key: key}, &a.c)
	if err != nil {
		return err
	}
	if !v.Schema.LockTable || !v.Schema.FenceTable {
		return fail(exitSchema, "no lease tables (missing: %s): %s", strings.Join(v.Schema.Missing[:countTables(&v.Schema)], ", "), howToSetup)
	}
	kv, err := readKey(cctx, pool, st, v, key, o.showKeys)
	if err != nil {
		return err
	}
	if o.json {
		if err := json.NewEncoder(a.stdout).Encode(kv); err != nil {
			return err
		}
	} else {
		printInspect(a.stdout, kv)
	}
	if !kv.found && kv.Shared.Count == 0 && kv.queueLen == 0 {
		return fail(exitNotFound, "")
	}
	return nil
}

// readKey is the model of inspect: what the snapshot v (of key only) shows
// of key, with the key's fence counter and the Managers waiting for and
// watching it (the holders of its waiter and watch locks).
func readKey(ctx context.Context, pool *pgxpool.Pool, st *store.Store, v *snapshotView, key string, showKeys bool) (*keyView, error) {
	fc, ok, err := st.FenceCounter(ctx, key)
	if err != nil {
		return nil, err
	}
	var counter *string
	if ok {
		s := fc.String()
		counter = &s
	}
	nk := mustNFC(key)
	var ht int32
	if err := pool.QueryRow(ctx, "SELECT hashtext($1)", nk).Scan(&ht); err != nil {
		return nil, err
	}
	return newKeyView(v, nk, counter, ht, showKeys), nil
}

// newKeyView picks key nk's parts of the snapshot v: nk's fence counter
// is counter (nil: never granted), ht its hashtext.
func newKeyView(v *snapshotView, nk string, counter *string, ht int32, showKeys bool) *keyView {
	hash := pglease.HashKey(nk)
	kv := &keyView{KeyHash: hash, FenceCounter: counter, Marks: v.Marks, Acquires: []advisoryView{},
		WaitingManagers: []int32{}, WatchingManagers: []int32{}, GuardedTables: v.GuardedTables, Schema: v.Schema,
		Shared: sharedKeyView{KeyHash: hash, Kind: "none", Holders: []sharedHoldView{}}, Queue: []queuedView{},
		time: v.Time, found: len(v.Leases.Rows) > 0}
	if len(v.Leases.Rows) == 1 {
		v.Leases.Rows[0].FenceCounter = counter
		kv.Lease = &v.Leases.Rows[0]
	}
	// The acquires waiting for this key: waiters on its advisory lock.
	for _, l := range v.Advisory {
		if l.Name == "lease acquire "+hash {
			kv.Acquires = append(kv.Acquires, l)
		}
	}
	for _, w := range v.WaitingManagers {
		if w.Hashtext == ht {
			kv.WaitingManagers = w.PIDs
		}
	}
	for _, w := range v.WatchingManagers {
		if w.Hashtext == ht {
			kv.WatchingManagers = w.PIDs
		}
	}
	if len(v.Shared.Rows) == 1 {
		kv.Shared = v.Shared.Rows[0]
	}
	if len(v.Queue.Rows) == 1 {
		kv.Queue, kv.queueLen = v.Queue.Rows[0].Tickets, v.Queue.Rows[0].Length
	}
	if showKeys {
		kv.Key, kv.Shared.Key = nk, nk
	}
	return kv
}

// lockDelay is the key's lock delay in force, nil if none.
func (kv *keyView) lockDelay() *markView {
	var delay *markView
	for i, m := range kv.Marks {
		if m.Mark == markLockDelay {
			delay = &kv.Marks[i]
		}
	}
	return delay
}

// printInspect is inspect's text view.
func printInspect(w io.Writer, kv *keyView) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	name := kv.KeyHash
	if kv.Key != "" {
		name = fmt.Sprintf("%q (hash %s)", kv.Key, name)
	}
	fmt.Fprintf(tw, "key\t%s\n", name)
	if kv.FenceCounter != nil {
		fmt.Fprintf(tw, "fence counter\t%s (the last fence granted; the next grant gets a higher one)\n", strings.TrimLeft(*kv.FenceCounter, "0"))
	} else {
		fmt.Fprintln(tw, "fence counter\tnone (never granted)")
	}
	printKeyLease(tw, kv)
	printKeyShared(tw, kv)
	printKeyMarks(tw, kv)
	printKeyQueue(tw, kv)
	printKeyWaiters(tw, kv)
	tw.Flush()
	fmt.Fprintln(w, "(a pglease Manager's waiting callers show in the queue while they hold a ticket in the database (the fair queue);\n"+
		"the Manager shows up among the waiting Managers while they wait, and among the acquires in progress only while an attempt runs)")
}

// printKeyLease prints the key's exclusive lease, or what its absence
// leaves the key as.
func printKeyLease(tw io.Writer, kv *keyView) {
	// free is what an absent or expired lease leaves the key as.
	free := "free"
	switch {
	case kv.lockDelay() != nil:
		free = "no holder, but a lock delay holds the key off (see lock delay)"
	case kv.Shared.Count > 0:
		free = "no exclusive holder (see shared holds)"
	}
	if kv.Lease == nil {
		fmt.Fprintf(tw, "lease\tnone: %s\n", free)
		return
	}
	l := kv.Lease
	state := "live, expires in " + short(time.Duration(l.ExpiresInMs)*time.Millisecond)
	switch {
	case !l.Live && kv.lockDelay() != nil:
		state = "expired " + short(-time.Duration(l.ExpiresInMs)*time.Millisecond) + " ago: " + free
	case !l.Live:
		state = "expired " + short(-time.Duration(l.ExpiresInMs)*time.Millisecond) + " ago: " + free + ", the next acquire overwrites it"
	case l.ExpiresInMs <= 0 && l.LockDelayMs > keys.TimeToleranceMs:
		state = "expired, inside its lock delay: not grantable before " +
			until(l.ExpiresAt.Add(time.Duration(l.LockDelayMs)*time.Millisecond), kv.time)
	case l.ExpiresInMs <= 0:
		state = "expired, within the 1 s tolerance: free for acquirers in under a second"
	}
	fmt.Fprintf(tw, "lease\t%s\n", state)
	fmt.Fprintf(tw, "holder\t%s\n", dash(l.Holder))
	fmt.Fprintf(tw, "fence\t%s\n", strings.TrimLeft(l.Fence, "0"))
	fmt.Fprintf(tw, "acquired\t%s (%s)\n", l.AcquiredAt.Format(time.RFC3339Nano), ago(kv.time.Sub(l.AcquiredAt)))
	fmt.Fprintf(tw, "expires\t%s\n", l.ExpiresAt.Format(time.RFC3339Nano))
}

// printKeyShared prints the key's shared holds.
func printKeyShared(tw io.Writer, kv *keyView) {
	if !kv.Schema.SharedTable {
		fmt.Fprintf(tw, "shared holds\tnot shown: no shared-hold table (schema v%d; readers and semaphore permits need v4)\n", kv.Schema.Version)
		return
	}
	shared := kv.Shared
	fmt.Fprintf(tw, "shared holds\t%s\n", shared.held())
	for _, h := range shared.Holders {
		kind := "reader"
		if shared.Limit > 0 {
			kind = "permit"
		}
		fmt.Fprintf(tw, "  %s\tid %s, holder %s, fence %s, acquired %s, expires %s\n", kind, h.LockIDHash, dash(h.Holder), fenceNum(h.Fence),
			ago(kv.time.Sub(h.AcquiredAt)), expires(h.ExpiresInMs, true))
	}
}

// printKeyMarks prints the key's exclusive-waiting mark and lock delays.
func printKeyMarks(tw io.Writer, kv *keyView) {
	if !kv.Schema.MarkColumns {
		fmt.Fprintf(tw, "exclusive waiting\tnot shown (schema v%d; needs v4)\n", kv.Schema.Version)
		fmt.Fprintf(tw, "lock delay\tnot shown (schema v%d; needs v4)\n", kv.Schema.Version)
		return
	}
	ew := "no"
	for _, m := range kv.Marks {
		if m.Mark == markExclusiveWaiting {
			ew = "yes: a writer waits for the key; new shared holds are refused until " + until(m.Until, kv.time) + ", unless it tries again"
		}
	}
	fmt.Fprintf(tw, "exclusive waiting\t%s\n", ew)
	ld := "none in force"
	switch delay := kv.lockDelay(); {
	case delay != nil && delay.Source == "revoke":
		ld = "not grantable before " + until(delay.Until, kv.time) + ": a revoke's delay"
	case delay != nil:
		ld = "not grantable before " + until(delay.Until, kv.time) + ": the expired lease's lock delay"
	}
	if l := kv.Lease; l != nil && l.LockDelayMs > 0 && l.Live {
		ld += fmt.Sprintf("; the lease's lock delay is %s (if it expires unreleased, the key is not grantable before its expiry + %[1]s)",
			short(time.Duration(l.LockDelayMs)*time.Millisecond))
	}
	fmt.Fprintf(tw, "lock delay\t%s\n", ld)
}

// printKeyWaiters prints who waits for and watches the key, and the
// guarded tables.
func printKeyWaiters(tw io.Writer, kv *keyView) {
	acq := fmt.Sprintf("%d waiting in the database", len(kv.Acquires))
	for _, x := range kv.Acquires {
		acq += fmt.Sprintf("; pid %d (%s) since %s", x.PID, dash(x.Application), short(time.Duration(x.WaitingMs)*time.Millisecond))
	}
	fmt.Fprintf(tw, "acquires in progress\t%s\n", acq)
	fmt.Fprintf(tw, "waiting Managers\t%s\n", listeningPIDs(kv.WaitingManagers))
	fmt.Fprintf(tw, "watching Managers\t%s\n", listeningPIDs(kv.WatchingManagers))
	gt := "none"
	if len(kv.GuardedTables) > 0 {
		gt = joinGuarded(kv.GuardedTables) + ": writes of the key's rows need its live exclusive lease"
	}
	fmt.Fprintf(tw, "guarded tables\t%s\n", gt)
}

// listeningPIDs counts and lists the Managers' listening sessions.
func listeningPIDs(ps []int32) string {
	if len(ps) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d (listening sessions' pids %s)", len(ps), pids(ps))
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
