package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg/advisory"
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
	// The acquires waiting for this key: waiters on its advisory lock.
	waiters := []advisoryView{}
	for _, l := range v.Advisory {
		if len(v.Leases.Rows) == 1 && l.Name == "lease acquire "+v.Leases.Rows[0].KeyHash {
			waiters = append(waiters, l)
		}
	}
	// The Managers waiting for it: holders of its waiter lock.
	var ht int32
	if err := pool.QueryRow(cctx, "SELECT hashtext($1)", nk).Scan(&ht); err != nil {
		return err
	}
	managers := []int32{}
	for _, w := range v.WaitingManagers {
		if w.Hashtext == ht {
			managers = w.PIDs
		}
	}
	if o.json {
		out := struct {
			KeyHash         string         `json:"key_hash"`
			Key             string         `json:"key,omitempty"`
			Lease           *leaseView     `json:"lease"`
			FenceCounter    *string        `json:"fence_counter"`
			Acquires        []advisoryView `json:"acquires_in_progress"`
			WaitingManagers []int32        `json:"waiting_manager_pids"`
		}{KeyHash: pglease.HashKey(nk), FenceCounter: counter, Acquires: waiters, WaitingManagers: managers}
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
		name := pglease.HashKey(nk)
		if o.showKeys {
			name = fmt.Sprintf("%q (hash %s)", nk, name)
		}
		fmt.Fprintf(tw, "key\t%s\n", name)
		if counter != nil {
			fmt.Fprintf(tw, "fence counter\t%s (the last fence granted; the next grant gets a higher one)\n", strings.TrimLeft(*counter, "0"))
		} else {
			fmt.Fprintln(tw, "fence counter\tnone (never granted)")
		}
		if len(v.Leases.Rows) == 0 {
			fmt.Fprintln(tw, "lease\tnone: free")
		} else {
			l := v.Leases.Rows[0]
			state := "live, expires in " + short(time.Duration(l.ExpiresInMs)*time.Millisecond)
			switch {
			case !l.Live:
				state = "expired " + short(-time.Duration(l.ExpiresInMs)*time.Millisecond) + " ago: free, the next acquire overwrites it"
			case l.ExpiresInMs <= 0:
				state = "expired, within the 1 s tolerance: free for acquirers in under a second"
			}
			fmt.Fprintf(tw, "lease\t%s\n", state)
			fmt.Fprintf(tw, "holder\t%s\n", dash(l.Holder))
			fmt.Fprintf(tw, "fence\t%s\n", strings.TrimLeft(l.Fence, "0"))
			fmt.Fprintf(tw, "acquired\t%s (%s)\n", l.AcquiredAt.Format(time.RFC3339Nano), ago(v.Time.Sub(l.AcquiredAt)))
			fmt.Fprintf(tw, "expires\t%s\n", l.ExpiresAt.Format(time.RFC3339Nano))
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
		tw.Flush()
		fmt.Fprintln(a.stdout, "(a pglease Manager queues its callers in process: it shows up among the waiting Managers while they wait,\n"+
			"and among the acquires in progress only while an attempt runs)")
	}
	if len(v.Leases.Rows) == 0 {
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

// auditLogger writes the one audit record of a release: JSON to stderr.
func (a *app) auditLogger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(a.stderr, nil))
}

func operator() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return os.Getenv("USER")
}

// confirm asks on stderr and reads the answer from stdin; only "y" or
// "yes" confirms (EOF does not).
func (a *app) confirm(question string) bool {
	fmt.Fprintf(a.stderr, "%s [y/N] ", question)
	line, _ := bufio.NewReader(a.stdin).ReadString('\n')
	if !a.stdinTerminal { // the answer was not echoed: end the prompt's line
		fmt.Fprintln(a.stderr)
	}
	ans := strings.ToLower(strings.TrimSpace(line))
	return ans == "y" || ans == "yes"
}

func (a *app) release(ctx context.Context, args []string) error {
	fs := a.flags("release", "(--key KEY | --lock-id ID | --pid PID)")
	key := fs.String("key", "", "release the lease on KEY")
	lockID := fs.String("lock-id", "", "release the lease with this lockId")
	pid := fs.Int("pid", 0, "terminate this backend, which holds advisory locks (pg_terminate_backend)")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	force := fs.Bool("force", false, "release a lease that has not expired (its holder loses it)")
	if err := parse(fs, args); err != nil {
		return err
	}
	n := 0
	for _, set := range []bool{*key != "", *lockID != "", *pid != 0} {
		if set {
			n++
		}
	}
	if n != 1 || fs.NArg() != 0 {
		return fail(exitUsage, "release takes exactly one of --key, --lock-id, --pid, and no arguments")
	}
	if *key != "" {
		if _, err := keys.NormalizeKey(*key); err != nil {
			return fail(exitUsage, "%v", err)
		}
	}
	if *lockID != "" {
		if err := keys.ValidateLockID(*lockID); err != nil {
			return fail(exitUsage, "%v", err)
		}
	}
	if *pid < 0 || *pid > 1<<31-1 {
		return fail(exitUsage, "--pid out of range")
	}
	pool, st, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cctx, cancel := a.withTimeout(ctx)
	defer cancel()
	if *pid != 0 {
		return a.terminate(cctx, pool, int32(*pid), *yes)
	}
	list, err := st.ListLeases(cctx, store.ListOptions{Key: *key, LockID: *lockID})
	if err != nil {
		return err
	}
	if len(list.Rows) == 0 {
		return fail(exitNotFound, "no such lease: nothing to release")
	}
	r := list.Rows[0]
	left := r.ExpiresAt.Sub(list.Now)
	holder := dash(r.Holder)
	if !r.Live || left <= 0 {
		return fail(exitNotFound, "lease %s expired %s ago: it is already free for acquirers (within the 1 s tolerance); nothing to release", r.KeyHash, short(-left))
	}
	consequence := fmt.Sprintf("the holder (%s) keeps working until its next extend fails — for a pglease Manager within a third of its TTL — "+
		"and then sees its lock lost (Context ended, ErrLockLost); the next holder gets a fence above %s, so the old holder's fenced writes "+
		"are refused from then on. The fence counter is not touched.", holder, strings.TrimLeft(r.Fence.String(), "0"))
	if !*force {
		return fail(exitRefused, "refusing: lease %s is held by %s and expires in %s. Releasing it: %s Rerun with --force to release it anyway.",
			r.KeyHash, holder, short(left), consequence)
	}
	fmt.Fprintf(a.stderr, "lease %s: holder %s, fence %s, expires in %s.\nIf released, %s\n", r.KeyHash, holder, strings.TrimLeft(r.Fence.String(), "0"), short(left), consequence)
	if !*yes && !a.confirm("Release it?") {
		return fail(exitRefused, "not released (not confirmed; --yes skips the question)")
	}
	ok, err := st.Release(cctx, r.LockID)
	result := "released"
	switch {
	case err != nil:
		result = "error"
	case !ok:
		result = "not held any more"
	}
	a.auditLogger().Info("pglease release", "action", "release_lease", "key_hash", r.KeyHash, "lock_id_hash", r.LockIDHash,
		"holder", r.Holder, "fence", r.Fence.String(), "expires_in", left.String(), "forced", true, "operator", operator(), "result", result)
	if err != nil {
		return err
	}
	if !ok {
		return fail(exitNotFound, "the lease was released or expired meanwhile: nothing released")
	}
	fmt.Fprintf(a.stdout, "released lease %s (fence %s, holder %s)\n", r.KeyHash, strings.TrimLeft(r.Fence.String(), "0"), holder)
	return nil
}

// terminate ends a backend that holds advisory locks.
func (a *app) terminate(ctx context.Context, pool *pgxpool.Pool, pid int32, yes bool) error {
	locks, err := advisory.Inspect(ctx, pool, nil)
	if err != nil {
		return err
	}
	var held []string
	app := ""
	for _, l := range locks {
		if l.PID == pid && l.Granted {
			held = append(held, l.Key.String())
			app = l.ApplicationName
		}
	}
	if len(held) == 0 {
		return fail(exitNotFound, "backend %d holds no advisory lock in this database: nothing to release", pid)
	}
	fmt.Fprintf(a.stderr, "backend %d (application %s) holds %d advisory lock(s): %s.\n"+
		"If terminated, its session ends: the server frees all its session and transaction locks at once, its open transaction "+
		"rolls back, and its client gets a connection error (a pglease advisory.Session sees its locks lost, ErrLockLost, at once or "+
		"within its probe interval).\n", pid, dash(app), len(held), strings.Join(held, " "))
	if !yes && !a.confirm("Terminate backend "+strconv.Itoa(int(pid))+"?") {
		return fail(exitRefused, "not terminated (not confirmed; --yes skips the question)")
	}
	var ok bool
	err = pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok)
	result := "terminated"
	if err != nil {
		result = "error"
	} else if !ok {
		result = "not terminated"
	}
	a.auditLogger().Info("pglease release", "action", "terminate_backend", "pid", pid, "application", app,
		"advisory_keys", held, "operator", operator(), "result", result)
	if err != nil {
		return fmt.Errorf("pg_terminate_backend: %w (needs superuser, pg_signal_backend, or the same role)", err)
	}
	if !ok {
		return fail(exitNotFound, "backend %d was gone already", pid)
	}
	fmt.Fprintf(a.stdout, "terminated backend %d (held %s)\n", pid, strings.Join(held, " "))
	return nil
}
