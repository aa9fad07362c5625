// Package telemetry is what a user of pglease configures and reads of its
// OpenTelemetry instrumentation: the configuration (Config, set as
// manager.Config.Telemetry) and the names of the spans, events, attributes
// and metrics a Manager records, with keys identified by hash and lockIds
// never recorded. The recording itself is internal to pglease.
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
// every tracer and meter is named ScopeName with Version().
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
//     only.
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
// Keys are identified by pglease.key.hash (AttrKeyHash):
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
// Key hashes appear on spans, events and logs only; metric attributes
// carry no key at all (cardinality), only lock kind, outcome, cause, queue
// and db.operation.name. TestNoRawKeysOrLockIDs drives every method over
// hundreds of keys with errors whose text quotes the key and its lockId,
// and scans every exported span, metric and log record for them.
//
// # Spans
//
//	name                      kind      parent                   attributes (+ at end)
//	pglease.acquire           internal  the caller's ctx         pglease.key.hash, pglease.lock.kind, pglease.acquire.try,
//	                                                             pglease.lock.ttl (s); + pglease.outcome, pglease.acquire.attempts,
//	                                                             pglease.acquire.wait (s), pglease.acquire.coalesced,
//	                                                             pglease.acquire.contended, pglease.fence (granted),
//	                                                             error.type (failed). Events pglease.queued
//	                                                             (coalesced, contended, queue.position) and pglease.attempt
//	                                                             (pglease.attempt, pglease.outcome, pglease.attempt.retry_in (s));
//	                                                             links to every DB span that carried an attempt.
//	pglease.release           internal  the releasing ctx        pglease.key.hash, pglease.lock.kind; + pglease.outcome
//	                                                             (ok, not_held, error), pglease.lock.held_for (s), error.type;
//	                                                             links to the acquire span and the DB span.
//	pglease.lost              internal  the lock's acquire span  pglease.key.hash, pglease.lock.kind, pglease.loss.cause,
//	                                                             pglease.lock.held_for (s), error.type=LockLost; status Error;
//	                                                             link to the heartbeat/DB span that found the loss.
//	pglease.heartbeat         internal  the loop's ctx (root)    pglease.heartbeat.due; + .extended, .lost, pglease.outcome.
//	pglease.acquire_many,     client    the operation it is      db.system.name=postgresql, db.operation.name (= span name),
//	pglease.release_many,               made for (see below),    server.address, server.port, db.namespace (from the
//	pglease.extend_many,                the heartbeat, or none   Manager's pool), pglease.batch.size;
//	pglease.handoff,                    (root)                   + pglease.batch.ok, pglease.outcome (ok, error), error.type,
//	pglease.advisory_lock, …                                     db.response.status_code (the SQLSTATE, when the server
//	                                                             refused the statement). Links to the spans it serves.
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
// Acquire outcomes (pglease.outcome on pglease.acquire and the acquire
// metrics): granted; locked (TryAcquire found the key held; not an error);
// timeout (AcquisitionTimeout); aborted (the caller's ctx ended); closed
// (the Manager closed); error (anything else).
//
// Advisory locks use the same spans with pglease.lock.kind=advisory; a
// blocking advisory wait is one pglease.advisory_lock client span whose
// duration is the wait.
//
// # Metrics
//
//	name                           instrument             unit       attributes
//	pglease.acquire.duration       histogram              s          pglease.lock.kind, pglease.outcome
//	pglease.acquire.attempts       histogram              {attempt}  pglease.lock.kind, pglease.outcome
//	pglease.acquire.contended      counter                {acquire}  pglease.lock.kind
//	pglease.acquire.coalesced      counter                {acquire}  pglease.lock.kind
//	pglease.lock.held              updowncounter          {lock}     pglease.lock.kind
//	pglease.lock.extends           counter                {extend}   pglease.lock.kind, pglease.outcome (ok, error)
//	pglease.lock.extend.lag        histogram              s          pglease.lock.kind
//	pglease.lock.lost              counter                {lock}     pglease.lock.kind, pglease.loss.cause
//	pglease.lock.releases          counter                {release}  pglease.lock.kind, pglease.outcome
//	pglease.db.batch.size          histogram              {item}     db.operation.name
//	pglease.listener.polling       counter                {manager}  (none): Managers polling instead of listening (see manager.Config.ListenConnString)
//	pglease.release_trigger.installed updowncounter       {manager}  (none): 1 per Manager whose lock table has the release trigger for its
//	                                                                 notify channel, 0 for one without (see migrate.Migrator.SetupReleaseTrigger)
//	db.client.operation.duration   histogram              s          db.system.name, db.operation.name, server.address,
//	                                                                 server.port, db.namespace, error.type, db.response.status_code
//	pglease.manager.loop.busy      observable gauge       1          (none): share of time busy since the last collection
//	pglease.manager.queue.depth    observable gauge       {item}     pglease.queue (waiters, mailbox, inflight, due)
//
// pglease.acquire.duration is the caller's whole wait, from StartAcquire
// to its outcome. Loss causes: expired (the local trust window passed
// without a successful extend), not_held (the database said the lock is
// gone), session_ended (an advisory lock's connection ended), other.
//
// pglease.release_trigger.installed follows the semantic conventions'
// 0/1 status metrics (k8s.container.ready): summed over Managers, it
// counts those with the trigger; a series at 0 is a Manager without it.
// The trigger (migrate.Migrator.SetupReleaseTrigger) matters only when SyncGuard
// processes share the tables: their releases delete the row without a
// NOTIFY, so without it this Manager's waiters learn of them by polling.
// A Manager without it therefore logs one Info record, not a warning.
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
package telemetry
