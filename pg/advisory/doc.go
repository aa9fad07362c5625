// Package advisory gives PostgreSQL advisory locks a typed, checked Go API:
// session-level locks on a dedicated connection that reports its own loss,
// transaction-level locks, deadlock-free multi-key locking, key
// derivations equal to existing SQL and TypeScript code, a registry that
// refuses colliding lock ids, and inspection of who holds and who waits.
//
// # Which lock to use
//
//   - Transaction-level (XactLock, TryXactLock, WithXactLock, XactLockAll,
//     TryXactLockAll): the lock
//     lives exactly as long as one transaction, and writes made in that
//     transaction are safe, because a holder that lost its connection
//     cannot commit. Prefer these whenever the protected work is database
//     writes that fit in one transaction.
//   - Lease locks (package pg and the Manager): for work outside the
//     database or longer than a transaction. They have a TTL and a fencing
//     token, so a resource can refuse a stale holder's writes.
//   - Session-level (Session, or Client, which manages a Session for
//     you): for coordination across many transactions (a scheduler that
//     must run once, a long cleanup) where a fence is not needed, or for
//     compatibility with code that already uses pg_advisory_lock on the
//     same ids.
//
// A session lock has NO fencing token, and it has a detection window:
// when the session dies (connection cut, pg_terminate_backend,
// idle_session_timeout, server restart), the server frees its locks at
// once, but the holder learns of it only when its probe finds out, up to
// ProbeInterval + ProbeTimeout later (2 s by default; see "Loss notice"
// below). During that window another session can hold the same key while
// the first still believes it does. Do not rely on a session lock alone
// for correctness; use a transaction-level or lease lock for that.
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
// The Session sets idle_in_transaction_session_timeout and
// statement_timeout to 0 on its connection (so role or database defaults
// cannot end it or cancel it), lock_timeout to ProbeInterval (a blocking
// Lock waits in slices that long), and tcp_keepalives_*, tcp_user_timeout
// and idle_session_timeout so that the server frees a silently vanished
// holder's locks within about 25 s, well after the
// holder's own probe (2 s) has reported the loss. A healthy Session is
// never idle longer than ProbeInterval, so idle_session_timeout ends only
// a holder that stopped talking: partitioned, or its process stopped
// (SIGSTOP, a debugger) for that long, which then loses its locks like a
// lease holder paused past its TTL, and hears of it at its next probe
// when it runs again.
//
// # Loss notice
//
// The holder is told of a lost session (every held Lock's Context ends
// with ErrLockLost) within ProbeInterval + ProbeTimeout of the session
// dying, for every accepted Options value, whether the connection was
// terminated, cut, left half-open (server side gone, client side silent)
// or blackholed. The Session keeps the time it last had proof that the
// server held it (the send time of the last statement the server
// answered) and sends a probe ProbeInterval after it; the probe is
// answered, fails at once, or times out after ProbeTimeout. A blocking
// Lock's wait slice (up to ProbeInterval)
// is started only if it ends before the probe would have given up, and
// is preceded by a probe otherwise, so a wait in progress never pushes
// the notice past the bound. The bound assumes the holder's process runs:
// a process that is stopped or starved for longer hears of the loss when
// it runs again. The bound is measured by TestLossNoticeBound* (terminate,
// cut, half-open, blackhole) in this package.
//
// # Behind a proxy or pooler
//
// TCP keepalives and tcp_user_timeout act on the server's own socket, so
// they free a vanished holder's locks only when the holder is the
// server's TCP peer. Behind a TCP proxy or a session-mode pooler
// (HAProxy, PgBouncer, a cloud proxy) the server's peer is the proxy,
// which stays alive and answers the keepalives: they never fire, and a
// partitioned holder's session locks would stay held for as long as the
// proxy keeps its server connection, indefinitely by default. The holder
// still hears of the loss in time (its probe times out), but no one else
// could take the keys.
//
// That is why the Session also sets idle_session_timeout
// (the same 25 s): a partitioned
// holder sends no probes, so the server ends its idle session and frees
// its locks, through any proxy. It needs PostgreSQL 14 or later. On older
// servers, or to free them sooner:
//
//   - give session locks a direct connection to PostgreSQL (a pool of
//     its own, used only for advisory.Open), or
//   - make the proxy drop a silent client, well after the probe bound: a
//     client-side inactivity timeout longer than a few ProbeIntervals (a
//     healthy Session sends a probe every ProbeInterval), such as
//     HAProxy's "timeout client", or TCP keepalive and tcp_user_timeout on
//     the proxy's client sockets (PgBouncer: tcp_keepalive,
//     tcp_keepidle, tcp_keepintvl, tcp_keepcnt, tcp_user_timeout). The
//     server frees the locks when the proxy closes its server connection
//     (PgBouncer resets it with server_reset_query, DISCARD ALL by
//     default, which releases advisory locks). PgBouncer's
//     client_idle_timeout does not help: it skips clients linked to a
//     server connection, which in session mode every client is.
//
// TestProxyPinsPartitionedHoldersLock, TestPgBouncerPartitionedHolder and
// TestServerIdleTimeoutFreesPartitionedHolderBehindProxy show each case.
//
// A transaction-mode pooler is refused at Open (the backend changes
// between transactions, or a pooler answered the start-up and hands this
// connection's backend to another client), and so is a change of backend
// seen by a probe. A session-mode pooler is accepted (TestPgBouncer…).
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
// # Client
//
// A Client (NewClient) takes session locks from a pool without the
// caller managing sessions: it opens one Session on its first Lock or
// TryLock (concurrent first callers share that one Open), replaces it on
// the next call after a loss, and hands out the same *Lock a Session
// does, with the same loss signal. Its callers exclude each other like
// two sessions: Lock of a key held through the Client waits, without
// I/O, for that holder in FIFO order, and the key is handed on only once
// the holder's unlock was answered, so the session never stacks a key.
// Options.HoldLimit applies per lock, from its grant. The Manager's
// LockAdvisory and TryLockAdvisory go through one Client per Manager,
// which adds its telemetry, a per-call hold limit and its Close.
//
// # Shared locks
//
// LockShared and TryLockShared (on a Session) and XactLockShared and
// TryXactLockShared (in a transaction) take a key in shared mode: any
// number of holders share it, and an exclusive holder (Lock, XactLock, …)
// excludes them all and is excluded by each of them, across sessions and
// transactions alike. A shared request waits behind a waiting exclusive
// one (PostgreSQL does not let readers starve a writer). Inspect reports
// the mode as pg_locks does: "ShareLock" for a shared holder or waiter,
// "ExclusiveLock" for an exclusive one. A Session holds each key in one
// mode only: taking a key in the other mode is InvalidArgument (see
// Options.Reentrant).
//
// # Several keys
//
// Session.LockAll, XactLockAll and TryXactLockAll take several keys in
// ascending Key order (int64 space before pairs, then by id), whatever
// order they are given in, so callers taking overlapping sets never
// deadlock each other. XactLockAll takes them all in one statement;
// TryXactLockAll takes all or none, giving back what it took when one is
// busy by rolling back to a savepoint.
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
// # Registry and inspection
//
// A Registry is the process's table of named ids (fixed keys and hash
// patterns) and refuses collisions when they are registered. Keep it in a
// registry file (LoadRegistry, JSON) that the application loads at
// start-up — a colliding id stops it there — and that operators load to
// read Inspect: Inspect names every fixed key, and every pattern key the
// inspecting Registry derived (Registry.Derive, Pattern.Key). A pattern
// key cannot be named from the key alone (that would need the input), so
// an operator who wants to find, say, the cleanup lock of the e-mail
// address in a ticket derives it from the address; the Registry keeps
// the key, never the address, and Inspect returns neither. Keys and
// Inspect's rows print as "int64:ID" (ParseKey reads that back).
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
