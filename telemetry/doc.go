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
//	                                                             pglease.lock.ttl; + pglease.outcome, pglease.acquire.attempts,
//	                                                             pglease.acquire.wait, pglease.acquire.coalesced,
//	                                                             pglease.acquire.contended, pglease.fence (granted),
//	                                                             error.type (failed). Events pglease.queued
//	                                                             (coalesced, contended, queue.position) and pglease.attempt
//	                                                             (pglease.attempt, pglease.outcome, pglease.attempt.retry_in);
//	                                                             links to every DB span that carried an attempt.
//	pglease.release           internal  the releasing ctx        pglease.key.hash, pglease.lock.kind; + pglease.outcome
//	                                                             (ok, not_held, error), pglease.lock.held_for, error.type;
//	                                                             links to the acquire span and the DB span.
//	pglease.lost              internal  the lock's acquire span  pglease.key.hash, pglease.lock.kind, pglease.loss.cause,
//	                                                             pglease.lock.held_for, error.type=LockLost; status Error;
//	                                                             link to the heartbeat/DB span that found the loss.
//	pglease.heartbeat         internal  the loop's ctx (root)    pglease.heartbeat.due; + .extended, .lost, pglease.outcome.
//	pglease.acquire_many,     client    the only operation it    db.system.name=postgresql, db.operation.name (= span name),
//	pglease.release_many,               serves, else the span    server.address, server.port, db.namespace (from the
//	pglease.extend_many,                in ctx (heartbeat),      Manager's pool), pglease.batch.size;
//	pglease.handoff,                    else none (root)         + pglease.batch.ok, pglease.outcome (ok, error), error.type,
//	pglease.advisory_lock, …                                     db.response.status_code (the SQLSTATE, when the server
//	                                                             refused the statement).
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
//	pglease.release_trigger.missing counter               {manager}  (none): Managers whose lock table has no release trigger for their channel (see pg.Store.SetupReleaseTrigger)
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
// pglease.queued with coalesced=true and links to the same DB spans, and
// a round trip serving several callers is a root span that each of them
// links to. Example shows the spans of a real acquire.
//
// If the lock is later lost, a pglease.lost span appears in the same
// trace, under the acquire span, with the cause and a link to the
// heartbeat round that found it.
package telemetry
