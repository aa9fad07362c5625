package manager

import "go.opentelemetry.io/otel/attribute"

// The telemetry names the tests look for, as the table in package
// telemetry's documentation lists them (the recorder's own copy is checked
// against that table in package telemetry).

// Span names.
const (
	spanAcquire         = "pglease.acquire"
	spanAcquireMany     = "pglease.acquire_many"
	spanAcquireShared   = "pglease.acquire_shared_many"
	spanAcquireSets     = "pglease.acquire_sets"
	spanAdvisoryLock    = "pglease.advisory_lock"
	spanAdvisoryTryLock = "pglease.advisory_try_lock"
	spanAdvisoryUnlock  = "pglease.advisory_unlock"
	spanExtendMany      = "pglease.extend_many"
	spanHandOff         = "pglease.handoff"
	spanHeartbeat       = "pglease.heartbeat"
	spanListen          = "pglease.listen"
	spanLost            = "pglease.lost"
	spanRelease         = "pglease.release"
	spanReleaseMany     = "pglease.release_many"
	spanRevoke          = "pglease.revoke"
	spanRequestRelease  = "pglease.request_release"
	spanSnapshot        = "pglease.snapshot"
)

// Event names.
const (
	eventAttempt = "pglease.attempt"
	eventQueued  = "pglease.queued"
)

// Attribute keys.
const (
	attrAttempts      = attribute.Key("pglease.acquire.attempts")
	attrBatchOK       = attribute.Key("pglease.batch.ok")
	attrBatchSize     = attribute.Key("pglease.batch.size")
	attrCoalesced     = attribute.Key("pglease.acquire.coalesced")
	attrContended     = attribute.Key("pglease.acquire.contended")
	attrDue           = attribute.Key("pglease.heartbeat.due")
	attrExtended      = attribute.Key("pglease.heartbeat.extended")
	attrFence         = attribute.Key("pglease.fence")
	attrHeldFor       = attribute.Key("pglease.lock.held_for")
	attrKeyHash       = attribute.Key("pglease.key.hash")
	attrLockKind      = attribute.Key("pglease.lock.kind")
	attrLossCause     = attribute.Key("pglease.loss.cause")
	attrLost          = attribute.Key("pglease.heartbeat.lost")
	attrOutcome       = attribute.Key("pglease.outcome")
	attrQueue         = attribute.Key("pglease.queue")
	attrQueuePosition = attribute.Key("pglease.queue.position")
	attrTTL           = attribute.Key("pglease.lock.ttl")
	attrTry           = attribute.Key("pglease.acquire.try")
	attrWait          = attribute.Key("pglease.acquire.wait")
)
