package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg/advisory"
)

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

// releaseCmd is pglease release: revoke a lease or shared holds, ask a
// key's holders to release it, or end an advisory holder's session.
type releaseCmd struct {
	a                   *app
	key, lockID         string
	pid                 int
	yes, force, request bool
	delay               time.Duration
	hold, channel       string
}

func releaseFlags(a *app, fs *flag.FlagSet) runFunc {
	c := &releaseCmd{a: a}
	fs.StringVar(&c.key, "key", "", "revoke the lease on KEY (its holder is told at once)")
	fs.StringVar(&c.lockID, "lock-id", "", "revoke the lease with this lockId")
	fs.IntVar(&c.pid, "pid", 0, "terminate this backend, which holds advisory locks (pg_terminate_backend)")
	fs.BoolVar(&c.yes, "yes", false, "do not ask for confirmation")
	fs.BoolVar(&c.force, "force", false, "revoke a lease that has not expired (its holder loses it)")
	fs.DurationVar(&c.delay, "delay", 0, "with --key or --lock-id: a lock delay, no acquire takes the key for `D` after the revoke\n"+
		"(default: the lease's own lock delay, if it has one)")
	fs.BoolVar(&c.request, "request", false, "with --key: only ask the key's holders to release it (cooperative: nothing is deleted, the holder decides)")
	fs.StringVar(&c.hold, "hold", "", "with --key: only the hold with this `ID` (a reader's or permit's id as pglease inspect shows it, the\n"+
		"lock_id_hash of the leases view, or a Lock.GrantID); default: every hold of the key (its lease, or all its readers or permits)")
	fs.StringVar(&c.channel, "notify-channel", manager.DefaultNotifyChannel, "the channel the Managers listen on (manager.Config.NotifyChannel): the holder is told there")
	return c.run
}

// checkTarget checks what release acts on: exactly one of --key,
// --lock-id and --pid, each well-formed.
func (c *releaseCmd) checkTarget(args []string) error {
	n := 0
	for _, set := range []bool{c.key != "", c.lockID != "", c.pid != 0} {
		if set {
			n++
		}
	}
	if n != 1 || len(args) != 0 {
		return fail(exitUsage, "release takes exactly one of --key, --lock-id, --pid, and no arguments")
	}
	if c.key != "" {
		if _, err := keys.NormalizeKey(c.key); err != nil {
			return fail(exitUsage, "%v", err)
		}
	}
	if c.lockID != "" {
		if err := keys.ValidateLockID(c.lockID); err != nil {
			return fail(exitUsage, "%v", err)
		}
	}
	if c.pid < 0 || c.pid > 1<<31-1 {
		return fail(exitUsage, "--pid out of range")
	}
	return nil
}

// checkOptions checks the flags that shape the release.
func (c *releaseCmd) checkOptions() error {
	switch {
	case c.delay < 0 || c.delay%time.Millisecond != 0 || c.delay > keys.MaxTTL():
		return fail(exitUsage, "--delay must be a whole number of milliseconds, 0..%v", keys.MaxTTL())
	case c.delay != 0 && c.pid != 0:
		return fail(exitUsage, "--delay is for a lease (--key or --lock-id), not --pid")
	case c.request && c.key == "":
		return fail(exitUsage, "--request asks the holders of a key: it needs --key")
	case c.request && (c.delay != 0 || c.force):
		return fail(exitUsage, "--request deletes nothing: it takes no --force or --delay")
	case c.hold != "" && c.key == "":
		return fail(exitUsage, "--hold names one hold of a key: it needs --key")
	case c.hold != "" && !store.ValidHold(c.hold):
		return fail(exitUsage, "--hold must be a hold's id (24 lowercase hex digits, as pglease inspect shows) or a grant id (64)")
	}
	if err := store.CheckChannel("", c.channel); err != nil {
		return fail(exitUsage, "--notify-channel must match "+store.ChannelRule)
	}
	return nil
}

func (c *releaseCmd) run(ctx context.Context, args []string) error {
	a := c.a
	if err := c.checkTarget(args); err != nil {
		return err
	}
	if err := c.checkOptions(); err != nil {
		return err
	}
	pool, st, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cctx, cancel := a.withTimeout(ctx)
	defer cancel()
	if c.pid != 0 {
		return a.terminate(cctx, pool, int32(c.pid), c.yes)
	}
	cfg := store.Config(a.c.config())
	cfg.NotifyChannel = c.channel
	if c.request {
		return a.requestRelease(cctx, pool, st, cfg, c.key, c.hold)
	}
	r := &revocation{a: a, pool: pool, st: st, cfg: cfg, key: c.key, lockID: c.lockID, hold: c.hold, delay: c.delay, force: c.force, yes: c.yes}
	return r.revoke(cctx)
}

// revocation is one revoke of release: its target and options.
type revocation struct {
	a           *app
	pool        *pgxpool.Pool
	st          *store.Store
	cfg         store.Config
	key, lockID string
	hold        string
	delay       time.Duration
	force, yes  bool
}

// revoke revokes the lease of key (or of lockID), or, when the key has no
// live exclusive lease, its live shared holds (revokeShared); hold, if not
// "", picks one. store.Revoke runs in a transaction that commits only when
// it revoked the very grants shown (and confirmed); a grant of the key made
// meanwhile is left alone.
func (r *revocation) revoke(ctx context.Context) error {
	a := r.a
	list, err := r.st.ListLeases(ctx, store.ListOptions{Key: r.key, LockID: r.lockID})
	if err != nil {
		return err
	}
	var row store.LeaseRow
	if len(list.Rows) > 0 {
		row = list.Rows[0]
	}
	left := row.ExpiresAt.Sub(list.Now)
	if len(list.Rows) == 0 || !row.Live || left <= 0 || !store.HoldMatches(r.hold, row.LockID) {
		return r.notLive(ctx, list, row)
	}
	holder := dash(row.Holder)
	fence := strings.TrimLeft(row.Fence.String(), "0")
	consequence := r.consequence(ctx, row, holder, fence)
	if !r.force {
		return fail(exitRefused, "refusing: lease %s is held by %s and expires in %s. Revoking it: %s Rerun with --force to revoke it anyway "+
			"(or --request to ask the holder to release it).", row.KeyHash, holder, short(left), consequence)
	}
	fmt.Fprintf(a.stderr, "lease %s: holder %s, fence %s, expires in %s.\nIf revoked, %s\n", row.KeyHash, holder, fence, short(left), consequence)
	if !r.yes && !a.confirm("Revoke it?") {
		return fail(exitRefused, "not revoked (not confirmed; --yes skips the question)")
	}
	res, err := revokeGrant(ctx, r.pool, r.cfg, row.Key, row.LockIDHash, r.delay)
	r.audit(row, left, res, err)
	switch {
	case err != nil:
		return err
	case res.other && r.lockID != "":
		return fail(exitNotFound, "the lease was released or expired meanwhile, and the key granted again: nothing revoked")
	case res.other:
		return fail(exitRefused, "the key changed hands after it was shown (now fence %s): nothing revoked; run again to revoke the new holder",
			strings.TrimLeft(res.Fences[0].String(), "0"))
	case !res.ok:
		return fail(exitNotFound, "the lease was released or expired meanwhile: nothing revoked")
	}
	fmt.Fprintf(a.stdout, "revoked lease %s (fence %s, holder %s); its holder was told on channel %s", row.KeyHash, fence, holder, r.cfg.NotifyChannel)
	if !res.DelayUntil.IsZero() {
		fmt.Fprintf(a.stdout, "; not grantable before %s", res.DelayUntil.UTC().Format(time.RFC3339Nano))
	}
	fmt.Fprintln(a.stdout)
	return nil
}

// notLive answers a revoke that found no live exclusive lease to revoke:
// the key's shared holds are revoked instead if it has some, otherwise
// it says why there is nothing to revoke.
func (r *revocation) notLive(ctx context.Context, list *store.LeaseList, row store.LeaseRow) error {
	if r.key != "" {
		holds, err := r.a.sharedHolds(ctx, r.pool, r.st, r.key, r.hold)
		if err != nil {
			return err
		}
		if len(holds) > 0 {
			return r.revokeShared(ctx, holds)
		}
	}
	switch {
	case len(list.Rows) == 0 && r.hold != "":
		return fail(exitNotFound, "no live hold %s of %s: nothing to revoke", r.hold, pglease.HashKey(mustNFC(r.key)))
	case len(list.Rows) == 0:
		return fail(exitNotFound, "no such lease: nothing to revoke")
	case !store.HoldMatches(r.hold, row.LockID):
		return fail(exitNotFound, "no live hold %s of %s: nothing to revoke", r.hold, row.KeyHash)
	}
	return fail(exitNotFound, "%s", r.a.expiredState(ctx, r.pool, r.st, row, list.Now))
}

// consequence says what revoking the lease row does to its holder.
func (r *revocation) consequence(ctx context.Context, row store.LeaseRow, holder, fence string) string {
	after := ""
	switch own := r.ownDelay(ctx, row); {
	case r.delay > 0:
		after = fmt.Sprintf(" No acquire (exclusive or shared) takes the key for %s after the revoke (--delay).", short(r.delay))
	case own > 0:
		after = fmt.Sprintf(" The lease's own lock delay keeps every acquire off the key for %s after the revoke.", short(own))
	}
	return fmt.Sprintf("the holder (%s) loses it at once: a pglease Manager listening on channel %s is told and ends the lock's Context "+
		"with ErrRevoked (CodeRevoked) right away; a holder that does not hear it (a SyncGuard process, an older pglease, another channel) "+
		"keeps working until its next extend fails — for a pglease Manager within a third of its TTL — and then sees its lock lost (ErrLockLost). "+
		"The next holder gets a fence above %s, so the old holder's fenced writes are refused from then on.%s The fence counter is not touched.",
		holder, r.cfg.NotifyChannel, fence, after)
}

// ownDelay is the lease's own lock delay, which applies when --delay is
// not given (0 then, or when it cannot be read).
func (r *revocation) ownDelay(ctx context.Context, row store.LeaseRow) time.Duration {
	if r.delay != 0 {
		return 0
	}
	if _, cols, err := probeV4(ctx, r.pool, r.st.Names()); err != nil || !cols {
		return 0
	}
	m, err := readMarks(ctx, r.pool, r.st.Names(), row.Key, false)
	if err != nil {
		return 0
	}
	if km, ok := m[row.KeyHash]; ok {
		return time.Duration(km.lockDelayMs) * time.Millisecond
	}
	return 0
}

// audit writes the audit record of a lease's revoke.
func (r *revocation) audit(row store.LeaseRow, left time.Duration, res revokeResult, err error) {
	result := "revoked"
	switch {
	case err != nil:
		result = "error"
	case res.other:
		result = "not revoked: the key changed hands"
	case !res.ok:
		result = "not held any more"
	}
	attrs := []any{"action", "revoke_lease", "key_hash", row.KeyHash, "lock_id_hash", row.LockIDHash, "holder", row.Holder, "fence", row.Fence.String(),
		"expires_in", left.String(), "forced", true, "delay", r.delay.String(), "notify_channel", r.cfg.NotifyChannel}
	if err == nil && res.ok && !res.DelayUntil.IsZero() {
		attrs = append(attrs, "not_grantable_before", res.DelayUntil.UTC().Format(time.RFC3339Nano))
	}
	r.a.auditLogger().Info("pglease release", append(attrs, "operator", operator(), "result", result)...)
}

// expiredState says why an exclusive lease that is no longer held for its
// holder (expired, perhaps within the tolerance or its lock delay) leaves
// nothing to revoke, and when acquirers can take the key.
func (a *app) expiredState(ctx context.Context, pool *pgxpool.Pool, st *store.Store, r store.LeaseRow, now time.Time) string {
	ago := short(now.Sub(r.ExpiresAt))
	// The key is free from expiry + max(1 s, the lease's lock delay), or
	// a revoke's delay's end if later.
	free := r.ExpiresAt.Add(time.Duration(keys.TimeToleranceMs) * time.Millisecond)
	whose := ""
	if _, cols, err := probeV4(ctx, pool, st.Names()); err == nil && cols {
		if m, err := readMarks(ctx, pool, st.Names(), r.Key, false); err == nil {
			if km, ok := m[r.KeyHash]; ok {
				if end := r.ExpiresAt.Add(time.Duration(km.lockDelayMs) * time.Millisecond); end.After(free) {
					free, whose = end, "its own"
				}
				for _, mk := range km.marks {
					if mk.Mark == markLockDelay && mk.Source == "revoke" && mk.Until.After(free) {
						free, whose = mk.Until, "a revoke's"
					}
				}
			}
		}
	}
	switch {
	case free.After(now) && whose != "":
		return fmt.Sprintf("lease %s expired %s ago, and it is still inside %s lock delay: no acquire gets the key before %s; "+
			"nothing to revoke (a revoke leaves an expired lease and its delay in place)", r.KeyHash, ago, whose, until(free, now))
	case free.After(now):
		return fmt.Sprintf("lease %s expired %s ago: it is no longer its holder's, and acquirers can take the key in %s "+
			"(the 1 s tolerance after expiry); nothing to revoke", r.KeyHash, ago, short(free.Sub(now)))
	}
	return fmt.Sprintf("lease %s expired %s ago: the key is free for acquirers (the next grant overwrites the row); nothing to revoke", r.KeyHash, ago)
}

// sharedHolds is key's live shared holds (the one named by hold, if not
// ""), none without a shared-hold table.
func (a *app) sharedHolds(ctx context.Context, pool *pgxpool.Pool, st *store.Store, key, hold string) ([]sharedHoldView, error) {
	shared, _, err := probeV4(ctx, pool, st.Names())
	if err != nil || !shared {
		return nil, err
	}
	sec, err := readShared(ctx, pool, st.Names(), mustNFC(key), store.MaxBatch, false)
	if err != nil || len(sec.Rows) == 0 {
		return nil, err
	}
	var out []sharedHoldView
	for _, h := range sec.Rows[0].Holders {
		if store.HoldMatches(hold, h.lockID) {
			out = append(out, h)
		}
	}
	return out, nil
}

// revokeShared revokes the shared holds shown (readers or permits of
// key), each by its id, in one transaction that commits only when every
// one of them was revoked.
func (r *revocation) revokeShared(ctx context.Context, holds []sharedHoldView) error {
	a := r.a
	hash := pglease.HashKey(mustNFC(r.key))
	var list []string
	for _, h := range holds {
		list = append(list, fmt.Sprintf("id %s (holder %s, fence %s, expires %s)", h.LockIDHash, dash(h.Holder), fenceNum(h.Fence), expires(h.ExpiresInMs, true)))
	}
	after := ""
	if r.delay > 0 {
		after = fmt.Sprintf(" No acquire (exclusive or shared) takes the key for %s after the revoke (--delay).", short(r.delay))
	}
	consequence := fmt.Sprintf("each holder loses its hold at once: a pglease Manager listening on channel %s is told and ends the lock's Context "+
		"with ErrRevoked (CodeRevoked) right away; one that does not hear it sees its lock lost (ErrLockLost) at its next extend, within a third "+
		"of its TTL. Their places are free for other acquirers at once.%s", r.cfg.NotifyChannel, after)
	what := fmt.Sprintf("%d shared hold(s) of %s: %s", len(holds), hash, strings.Join(list, "; "))
	if !r.force {
		return fail(exitRefused, "refusing: %s. Revoking: %s Rerun with --force to revoke (--hold ID picks one; --request asks the holders instead).",
			what, consequence)
	}
	fmt.Fprintf(a.stderr, "%s.\nIf revoked, %s\n", what, consequence)
	if !r.yes && !a.confirm("Revoke them?") {
		return fail(exitRefused, "not revoked (not confirmed; --yes skips the question)")
	}
	reqs := make([]store.RevokeRequest, len(holds))
	ids := make([]string, len(holds))
	for i, h := range holds {
		reqs[i] = store.RevokeRequest{Key: mustNFC(r.key), Hold: h.LockIDHash, Delay: r.delay}
		ids[i] = h.LockIDHash
	}
	n, until, err := revokeHolds(ctx, r.pool, r.cfg, reqs)
	r.auditShared(hash, ids, n, until, err)
	switch {
	case err != nil:
		return err
	case n < len(holds):
		return fail(exitNotFound, "%d of the %d holds shown were released or expired meanwhile: nothing revoked; run again", len(holds)-n, len(holds))
	}
	fmt.Fprintf(a.stdout, "revoked %d shared hold(s) of %s (%s); their holders were told on channel %s", n, hash, strings.Join(ids, ", "), r.cfg.NotifyChannel)
	if !until.IsZero() {
		fmt.Fprintf(a.stdout, "; not grantable before %s", until.UTC().Format(time.RFC3339Nano))
	}
	fmt.Fprintln(a.stdout)
	return nil
}

// auditShared writes the audit record of a revoke of the shared holds
// ids of the key hash: n of them revoked, the delay's end until.
func (r *revocation) auditShared(hash string, ids []string, n int, until time.Time, err error) {
	result := "revoked"
	switch {
	case err != nil:
		result = "error"
	case n < len(ids):
		result = "not revoked: some holds ended meanwhile"
	}
	attrs := []any{"action", "revoke_shared", "key_hash", hash, "lock_id_hashes", ids, "forced", true, "delay", r.delay.String(),
		"notify_channel", r.cfg.NotifyChannel}
	if err == nil && n == len(ids) && !until.IsZero() {
		attrs = append(attrs, "not_grantable_before", until.UTC().Format(time.RFC3339Nano))
	}
	r.a.auditLogger().Info("pglease release", append(attrs, "operator", operator(), "result", result)...)
}

// revokeHolds runs reqs (holds named) in a transaction, committed only
// when every one revoked its hold: how many did, and the latest delay end.
func revokeHolds(ctx context.Context, pool *pgxpool.Pool, cfg store.Config, reqs []store.RevokeRequest) (int, time.Time, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	ts, err := store.New("pg.New", tx, cfg)
	if err != nil {
		return 0, time.Time{}, err
	}
	rs, err := ts.Revoke(ctx, reqs)
	if err != nil {
		return 0, time.Time{}, err
	}
	n, until := 0, time.Time{}
	for _, r := range rs {
		n += r.Revoked
		if r.DelayUntil.After(until) {
			until = r.DelayUntil
		}
	}
	if n < len(reqs) {
		return n, until, tx.Rollback(ctx)
	}
	return n, until, tx.Commit(ctx)
}

// revokeResult is revokeGrant's answer.
type revokeResult struct {
	store.RevokeResult
	// ok: the grant shown was revoked.
	ok bool
	// other: a live grant of the key other than the one shown was found
	// (and left alone: the transaction rolled back).
	other bool
}

// revokeGrant revokes key's lease if it is still the grant whose lockId
// hash is lockIDHash: store.Revoke in a transaction, committed only then
// (the revoke's notifications go out at the commit), rolled back
// otherwise.
func revokeGrant(ctx context.Context, pool *pgxpool.Pool, cfg store.Config, key, lockIDHash string, delay time.Duration) (revokeResult, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return revokeResult{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	ts, err := store.New("pg.New", tx, cfg)
	if err != nil {
		return revokeResult{}, err
	}
	rs, err := ts.Revoke(ctx, []store.RevokeRequest{{Key: key, Hold: lockIDHash, Delay: delay}})
	if err != nil {
		return revokeResult{}, err
	}
	r := revokeResult{RevokeResult: rs[0]}
	r.ok = r.Revoked == 1 && r.Exclusive
	if r.ok {
		return r, tx.Commit(ctx)
	}
	// Not revoked: is the key held by another grant now?
	list, err := ts.ListLeases(ctx, store.ListOptions{Key: key})
	if err != nil {
		return r, err
	}
	if len(list.Rows) == 1 && list.Rows[0].Live && list.Rows[0].LockIDHash != lockIDHash {
		r.other, r.Fences = true, []pglease.Fence{list.Rows[0].Fence}
	}
	return r, tx.Rollback(ctx)
}

// requestRelease asks the holders of key to release it: store.RequestRelease
// ("q:" on the channel), nothing deleted. Nobody holding the key is
// exitNotFound, nothing sent.
func (a *app) requestRelease(ctx context.Context, pool *pgxpool.Pool, st *store.Store, cfg store.Config, key, hold string) error {
	hash := pglease.HashKey(mustNFC(key))
	list, err := st.ListLeases(ctx, store.ListOptions{Key: key})
	if err != nil {
		return err
	}
	holder, exclusive := "", false
	if len(list.Rows) == 1 && list.Rows[0].Live && list.Rows[0].ExpiresAt.After(list.Now) && store.HoldMatches(hold, list.Rows[0].LockID) {
		holder, exclusive = list.Rows[0].Holder, true
	}
	holds, err := a.sharedHolds(ctx, pool, st, key, hold)
	if err != nil {
		return err
	}
	shared := len(holds)
	if !exclusive && shared == 0 && hold != "" {
		return fail(exitNotFound, "no live hold %s of %s: no request sent", hold, hash)
	}
	if !exclusive && shared == 0 {
		return fail(exitNotFound, "nobody holds %s: no request sent", hash)
	}
	rs, err := store.New("pg.New", pool, cfg)
	if err != nil {
		return err
	}
	err = rs.RequestRelease(ctx, []string{key}, []string{hold})
	result := "sent"
	if err != nil {
		result = "error"
	}
	a.auditLogger().Info("pglease release", "action", "request_release", "key_hash", hash, "holder", holder, "exclusive", exclusive,
		"shared_holds", shared, "notify_channel", cfg.NotifyChannel, "operator", operator(), "result", result)
	if err != nil {
		return err
	}
	var who []string
	if exclusive {
		who = append(who, "the exclusive holder "+dash(holder))
	}
	if shared > 0 {
		who = append(who, fmt.Sprintf("%d shared holder(s)", shared))
	}
	fmt.Fprintf(a.stdout, "asked the holders of %s to release it (%s), on channel %s: nothing was deleted; the holder decides "+
		"(a pglease Manager closes the lock's ReleaseRequested channel)\n", hash, strings.Join(who, " and "), cfg.NotifyChannel)
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
