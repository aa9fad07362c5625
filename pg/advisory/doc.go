// Package advisory gives PostgreSQL advisory locks a typed, checked Go API:
// session-level locks on a dedicated connection that reports its own loss,
// transaction-level locks, deadlock-free multi-key locking, key
// derivations equal to existing SQL and TypeScript code, a registry that
// refuses colliding lock ids, and inspection of who holds and who waits.
//
// # Which lock to use
//
//   - Transaction-level (XactLock, TryXactLock, WithXactLock): the lock
//     lives exactly as long as one transaction, and writes made in that
//     transaction are safe, because a holder that lost its connection
//     cannot commit. Prefer these whenever the protected work is database
//     writes that fit in one transaction.
//   - Lease locks (package pg and the Manager): for work outside the
//     database or longer than a transaction. They have a TTL and a fencing
//     token, so a resource can refuse a stale holder's writes.
//   - Session-level (Session): for coordination across many transactions
//     (a scheduler that must run once, a long cleanup) where a fence is not
//     needed, or for compatibility with code that already uses
//     pg_advisory_lock on the same ids.
//
// A session lock has NO fencing token, and it has a detection window:
// when the session dies (connection cut, pg_terminate_backend,
// idle_session_timeout, server restart), the server frees its locks at
// once, but the holder learns of it only at the next probe, up to
// ProbeInterval + ProbeTimeout later (2 s by default; longer while a
// statement is in flight, bounded by WaitSlice + ProbeTimeout). During
// that window another session can hold the same key while the first still
// believes it does. Do not rely on a session lock alone for correctness;
// use a transaction-level or lease lock for that.
//
// # Session guarantees
//
// A Session holds its locks on one connection hijacked from a pgxpool: it
// never goes back to the pool, so a lock cannot leak to the pool's next
// user. A caller's context never runs on that connection (pgx closes a
// connection whose context is cancelled, which would drop every lock on
// it): statements run under the Session's own context, and a caller that
// gives up on a blocking Lock has its server-side wait cancelled with a
// CancelRequest, after which the lock state is checked in pg_locks and a
// grant that raced the cancel is released. The other locks stay held.
//
// The Session sets idle_session_timeout and
// idle_in_transaction_session_timeout to 0 and statement_timeout to 0 on its
// connection (so role or database defaults cannot end it or cancel it),
// lock_timeout to WaitSlice, and tcp_keepalives_* and tcp_user_timeout so
// that the server frees a silently vanished holder's locks within about
// 25 s, well after the holder's own probe (2 s) has reported the loss.
//
// When the probe fails, a statement gets no reply within its bound, the
// backend pid changes (a transaction-mode pooler), or pg_advisory_unlock
// returns false, the Session ends as lost: every held Lock's Context is
// cancelled with a cause matching pglease.ErrLockLost, the connection is
// closed, and later calls return pglease.ErrClosed. Close releases
// everything and cancels the locks' contexts with pglease.ErrClosed.
//
// Taking a key the Session already holds is refused (InvalidArgument)
// unless Options.Reentrant is set: PostgreSQL would otherwise stack the
// lock silently and need two unlocks. Sessions are independent: two
// Sessions in one process contend like two processes.
//
// LockAll takes several keys in ascending Key order (int64 space before
// pairs, then by id), so callers taking overlapping sets never deadlock.
//
// # Keys
//
// PostgreSQL has two advisory key spaces, one bigint and one pair of int4,
// which never conflict with each other. Key keeps them apart: Int64 and
// Pair build keys of each, and SHA256Key, NamespacedKey and FNV1a32 derive
// int64-space keys exactly as the design's SQL functions (email_to_lock_id,
// generate_lock_id, under collation "C") and the registry's TypeScript
// hashString do. A Key never keeps the input it was derived from.
//
// # Security
//
// Advisory locks trust every role in the database: any role can take or
// block any key, and the lock table is shared by the whole server (53200
// "out of shared memory" is ResourceExhausted). Nothing here needs
// superuser or pg_signal_backend; Inspect degrades without
// pg_read_all_stats. Error messages never contain key ids or derivation
// inputs.
package advisory
