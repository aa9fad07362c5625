// Package manager hands out PostgreSQL lease locks (SyncGuard-compatible
// tables) to the goroutines of one process, through one actor goroutine
// that batches, heartbeats, coalesces waiters and signals loss.
//
//	m, err := manager.New(pool, manager.Config{}) // zero Config = defaults
//	defer m.Close(ctx)
//	lk, err := m.Acquire(ctx, "payment:123", manager.WithTTL(30*time.Second))
//	defer lk.Release(ctx)
//	work(lk.Context(), lk.Fence()) // cancelled with cause ErrLockLost if the lock is lost
//
// # Guarantees
//
// docs/guarantees.md states them, under these names: fence monotonicity
// (the Manager also refuses a grant whose fence is not above one it has
// seen for the key: CodeFenceRegression), server-time exclusivity,
// fenced-resource safety (fence your writes: that, not time, protects
// data), timely loss signal, ambiguity is never success, dead connections
// cost one bounded timeout, Close is bounded. No lock leaks when a caller
// leaves (its context ends) before, during or after its grant.
//
// Besides exclusive leases, a key can be held shared: by readers of a
// reader-writer lease (Shared) or permits of a counting semaphore
// (WithLimit), in the lock table's {lock}_shared table; AcquireAll takes
// several keys all or nothing; Lock.Guard ties a lease to the caller's
// transaction. Every one of them is a *Lock with the same heartbeat, loss
// signal and release.
//
// Any process can revoke a key's holds, its exclusive lease or its readers
// or permits, all or one (Revoke: each holder's Context ends with
// ErrRevoked as soon as its Manager hears of it) or ask
// its holders to release it (RequestRelease, Lock.ReleaseRequested); a
// lease taken WithLockDelay keeps the key from the next holder for a
// while after it expired or was revoked; Watch reports a key's grants,
// releases, revokes and expiries as they commit (elections use it).
//
// Callers of one Manager exclude each other like any two holders, for
// leases and advisory locks alike: locks are not re-entrant, and a caller
// that acquires a key it holds waits for itself until its context ends,
// as with sync.Mutex (see Acquire). The Manager cannot tell the goroutine
// that holds a lock from another, and workers of one process taking
// turns on a key is the common case.
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
//	                                                             ├─ revoked (Revoke) ────────► revoked  (cause ErrRevoked)
//	                                                             └─ Close ───────────────────► closed   (cause ErrClosed)
//
// waiting: the caller is in its key's FIFO queue, and all callers waiting
// for one key share one database attempt at a time (exclusive and shared
// waiters alike, in order: consecutive shared waiters at the head share
// one statement, shared.go; a set waiter has an attempt loop of its own,
// sets.go). A failed attempt
// schedules the next after the key's jittered backoff (Config.Retry), or
// sooner when its "locked" answer says when the holder's lease can be
// taken over; a release, notified from another process or made in this
// one, starts it at once. A release in this process with callers waiting
// here hands the key over in one statement (release and grant in one
// transaction), at most 4 times in a row, so that other processes'
// waiters get their turn at a hot key.
//
// held/extending: the heartbeat extends every lock TTL/3 after its last
// successful attempt, every extend due in one tick in one statement, and
// retries a failed extend every TTL/10 until the trust window ends
// (WithoutAutoExtend: only Lock.Extend extends it). An extend statement
// gives up at Config.StatementTimeout, unless no lease it carries could be
// retried before its trust window ends: then it waits for the server's
// answer until the first of their windows ends, so that a slow server's
// late answer still keeps them. Every end cancels the
// lock's Context once, with a *pglease.Error cause (Lock.Err). At a hold
// limit (WithHoldLimit) the Context ends with ErrHoldLimitExceeded while
// the lease, no longer extended, stays held until Release or expiry.
//
// # The trust window
//
//	trustedUntil = attemptStart + TTL − margin
//
// attemptStart is taken just before the acquire or extend is sent, so a
// slow round trip shortens the window instead of stretching it; margin is
// Config.LossMargin. The server computes expires_at from its own now() ≥
// attemptStart and gives the key to another only after expires_at + 1 s,
// so the lock is declared lost here first: by a timer that does not
// depend on the loop (one runtime timer for the earliest deadline of all
// held leases, losswatch.go), which ends the Context itself. A late extend
// that succeeds after the window does not revive the lock. The margin is
// the holder's: a lost lock's row stays until Release, Close or expiry.
//
// # After a pause
//
// A stopped process (SIGSTOP, a debugger, a VM pause) runs no timer, and
// once it resumes the overdue loss timer needs a moment to run; after a
// suspend of the machine, Go's timers, which do not count the suspended
// time, fire late, and the loss is signalled at the next heartbeat (up to
// TTL/3 after the resume; for a lease WithoutAutoExtend, up to the rest of
// its window). So Lock.Err, Lock.Extend and Lock.Release
// read the clock themselves (heartbeat.Now, which counts the suspended
// time) and answer ErrLockLost once the window has passed, while an
// open Done says only "not yet declared lost": call Err right before a
// step that needs the lock. No check closes the gap between it and the
// write reaching the database: fence the write (pg.FenceGuard, or the
// fence in your own WHERE clause).
//
// # Wake-ups across processes
//
// Unless Config.DisableNotify, each Manager keeps one dedicated connection
// LISTENing on the notify channel. A release runs pg_notify on the key's
// wake channel (the channel, ".", and hex digits 7 and 8 of
// pglease.HashKey(key): one of 256) with pglease.HashKey(key), never the
// raw key, only when another process waits for the key: a Manager whose
// attempt found the key taken elsewhere, or failed (free or not is then
// unknown), with callers still waiting, holds the key's waiter lock on
// its listening session (waiters.go), LISTENs to the key's wake channel
// while it waits, and tries the key once more after taking both. So a
// release is read by the processes waiting for its key (and for the
// keys sharing its wake channel), not by every listener of the fleet. A notification for a key with waiters starts its next
// attempt at once. Notifications are only a nudge: polling with backoff
// stays, and after the listener reconnects every waiting key is tried
// once, since notifications sent in the gap are lost.
//
// The same channel carries the other notices (store.ParseNotification,
// parsed by the listener): a revoke names the key's and the revoked
// lockId's hashes, and the loop ends the matching lock (revoke.go); a
// release request names the key's hash; a watched key's change names the
// key's hash, what changed and the fence, and is sent only while some
// session holds the key's watch lock, which the listener holds for a key
// a caller here watches (the same mail as the waiter locks; watch.go).
//
// # Who owns what
//
// One goroutine, run (loop.go), owns the lock state: LoopState and all it
// reaches (keys and their FIFO queues, set waiters, held locks, watched
// keys, the lanes of batched statements, retries, the listener's
// outbox). It never blocks on a caller
// (every reply channel has room), never runs SQL (a DB worker runs each
// batch and posts the outcome back) and sleeps on one timer. The rest:
//
//	state                         written by                   read by       synchronization
//	settings, store, recorder     New                          all           immutable after New
//	requests (acquireCh …)        callers                      run           channels; replies have one slot
//	batch outcomes (…DoneCh)      DB workers                   run           channels; a batch's items travel with it
//	loss deadlines (lossWatch)    run                          loss timer    lossWatch.mu
//	a lock's Context              run, loss and hold-limit     anyone        context: the first cause wins
//	                              timers, Lock.checkTrust
//	a lock's expiry and window    run                          Lock methods  atomics (leaseState)
//	lossCh                        loss and hold-limit timers,  run           one slot, non-blocking: nudges merge
//	                              Lock.checkTrust
//	the listening connection      listening service            service       owned by it (internal/notifier)
//	subscriptions (session locks) run (Link's outbox)          service       handed over on a channel (notifier.Link)
//	notifications, resyncs        service (and Revoke)         run           notifyCh, then Link.Deliver by topic
//	watched keys (watchLoop)      run                          run           watchCh (Watch, its ctx's end); reads
//	                                                                         on DB workers post to watchDoneCh
//	a watcher's events            run (sends, closes)          the caller    buffered channel; full: oldest dropped
//	a lock's ReleaseRequested     run, Lock.ReleaseRequested   the caller    made once by CAS (Lock.rq), closed by run
//	closing; done and closeErr    Close; run                   all; Close    closed once; closeErr set before done
//	advisory locks (adv)          callers, Close               callers       advisoryState.mu: they run on the
//	                                                                         Manager's advisory.Client, not on the loop
//
// # How it fails
//
//   - Database unreachable, connections terminated, server restarted:
//     waiters retry with backoff, and a wait that ends on an outage says
//     so (see Acquire); held locks retry their extends within the trust
//     window and are otherwise signalled lost, never silently; a release
//     with an unknown outcome is sent again while the lease may be live
//     (Lock.Release, Close).
//   - A dead pooled connection: a batch unanswered after a second (or half
//     the StatementTimeout) is stuck: the caps stop counting it and each
//     key it carries gets a new attempt on another connection
//     (flight.go), unless the Manager is shedding (next item). The
//     listener probes its connection after a quiet second, reconnects,
//     and then tries every waiting key once.
//   - Overload: held leases are renewed first. Acquires, releases and
//     handoffs never take the pool's last connection, stuck or not, and a
//     slow round trip makes the Manager shed: acquires go out at most one
//     batch per pause (up to 2 s) until answers are quick again for 5 s,
//     shown by pglease.manager.overload and a log record; a wait that
//     ends meanwhile says so (overload.go).
//   - Failover (several hosts, target_session_attrs=read-write): the pool
//     and the listener move to the new primary, each host's connect
//     bounded; fences stay safe only with synchronous replication
//     (docs/failover.md).
//   - Errors no retry can fix (a missing table, failed authentication)
//     fail the key's waiters at once; bad input is CodeInvalidArgument
//     before any I/O; a closed Manager answers CodeClosed.
//
// # Where the rest lives
//
//   - Settings and defaults: Config; per call: WithTTL,
//     WithAcquireTimeout, WithoutAutoExtend, WithHoldLimit, Shared,
//     WithLimit, WithLockDelay.
//   - Advisory locks: LockAdvisory, TryLockAdvisory (through one
//     advisory.Client per Manager), package advisory;
//     elections: package election (election.Run), built on Acquire,
//     Watch, Lookup and Config.
//   - Telemetry: package telemetry names every span, event, attribute and
//     metric, and says what recording costs.
//   - Performance figures: docs/performance.md and docs/scaling.md.
//   - The implementation (CONTRIBUTING.md maps the whole repository):
//     this package is the public face: manager.go (Config, New, Open,
//     Acquire, the options), lock.go (Lock), acquireall.go, calls.go
//     (Close, Revoke, RequestRelease), event.go (Watch), guard.go,
//     advisory.go, lookup.go (Config, Lookup). Each call validates,
//     builds a request, hands it to the kernel and wraps its answer; a
//     Lock wraps the kernel's hold. The kernel is package
//     manager/internal/kernel, and the file names above (loop.go,
//     waiters.go …) are its: loop.go (run, its handlers), state.go
//     (KeyState and its predicates), invariants.go (the rules the loop
//     state keeps, checked after every event in tests), pipeline.go (the
//     acquire-attempt protocol, written once), the attempt kinds
//     exclusive.go, shared.go (shared holds), sets.go (AcquireAll) and
//     fair.go (Config.FairQueue), tryattempt.go (try as a mode),
//     effects.go (an event's DB work), kstore.go (the store calls the
//     kernel makes: its Store interface), lane.go and flight.go
//     (batches, caps, stuck batches), handoff.go, foreign.go,
//     overload.go, extend.go, relretry.go, shutdown.go, losswatch.go,
//     timing.go, listener.go (the loop's subscriptions to the listening
//     service, internal/notifier), waiters.go (release wake-ups),
//     revoke.go (Revoke, RequestRelease), watch.go (Watch); its seeded
//     simulator runs with go test -run TestSimulate
//     ./manager/internal/kernel/ -sim.seed=N.
package manager
