// Package store is the lease-table implementation behind package pg and
// the Manager: SyncGuard-compatible lease-lock operations, one statement
// (one round trip) each, single and batched, and what the Manager and the
// CLI need beyond them (handoff, waiter locks, release notification,
// listings, holder identities, the schema version check). Package pg
// exposes the single operations users call without a Manager; the design
// and the guarantees are described there (pg/doc.go).
//
// Schema version 4 adds, each a batch in one statement with per-item
// results: shared holds (AcquireSharedMany: readers and semaphore
// permits, released and extended like exclusive leases), all-or-nothing
// sets (AcquireSets), lock delays (AcquireRequest.LockDelay), revocation
// and release requests (Revoke, RequestRelease), watchers
// (RegisterWatchers, Snapshot), a transaction's guard of its lease
// (Guard), and ParseNotification for every payload the notify channel
// carries.
package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/connx"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
)

// DB is what a Store runs its statements on (pg.DB has the same methods).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Config is pg.Config (same fields, so each converts to the other):
// pg.Config's godoc is the reference.
type Config struct {
	LockTable      string
	FenceTable     string
	NotifyChannel  string
	OnFenceWarning func(keyHash string, fence pglease.Fence)
	Holder         string
}

// MaxHolderBytes caps Config.Holder (pg.Config.Holder says it in words).
const MaxHolderBytes = 256

// MaxBatch is the largest number of items one batched call accepts,
// except ExtendMany (MaxExtendBatch).
const MaxBatch = 10000

// MaxExtendBatch is the largest number of items ExtendMany accepts. An
// extend takes no advisory lock per key (an acquire does, and PostgreSQL's
// shared lock table bounds those per transaction), so one statement can
// extend every lease a large holder keeps.
const MaxExtendBatch = 100000

// Store runs SyncGuard-compatible lease-lock operations on a DB. It is
// safe for concurrent use (as safe as its DB: a *pgx.Conn or pgx.Tx is
// not). It does not own the DB and never closes it.
type Store struct {
	db     DB
	cfg    Config
	n      Names
	holder string

	// checked is set once the schema version is known to serve this
	// code (checkOnce, MarkChecked).
	checked atomic.Bool

	acquireSQL, releaseSQL, extendSQL string
	sharedSQL, setsSQL                string
	versionSQL                        string
	handOffSQL                        string
	handOff1SQL                       string
	qwait1SQL, qrelease1SQL           string // the fair queue's lighter calls
	revokeSQL, snapshotSQL, guardSQL  string
	lookupKeySQL, lookupIDSQL         string
	isLockedSQL                       string
}

// acquireCols are the columns of the acquire, set and handoff functions'
// answers that scanGrant reads, in its order.
const acquireCols = "o_idx, o_status, o_fence, o_acquired_ms, o_expires_ms, o_now_ms, o_retry_ms, o_holder, o_shared"

// New returns a Store on db. It validates cfg (bad names are
// InvalidArgument, reported under op) and does no I/O.
func New(op string, db DB, cfg Config) (*Store, error) {
	if IsNilDB(db) { // also a nil *pgxpool.Pool inside the interface
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "nil DB", nil)
	}
	n, err := cfg.Names(op)
	if err != nil {
		return nil, err
	}
	holder := cfg.Holder
	if holder == "" {
		holder = DefaultHolder()
	} else if err := checkHolder(op, holder); err != nil {
		return nil, err
	}
	const liveMs = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
	sel := "SELECT l.key, l.lock_id, l.expires_at_ms, l.acquired_at_ms, l.fence, l.user_key, h.holder FROM " + n.Lock +
		" AS l LEFT JOIN " + n.Holders + " AS h ON h.key = l.key AND h.lock_id = l.lock_id WHERE "
	live := " AND l.expires_at_ms + " + fmt.Sprint(keys.TimeToleranceMs) + " > " + liveMs
	return &Store{
		db: db, cfg: cfg, n: n, holder: holder,
		acquireSQL:   "SELECT " + acquireCols + " FROM " + n.FnAcquire4 + "($1, $2, $3, $4, $5, $6, $7)",
		sharedSQL:    "SELECT " + acquireCols + ", o_limit FROM " + n.FnAcquireShared + "($1, $2, $3, $4, $5, $6, $7)",
		setsSQL:      "SELECT " + acquireCols + " FROM " + n.FnAcquireSets + "($1, $2, $3, $4, $5, $6, $7, $8)",
		versionSQL:   "SELECT version, compatible_from FROM " + n.FnSchema + "()",
		releaseSQL:   "SELECT o_idx, o_ok FROM " + n.FnRelease4 + "($1, $2, $3, $4)",
		extendSQL:    "SELECT o_idx, o_expires_ms, o_revoked FROM " + n.FnExtend4 + "($1, $2)",
		handOffSQL:   "SELECT o_idx, o_released, " + acquireCols[len("o_idx, "):] + " FROM " + n.FnHandOff4 + "($1, $2, $3, $4, $5, $6, $7, $8)",
		handOff1SQL:  "SELECT 1::integer, o_released, " + acquireCols[len("o_idx, "):] + " FROM " + n.FnHandOff1 + "($1, $2, $3, $4, $5, $6, $7, $8)",
		revokeSQL:    "SELECT o_idx, o_revoked, o_exclusive, o_lock_hashes, o_fences, o_delay_until_ms FROM " + n.FnRevoke + "($1, $2, $3, $4)",
		qwait1SQL:    "SELECT " + acquireCols + ", o_limit, o_position FROM " + n.FnQWait1 + "($1, $2, $3, $4, $5, $6, $7, $8, $9)",
		qrelease1SQL: "SELECT 1::integer, o_ok, o_served, o_turns FROM " + n.FnQRelease1 + "($1, $2, $3, $4, $5, $6, $7)",
		snapshotSQL: "SELECT o_idx, o_now_ms, o_lock_hash, o_fence, o_acquired_ms, o_expires_ms, o_holder, o_lock_delay_ms, o_shared, o_limit," +
			" o_shared_expires_ms, o_counter, o_delay_until_ms, o_excl_wait_until_ms FROM " + n.FnSnapshot + "($1)",
		guardSQL: "WITH g AS MATERIALIZED (SELECT l.fence, l.expires_at_ms FROM " + n.Lock + " AS l WHERE l.lock_id = $1 AND l.expires_at_ms > " + liveMs +
			" FOR KEY SHARE) SELECT g.fence, g.expires_at_ms, set_config('pglease.lock_ids', concat_ws(',', nullif(current_setting('pglease.lock_ids', true), ''), $1::text), true)," +
			" set_config('pglease.lock_proofs', concat_ws(',', nullif(current_setting('pglease.lock_proofs', true), ''), nullif($2::text, '')), true) FROM g",
		lookupKeySQL: sel + "l.key = $1" + live,
		lookupIDSQL:  sel + "l.lock_id = $1" + live,
		isLockedSQL:  "SELECT EXISTS (SELECT 1 FROM " + n.Lock + " AS l WHERE l.key = $1" + live + ")",
	}, nil
}

// AcquireRequest is one acquire: the argument of Acquire and an item of
// AcquireMany.
type AcquireRequest struct {
	// Key is the lock key (normalized to NFC; see keys.NormalizeKey).
	Key string
	// TTL is the lease TTL, a whole number of milliseconds
	// (keys.ValidateTTL).
	TTL time.Duration
	// LockID is an optional pre-generated lockId (keys.NewLockID);
	// "" = generate one. Pre-generating lets a caller clean up after an
	// ambiguous outcome (see Acquire).
	LockID string
	// LockDelay, if positive (a whole number of milliseconds, at most
	// keys.MaxTTL), is stored with the grant: when it expires without a
	// release, nobody takes the key before expires_at + max(1 s,
	// LockDelay), and a revoke of it keeps the key free for LockDelay
	// (unless the revoke gives its own delay). SyncGuard does not honour
	// it.
	LockDelay time.Duration
	// Yield makes the item yield to its key's fair queue (QueueWait's
	// tickets): a key that could be granted is answered locked (OK false,
	// no expiry, holder or retry time) while a live ticket waits for it.
	// It is how a caller that never queues (a try of a Manager with
	// FairQueue) keeps from jumping the queue. Checked under the key's
	// advisory lock, which every enqueue takes, in the same statement.
	Yield bool
}

// Format never prints the key or lockId.
func (r AcquireRequest) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "store.AcquireRequest{Key:%s TTL:%v LockID:[redacted] LockDelay:%v Yield:%v}", pglease.HashKey(r.Key), r.TTL, r.LockDelay, r.Yield)
}

// AcquireResult answers one acquire.
type AcquireResult struct {
	// OK is false when another holder has the key (a result, not an
	// error) or, in AcquireMany only, when Err is set.
	OK bool
	// LockID is the lockId of the grant (a bearer secret), set when OK.
	LockID string
	// Fence is the grant's fencing token, set when OK.
	Fence pglease.Fence
	// AcquiredAt and ExpiresAt are server times with millisecond
	// precision, set when OK. The record stays live for acquirers until
	// ExpiresAt + keys.TimeTolerance. When the key is held by someone
	// else, ExpiresAt is that holder's expiry (AcquiredAt stays zero).
	AcquiredAt, ExpiresAt time.Time
	// RetryAfter is set when the key is held by someone else: the time
	// from the server's clock reading in this attempt to the moment the
	// key can be taken (for an exclusive holder ExpiresAt +
	// keys.TimeTolerance, or + its lock delay when that is longer; a
	// revoke's delay; the earliest expiry of the permits of a full
	// semaphore) unless the holders extend or release first. Counted
	// from the call's return it is never early (clock rate differences
	// apart), so a caller that polls can try again then instead of at its
	// next poll; keep polling too, since the holder may extend. A refused
	// exclusive attempt marks the key as waited for by a writer for 2 s
	// (a key readers or permits use; see AcquireSharedMany): a writer that waits keeps the mark by
	// trying again within 1 s, and one refused by shared holds
	// (SharedHolders > 0) is told at most 1 s.
	RetryAfter time.Duration
	// Holder is set when the key is held by someone else and its holder
	// recorded an identity (Config.Holder of the pglease Store that took
	// it; "" for a SyncGuard holder, or none recorded), for messages and
	// operators. For shared holds it is the latest-expiring one's.
	Holder string
	// SharedHolders is the number of live shared holds that refused the
	// key: for an exclusive attempt, the readers or permits it waits for;
	// for a permit, the holders of the full semaphore.
	SharedHolders int
	// Delayed is set when the key is refused though its last exclusive
	// holder's lease has expired (ExpiresAt + keys.TimeTolerance is past
	// on the server's clock): that grant's lock delay keeps it.
	Delayed bool
	// Queued is set when the key is refused for its fair queue alone:
	// nothing holds it, but live tickets of other callers go first (an
	// item that yields, AcquireRequest.Yield; a QueueWait item queued
	// behind others).
	Queued bool
	// Err is set (and OK false) in batch results for an item that failed
	// on its own: a fence counter past keys.FenceMax (CodeInternal).
	// Acquire returns it as its error.
	Err error
}

// Format never prints the lockId.
func (r AcquireResult) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "store.AcquireResult{OK:%t LockID:[redacted] Fence:%s AcquiredAt:%s ExpiresAt:%s RetryAfter:%v Holder:%q SharedHolders:%d Err:%v}",
		r.OK, r.Fence, r.AcquiredAt.Format(time.RFC3339Nano), r.ExpiresAt.Format(time.RFC3339Nano), r.RetryAfter, r.Holder, r.SharedHolders, r.Err)
}

// ExtendRequest is one item of ExtendMany.
type ExtendRequest struct {
	LockID string
	TTL    time.Duration
}

// Format never prints the lockId.
func (r ExtendRequest) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "store.ExtendRequest{LockID:[redacted] TTL:%v}", r.TTL)
}

// ExtendResult answers one extend.
type ExtendResult struct {
	// OK is false when the lock is no longer held: unknown lockId, or
	// expires_at already passed on the server clock.
	OK bool
	// ExpiresAt is the new expiry (server now + ttl), set when OK.
	ExpiresAt time.Time
	// Revoked: not OK because a revoke deleted the lease (the server
	// records the last revoked lockId of each key), so a holder that
	// missed the revoke's notification still learns it was revoked.
	Revoked bool
}

// Sent reports whether err may have happened after the statement reached
// the server with its outcome unknown: a server-reported error is
// definite (the statement and its implicit transaction rolled back),
// except FATAL/PANIC ones, which end the session at any point; an error
// pgconn marks safe to retry happened before anything was sent.
func Sent(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC"
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return false
	}
	return !pgconn.SafeToRetry(err)
}

// run sends one statement and reads its rows with scan. For a pool it
// takes the connection first, so that a failure to get one is known not
// to have sent anything. When write is set, an error that may have
// come after the statement was sent is CodeAmbiguous (wrapping the mapped
// cause): the write may or may not have committed.
func (s *Store) run(ctx context.Context, op string, write bool, sql string, args []any, scan func(pgx.Rows) error) error {
	db := s.db
	var pc *pgxpool.Conn
	if pool, ok := db.(*pgxpool.Pool); ok {
		conn, err := acquireConn(ctx, pool)
		if err != nil {
			return pgerr.MapSchema(ctx, op, err)
		}
		defer conn.Release()
		db, pc = conn, conn
		connx.TakeWarning(conn.Conn().PgConn()) // one from an earlier statement is not this one's
	}
	err := func() error {
		rows, err := db.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	}()
	if err == nil {
		if write && pc != nil && connx.TakeWarning(pc.Conn().PgConn()) {
			// The only warning a lock write's commit gets is PostgreSQL's
			// for a cancelled wait for a synchronous standby: committed
			// here, maybe not on the standby, so a failover can undo it
			// and issue its fence again. pglease's writes ask for that
			// durability (synchronous_commit = on): the outcome is not
			// what was asked, so it is not reported as a success.
			return pgerr.New(pglease.CodeAmbiguous, op, SyncCommitWarned, nil)
		}
		return nil
	}
	if pc != nil && pgerr.ReadOnly(err) {
		dropConn(pc)
	}
	mapped := pgerr.MapSchema(ctx, op, err)
	if write && Sent(err) && pglease.CodeOf(mapped) != pglease.CodeInvalidArgument {
		return pgerr.New(pglease.CodeAmbiguous, op, "outcome unknown: the statement may have committed", mapped)
	}
	return mapped
}

// SyncCommitWarned is the message of the Ambiguous error of a write whose
// commit drew a server WARNING, on a pool whose connections record them
// (pg.ConfigurePool).
const SyncCommitWarned = "outcome unknown: the server warned during the commit (a cancelled wait for a synchronous standby " +
	"commits on the primary only, and a failover can then undo the write and issue its fence again)"

// dropConn closes conn, which its Release then takes out of the pool. A
// connection whose server refused a write as read-only (a standby, or a
// primary demoted or made read-only without closing its connections)
// would refuse every later one too, while pgxpool's liveness ping keeps
// succeeding there: kept, it would pin the pool to that server. Its
// replacement is a new connection, which a multi-host connection string
// with target_session_attrs=read-write opens on the writer.
func dropConn(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Conn().Close(ctx)
}

// connCheckSlice bounds each try of acquireConn. pgxpool checks a
// connection idle for more than a second with a ping under the acquire's
// context before handing it out; a dead one (half-open, blackholed) then
// answers nothing until that context ends.
const connCheckSlice = time.Second

// acquireConn takes a connection from pool in tries of at most
// connCheckSlice, until ctx ends: a dead idle connection's liveness check
// costs one try (pgxpool destroys the connection when its ping fails at the
// try's end, and the next try takes another), not the caller's whole
// deadline. A try that merely waited for a busy pool is repeated too.
func acquireConn(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	for {
		tctx, cancel := context.WithTimeout(ctx, connCheckSlice)
		conn, err := pool.Acquire(tctx)
		tried := tctx.Err() != nil
		cancel()
		if err == nil || ctx.Err() != nil || !tried {
			return conn, err
		}
	}
}

// WithOp returns err with its *pglease.Error's Op replaced by op.
func WithOp(op string, err error) error {
	var e *pglease.Error
	if errors.As(err, &e) {
		return pgerr.New(e.Code, op, e.Msg, e.Err)
	}
	return err
}

// Acquire tries once to take req.Key for req.TTL. A key held by someone
// else is AcquireResult{OK: false}, not an error. One round trip.
//
// req.LockID, if set (keys.NewLockID), is the lockId the grant gets;
// "" generates one. Choosing it before the call is how a caller cleans up
// after an ambiguous outcome: when the error is CodeAmbiguous the grant
// may have committed, and Release(ctx, req.LockID) removes it if it did.
func (s *Store) Acquire(ctx context.Context, req AcquireRequest) (AcquireResult, error) {
	const op = "pg.Acquire"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return AcquireResult{}, err
	}
	res, err := s.acquire(ctx, op, []AcquireRequest{req})
	if err != nil {
		return AcquireResult{}, err
	}
	if res[0].Err != nil {
		return AcquireResult{}, res[0].Err
	}
	return res[0], nil
}

// AcquireMany tries once to take every key in one statement (one round
// trip); results[i] answers reqs[i]. Keys are taken in a fixed global
// order, so concurrent batches cannot deadlock. When a key appears more
// than once, the first occurrence may win and later ones are OK=false.
// Invalid input anywhere fails the whole call before I/O. An empty batch
// returns no results without I/O.
func (s *Store) AcquireMany(ctx context.Context, reqs []AcquireRequest) ([]AcquireResult, error) {
	const op = "pg.AcquireMany"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	return s.acquire(ctx, op, reqs)
}

func (s *Store) acquire(ctx context.Context, op string, reqs []AcquireRequest) ([]AcquireResult, error) {
	if len(reqs) > MaxBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	if len(reqs) == 0 {
		return []AcquireResult{}, nil
	}
	p, err := prepareAcquire(op, reqs)
	if err != nil {
		return nil, err
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	// user_key is the NFC key, which for PostgreSQL equals the storage key.
	out := make([]AcquireResult, len(reqs))
	got := make([]bool, len(reqs))
	sql, args := p.withYield(s.acquireSQL, []any{p.keys, p.fenceKeys, p.ids, p.ttls, p.delays, s.holderArg(), s.channelArg()})
	err = s.run(ctx, op, true, sql, args, func(rows pgx.Rows) error {
		g, err := scanGrant(rows)
		if err != nil {
			return err
		}
		i := int(g.idx) - 1
		if i < 0 || i >= len(out) || got[i] {
			return errors.New("pg: bad result index from acquire function")
		}
		got[i] = true
		out[i], err = g.result(op, p.ids[i])
		out[i].Queued = p.yielded(i, g)
		return err
	})
	if err != nil {
		return nil, err
	}
	for i := range got {
		if !got[i] {
			return nil, pgerr.New(pglease.CodeAmbiguous, op, "acquire function returned too few rows", nil)
		}
	}
	s.warnFences(p.keys, out)
	return out, nil
}

// holderArg is the holder identity argument of the grant functions (nil
// only in the holder cost benchmark).
func (s *Store) holderArg() *string {
	if s.holder == "" {
		return nil
	}
	return &s.holder
}

// channelArg is the notification channel argument of the functions that
// notify (nil: none).
func (s *Store) channelArg() *string {
	if s.cfg.NotifyChannel == "" {
		return nil
	}
	return &s.cfg.NotifyChannel
}

// warnFences calls Config.OnFenceWarning for each grant of out (keys[i]
// being out[i]'s storage key) whose fence is above keys.FenceWarn.
func (s *Store) warnFences(storageKeys []string, out []AcquireResult) {
	if s.cfg.OnFenceWarning == nil {
		return
	}
	for i, r := range out {
		if r.OK && r.Fence > keys.FenceWarn {
			s.cfg.OnFenceWarning(pglease.HashKey(storageKeys[i]), r.Fence)
		}
	}
}

// grantRow is one row of the acquire, shared, set and handoff functions'
// answers (acquireCols).
type grantRow struct {
	idx, status              int32
	fence, acq, exp, now, at *int64
	holder                   *string
	shared                   *int32
}

func scanGrant(rows pgx.Rows, extra ...any) (grantRow, error) {
	var g grantRow
	err := rows.Scan(append([]any{&g.idx, &g.status, &g.fence, &g.acq, &g.exp, &g.now, &g.at, &g.holder, &g.shared}, extra...)...)
	return g, err
}

// result converts a row with status 0 (granted, to lockID), 1 (held),
// 2 (fence overflow) or 4 (free, its set not granted); an unknown status
// or an incomplete grant is an error (of the statement).
func (g grantRow) result(op, lockID string) (AcquireResult, error) {
	switch g.status {
	case 0:
		if g.fence == nil || g.acq == nil || g.exp == nil {
			return AcquireResult{}, errors.New("pg: incomplete grant from acquire function")
		}
		return AcquireResult{OK: true, LockID: lockID, Fence: pglease.Fence(*g.fence),
			AcquiredAt: time.UnixMilli(*g.acq), ExpiresAt: time.UnixMilli(*g.exp)}, nil
	case 1:
		r := lockedResult(g.exp, g.now, g.at, g.holder)
		if g.shared != nil {
			r.SharedHolders = int(*g.shared)
		}
		return r, nil
	case 2:
		return AcquireResult{Err: pgerr.New(pglease.CodeInternal, op, "fence counter overflow: the key's fence would exceed 900000000000000; no lock granted", nil)}, nil
	case 4:
		return AcquireResult{}, nil
	}
	return AcquireResult{}, errors.New("pg: unknown status from acquire function")
}

// lockedResult is the answer for a key held by someone else: the
// holder's expiry, the server time from which to try again (at) and the
// holder's identity, when the function returned them.
func lockedResult(exp, now, at *int64, holder *string) AcquireResult {
	var r AcquireResult
	if exp != nil {
		r.ExpiresAt = time.UnixMilli(*exp)
	}
	if at != nil && now != nil {
		// now is the server clock floored to the ms: the true remaining
		// time is at most this.
		r.RetryAfter = max(time.Duration(*at-*now)*time.Millisecond, 0)
	}
	if exp != nil && now != nil && *exp+keys.TimeToleranceMs <= *now {
		r.Delayed = true
	}
	// Shown in messages and on terminals: only what Config.Holder accepts.
	if holder != nil && checkHolder("", *holder) == nil {
		r.Holder = *holder
	}
	return r
}

// acquireArgs are the grant functions' per-item arguments: storage keys
// (= NFC keys), fence keys, lockIds (generated when empty), TTLs and lock
// delays in ms.
type acquireArgs struct {
	keys, fenceKeys, ids []string
	ttls, delays         []int64
	yields               []bool // nil: no item yields (AcquireRequest.Yield)
}

// yielded reports whether item i yielded to its key's fair queue: it was
// to yield, and its answer is "held" naming nothing that holds the key
// (the functions' answer to an item that yields to live tickets).
func (p acquireArgs) yielded(i int, g grantRow) bool {
	return p.yields != nil && p.yields[i] && g.unnamed()
}

// unnamed reports whether g is "held" naming no lease, shared holds or
// time to try again.
func (g grantRow) unnamed() bool {
	return g.status == 1 && g.exp == nil && g.at == nil && g.holder == nil && g.shared == nil
}

// withYield returns the acquire function call sql with its arguments
// args, given the p_yield argument too when an item yields: a statement
// with no such item is sent as it always was (the function's p_yield
// defaults to none).
func (p acquireArgs) withYield(sql string, args []any) (string, []any) {
	if p.yields == nil {
		return sql, args
	}
	return sql[:len(sql)-1] + ", $" + strconv.Itoa(len(args)+1) + ")", append(args, p.yields)
}

// prepareAcquire validates acquire items and derives the functions'
// arguments.
func prepareAcquire(op string, reqs []AcquireRequest) (acquireArgs, error) {
	p := acquireArgs{
		keys: make([]string, len(reqs)), fenceKeys: make([]string, len(reqs)), ids: make([]string, len(reqs)),
		ttls: make([]int64, len(reqs)), delays: make([]int64, len(reqs)),
	}
	seen := make(map[string]struct{}, len(reqs))
	for i, r := range reqs {
		sk, fk, err := storageKey(op, r.Key)
		if err != nil {
			return acquireArgs{}, err
		}
		if err := keys.ValidateTTL(r.TTL); err != nil {
			return acquireArgs{}, WithOp(op, err)
		}
		if err := checkDelay(op, "LockDelay", r.LockDelay); err != nil {
			return acquireArgs{}, err
		}
		id := r.LockID
		if id == "" {
			id = keys.NewLockID()
		} else if err := keys.ValidateLockID(id); err != nil {
			return acquireArgs{}, WithOp(op, err)
		}
		if _, dup := seen[id]; dup {
			return acquireArgs{}, pgerr.New(pglease.CodeInvalidArgument, op, "duplicate lockId in one batch", nil)
		}
		seen[id] = struct{}{}
		p.keys[i], p.fenceKeys[i], p.ids[i], p.ttls[i], p.delays[i] = sk, fk, id, r.TTL.Milliseconds(), r.LockDelay.Milliseconds()
		if r.Yield && p.yields == nil {
			p.yields = make([]bool, len(reqs))
		}
		if r.Yield {
			p.yields[i] = true
		}
	}
	return p, nil
}

// storageKey normalizes key and derives its storage key and fence key.
func storageKey(op, key string) (sk, fk string, err error) {
	k, err := keys.NormalizeKey(key)
	if err != nil {
		return "", "", WithOp(op, err)
	}
	// PostgreSQL: prefix "", limit 1700, reserve 0. A key ≤ 512 bytes is
	// never hashed, so storage key == user key and fence key ==
	// "fence:"+key (SyncGuard's two-step derivation).
	sk, err = keys.MakeStorageKey("", k, keys.PostgresLimitBytes, keys.PostgresReserveBytes)
	if err != nil {
		return "", "", WithOp(op, err)
	}
	fk, err = keys.MakeStorageKey("", "fence:"+sk, keys.PostgresLimitBytes, keys.PostgresReserveBytes)
	if err != nil {
		return "", "", WithOp(op, err)
	}
	return sk, fk, nil
}

// checkDelay validates a lock delay (what names the field): zero, or a
// positive whole number of milliseconds no larger than keys.MaxTTL.
func checkDelay(op, what string, d time.Duration) error {
	switch {
	case d < 0:
		return pgerr.New(pglease.CodeInvalidArgument, op, what+" must not be negative", nil)
	case d%time.Millisecond != 0:
		return pgerr.New(pglease.CodeInvalidArgument, op, what+" must be a whole number of milliseconds", nil)
	case d > keys.MaxTTL():
		return pgerr.New(pglease.CodeInvalidArgument, op, what+" too large: above MaxTTL", nil)
	}
	return nil
}

// IsNilDB reports whether db is nil or holds a nil pointer (a nil
// *pgxpool.Pool or *pgx.Conn would otherwise panic at first use).
func IsNilDB(db any) bool {
	if db == nil {
		return true
	}
	v := reflect.ValueOf(db)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

func (s *Store) checkIDs(op string, ids []string) error {
	if len(ids) > MaxBatch {
		return pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	for _, id := range ids {
		if err := keys.ValidateLockID(id); err != nil {
			return WithOp(op, err)
		}
	}
	return nil
}

// Release releases the lock lockID holds. false means it was not held
// (unknown lockId, already released, or expired on the server clock: a
// lock past its expires_at cannot be released, it is simply gone for the
// next acquirer after the tolerance). One round trip.
func (s *Store) Release(ctx context.Context, lockID string) (bool, error) {
	const op = "pg.Release"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return false, err
	}
	res, err := s.release(ctx, op, []string{lockID})
	if err != nil {
		return false, err
	}
	return res[0], nil
}

// ReleaseMany releases every lockId in one statement (one round trip);
// results[i] answers lockIDs[i]. A lockId given twice is released once
// (the later occurrence answers false).
func (s *Store) ReleaseMany(ctx context.Context, lockIDs []string) ([]bool, error) {
	const op = "pg.ReleaseMany"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	return s.release(ctx, op, lockIDs)
}

func (s *Store) release(ctx context.Context, op string, ids []string) ([]bool, error) {
	if err := s.checkIDs(op, ids); err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return []bool{}, nil
	}
	return s.runRelease(ctx, op, ids, wakeAlways)
}

// The release function's notification modes (p_wake).
const (
	wakeWaited = 1 // notify a released key when a session waits for it
	wakeAlways = 2 // notify every released key
)

// runRelease runs the release function for lockIds and collects its
// (o_idx, o_ok) rows. With Config.NotifyChannel set, releases notify in
// mode wake (and watchers). On a pgx.Tx the release commits with the
// caller's transaction, durably; otherwise it need not wait for its WAL
// flush, unless its transaction wrote before it (the function checks:
// an explicit transaction on a connection that wrote first stays
// durable).
func (s *Store) runRelease(ctx context.Context, op string, ids []string, wake int) ([]bool, error) {
	_, inTx := s.db.(pgx.Tx)
	out := make([]bool, len(ids))
	got := 0
	err := s.run(ctx, op, true, s.releaseSQL, []any{ids, s.channelArg(), wake, !inTx}, func(rows pgx.Rows) error {
		var idx int32
		var ok bool
		if err := rows.Scan(&idx, &ok); err != nil {
			return err
		}
		if idx < 1 || int(idx) > len(out) {
			return errors.New("pg: bad result index from release function")
		}
		out[idx-1] = ok
		got++
		return nil
	})
	if err != nil {
		return nil, err
	}
	if got != len(ids) {
		return nil, pgerr.New(pglease.CodeAmbiguous, op, "release function returned a wrong row count", nil)
	}
	return out, nil
}

// Extend sets the lock's expiry to server now + ttl (it replaces the
// expiry, it does not add to it). OK=false means the lock is no longer
// held: unknown lockId or expires_at already passed on the server clock
// (no revival inside the tolerance window). One round trip.
func (s *Store) Extend(ctx context.Context, lockID string, ttl time.Duration) (ExtendResult, error) {
	const op = "pg.Extend"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return ExtendResult{}, err
	}
	res, err := s.extend(ctx, op, []ExtendRequest{{LockID: lockID, TTL: ttl}})
	if err != nil {
		return ExtendResult{}, err
	}
	return res[0], nil
}

// ExtendMany extends every lock in one statement (one round trip; at most
// MaxExtendBatch items); results[i] answers reqs[i].
func (s *Store) ExtendMany(ctx context.Context, reqs []ExtendRequest) ([]ExtendResult, error) {
	const op = "pg.ExtendMany"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	return s.extend(ctx, op, reqs)
}

func (s *Store) extend(ctx context.Context, op string, reqs []ExtendRequest) ([]ExtendResult, error) {
	if len(reqs) > MaxExtendBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	ids := make([]string, len(reqs))
	ttls := make([]int64, len(reqs))
	for i, r := range reqs {
		if err := keys.ValidateLockID(r.LockID); err != nil {
			return nil, WithOp(op, err)
		}
		if err := keys.ValidateTTL(r.TTL); err != nil {
			return nil, WithOp(op, err)
		}
		ids[i], ttls[i] = r.LockID, r.TTL.Milliseconds()
	}
	if len(reqs) == 0 {
		return []ExtendResult{}, nil
	}
	out := make([]ExtendResult, len(reqs))
	n := 0
	err := s.run(ctx, op, true, s.extendSQL, []any{ids, ttls}, func(rows pgx.Rows) error {
		var idx int32
		var exp *int64
		var revoked *bool
		if err := rows.Scan(&idx, &exp, &revoked); err != nil {
			return err
		}
		if idx < 1 || int(idx) > len(out) {
			return errors.New("pg: bad result index from extend function")
		}
		if exp != nil {
			out[idx-1] = ExtendResult{OK: true, ExpiresAt: time.UnixMilli(*exp)}
		} else {
			out[idx-1].Revoked = revoked != nil && *revoked
		}
		n++
		return nil
	})
	if err != nil {
		return nil, err
	}
	if n != len(reqs) {
		return nil, pgerr.New(pglease.CodeAmbiguous, op, "extend function returned a wrong row count", nil)
	}
	return out, nil
}
