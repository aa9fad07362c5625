package pg

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
)

// DB is what a Store, a FenceGuard and a migrate.Migrator run their
// statements on, so that the caller chooses the connection:
// *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx satisfy it. With a
// pgx.Tx, the statements join the caller's transaction (and its advisory
// locks last until it ends).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Config names the tables and says how releases are announced; a Store,
// a migrate.Migrator and a Manager (manager.Config embeds it) read the
// same tables only when they are given the same names. The zero value
// uses SyncGuard's default table names.
type Config struct {
	// LockTable is the lock table, `ident` or `schema.ident` with
	// ident = ^[A-Za-z_][A-Za-z0-9_]{0,62}$. Default "syncguard_locks".
	// An unqualified name resolves through the connection's search_path,
	// as do the server functions the schema migrations (package
	// pg/migrate) create next to it.
	LockTable string
	// FenceTable is the fence counter table, same rules; it must differ
	// from LockTable. Default "syncguard_fence_counters".
	FenceTable string
	// NotifyChannel, if non-empty (an identifier of at most 60 bytes),
	// makes every successful release also run pg_notify(NotifyChannel ||
	// '.' || hex digits 7 and 8 of pglease.HashKey(key),
	// pglease.HashKey(key)) in the same transaction: the key's wake
	// channel, one of 256, which the processes waiting for the key LISTEN
	// to, so waiters in other processes can wake up without every
	// listener reading every release. "" = no wake-ups; a key some Manager
	// watches (manager.Manager.Watch) is still told to its watchers, on
	// the default channel "pglease_release", so every change of a
	// watched key reaches them whatever made it.
	NotifyChannel string
	// OnFenceWarning, if set, is called (synchronously, after the grant)
	// for each grant whose fence is above 90000000000000, a tenth of the
	// largest fence ever granted (900000000000000, after which a key can
	// no longer be acquired): time to plan for it. It gets
	// pglease.HashKey of the key, never the key itself.
	OnFenceWarning func(keyHash string, fence pglease.Fence)
	// Holder identifies this process as the holder of the leases it
	// acquires, for operators (Lookup, `pglease status`, the Holder of a
	// locked answer): at most 256 bytes of UTF-8 without control
	// characters. "" means "program[pid]@host", e.g. "worker[4242]@web-1"
	// (the executable's base name, the process id and the host name). It
	// is stored in a table of its own next to the lock table, tied to the
	// grant's lockId, so SyncGuard processes on the same tables are
	// unaffected and a lease SyncGuard takes over never shows it.
	Holder string
}

// Store runs SyncGuard-compatible lease-lock operations on a DB, one
// statement (one round trip) each: what a program that locks without a
// Manager calls. It is safe for concurrent use (as safe as its DB: a
// *pgx.Conn or pgx.Tx is not). It does not own the DB and never closes
// it. The schema must be at the version this pglease needs (package
// pg/migrate): the Store checks it once, before its first acquire, and
// fails with an error that says how to migrate when it is not. A Store on
// a transaction or a connection (pg.New(tx, cfg), typically one per
// transaction) skips that check, and its round trip, when a Store of
// this process already checked the same tables through the same
// connection settings; a migration with package pg/migrate makes them
// check again.
type Store struct {
	s *store.Store
}

// New returns a Store on db. It validates cfg (bad names are
// InvalidArgument) and does no I/O.
func New(db DB, cfg Config) (*Store, error) {
	s, err := store.New("pg.New", db, store.Config(cfg))
	if err != nil {
		return nil, err
	}
	return &Store{s: s}, nil
}

// AcquireResult answers Acquire: whether the key was taken and, if so,
// the grant a caller extends, releases and fences its writes with; if
// not, until when and by whom the key is held.
type AcquireResult struct {
	// OK is false when another holder has the key (a result, not an
	// error).
	OK bool
	// LockID is the lockId of the grant, which Extend and Release take: a
	// bearer secret (whoever has it can release the lease), so it is
	// never printed (Format). Set when OK, and when Acquire's error is
	// CodeAmbiguous (see Acquire).
	LockID string
	// Fence is the grant's fencing token, set when OK: it is above every
	// fence granted before for the key, so a FenceGuard can refuse the
	// writes of earlier holders.
	Fence pglease.Fence
	// AcquiredAt and ExpiresAt are server times with millisecond
	// precision, set when OK. The record stays live for acquirers until
	// ExpiresAt plus SyncGuard's tolerance of one second. When the key is
	// held by someone else, ExpiresAt is that holder's expiry (AcquiredAt
	// stays zero).
	AcquiredAt, ExpiresAt time.Time
	// RetryAfter is set when the key is held by someone else: the time
	// from the server's clock reading in this attempt to the moment the
	// key can be taken over (ExpiresAt plus one second) unless the holder
	// extends or releases it first. A key another transaction keeps
	// locked (an acquire, extend or release in flight, or in a
	// transaction left open) is answered held after at most 100 ms of
	// waiting for it, with RetryAfter one second (and ExpiresAt and Holder
	// as far as the committed rows show them). Counted from the call's return it is
	// never early (clock rate differences apart), so a caller that polls
	// can try again then instead of at its next poll; keep polling too,
	// since the holder may extend. A refused attempt of a key that
	// readers or permits use marks it as waited for by a writer for 2 s
	// (no new reader or permit meanwhile: writer preference,
	// docs/leases.md); a caller that polls keeps the mark by trying again
	// within 1 s.
	RetryAfter time.Duration
	// Holder is set when the key is held by someone else and its holder
	// recorded an identity (Config.Holder of the pglease process that took
	// it; "" for a SyncGuard holder, or none recorded), for messages and
	// operators.
	Holder string
}

// Format prints every field but the lockId (a bearer secret), for every
// verb, so that logging a result never leaks it.
func (r AcquireResult) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "pg.AcquireResult{OK:%t LockID:[redacted] Fence:%s AcquiredAt:%s ExpiresAt:%s RetryAfter:%v Holder:%q}",
		r.OK, r.Fence, r.AcquiredAt.Format(time.RFC3339Nano), r.ExpiresAt.Format(time.RFC3339Nano), r.RetryAfter, r.Holder)
}

// Acquire tries once to take key for ttl (a whole number of
// milliseconds). A key held by someone else is AcquireResult{OK: false},
// not an error. One round trip.
//
// When the error is CodeAmbiguous (the connection failed or ctx ended
// after the statement was sent), the grant may have committed: the
// result's LockID is then the lockId it would have, and
// Release(ctx, res.LockID) removes it if it did. Any other error means
// nothing was granted.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (AcquireResult, error) {
	id := keys.NewLockID()
	r, err := s.s.Acquire(ctx, store.AcquireRequest{Key: key, TTL: ttl, LockID: id})
	if err != nil {
		if pglease.CodeOf(err) == pglease.CodeAmbiguous {
			return AcquireResult{LockID: id}, err
		}
		return AcquireResult{}, err
	}
	return AcquireResult{OK: r.OK, LockID: r.LockID, Fence: r.Fence, AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt,
		RetryAfter: r.RetryAfter, Holder: r.Holder}, nil
}

// Release releases the lock lockID holds. false means it was not held
// (unknown lockId, already released, or expired on the server clock: a
// lock past its expires_at cannot be released, it is simply gone for the
// next acquirer after the tolerance). One round trip.
func (s *Store) Release(ctx context.Context, lockID string) (bool, error) {
	return s.s.Release(ctx, lockID)
}

// ExtendResult answers Extend: whether the lease is still held, and its
// new expiry.
type ExtendResult struct {
	// OK is false when the lock is no longer held: unknown lockId, or
	// expires_at already passed on the server clock.
	OK bool
	// ExpiresAt is the new expiry (server now + ttl), set when OK.
	ExpiresAt time.Time
}

// Extend sets the lock's expiry to server now + ttl (it replaces the
// expiry, it does not add to it). OK=false means the lock is no longer
// held: unknown lockId or expires_at already passed on the server clock
// (no revival inside the tolerance window). One round trip.
func (s *Store) Extend(ctx context.Context, lockID string, ttl time.Duration) (ExtendResult, error) {
	r, err := s.s.Extend(ctx, lockID, ttl)
	return ExtendResult{OK: r.OK, ExpiresAt: r.ExpiresAt}, err
}

// Guard ties the caller's transaction tx to the exclusive lease lockID
// holds, as (*manager.Lock).Guard does for a Manager's lock, in one
// statement on tx (not on the Store's DB): it checks on the server that
// the lease is live and still lockID's, locks the lease's row FOR KEY
// SHARE until tx ends (a takeover, release or revoke of the lease waits
// for tx's commit; the lease's extend does not), and lets tx write the
// key's rows of the tables a database guard protects
// (migrate.Migrator.Guard, and GuardStrict when lockID came from this
// process's Acquire: it presents the lease's guard proof, which the lock
// table does not hold). It returns the grant's fence. A lease that is no
// longer held (released, expired, revoked, taken over) is CodeLockLost
// and tx is left as it was (no error inside it). Call Guard inside the
// transaction before its writes, and release the lease after tx ends; in
// a REPEATABLE READ or SERIALIZABLE transaction, call it first. A nil tx
// or an invalid lockId is InvalidArgument before any I/O.
func (s *Store) Guard(ctx context.Context, tx pgx.Tx, lockID string) (pglease.Fence, error) {
	r, err := s.s.Guard(ctx, tx, lockID)
	return r.Fence, err
}

// IsLocked reports whether key has a live lock record, by SyncGuard's
// liveness rule: expires_at_ms + 1000 > server now (what an acquirer
// checks). One round trip, read-only.
func (s *Store) IsLocked(ctx context.Context, key string) (bool, error) {
	return s.s.IsLocked(ctx, key)
}

// LockInfo is the state of a live lock as Lookup shows it, for
// diagnostics and operators: hashes instead of the key and lockId
// (SyncGuard's LockInfo), so that it can be logged as it is.
type LockInfo struct {
	// KeyHash is pglease.HashKey of the (NFC) key.
	KeyHash string
	// LockIDHash is pglease.HashKey of the lockId: compare it with
	// pglease.HashKey(lockID) to tell whether a lockId of yours holds it.
	LockIDHash string
	// AcquiredAt and ExpiresAt are server times, millisecond precision.
	AcquiredAt, ExpiresAt time.Time
	// Fence is the grant's fencing token.
	Fence pglease.Fence
	// Holder is the holder identity the granting pglease process recorded
	// (its Config.Holder); "" when the holder did not record one
	// (SyncGuard, or pglease before schema version 2).
	Holder string
}

// String formats the fields with their names, for messages.
func (i LockInfo) String() string {
	return fmt.Sprintf("pg.LockInfo{KeyHash:%s LockIDHash:%s AcquiredAt:%s ExpiresAt:%s Fence:%s Holder:%q}",
		i.KeyHash, i.LockIDHash, i.AcquiredAt.UTC().Format(time.RFC3339Nano), i.ExpiresAt.UTC().Format(time.RFC3339Nano), i.Fence, i.Holder)
}

// LogValue logs the fields as a group, for structured logs.
func (i LockInfo) LogValue() slog.Value {
	return slog.GroupValue(slog.String("key_hash", i.KeyHash), slog.String("lock_id_hash", i.LockIDHash),
		slog.Time("acquired_at", i.AcquiredAt), slog.Time("expires_at", i.ExpiresAt), slog.String("fence", i.Fence.String()),
		slog.String("holder", i.Holder))
}

// Lookup returns the state of key's lock, or nil, nil when there is none
// or it is not live (SyncGuard's rule, as IsLocked): SyncGuard's
// lookup({key}). Diagnostic only: by the time you act on it the answer
// may be stale; use the fence to protect data. One round trip, read-only.
func (s *Store) Lookup(ctx context.Context, key string) (*LockInfo, error) {
	r, err := s.s.Lookup(ctx, "pg.Lookup", key)
	if r == nil || err != nil {
		return nil, err
	}
	i := LockInfo(*r)
	return &i, nil
}
