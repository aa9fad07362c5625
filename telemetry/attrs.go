package telemetry

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"

	"github.com/pglease/pglease"
)

// Attribute keys set by pglease on spans, events and metrics, beside the
// semantic-convention ones (db.system.name, db.operation.name, error.type).
// Durations are float64 seconds.
const (
	// AttrKeyHash identifies a key: see KeyID.Hash. On every per-key span,
	// event and log record; never on metrics (unbounded cardinality).
	AttrKeyHash = attribute.Key("pglease.key.hash")
	// AttrKey is the raw key, only with WithRawKeys(true).
	AttrKey = attribute.Key("pglease.key")
	// AttrLockKind is "lease" or "advisory".
	AttrLockKind = attribute.Key("pglease.lock.kind")
	// AttrTTL is the lease TTL in seconds.
	AttrTTL = attribute.Key("pglease.lock.ttl")
	// AttrTry is true for TryAcquire (one attempt, no waiting).
	AttrTry = attribute.Key("pglease.acquire.try")
	// AttrOutcome is how an operation ended: see the doc.go table.
	AttrOutcome = attribute.Key("pglease.outcome")
	// AttrAttempts is the number of database attempts an acquire saw.
	AttrAttempts = attribute.Key("pglease.acquire.attempts")
	// AttrWait is the time an acquire waited, in seconds.
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
	// AttrRetryIn is the backoff delay before the next attempt, in seconds.
	AttrRetryIn = attribute.Key("pglease.attempt.retry_in")
	// AttrQueuePosition is the caller's place in the key's local FIFO (0 =
	// first) on a pglease.queued event.
	AttrQueuePosition = attribute.Key("pglease.queue.position")
	// AttrFence is the fencing token granted (not a secret: §6.6).
	AttrFence = attribute.Key("pglease.fence")
	// AttrHeldFor is how long the lock was held, in seconds.
	AttrHeldFor = attribute.Key("pglease.lock.held_for")
	// AttrLossCause is why a lock was lost: see LossCause.
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

// LockKind is the kind of lock an operation is about.
type LockKind uint8

// Lock kinds.
const (
	// KindLease is a SyncGuard-compatible lease lock (a row with a TTL).
	KindLease LockKind = iota
	// KindAdvisory is a PostgreSQL session-level advisory lock.
	KindAdvisory
	numKinds
)

var kindNames = [numKinds]string{KindLease: "lease", KindAdvisory: "advisory"}

// String returns "lease" or "advisory".
func (k LockKind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return "unknown"
}

func (k LockKind) norm() LockKind {
	if k < numKinds {
		return k
	}
	return KindLease
}

// AttemptOutcome is the result of one database attempt for a key.
type AttemptOutcome uint8

// Attempt outcomes.
const (
	// AttemptGranted: the attempt took the lock.
	AttemptGranted AttemptOutcome = iota
	// AttemptContended: the key was held by someone else; a retry follows
	// (unless the caller gives up).
	AttemptContended
	// AttemptFailed: the round trip failed (connection, timeout …).
	AttemptFailed
	numAttemptOutcomes
)

var attemptNames = [numAttemptOutcomes]string{
	AttemptGranted:   "granted",
	AttemptContended: "contended",
	AttemptFailed:    "error",
}

// String returns "granted", "contended" or "error".
func (o AttemptOutcome) String() string {
	if o < numAttemptOutcomes {
		return attemptNames[o]
	}
	return "unknown"
}

// LossCause says why a held lock was lost.
type LossCause uint8

// Loss causes.
const (
	// LossExpired: no extend succeeded before the local trust window
	// (start of the last successful acquire/extend + TTL − margin) passed.
	LossExpired LossCause = iota
	// LossNotHeld: the database answered that the lock is no longer this
	// holder's (an extend matched no row: expired and maybe re-acquired).
	LossNotHeld
	// LossSessionEnded: the connection holding a session advisory lock
	// ended, so the server dropped the lock.
	LossSessionEnded
	// LossOther: any other cause (e.g. a fence regression).
	LossOther
	numLossCauses
)

var lossNames = [numLossCauses]string{
	LossExpired:      "expired",
	LossNotHeld:      "not_held",
	LossSessionEnded: "session_ended",
	LossOther:        "other",
}

// String returns the cause as recorded in pglease.loss.cause.
func (c LossCause) String() string {
	if c < numLossCauses {
		return lossNames[c]
	}
	return "other"
}

func (c LossCause) norm() LossCause {
	if c < numLossCauses {
		return c
	}
	return LossOther
}

// DBOperation names one kind of database round trip. It becomes the span
// name and db.operation.name.
type DBOperation string

// Database operations the Manager performs. Each is one round trip.
const (
	OpAcquireMany     DBOperation = "pglease.acquire_many"
	OpReleaseMany     DBOperation = "pglease.release_many"
	OpExtendMany      DBOperation = "pglease.extend_many"
	OpHandOff         DBOperation = "pglease.handoff"           // a release and the next local waiter's acquire, one statement
	OpAdvisoryLock    DBOperation = "pglease.advisory_lock"     // blocking wait on pg_advisory_lock
	OpAdvisoryTryLock DBOperation = "pglease.advisory_try_lock" // pg_try_advisory_lock, batched
	OpAdvisoryUnlock  DBOperation = "pglease.advisory_unlock"
	OpListen          DBOperation = "pglease.listen"
)

// Queue names a Manager queue whose depth is reported by
// pglease.manager.queue.depth.
type Queue uint8

// Manager queues.
const (
	// QueueWaiters: callers waiting in per-key FIFOs.
	QueueWaiters Queue = iota
	// QueueMailbox: work the loop accepted and has not sent yet (pending
	// acquire attempts, releases and extends waiting for a batch slot).
	// The Manager's channels are unbuffered, so this is where its
	// backlog builds.
	QueueMailbox
	// QueueInflight: database round trips started and not yet reported.
	QueueInflight
	// QueueDue: scheduled wake-ups (extends, retries) in the loop's heap.
	QueueDue
	numQueues
)

var queueNames = [numQueues]string{
	QueueWaiters:  "waiters",
	QueueMailbox:  "mailbox",
	QueueInflight: "inflight",
	QueueDue:      "due",
}

// String returns the queue's attribute value.
func (q Queue) String() string {
	if q < numQueues {
		return queueNames[q]
	}
	return "unknown"
}

// outcome values of AttrOutcome.
const (
	outcomeGranted  = "granted"
	outcomeLocked   = "locked" // TryAcquire: held elsewhere
	outcomeTimeout  = "timeout"
	outcomeAborted  = "aborted"
	outcomeClosed   = "closed"
	outcomeError    = "error"
	outcomeOK       = "ok"
	outcomeNotHeld  = "not_held"
	numAcquireOutcs = 6
)

// acquireOutcome indexes the acquire outcome sets.
type acquireOutcome uint8

const (
	aoGranted acquireOutcome = iota
	aoLocked
	aoTimeout
	aoAborted
	aoClosed
	aoError
)

var acquireOutcomeNames = [numAcquireOutcs]string{
	aoGranted: outcomeGranted,
	aoLocked:  outcomeLocked,
	aoTimeout: outcomeTimeout,
	aoAborted: outcomeAborted,
	aoClosed:  outcomeClosed,
	aoError:   outcomeError,
}

func acquireOutcomeOf(err error) acquireOutcome {
	if err == nil {
		return aoGranted
	}
	switch pglease.CodeOf(err) {
	case pglease.CodeAcquisitionTimeout:
		return aoTimeout
	case pglease.CodeAborted:
		return aoAborted
	case pglease.CodeClosed:
		return aoClosed
	case 0:
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return aoAborted
		}
	}
	return aoError
}

// errorType is the value of error.type for err: the pglease Code name
// ("LockLost"), or for other errors a fixed class. It never contains
// err.Error(), which may quote a caller's text.
func errorType(err error) string {
	if err == nil {
		return ""
	}
	if c := pglease.CodeOf(err); c != 0 {
		return c.String()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return "context.Canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "context.DeadlineExceeded"
	}
	return "_OTHER"
}

// sqlState returns the SQLSTATE of the server error in err's chain, or ""
// (pgconn.PgError and pglease's mapped server errors have SQLState).
func sqlState(err error) string {
	var st interface{ SQLState() string }
	if err != nil && errors.As(err, &st) {
		return st.SQLState()
	}
	return ""
}
