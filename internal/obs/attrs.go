package obs

import (
	"context"
	"errors"

	"github.com/pglease/pglease"
)

// LockKind is the kind of lock an operation is about.
type LockKind uint8

// Lock kinds.
const (
	// KindLease is a SyncGuard-compatible lease lock (a row with a TTL).
	KindLease LockKind = iota
	// KindAdvisory is a PostgreSQL session-level advisory lock.
	KindAdvisory
	// KindShared is a reader of a reader-writer lease (a shared hold with
	// no limit, manager.Shared).
	KindShared
	// KindPermit is a permit of a counting semaphore (a shared hold with a
	// limit, manager.WithLimit).
	KindPermit
	numKinds
)

var kindNames = [numKinds]string{KindLease: "lease", KindAdvisory: "advisory", KindShared: "shared", KindPermit: "permit"}

// String returns "lease", "advisory", "shared" or "permit".
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
	// LossRevoked: the lease was revoked on purpose (manager.Revoke, the
	// SQL revoke function): its Context ended with ErrRevoked.
	LossRevoked
	numLossCauses
)

var lossNames = [numLossCauses]string{
	LossExpired:      "expired",
	LossNotHeld:      "not_held",
	LossSessionEnded: "session_ended",
	LossOther:        "other",
	LossRevoked:      "revoked",
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
	OpAcquireMany     DBOperation = spanAcquireMany
	OpReleaseMany     DBOperation = spanReleaseMany
	OpExtendMany      DBOperation = spanExtendMany
	OpHandOff         DBOperation = spanHandOff
	OpAcquireShared   DBOperation = spanAcquireShared
	OpAcquireSets     DBOperation = spanAcquireSets
	OpAdvisoryLock    DBOperation = spanAdvisoryLock
	OpAdvisoryTryLock DBOperation = spanAdvisoryTryLock
	OpAdvisoryUnlock  DBOperation = spanAdvisoryUnlock
	OpListen          DBOperation = spanListen
	OpRevoke          DBOperation = spanRevoke
	OpRequestRelease  DBOperation = spanRequestRelease
	OpSnapshot        DBOperation = spanSnapshot
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

// outcome values of attrOutcome.
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
