package telemetry

import "go.opentelemetry.io/otel/attribute"

// The names the recorder records (the spans of database round trips are
// named by their operation: the obs.DBOperation values, which callers
// pass to StartDB). Each one, with its kind, unit and
// meaning, is a row of the one table in the public telemetry package's
// documentation (telemetry/doc.go, "Names"); TestNamesMatchDocTable fails
// when a name recorded here is missing from it or a name in it is never
// recorded. Semantic-convention names (db.*, server.*, error.type) come
// from the semconv package and are in that table too.

// Span names of operations (kind internal).
const (
	spanAcquire   = "pglease.acquire"
	spanRelease   = "pglease.release"
	spanLost      = "pglease.lost"
	spanHeartbeat = "pglease.heartbeat"
)

// Event names on the pglease.acquire span.
const (
	eventQueued  = "pglease.queued"
	eventAttempt = "pglease.attempt"
	eventWait    = "pglease.wait"
	eventTicket  = "pglease.ticket"
)

// Attribute keys of pglease's own (beside the semantic-convention ones).
const (
	attrKeyHash       = attribute.Key("pglease.key.hash")
	attrKey           = attribute.Key("pglease.key")
	attrLockKind      = attribute.Key("pglease.lock.kind")
	attrTTL           = attribute.Key("pglease.lock.ttl")
	attrTry           = attribute.Key("pglease.acquire.try")
	attrOutcome       = attribute.Key("pglease.outcome")
	attrAttempts      = attribute.Key("pglease.acquire.attempts")
	attrWait          = attribute.Key("pglease.acquire.wait")
	attrCoalesced     = attribute.Key("pglease.acquire.coalesced")
	attrContended     = attribute.Key("pglease.acquire.contended")
	attrAttempt       = attribute.Key("pglease.attempt")
	attrRetryIn       = attribute.Key("pglease.attempt.retry_in")
	attrQueuePosition = attribute.Key("pglease.queue.position")
	attrTicketPos     = attribute.Key("pglease.ticket.position")
	attrFence         = attribute.Key("pglease.fence")
	attrHeldFor       = attribute.Key("pglease.lock.held_for")
	attrLossCause     = attribute.Key("pglease.loss.cause")
	attrBatchSize     = attribute.Key("pglease.batch.size")
	attrBatchOK       = attribute.Key("pglease.batch.ok")
	attrDue           = attribute.Key("pglease.heartbeat.due")
	attrExtended      = attribute.Key("pglease.heartbeat.extended")
	attrLost          = attribute.Key("pglease.heartbeat.lost")
	attrQueue         = attribute.Key("pglease.queue")
	attrWaitReason    = attribute.Key("pglease.wait.reason")
	attrHolder        = attribute.Key("pglease.holder")
)

// Metric names.
const (
	metricAcquireDuration         = "pglease.acquire.duration"
	metricAcquireAttempts         = "pglease.acquire.attempts"
	metricAcquireContended        = "pglease.acquire.contended"
	metricAcquireCoalesced        = "pglease.acquire.coalesced"
	metricLockHeld                = "pglease.lock.held"
	metricLockExtends             = "pglease.lock.extends"
	metricLockExtendLag           = "pglease.lock.extend.lag"
	metricLockLost                = "pglease.lock.lost"
	metricLockReleases            = "pglease.lock.releases"
	metricDBBatchSize             = "pglease.db.batch.size"
	metricListenerPolling         = "pglease.listener.polling"
	metricReleaseTriggerInstalled = "pglease.release_trigger.installed"
	metricDBClientDuration        = "db.client.operation.duration"
	metricManagerLoopBusy         = "pglease.manager.loop.busy"
	metricManagerQueueDepth       = "pglease.manager.queue.depth"
	metricManagerOverload         = "pglease.manager.overload"
	metricLockHoldDuration        = "pglease.lock.hold.duration"
	metricAcquireWaitDuration     = "pglease.acquire.wait.duration"
	metricLockOldestAge           = "pglease.lock.oldest.age"
	metricAcquireWaitLongest      = "pglease.acquire.wait.longest"
	metricListenerUp              = "pglease.listener.up"
)
