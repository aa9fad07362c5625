// Package telemetry is what a user of pglease configures and reads of its
// OpenTelemetry instrumentation: the configuration (Config, set as
// manager.Config.Telemetry), and, in the table under "Names" below, every
// span, event, attribute and metric a Manager records, with its unit and
// meaning. Keys are identified by hash and lockIds are never recorded.
// This package also holds the recorder that names and emits them, as
// unexported code (see "Where the recorder lives"): a user configures and
// reads, and never calls it.
//
//	tp := sdktrace.NewTracerProvider(...)          // or leave nil: the otel globals
//	m, err := manager.New(pool, manager.Config{
//		Telemetry: telemetry.Config{TracerProvider: tp, MeterProvider: mp, Logger: logger},
//	})
//
// It follows the opentelemetry-go-contrib rules for instrumentation
// libraries: pglease depends on the OpenTelemetry API only (otel, trace,
// metric, attribute, codes, semconv/v1.40.0), never on the SDK; it takes
// providers, never a Tracer or Meter, and they default to the global ones;
// every tracer and meter is named ScopeName, with the pglease release that
// recorded the data as its instrumentation version (so a dashboard can
// tell which release's names and units apply).
//
// # Guarantees
//
//   - Telemetry never fails the caller: an instrument or callback the
//     MeterProvider refuses is reported to otel.Handle and replaced by a
//     no-op, and nothing in the recording returns an error or panics.
//   - Telemetry never blocks: recording takes no lock shared with
//     collection, does no I/O and never waits, except what the configured
//     providers and slog handler do themselves (the SDK's batch span
//     processor does not block; a slow slog handler would, so give
//     Config.Logger a non-blocking one). Metric callbacks read atomics
//     only, and walk a concurrent map of the live locks that never makes
//     a recording wait.
//   - Telemetry is cheap: attribute sets and span options are built once
//     per Manager; spans get their attributes only when IsRecording. One
//     acquire plus its release (two operation spans, two database spans,
//     eight measurements) costs ~1.2 µs and 15 allocations with the
//     never-configured global providers, ~0.8 µs with explicit no-op
//     providers, ~8 µs with a recording SDK, against ≥ 100 µs for a
//     database round trip.
//
// # Redaction
//
// A raw lock key never appears in a span name, attribute, event, link,
// status message, metric attribute or log record, unless Config.RawKeys
// is set (debugging only), which adds it as pglease.key / "key". A lockId
// never appears at all: no method accepts one. Error text is never
// recorded either, since it may quote caller data: errors are recorded as
// error.type = the pglease Code name ("LockLost", "AcquisitionTimeout"),
// "context.Canceled", "context.DeadlineExceeded" or "_OTHER", and the span
// status description is that same string.
//
// Keys are identified by pglease.key.hash:
//
//   - with Config.KeySecret: HMAC-SHA-256(secret, NFC(key)) truncated
//     to 128 bits, 32 hex digits. Without the secret the hash reveals
//     nothing about the key; processes sharing the secret produce the same
//     hash for the same key.
//   - otherwise: pglease.HashKey, SyncGuard's hashKey of NFC(key), 24 hex digits, the value
//     SyncGuard reports as LockInfo.keyHash. It is NOT secret: it is a
//     fixed, unkeyed, non-cryptographic function, so anyone holding a
//     candidate key can compare, and low-entropy keys (order numbers,
//     e-mail addresses) can be recovered by guessing. It identifies keys;
//     it does not hide them.
//
// Key hashes appear on spans, events and logs, and on the two age gauges
// (pglease.lock.oldest.age, pglease.acquire.wait.longest: one point each
// per Manager, the oldest lock's or longest wait's key, so an alert can
// name the key an operator looks up with `pglease status`); other metric
// attributes carry no key at all (cardinality), only lock kind, outcome,
// cause, wait reason, queue and db.operation.name. TestNoRawKeysOrLockIDs drives every method over
// hundreds of keys with errors whose text quotes the key and its lockId,
// and scans every exported span, metric and log record for them.
//
// # Names
//
// Every name pglease records, one row each: spans (kind internal for an
// operation, client for a database round trip), the events on them, their
// attributes, and the metrics (with their instrument). Units: s is
// seconds; a name in braces counts things; 1 is a ratio; - is no unit (a
// span, an event, a string, a boolean). Names carry no unit themselves
// (see "Units"). Names marked semconv are the OpenTelemetry semantic
// conventions' own (v1.40.0). Every client span has db.system.name,
// db.operation.name (its own name), server.address, server.port,
// db.namespace (the Manager's pool) and pglease.batch.size; at its end
// pglease.batch.ok, pglease.outcome (ok, error), and for a failed one
// error.type and db.response.status_code. It links to the spans it serves
// (see "Traces").
//
//	name                               kind                       unit       meaning
//	pglease.acquire                    span, internal             -          One Acquire, TryAcquire, Do, LockAdvisory or TryLockAdvisory (and one
//	                                                                         per key of an AcquireAll or TryAcquireAll), from the call to its
//	                                                                         outcome (the caller's wait); a child of the caller's span.
//	                                                                         Attributes pglease.key.hash, pglease.lock.kind, pglease.acquire.try,
//	                                                                         pglease.lock.ttl (leases); at its end pglease.outcome,
//	                                                                         pglease.acquire.attempts, pglease.acquire.wait, pglease.acquire.coalesced,
//	                                                                         pglease.acquire.contended, pglease.fence (granted), error.type (failed),
//	                                                                         and for one that found its key held pglease.wait.reason and
//	                                                                         pglease.holder (the last refusal's). Events pglease.queued,
//	                                                                         pglease.attempt and pglease.wait; links to the round trips that
//	                                                                         carried its attempts.
//	pglease.release                    span, internal             -          One release the Manager makes, a child of the releasing caller's span.
//	                                                                         Attributes pglease.key.hash, pglease.lock.kind; at its end
//	                                                                         pglease.outcome (ok, not_held, error), pglease.lock.held_for,
//	                                                                         error.type. Links to the lock's acquire span and its round trip.
//	pglease.lost                       span, internal             -          A held lock found lost, a child of its pglease.acquire span; status
//	                                                                         Error. Attributes pglease.key.hash, pglease.lock.kind,
//	                                                                         pglease.loss.cause, pglease.lock.held_for, error.type=LockLost
//	                                                                         (Revoked for a revoked lease); a link
//	                                                                         to the heartbeat or round trip that found the loss.
//	pglease.heartbeat                  span, internal             -          One round of extends of the locks due, a root span. Attributes
//	                                                                         pglease.heartbeat.due; at its end pglease.heartbeat.extended,
//	                                                                         pglease.heartbeat.lost, pglease.outcome (ok, error), error.type.
//	pglease.acquire_many               span, client               -          A round trip of lease acquire attempts, one or more keys.
//	pglease.release_many               span, client               -          A round trip of lease releases.
//	pglease.extend_many                span, client               -          A round trip of lease extends, a child of its pglease.heartbeat.
//	pglease.handoff                    span, client               -          One statement releasing a lease and granting the key to the next
//	                                                                         local waiter.
//	pglease.acquire_shared_many        span, client               -          A round trip of shared-hold attempts (readers, semaphore permits),
//	                                                                         one or more keys.
//	pglease.acquire_sets               span, client               -          A round trip of all-or-nothing set attempts (AcquireAll), one or more
//	                                                                         sets.
//	pglease.advisory_lock              span, client               -          A blocking wait on pg_advisory_lock: its duration is the wait.
//	pglease.advisory_try_lock          span, client               -          One pg_try_advisory_lock.
//	pglease.advisory_unlock            span, client               -          Advisory unlocks: one lock's, or all of a session's at Close.
//	pglease.listen                     span, client               -          Connecting the listening connection and subscribing to the notify
//	                                                                         channel (not the wait for notifications).
//	pglease.revoke                     span, client               -          One Revoke: the statement that deletes a key's lease, a child of the
//	                                                                         caller's span.
//	pglease.request_release            span, client               -          One RequestRelease: the statement that asks a key's holders to release
//	                                                                         it, a child of the caller's span.
//	pglease.snapshot                   span, client               -          A read of watched keys' state (Watch): after a watch registers, after
//	                                                                         a grant (its holder and expiry), to confirm an expiry.
//	pglease.queued                     event                      -          On pglease.acquire, when the caller joined the key's local queue:
//	                                                                         pglease.acquire.coalesced, pglease.acquire.contended,
//	                                                                         pglease.queue.position.
//	pglease.attempt                    event                      -          On pglease.acquire, one per database attempt that served it:
//	                                                                         pglease.attempt, pglease.outcome (granted, contended, error),
//	                                                                         pglease.attempt.retry_in.
//	pglease.wait                       event                      -          On pglease.acquire, at its first refusal and when the reason or the
//	                                                                         holder changes: pglease.wait.reason, pglease.holder.
//	pglease.ticket                     event                      -          On pglease.acquire with Config.FairQueue, when its place in the key's
//	                                                                         queue in the database changed: pglease.ticket.position.
//	pglease.key.hash                   attribute, string          -          The key's hash (see "Redaction"): on every per-key span, event and
//	                                                                         log record; on metrics only on the two age gauges
//	                                                                         (pglease.lock.oldest.age, pglease.acquire.wait.longest), one point
//	                                                                         each per Manager.
//	pglease.key                        attribute, string          -          The raw key, only with Config.RawKeys (debugging).
//	pglease.lock.kind                  attribute, string          -          lease (an exclusive lease, also each lock of a set), shared (a reader
//	                                                                         of a reader-writer lease), permit (a semaphore permit) or advisory.
//	pglease.lock.ttl                   attribute, float64         s          The lease TTL.
//	pglease.lock.held_for              attribute, float64         s          How long the lock was held.
//	pglease.acquire.try                attribute, bool            -          True for TryAcquire and TryLockAdvisory (one attempt, no waiting).
//	pglease.acquire.attempts           attribute, int             {attempt}  The database attempts an acquire saw.
//	pglease.acquire.wait               attribute, float64         s          The time an acquire waited.
//	pglease.acquire.coalesced          attribute, bool            -          The acquire queued behind another caller of this process for the
//	                                                                         same key instead of starting its own attempts.
//	pglease.acquire.contended          attribute, bool            -          The acquire found the key held (by another process, or by another
//	                                                                         caller of this one) at least once.
//	pglease.outcome                    attribute, string          -          How an operation ended. Acquires: granted, locked (a try found the
//	                                                                         key held; not an error), timeout (AcquisitionTimeout), aborted (the
//	                                                                         caller's context ended), closed (the Manager closed), error
//	                                                                         (anything else); attempts: granted, contended, error; releases: ok,
//	                                                                         not_held, error; round trips and heartbeats: ok, error.
//	pglease.attempt                    attribute, int             -          The attempt's number, from 1, on a pglease.attempt event.
//	pglease.attempt.retry_in           attribute, float64         s          The backoff delay before the next attempt.
//	pglease.queue.position             attribute, int             -          The caller's place in the key's local queue (0 = first).
//	pglease.ticket.position            attribute, int             -          The caller's place in the key's queue in the database, across
//	                                                                         processes (1 = the head; Config.FairQueue).
//	pglease.wait.reason                attribute, string          -          Why an acquire waits (its last refusal): holder (a live exclusive
//	                                                                         lease), shared_holders (readers or permits an exclusive acquire waits
//	                                                                         for), semaphore_full (a permit: the limit is taken), writer_mark (a
//	                                                                         reader or permit kept off by a waiting writer's mark), lock_delay
//	                                                                         (an expired lease's lock delay or a revoke's delay), set_member (a
//	                                                                         free key of a set another key of which is held), held_locally
//	                                                                         (another caller of this process holds it), queued (nothing holds
//	                                                                         it, but other callers' tickets of its fair queue go first), none.
//	pglease.holder                     attribute, string          -          The holder identity the refusing holder recorded (its
//	                                                                         manager.Config.Holder, "program[pid]@host" by default); absent for a
//	                                                                         SyncGuard holder, which records none.
//	pglease.fence                      attribute, int             -          The fencing token granted (not a secret).
//	pglease.loss.cause                 attribute, string          -          Why a lock was lost: expired (the local trust window passed without
//	                                                                         a successful extend), not_held (the database said the lock is
//	                                                                         gone), session_ended (an advisory lock's connection ended), revoked
//	                                                                         (the lease was revoked: its Context ended with ErrRevoked), other.
//	pglease.batch.size                 attribute, int             {item}     The items (keys, locks) one round trip carries.
//	pglease.batch.ok                   attribute, int             {item}     How many of them succeeded (granted, extended, released).
//	pglease.heartbeat.due              attribute, int             {lock}     The locks due for extension in a heartbeat round.
//	pglease.heartbeat.extended         attribute, int             {lock}     The locks a heartbeat round extended.
//	pglease.heartbeat.lost             attribute, int             {lock}     The locks a heartbeat round found lost.
//	pglease.queue                      attribute, string          -          A Manager queue on pglease.manager.queue.depth: waiters (callers in
//	                                                                         the keys' queues), mailbox (work accepted and not yet sent),
//	                                                                         inflight (round trips started and not yet answered), due (scheduled
//	                                                                         extends and retries).
//	db.system.name                     attribute, string          -          semconv: postgresql.
//	db.operation.name                  attribute, string          -          semconv: the round trip's span name (pglease.acquire_many, …).
//	db.namespace                       attribute, string          -          semconv: the database of the Manager's pool.
//	db.response.status_code            attribute, string          -          semconv: the SQLSTATE, when the server refused the statement.
//	server.address                     attribute, string          -          semconv: the host of the Manager's pool.
//	server.port                        attribute, int             -          semconv: the port of the Manager's pool.
//	error.type                         attribute, string          -          semconv: the pglease Code name of a failure ("LockLost",
//	                                                                         "AcquisitionTimeout"), "context.Canceled",
//	                                                                         "context.DeadlineExceeded" or "_OTHER"; never the error's text.
//	pglease.acquire.duration           metric, histogram          s          An acquire's whole wait, from the call to its outcome, including
//	                                                                         retries; by pglease.lock.kind, pglease.outcome.
//	pglease.acquire.attempts           metric, histogram          {attempt}  The database attempts an acquire saw; by pglease.lock.kind,
//	                                                                         pglease.outcome.
//	pglease.acquire.contended          metric, counter            {acquire}  Acquires that found their key held at least once; by
//	                                                                         pglease.lock.kind.
//	pglease.acquire.coalesced          metric, counter            {acquire}  Acquires that queued behind another caller of this process for the
//	                                                                         same key; by pglease.lock.kind.
//	pglease.lock.held                  metric, updowncounter      {lock}     Locks held by this process now; by pglease.lock.kind.
//	pglease.lock.extends               metric, counter            {extend}   Automatic extends; by pglease.lock.kind, pglease.outcome (ok, error).
//	pglease.lock.extend.lag            metric, histogram          s          How late an extend started after it was due; by pglease.lock.kind.
//	pglease.lock.lost                  metric, counter            {lock}     Held locks lost; by pglease.lock.kind, pglease.loss.cause.
//	pglease.lock.releases              metric, counter            {release}  Releases; by pglease.lock.kind, pglease.outcome.
//	pglease.lock.hold.duration         metric, histogram          s          How long a lock was held, grant to release or loss; by
//	                                                                         pglease.lock.kind.
//	pglease.acquire.wait.duration      metric, histogram          s          How long an acquire that found its key held waited, call to outcome;
//	                                                                         by pglease.lock.kind, pglease.wait.reason (its last refusal's).
//	pglease.lock.oldest.age            metric, observable gauge   s          How long this process's longest-held lock has been held, with its
//	                                                                         pglease.key.hash and pglease.lock.kind; no point when none is held.
//	pglease.acquire.wait.longest       metric, observable gauge   s          How long this process's longest-waiting acquire of a held key has
//	                                                                         waited, with pglease.key.hash, pglease.lock.kind, pglease.wait.reason;
//	                                                                         no point when none waits.
//	pglease.db.batch.size              metric, histogram          {item}     The items one round trip carries; by db.operation.name.
//	pglease.listener.polling           metric, counter            {manager}  Managers polling instead of listening, because their listening
//	                                                                         connection goes through a transaction-mode pooler (see
//	                                                                         manager.Config.ListenConnString).
//	pglease.listener.up                metric, observable gauge   {session}  1 while the Manager's listening session (release notifications,
//	                                                                         revocations, watch events) is connected, 0 while it reconnects or
//	                                                                         after it gave up for polling; no point without a listener.
//	pglease.release_trigger.installed  metric, updowncounter      {manager}  1 per Manager whose lock table has the release trigger for its
//	                                                                         notify channel, 0 for one without (see "The release trigger").
//	pglease.manager.loop.busy          metric, observable gauge   1          The share of time the Manager's loop was busy since the last
//	                                                                         collection.
//	pglease.manager.queue.depth        metric, observable gauge   {item}     The length of each Manager queue, by pglease.queue.
//	pglease.manager.overload           metric, observable gauge   1          1 while the Manager holds back acquires because the database answers
//	                                                                         slowly, so that held leases are renewed first; 0 otherwise (see
//	                                                                         "Overload").
//	db.client.operation.duration       metric, histogram          s          semconv: one round trip's duration; by db.system.name,
//	                                                                         db.operation.name, server.address, server.port, db.namespace, and
//	                                                                         for a failed one error.type and db.response.status_code.
//
// # Traces
//
// A database round trip goes in the trace of the operation it is made
// for. One carrying one key is a child of the acquire span of that key's
// head waiter (the caller it grants, if it grants), however many callers
// wait behind it; a handoff too (it grants the head waiter). One carrying
// one release is a child of that pglease.release span, or, for a release
// the Manager makes on its own of a lockId no caller holds (an attempt's
// whose callers left, whose outcome was unknown, or which another attempt
// superseded), a child of the acquire round trip whose grant it undoes. An extend is a child of its pglease.heartbeat
// span. A round trip carrying several keys or releases is a root span.
// Every lease round trip links, from its start, to each span it serves
// that is not its parent (each waiter of each key it carries, each
// release, each extended lock's acquire span; at most 128), as the
// messaging conventions link a batch to the messages it processes; and
// each pglease.acquire and pglease.release span links to the round trips
// that carried it. (An advisory lock's round trips are children of its
// acquire or release span; the one ending the session at Close, which
// releases several, is a root span each release span links to.) A caller following its own trace reaches every round trip
// made for it, as a descendant or through a link, and a contended acquire
// adds no trace besides its caller's unless its key was batched with
// others.
//
// Advisory locks use the same spans with pglease.lock.kind=advisory; a
// blocking advisory wait is one pglease.advisory_lock client span whose
// duration is the wait.
//
// # The release trigger
//
// pglease.release_trigger.installed follows the semantic conventions'
// 0/1 status metrics (k8s.container.ready): summed over Managers, it
// counts those with the trigger; a series at 0 is a Manager without it.
// The trigger (migrate.Migrator.SetupReleaseTrigger) matters only when SyncGuard
// processes share the tables: their releases delete the row without a
// NOTIFY, so without it this Manager's waiters learn of them by polling.
// A Manager without it therefore logs one Info record, not a warning.
//
// # Overload
//
// Under overload a Manager renews the leases it holds before it sends new
// acquires. When a round trip is answered slowly (beyond a tenth of
// Config.StatementTimeout, within [50 ms, 500 ms], plus 20 µs per item;
// or an extend beyond a quarter of its leases' slack, or an extend that
// failed by its deadline), the Manager starts holding back acquires: at
// most one acquire batch per pause, which doubles while slow answers go on
// (up to 2 s) and shrinks while answers are quick; stuck batches are not
// hedged. It stops when no slow answer was seen for 5 s.
// pglease.manager.overload is 1 meanwhile (summed over Managers: how many
// hold back acquires), and each change is one log record:
//
//	Warn  "pglease: the database is overloaded; acquires are held back so that held leases stay renewed"
//	      round_trip (s), operation (db.operation.name), acquire_gap (s)
//	Info  "pglease: the database answers in time again; acquires are no longer held back"
//	      lasted (s), slowest_round_trip (s), operation, longest_acquire_gap (s)
//
// An acquire whose wait ends while its Manager holds back acquires says
// so in its error. Whatever the load, acquires, releases and handoffs use
// at most the pool's MaxConns − 1 connections together (1 when MaxConns
// is 1), so an extend never waits for a connection behind them.
//
// # Units
//
// Every duration is in seconds, as the OpenTelemetry semantic conventions
// record durations. Metric instruments that measure time have unit "s"
// (pglease.acquire.duration, pglease.lock.extend.lag,
// db.client.operation.duration); duration attributes are float64 seconds
// (pglease.lock.ttl=30 is 30 s; pglease.acquire.wait,
// pglease.attempt.retry_in, pglease.lock.held_for), as the conventions'
// own duration attributes are (app.jank.period,
// messaging.gcp_pubsub.message.ack_deadline); log fields are the same
// numbers (wait, held_for). Names carry no unit, as in the conventions: a
// metric's unit is its metadata (a Prometheus exporter appends _seconds
// itself), and an attribute's is the one stated here. Counts have
// annotation units ({lock}, {attempt}, {manager}); pglease.manager.loop.busy
// is a ratio (unit 1).
//
// # A contended acquire in a trace
//
// A caller asks for "payment:123", which another process holds. In the
// caller's trace, its pglease.acquire span (pglease.key.hash=a422dabe…)
// carries an event pglease.queued (position 0, not coalesced), then one
// pglease.attempt event per try: "1 contended retry_in=0.1", "2 contended
// retry_in=0.2", "3 granted". Because each round trip served only this
// caller, each is a pglease.acquire_many client span under the acquire
// span (db.system.name=postgresql, pglease.batch.size=1, batch.ok 0, 0,
// then 1), and the acquire span also links to all three. The span ends
// with pglease.outcome=granted, pglease.acquire.attempts=3,
// pglease.acquire.contended=true and pglease.fence; its duration is the
// wait, also recorded in pglease.acquire.duration{outcome=granted}, and
// pglease.acquire.contended goes up by one. If a second caller of the same
// process had asked meanwhile, its own acquire span would show
// pglease.queued with coalesced=true and links to the DB spans made for
// the key from then on; those stay children of the first caller's acquire
// span (the head waiter) and link to the second caller's. When the first
// caller releases, one pglease.handoff round trip releases its lock and
// grants the key to the second: a child of the second caller's acquire
// span, linked to the first caller's pglease.release span. Each caller's
// trace holds or links to every round trip made for it. Example shows the
// spans of a real acquire.
//
// If the lock is later lost, a pglease.lost span appears in the same
// trace, under the acquire span, with the cause and a link to the
// heartbeat round that found it.
//
// # Where the recorder lives
//
// Everything that names and emits pglease's telemetry is in this package:
// the names (names.go), the instruments and their attribute sets, the
// spans, the log records and the metric callbacks (the unexported
// recorder, acquisition and loop types). The Manager, the advisory Client
// and the notifier reach it through pglease's internal/obs package, which
// holds only the handles they keep (a nil or zero one records nothing)
// and the values they pass (lock kinds, outcomes, causes, operations).
// This package registers its constructor there in its init, as grpc's
// packages register balancers and codecs, and as pglease's pg/advisory
// and pg/migrate register themselves in its internal packages. So the
// public API gains no name (the recorder's methods are on unexported
// types), the callers compile against the small internal/obs, and every
// program that builds a Manager links this package, because
// manager.Config holds a Config; a recorder built without it panics at
// once, never records nothing in silence.
package telemetry
