// Package pg implements SyncGuard-compatible lease locks on PostgreSQL
// with pgx: one network round trip per operation, and stronger guarantees
// than SyncGuard 2.5.2 where it is weak. A Store takes, extends and
// releases leases one call at a time, without a Manager (package
// manager batches, heartbeats and waits on top of the same tables); a
// FenceGuard makes writes to your own tables safe against holders that
// lost their lease; Store.Guard ties your transaction to a lease, for the
// tables a database guard protects (migrate.Migrator.Guard, GuardStrict);
// package pg/migrate creates and upgrades the schema.
//
// A Store shares its two tables (syncguard_locks, syncguard_fence_counters
// by default) byte for byte with SyncGuard's PostgreSQL backend, so Go
// and Node processes can lock the same keys: the storage key is the NFC
// key (≤ 512 bytes), the fence key "fence:"+key, the fence a 15-digit
// zero-padded TEXT in the lock table and a BIGINT counter in the fence
// table, lockIds 22-character base64url, times integer milliseconds, and
// acquire serializes on pg_advisory_xact_lock(hashtext(key)) exactly as
// SyncGuard does. LockInfo hashes are SyncGuard's hashKey.
//
// # Guarantees
//
//   - Fences per key strictly increase over successful acquires, across
//     expiry, release and takeover, and are never reused. Acquire forces
//     synchronous_commit = on for its transaction (set_config(…, true)),
//     so a granted fence survives a server crash. Extend does the same, so
//     an acknowledged new expiry survives a crash too: the holder's trust
//     window rests on it. That costs one WAL flush per extend statement,
//     i.e. per Manager heartbeat tick whatever the number of locks in it
//     (BenchmarkExtend, BenchmarkExtendMany). Release, in contrast,
//     commits with synchronous_commit = off: a release lost in a crash
//     only lets the lease run to its expiry, and an acquire that saw the
//     release flushes it (WAL is sequential) before it is acknowledged.
//     This saves one WAL flush per acquire+release cycle. Fence counters are
//     never deleted. A grant that would exceed the largest fence,
//     900,000,000,000,000, is refused (CodeInternal, nothing changed);
//     grants above 90,000,000,000,000 are reported through Config.OnFenceWarning with
//     the key's hash, never the key.
//   - At most one live lease per key in server time. A record is live for
//     acquirers until expires_at_ms + 1000 ms (SyncGuard's tolerance), so
//     takeover happens only at or after that instant. Extend and Release,
//     in contrast, refuse a lease whose expires_at_ms has passed on the
//     server clock: an expired lease cannot be revived inside the
//     tolerance window (SyncGuard revives it).
//   - Acquire reads the existing lock row FOR UPDATE after taking the
//     advisory lock, so an extend that is in flight cannot be overwritten
//     (SyncGuard's acquire/extend double-holder window is closed).
//   - The lease clock is clock_timestamp() read after every wait, not
//     now() (transaction start): time spent waiting for another holder's
//     advisory or row lock does not shorten the new lease.
//   - An acquire, release or extend whose outcome is unknown (the
//     connection failed or the context ended after the statement was
//     sent) is an error with CodeAmbiguous, never success. Its cause
//     chain keeps the underlying error, so errors.Is(err,
//     pglease.ErrAborted) and errors.Is(err, context.Canceled) still
//     hold for a cancelled context. (With pgx's default context handling
//     the connection is abandoned, so a cancelled acquire is Ambiguous:
//     the server may still grant it once its wait ends. The result's
//     LockID is then set, to release it.)
//   - Every call validates its input before any I/O (key: non-empty,
//     ≤ 16 KiB raw, valid UTF-8, no NUL, ≤ 512 bytes after NFC; lockId:
//     ^[A-Za-z0-9_-]{22}$; ttl: positive whole milliseconds with
//     expires_at_ms ≤ 2^53−1; table names: identifiers, quoted) and
//     returns *pglease.Error. Error texts never contain a key or lockId;
//     server errors are mapped to codes without PgError's
//     Detail/Where/Hint (which can quote values).
//
// # Design: server functions, one round trip
//
// SyncGuard's acquire costs 8 round trips (BEGIN, advisory lock, now,
// select, two fence statements, upsert, COMMIT) and release/extend 5.
// Here every operation is a single statement in its own implicit
// transaction: the schema (package pg/migrate) has PL/pgSQL functions
// next to the lock table, named
// pglease_{acquire,release,extend,handoff}_<hash of the table names> and
// pglease_hashkey_v1. A function is needed rather than a CTE because
// under READ COMMITTED a single SQL statement keeps the snapshot it took
// before waiting for the advisory lock and would not see a row the
// previous holder inserted meanwhile; a volatile PL/pgSQL function takes
// a fresh snapshot for each statement, and it lets acquire read the
// clock after its waits.
//
// Acquire (and the Manager's batches) call the acquire function with
// arrays (keys, fence keys, lockIds, ttls). It visits the keys in ascending
// (hashtext(key), key) order — so two batches can never deadlock — and
// for each: pg_advisory_xact_lock(hashtext(key)); SELECT the lock row
// (FOR NO KEY UPDATE when a transaction has touched its version: a
// release or an extend in flight is waited for; an untouched live row is
// read without a lock, so a refused attempt writes nothing), and, when it
// has expired and is about to be taken over, again FOR UPDATE, which
// waits for transactions that guard the lease; read clock_timestamp(); if
// the row is live (expires + 1000 > now, or + the grant's lock delay) or
// the key has live shared holds (schema version 4) answer "locked"; else
// increment the counter (UPDATE … WHERE fence < MAX RETURNING, inserting
// it for the key's first grant; no row = overflow, nothing changed) and
// update the lock row in place or insert it. Results
// (status, fence, times) come back per item as rows; contention and
// overflow are statuses, not exceptions, so one item does not roll back
// the others.
//
// Release and Extend (and the Manager's batches) call functions that
// first lock all matching rows in the same (hashtext(key), key) order
// (SELECT … ORDER BY … FOR UPDATE; FOR NO KEY UPDATE for extend, so that
// a transaction guarding the lease does not block its heartbeat; a
// release of a single lockId deletes without locking first, its WHERE
// read again, clock included, after any wait), read
// clock_timestamp(), then delete
// or update each row whose lock_id matches and whose expires_at_ms is
// still in the future. Extend sets expires_at_ms = now + ttl (replace,
// not add). With Config.NotifyChannel, each successful release runs
// pg_notify(channel || '.' || substr(hashKey(user_key), 7, 2),
// hashKey(user_key)) in the same transaction (the key's wake channel).
//
// IsLocked and Lookup are one plain SELECT each (no transaction), using
// SyncGuard's liveness rule (expires_at_ms + 1000 > server now).
//
// Round trips, after pgx has prepared each statement once per connection
// (its default statement cache; the first use on a connection adds one
// describe round trip): Acquire 1, Release 1, Extend 1, IsLocked 1,
// Lookup 1, and one more before a Store's first acquire, which checks the
// schema version. A *pgxpool.Pool may add a liveness ping when it hands
// out a connection idle for over a second.
//
// # In the caller's transaction
//
// A Store on a pgx.Tx (New(tx, cfg)) runs its operations in that
// transaction: a grant exists if and only if the transaction commits (a
// rollback leaves no row and no fence gap: the counter's increment rolls
// back too), and a release takes effect at the commit, together with the
// transaction's writes. A release alone commits without waiting for its
// WAL flush (a lost release only runs to its expiry); in a pgx.Tx, or
// in a transaction that wrote before the release, it leaves
// synchronous_commit as it was, so the caller's writes stay durable. (On
// a plain connection inside BEGIN, a release that is the transaction's
// first write cannot tell: use a pgx.Tx, or write first.) The advisory
// and row locks an acquire takes last until the transaction ends: keep
// such transactions short.
//
// # Notes
//
//   - Unqualified table names resolve through search_path, and so do the
//     functions created next to them: use the same search_path for the
//     migrations and at run time, or schema-qualify the names.
//   - The database must use the UTF8 encoding (keys are Unicode; the
//     server-side hashKey reads code points).
//   - A lockId is a bearer secret and stored in plain text, as SyncGuard
//     requires: SELECT on the lock table is as sensitive as the lockIds.
//     pglease binds it as a parameter; server logs that print bind
//     parameters will show it.
//   - The runtime role needs the grants of roles.sql (`pglease sql
//     roles`; migrate.RolesSQL fills it in), listed in docs/operations.md
//     (Roles): SELECT/INSERT/UPDATE/DELETE on the lock table and on its
//     shared-hold table ({lock}_shared), SELECT/INSERT/UPDATE on the fence
//     table (never DELETE) and on the holder table ({lock}_holders),
//     SELECT on the SQL API's views and EXECUTE on its functions and on
//     every pglease_* function. A role that lacks one fails every lock
//     operation with AuthFailed (SQLSTATE 42501);
//     migrate.Migrator.MissingPrivileges lists what a role lacks. The
//     script sets up an owner role that runs the migrations and such a
//     runtime role, and revokes PUBLIC's EXECUTE on the functions; the
//     test suite runs the operations as that runtime role.
//   - Like SyncGuard, keys whose hashtext collides serialize each other's
//     acquires, and the advisory keys share the one-argument bigint space
//     with application advisory locks.
//
// # Mixed fleets: release trigger
//
// SyncGuard's release deletes the row itself and notifies nobody, so
// pglease waiters only see it at their next backoff poll (up to seconds
// later). migrate.Migrator.SetupReleaseTrigger(ctx, channel) (opt-in;
// DDL also from migrate.SQL) adds a row-level AFTER DELETE trigger on the lock
// table running pg_notify(channel, hashKey(user_key)), so any deleting
// session wakes them, whatever its role (the trigger function is SECURITY
// DEFINER: SyncGuard's role needs no grant on pglease's functions);
// takeover is an UPDATE and notifies nothing. Use the
// Managers' channel: pglease's own release then notifies the same payload
// twice in one transaction and PostgreSQL delivers it once (tested).
// Measured (BenchmarkReleaseTrigger, fsync on, 2 busy cores, 3 runs):
// pglease's releases are unaffected within noise (they already notify);
// SyncGuard's acquire+release cycle gets ~5-17% slower with one worker
// and loses ~25-45% throughput with 8 concurrent workers, because
// notifying commits serialize on PostgreSQL's global notify lock — the
// cost pglease's releases already pay. A statement-level trigger with a
// transition table costs the same. Recommended for mixed fleets whose
// pglease waiters wait on keys SyncGuard releases, unless SyncGuard's
// release throughput is near that limit; not needed without SyncGuard.
package pg
