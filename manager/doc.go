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
//   - Mutual exclusion is the server's (S2): a key is granted to one
//     lockId at a time, and every grant carries a fence strictly greater
//     than all earlier ones (S1). The Manager additionally remembers the
//     highest fence it has seen per key and refuses a lower or equal one
//     with CodeFenceRegression (the database lost acknowledged writes).
//     Fence your writes: that, not time, is what protects data.
//   - Timely loss signal (S4): a held lock's Context is cancelled with a
//     cause matching pglease.ErrLockLost no later than
//     attemptStart + TTL − margin of its last successful acquire or
//     extend, on this process's monotonic clock, by a timer that does not
//     depend on the Manager's loop; the server grants the key to someone
//     else only after expires_at + 1 s ≥ attemptStart + TTL + 1 s.
//   - Ambiguity is never success (S5): an acquire whose outcome is
//     unknown is not granted, and its pre-generated lockId is released;
//     an extend with an unknown outcome does not move the trust window.
//   - No leaked lock when a caller leaves (context cancelled or acquire
//     timeout) before, during or after its grant.
//   - Close is bounded and leaks no goroutine (L4).
//
// Locks are not re-entrant: Acquire of a key this Manager already holds
// waits behind the holder (FIFO), and TryAcquire answers "locked".
//
// # State diagram of a lock
//
//	Acquire ──► waiting ──(attempt ok, fence above all seen)──► held ◄──────────┐
//	             │  ▲                                            │              │ extend ok:
//	             │  └─ attempt "locked" or error: backoff,       │ TTL/3 after  │ trust window
//	             │     or a release/notification: at once        ▼ last attempt │ moves forward
//	             │                                            extending ────────┘
//	             ▼                                               │
//	   ctx/timeout: Aborted or AcquisitionTimeout                ├─ Release ─────────────────► released (cause ErrReleased)
//	   (a grant racing the caller's departure is                 ├─ extend not ok, or trust
//	    taken back and released)                                 │  window passed ───────────► lost     (cause ErrLockLost)
//	                                                             └─ Close ───────────────────► closed   (cause ErrClosed)
//
// waiting: the caller is in its key's FIFO queue. All callers waiting for
// one key share one database attempt at a time. A failed attempt
// schedules the next one after the key's jittered backoff (retry
// package); a release in this process starts it at once (local handoff,
// through the database: new lockId, new fence), and so does a release
// notification from another process.
//
// held/extending: the heartbeat (heartbeat package) extends every lock at
// TTL/3 after its last successful attempt; all extends due in one tick
// (within TTL/12) go out as one statement. A failed extend is retried
// every TTL/10 until the trust window ends.
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
// the window passed does not revive the lock: it is released instead.
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
// statement per batch (pg.Store's AcquireMany, ReleaseMany, ExtendMany).
// A request is sent at once when fewer than the in-flight cap of batches
// of its kind are running (so a lone caller never waits for a batch to
// fill); requests that arrive meanwhile go together in the next batch.
// The caps (Config.MaxInFlight, and (pool MaxConns − 1)/2 for acquires and
// releases) leave a pool connection for heartbeats; heartbeat extends
// have their own cap and never queue behind user requests in the loop.
//
// Wake-ups across processes: unless Config.DisableNotify, releases run
// pg_notify(channel, pglease.HashKey(key)) (never the raw key), and each
// Manager keeps one dedicated connection LISTENing on the channel. A
// notification for a key with waiters starts its next attempt at once.
// Notifications are only a nudge: polling with backoff stays, and after
// the listening connection is re-established every waiting key is tried
// once, since notifications sent in the gap are lost.
//
// # Failures
//
//   - Database unavailable, connections terminated, server restarted:
//     waiters keep retrying with backoff until their wait ends (the last
//     database error is the cause of their AcquisitionTimeout); held locks
//     keep retrying their extends and survive if one succeeds within the
//     trust window, otherwise they are signalled lost, never silently.
//     The pool reconnects by itself; the listener reconnects with backoff.
//   - Bad input (key, TTL, options, nil context) is CodeInvalidArgument
//     before any I/O; a closed Manager answers CodeClosed.
//   - Errors that retrying cannot fix (a missing table, failed
//     authentication, a fence counter past its maximum) fail the waiters
//     of the key at once.
//   - Close: see Manager.Close.
package manager
