package telemetry

import "go.opentelemetry.io/otel/attribute"

// ScopeName is the instrumentation scope name of every tracer and meter
// pglease creates: the module path, since pglease instruments itself.
const ScopeName = "github.com/pglease/pglease"

// version is the instrumentation version reported with ScopeName.
const version = "0.1.0"

// Version returns the instrumentation version reported with ScopeName.
func Version() string { return version }

// Span names of operations (kind internal).
const (
	// SpanAcquire covers one Acquire, TryAcquire, Do, LockAdvisory or
	// TryLockAdvisory, from the call to its outcome: the caller's wait.
	SpanAcquire = "pglease.acquire"
	// SpanRelease covers one release the Manager performs.
	SpanRelease = "pglease.release"
	// SpanLost marks a held lock found lost.
	SpanLost = "pglease.lost"
	// SpanHeartbeat covers one batch of extends.
	SpanHeartbeat = "pglease.heartbeat"
)

// Span names of database round trips (kind client); each is also the
// span's db.operation.name.
const (
	SpanAcquireMany     = "pglease.acquire_many"
	SpanReleaseMany     = "pglease.release_many"
	SpanExtendMany      = "pglease.extend_many"
	SpanHandOff         = "pglease.handoff"       // a release and the next local waiter's acquire, one statement
	SpanAdvisoryLock    = "pglease.advisory_lock" // a blocking wait on pg_advisory_lock
	SpanAdvisoryTryLock = "pglease.advisory_try_lock"
	SpanAdvisoryUnlock  = "pglease.advisory_unlock"
	SpanListen          = "pglease.listen" // connecting and subscribing, not the wait for notifications
)

// Event names on the pglease.acquire span.
const (
	EventQueued  = "pglease.queued"
	EventAttempt = "pglease.attempt"
)

// Attribute keys set by pglease on spans, events and metrics, beside the
// semantic-convention ones (db.system.name, db.operation.name,
// db.namespace, server.address, server.port, db.response.status_code,
// error.type). Durations are float64 seconds, with no unit in the name
// (see "Units" in the package documentation). The values of the
// enumerated ones are listed in the package documentation.
const (
	// AttrKeyHash identifies a key: see "Redaction". On every per-key
	// span, event and log record; never on metrics (unbounded
	// cardinality).
	AttrKeyHash = attribute.Key("pglease.key.hash")
	// AttrKey is the raw key, only with Config.RawKeys.
	AttrKey = attribute.Key("pglease.key")
	// AttrLockKind is "lease" or "advisory".
	AttrLockKind = attribute.Key("pglease.lock.kind")
	// AttrTTL is the lease TTL, in seconds (float64).
	AttrTTL = attribute.Key("pglease.lock.ttl")
	// AttrTry is true for TryAcquire (one attempt, no waiting).
	AttrTry = attribute.Key("pglease.acquire.try")
	// AttrOutcome is how an operation ended.
	AttrOutcome = attribute.Key("pglease.outcome")
	// AttrAttempts is the number of database attempts an acquire saw.
	AttrAttempts = attribute.Key("pglease.acquire.attempts")
	// AttrWait is the time an acquire waited, in seconds (float64).
	AttrWait = attribute.Key("pglease.acquire.wait")
	// AttrCoalesced is true when the acquire queued behind another caller
	// of this process for the same key instead of starting its own
	// attempt loop.
	AttrCoalesced = attribute.Key("pglease.acquire.coalesced")
	// AttrContended is true when the acquire found the key held (by
	// another process, or by another caller of this one) at least once.
	AttrContended = attribute.Key("pglease.acquire.contended")
	// AttrAttempt is the attempt number (from 1) on a pglease.attempt event.
	AttrAttempt = attribute.Key("pglease.attempt")
	// AttrRetryIn is the backoff delay before the next attempt, in
	// seconds (float64).
	AttrRetryIn = attribute.Key("pglease.attempt.retry_in")
	// AttrQueuePosition is the caller's place in the key's local FIFO (0 =
	// first) on a pglease.queued event.
	AttrQueuePosition = attribute.Key("pglease.queue.position")
	// AttrFence is the fencing token granted (not a secret).
	AttrFence = attribute.Key("pglease.fence")
	// AttrHeldFor is how long the lock was held, in seconds (float64).
	AttrHeldFor = attribute.Key("pglease.lock.held_for")
	// AttrLossCause is why a lock was lost.
	AttrLossCause = attribute.Key("pglease.loss.cause")
	// AttrBatchSize is the number of items (keys, locks) in one database
	// round trip.
	AttrBatchSize = attribute.Key("pglease.batch.size")
	// AttrBatchOK is how many of them succeeded (granted, extended,
	// released).
	AttrBatchOK = attribute.Key("pglease.batch.ok")
	// AttrDue is the number of locks due for extension in a heartbeat round.
	AttrDue = attribute.Key("pglease.heartbeat.due")
	// AttrExtended is the number of locks a heartbeat round extended.
	AttrExtended = attribute.Key("pglease.heartbeat.extended")
	// AttrLost is the number of locks a heartbeat round found lost.
	AttrLost = attribute.Key("pglease.heartbeat.lost")
	// AttrQueue names a Manager queue on pglease.manager.queue.depth.
	AttrQueue = attribute.Key("pglease.queue")
)

// Metric names; the package documentation gives each one's instrument,
// unit and attributes.
const (
	MetricAcquireDuration         = "pglease.acquire.duration"
	MetricAcquireAttempts         = "pglease.acquire.attempts"
	MetricAcquireContended        = "pglease.acquire.contended"
	MetricAcquireCoalesced        = "pglease.acquire.coalesced"
	MetricLockHeld                = "pglease.lock.held"
	MetricLockExtends             = "pglease.lock.extends"
	MetricLockExtendLag           = "pglease.lock.extend.lag"
	MetricLockLost                = "pglease.lock.lost"
	MetricLockReleases            = "pglease.lock.releases"
	MetricDBBatchSize             = "pglease.db.batch.size"
	MetricListenerPolling         = "pglease.listener.polling"          // Managers that poll instead of listening (manager.Config.ListenConnString)
	MetricReleaseTriggerInstalled = "pglease.release_trigger.installed" // 1 per Manager whose lock table has the release trigger for its channel, 0 without (migrate.Migrator.SetupReleaseTrigger)
	MetricDBClientDuration        = "db.client.operation.duration"      // the semantic-convention histogram
	MetricManagerLoopBusy         = "pglease.manager.loop.busy"
	MetricManagerQueueDepth       = "pglease.manager.queue.depth"
)
