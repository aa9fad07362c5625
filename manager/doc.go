// Package manager hands out PostgreSQL lease locks (SyncGuard-compatible
// tables, see package pg) to the goroutines of one process through a
// single actor goroutine that batches, heartbeats, coalesces, wakes
// waiters and signals loss.
//
//	m, err := manager.New(pool, manager.Config{}) // zero Config = defaults
//	defer m.Close(ctx)
//	lk, err := m.Acquire(ctx, "payment:123", manager.WithTTL(30*time.Second))
//	defer lk.Release(ctx)
//	work(lk.Context(), lk.Fence()) // cancelled with cause ErrLockLost if the lock is lost
//
// # Guarantees
//
// docs/guarantees.md states each guarantee in full, under the names used
// here.
//
//   - Server-time exclusivity: a key is granted to one lockId at a time.
//     Fence monotonicity: every grant carries a fence strictly greater
//     than all earlier ones. The Manager additionally remembers the
//     highest fence it has seen per key and refuses a lower or equal one
//     with CodeFenceRegression (the database lost acknowledged writes).
//     Fence your writes (fenced-resource safety): that, not time, is what
//     protects data.
//   - Timely loss signal: a held lock's Context is cancelled with a
//     cause matching pglease.ErrLockLost no later than
//     attemptStart + TTL − margin of its last successful acquire or
//     extend, on this process's monotonic clock, by a timer that does not
//     depend on the Manager's loop (one runtime timer, set for the earliest
//     loss deadline of all held leases, whose callback ends the lock's
//     Context itself; Lock.Err checks that deadline itself too,
//     so it holds for Err even right after the process was stopped: see
//     "After a pause"); the server grants the key to someone
//     else only after expires_at + 1 s ≥ attemptStart + TTL + 1 s.
//     That margin is the holder's: a lock declared lost on this clock is
//     not released in the database. Its row stays until the holder calls
//     Release (it has stopped; Release then frees the key at once and
//     returns the loss), Close, or the server's expiry.
//   - Ambiguity is never success: an acquire whose outcome is
//     unknown is not granted, and its pre-generated lockId is released;
//     an extend with an unknown outcome does not move the trust window.
//   - No leaked lock when a caller leaves (context cancelled or acquire
//     timeout) before, during or after its grant.
//   - Close is bounded and leaks no goroutine.
//
// # Callers of one Manager
//
// Locks are not re-entrant, and one rule holds for every kind (leases and
// the Manager's advisory locks): callers of one Manager exclude each
// other like any two holders. A try (TryAcquire, TryLockAdvisory) of a
// key held in this process answers ok=false; a waiting acquire (Acquire,
// LockAdvisory) waits for the local holder, in FIFO order with the other
// callers of this Manager; when such a wait ends without the lock, its
// error says that the key was held by this process (another caller of
// this Manager). So a goroutine that acquires a key it already holds
// waits for itself until its context ends, as with sync.Mutex: give the
// context a deadline. Why this rule, rather than refusing the second
// acquire: the Manager cannot tell the goroutine that holds a lock from
// another goroutine of the process, and two workers of one process
// taking turns on a key is the common case.
//
// # State diagram of a lock
//
//	Acquire ──► waiting ──(attempt ok, fence above all seen)──► held ◄──────────┐
//	             │  ▲                                            │              │ extend ok:
//	             │  └─ attempt "locked" or error: backoff,       │ TTL/3 after  │ trust window
//	             │     or a release/notification: at once        ▼ last attempt │ moves forward
//	             │                                            extending ────────┘
//	             ▼                                               │
//	   ctx/deadline: Aborted, AcquisitionTimeout or an outage    ├─ Release ─────────────────► released (cause ErrReleased)
//	   (a grant racing the caller's departure is                 ├─ extend not ok, or trust
//	    taken back and released)                                 │  window passed ───────────► lost     (cause ErrLockLost)
//	                                                             └─ Close ───────────────────► closed   (cause ErrClosed)
//
// waiting: the caller is in its key's FIFO queue. All callers waiting for
// one key share one database attempt at a time. A failed attempt
// schedules the next one after the key's jittered backoff (retry
// package), or sooner when its "locked" answer says that the holder's
// lease can be taken over sooner (the holder's expires_at + 1 s, with the
// server's clock read in the same statement: a holder that died is taken
// over then, not at the next poll); a release notification from another
// process starts it at once. A wait that ends without the lock names the
// holder its last "locked" answer saw (pg.Config.Holder), if known. A release in this process hands the key to the head waiter (local
// handoff, through the database: new lockId, new fence) in one statement
// that releases and grants in one transaction (internal/store's HandOff: one round
// trip and one durable commit per handover). After maxLocalHandOffs (4)
// handovers in a row the next release is a plain, notifying one and the
// next local waiter attempts like any other, so that waiters in other
// processes get their chance at a hot key.
//
// held/extending: the heartbeat (heartbeat package) extends every lock at
// TTL/3 after its last successful attempt; all extends due in one tick
// (within TTL/12) go out as one statement. A failed extend is retried
// every TTL/10 until the trust window ends. A lock taken
// WithoutAutoExtend is never extended by the heartbeat: its holder renews
// it with Lock.Extend, which joins the same batched statement. Lock.ExpiresAt
// is the server's expiry after the last successful acquire or extend, and
// Lock.Remaining the time left in the trust window.
//
// Every ended state cancels the lock's Context once, with a
// *pglease.Error cause (Lock.Err): ErrReleased, ErrLockLost or ErrClosed.
// The Lock, AdvisoryLock and advisory.Lock handles share this shape
// (pglease.Handle).
//
// # The trust window
//
//	trustedUntil = attemptStart + TTL − margin
//
// attemptStart is taken just before the acquire or extend is sent, so a
// slow round trip shortens the window instead of stretching it. margin
// defaults to TTL/10 within [10 ms, 5 s] (Config.LossMargin). The server
// computes expires_at from its own now() ≥ attemptStart, so, with clock
// rates within the margin, the lock is declared lost here before the
// server could give it to anybody else. A late extend that succeeds after
// the window passed does not revive the lock: it stays lost, and its row
// is kept until Release, Close or expiry, like any lost lease.
//
// # After a pause
//
// A process can be stopped without knowing it: SIGSTOP, a debugger, a VM
// or container pause, heavy swapping. No timer fires while it is stopped,
// and after it runs again the runtime needs a moment (microseconds to a
// few milliseconds, longer on a loaded machine) to run the loss timer
// that is by then overdue. Meanwhile the server may have given the key
// to someone else. So:
//
//   - Lock.Err, Lock.Extend and Lock.Release read the monotonic clock
//     themselves: once the trust window has passed they answer
//     ErrLockLost (and end the Context) even if the timer has not fired
//     yet. The heartbeat treats an extend that comes back after the
//     window as lost, whatever its timer says. Ask Err right before an
//     action that needs the lock.
//   - A bare ctx.Done() (or ctx.Err()) on the lock's Context promises
//     only that the lock ended if it is closed. While it is open it says
//     "not yet declared lost", not "held": just after a pause it can stay
//     open for that moment after the window passed. Code that selects on
//     Done between steps must still call Err before a step that needs the
//     lock.
//   - No check in this process can close the gap between its check and
//     its write reaching the database: a pause can fall right after Err
//     returned nil. Fence the write (pg.FenceGuard, or the fence in your
//     own WHERE clause): the guard takes a fence value, not the Lock, and
//     the database refuses a write whose fence is no longer the highest.
//
// # Hold limit
//
// WithHoldLimit(d) caps how long a lock is held, so that a stuck holder
// cannot keep it forever (the advisory-lock designs' 30-second limit).
// d after the grant the lock's Context ends with a cause matching
// pglease.ErrHoldLimitExceeded — not ErrLockLost: the lock is still
// held. The lease is not extended any more (Lock.Extend is refused) and
// is not released early either: Release before its trust window passes
// returns nil and frees it at once; a holder that never returns keeps it
// until it expires, TTL after its last extend, after which it is lost
// like any lease (Release then returns ErrLockLost). The margin and the
// takeover tolerance thus still protect a holder slow to stop. Advisory
// locks take the option too; they stay held until Release.
//
// # Architecture
//
// One goroutine (run, loop.go) owns all state (state.go): held locks, per
// key FIFO queues, the retry schedule, backoffs and the heartbeat
// schedule, with one timer. Callers talk to it through typed request
// channels with one-slot reply channels (requests.go), so the loop never
// blocks on a caller. The loop never runs SQL: it starts a goroutine per
// batch, which posts the result back.
//
// Batching: acquires, releases and extends each go out as one set-based
// statement per batch (internal/store's AcquireMany, ReleaseMany, ExtendMany).
// A request is sent at once when fewer than the in-flight cap of batches
// of its kind are running (so a lone caller never waits for a batch to
// fill); requests that arrive meanwhile go together in the next batch.
// The caps (Config.MaxInFlight, and (pool MaxConns − 1)/2 for acquires and
// releases) leave a pool connection for heartbeats; heartbeat extends
// have their own cap and never queue behind user requests in the loop.
//
// Wake-ups across processes: unless Config.DisableNotify, each Manager
// keeps one dedicated connection LISTENing on the channel, and a release
// runs pg_notify(channel, pglease.HashKey(key)) (never the raw key) when
// another process waits for the key (internal/store's ReleaseWaited): a Manager whose
// attempt found a key taken by someone else, with callers still waiting,
// holds the key's waiter lock (internal/store's WaiterLockClass) on its listening
// session until it no longer waits, and tries the key once more after
// taking it. Releases nobody waits for elsewhere skip the notification,
// whose commit serializes server-wide. A notification for a key with
// waiters starts its next attempt at once.
// Notifications are only a nudge: polling with backoff stays, and after
// the listening connection is re-established every waiting key is tried
// once, since notifications sent in the gap are lost. A listening
// connection can die silently (half-open behind a NAT or proxy, or
// blackholed), so whenever it has been quiet for a second the listener
// probes it with a round trip bounded by a second, and replaces it if the
// probe fails: wake-ups resume within about 2 s plus a reconnect. Its
// session also sets TCP keepalives, tcp_user_timeout and a 30 s
// idle_session_timeout (where the server has them), so the server ends
// the backend of a listener that vanished.
//
// # Configuration
//
// One style, by lifetime. Everything fixed for a Manager's life is a field
// of Config, including the nested telemetry.Config (as pg.Config and
// advisory.Options are in their packages): the zero value of each field
// means its documented default, and a bad value makes New fail with
// CodeInvalidArgument before any I/O. What varies per call is a small
// functional AcquireOption (WithTTL, WithAcquireTimeout,
// WithoutAutoExtend), validated before any I/O as well.
//
// Why: pgxpool.Config and river.Config configure a long-lived client the
// same way. A struct documents every setting and its default in one
// place, can be filled from a file, printed, copied and compared, and is
// validated as a whole (a TTL against the LossMargin, a hold limit against
// a TTL). Constructor options, as in etcd's concurrency.NewSession(client,
// WithTTL(…)), scatter the settings over functions and are applied one at
// a time. Per-call settings are few and usually absent, so options keep
// call sites short, as etcd's and nats's do. Telemetry used to be a slice
// of otel-contrib style options inside the struct, two styles in one
// value; it is a nested struct now, like pgxpool.Config.ConnConfig.
//
// # Telemetry
//
// Config.Telemetry is a telemetry.Config: TracerProvider and
// MeterProvider (default: the otel globals, which record nothing until
// the program installs SDK providers), Logger (default: no logging),
// KeySecret (default: keys identified by SyncGuard's hashKey, which is
// not secret) and RawKeys (debugging only). Spans
// and log records identify keys by pglease.key.hash only, metrics carry no
// key at all, and no lockId is ever recorded.
//
//   - pglease.acquire: one per Acquire/TryAcquire/Do, a child of the span
//     in the caller's ctx, covering the whole wait: a pglease.queued event
//     (coalesced behind other callers of this Manager, held locally,
//     position), one pglease.attempt event per database attempt made on
//     the caller's behalf (contended, granted or error, and the backoff
//     before the next), and at the end the outcome, attempts, wait,
//     coalesced, contended and the fence granted. It links to every
//     round trip that carried one of its attempts.
//   - pglease.acquire_many, pglease.release_many, pglease.extend_many,
//     pglease.handoff, pglease.listen: one client span per database round
//     trip (db.system.name=postgresql, batch size, items that succeeded).
//     A round trip carrying one key is a child of the acquire span of its
//     head waiter (the caller it grants; a handoff too), one carrying one
//     release a child of that release (or of the acquire round trip whose
//     orphaned grant it undoes); one carrying several is a root span. Each
//     links, from its start, to every other caller span it serves, and
//     those link to it: a caller's trace reaches every round trip made
//     for it.
//   - pglease.release: one per release the loop performs (Lock.Release,
//     a grant taken back from a caller who left, Close), a child of the
//     releasing caller's span, linked to the lock's acquire span and to
//     its round trip. Releasing an already released or lost lock records
//     nothing.
//   - pglease.heartbeat: one per extend batch, the parent of its
//     pglease.extend_many round trip, with the locks due, extended and
//     lost.
//   - pglease.lost: one per lost lock, a child of its acquire span (in the
//     acquirer's trace), with the cause (not_held: the server refused the
//     extend; expired: the trust window passed) and a link to the round
//     trip that found it.
//   - Advisory locks (LockAdvisory, TryLockAdvisory) record the same
//     pglease.acquire / pglease.release / pglease.lost spans with
//     pglease.lock.kind=advisory (no fence; loss cause session_ended) and
//     pglease.advisory_try_lock, pglease.advisory_lock and
//     pglease.advisory_unlock client spans; see TryLockAdvisory.
//
// Metrics (names in package telemetry) cover acquire waits, attempts,
// contention and coalescing, held locks, extends and their lag, losses by
// cause, releases, batch sizes, round-trip durations, and the loop's busy
// ratio and queue depths (waiters: callers in key queues; mailbox: items
// accepted by the loop and waiting for a batch slot; inflight: batches
// running; due: scheduled retries and held leases). Recording never
// blocks the loop: it is atomics, clock reads and the providers' own
// non-blocking calls; with the default (no-op) providers an acquire and
// its release cost 15 allocations more (BenchmarkAcquireRelease), against
// two database round trips.
//
// # Failures
//
//   - Database unavailable, connections terminated, server restarted:
//     waiters keep retrying with backoff until their wait ends. A wait
//     that ends while the key's last attempt (or a release its next one
//     waits for) could not reach the database, and no attempt since did,
//     ends with that failure's code
//     (ServiceUnavailable, NetworkTimeout), not AcquisitionTimeout: an
//     outage is not contention (see Manager.Acquire). A TryAcquire
//     answers at once with its own attempt's outcome. Held locks
//     keep retrying their extends and survive if one succeeds within the
//     trust window, otherwise they are signalled lost, never silently.
//     The pool reconnects by itself; the listener probes its connection
//     and reconnects with backoff. A release whose outcome is unknown
//     (Lock.Release's, or the best-effort release of an acquire whose
//     answer was lost) is sent again with backoff (100 ms doubling to 2 s)
//     until the server answers, for as long as the lease can be live on
//     the server (during Close: until CloseTimeout for a lock a caller
//     held, once more for the others; see Manager.Close): releasing by
//     lockId is safe to repeat, and the key is free as soon as the
//     database answers again, not only at the lease's expiry.
//   - Failover (a multi-host connection string with
//     target_session_attrs=read-write): the pool and the listener move to
//     the new primary; the connections pglease opens itself bound each
//     host's connect (2 s unless connect_timeout is set), and Open bounds
//     its pool's the same way, so a host that stopped answering without
//     closing connections does not hold them. Fences stay safe only with
//     synchronous replication (see docs/failover.md).
//   - Dead pooled connections (half-open, blackholed): a connection is
//     taken from the pool in tries of at most a second, so pgxpool's
//     liveness check of an idle dead connection costs one try (then the
//     pool destroys it); a batch without an answer after a second (or half
//     the StatementTimeout) is "stuck": the in-flight caps stop counting
//     it, and each key whose attempt it carries gets a new attempt (new
//     lockId) on another connection, while whatever the stuck one grants
//     or leaves unknown is released when its answer comes. A dead
//     connection thus costs the callers it carried about a second, and
//     nobody else anything.
//   - Bad input (key, TTL, options, nil context) is CodeInvalidArgument
//     before any I/O; a closed Manager answers CodeClosed.
//   - Errors that retrying cannot fix (a missing table or database,
//     failed authentication, a role that does not exist, a fence counter
//     past its maximum) fail the waiters of the key at once.
//   - Close: see Manager.Close.
//
// # Advisory locks
//
// LockAdvisory and TryLockAdvisory take PostgreSQL session-level advisory
// locks (package advisory keys) with the same handle shape as a lease
// (pglease.Handle): AdvisoryLock has Release, Context, Done, Err and Key.
// All advisory locks of a Manager share one advisory.Session (one dedicated connection
// hijacked from the pool, checked by a probe), opened on first use. When
// that session is lost (connection cut, pg_terminate_backend, server
// restart), the server has already freed its locks; every AdvisoryLock's
// Context is cancelled with a cause matching pglease.ErrLockLost once the
// probe notices (within about ProbeInterval + ProbeTimeout, 2 s by
// default), and the next call opens a new session. Advisory locks have no
// TTL and no fencing token, so that detection window is not covered by a
// fence: see package advisory for when to prefer a lease or a
// transaction lock. A key held or being taken through this Manager is
// waited for (LockAdvisory, FIFO) or answered ok=false (TryLockAdvisory),
// as for leases (see "Callers of one Manager"); a wait ended by ctx is
// CodeAborted and leaves the other locks held. Close
// cancels the held advisory locks with ErrClosed, fails waiting calls with
// ErrClosed and closes the session (pg_advisory_unlock_all, then the
// connection), bounded by Config.CloseTimeout, before Done is closed.
// WithHoldLimit caps how long one is held: its Context then ends with
// pglease.ErrHoldLimitExceeded, and it stays held until Release.
package manager
