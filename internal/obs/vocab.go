package obs

import (
	"log/slog"
	"time"
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
	NumKinds
)

var kindNames = [NumKinds]string{KindLease: "lease", KindAdvisory: "advisory", KindShared: "shared", KindPermit: "permit"}

// String returns "lease", "advisory", "shared" or "permit".
func (k LockKind) String() string {
	if k < NumKinds {
		return kindNames[k]
	}
	return "unknown"
}

func (k LockKind) Norm() LockKind {
	if k < NumKinds {
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
	NumAttemptOutcomes
)

var attemptNames = [NumAttemptOutcomes]string{
	AttemptGranted:   "granted",
	AttemptContended: "contended",
	AttemptFailed:    "error",
}

// String returns "granted", "contended" or "error".
func (o AttemptOutcome) String() string {
	if o < NumAttemptOutcomes {
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
	NumLossCauses
)

var lossNames = [NumLossCauses]string{
	LossExpired:      "expired",
	LossNotHeld:      "not_held",
	LossSessionEnded: "session_ended",
	LossOther:        "other",
	LossRevoked:      "revoked",
}

// String returns the cause as recorded in pglease.loss.cause.
func (c LossCause) String() string {
	if c < NumLossCauses {
		return lossNames[c]
	}
	return "other"
}

func (c LossCause) Norm() LossCause {
	if c < NumLossCauses {
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
	OpHandOff         DBOperation = "pglease.handoff"
	OpAcquireShared   DBOperation = "pglease.acquire_shared_many"
	OpAcquireSets     DBOperation = "pglease.acquire_sets"
	OpAdvisoryLock    DBOperation = "pglease.advisory_lock"
	OpAdvisoryTryLock DBOperation = "pglease.advisory_try_lock"
	OpAdvisoryUnlock  DBOperation = "pglease.advisory_unlock"
	OpListen          DBOperation = "pglease.listen"
	OpRevoke          DBOperation = "pglease.revoke"
	OpRequestRelease  DBOperation = "pglease.request_release"
	OpSnapshot        DBOperation = "pglease.snapshot"
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
	NumQueues
)

var queueNames = [NumQueues]string{
	QueueWaiters:  "waiters",
	QueueMailbox:  "mailbox",
	QueueInflight: "inflight",
	QueueDue:      "due",
}

// String returns the queue's attribute value.
func (q Queue) String() string {
	if q < NumQueues {
		return queueNames[q]
	}
	return "unknown"
}

// WaitReason says why an acquire waits: what the key's last refusal
// found. It is pglease.wait.reason on the acquire span, its pglease.wait
// events, pglease.acquire.wait.duration and pglease.acquire.wait.longest.
type WaitReason uint8

// Wait reasons.
const (
	// WaitNone: the acquire has not been refused (yet).
	WaitNone WaitReason = iota
	// WaitHolder: a live exclusive lease of another holder (a pglease
	// process or a SyncGuard one).
	WaitHolder
	// WaitSharedHolders: an exclusive attempt waits for the readers or
	// permits that hold the key.
	WaitSharedHolders
	// WaitSemaphoreFull: a permit waits because the semaphore's limit of
	// permits is taken.
	WaitSemaphoreFull
	// WaitWriterMark: a reader or permit waits because a writer waiting
	// for the key has marked it (writer preference).
	WaitWriterMark
	// WaitLockDelay: the last holder's lease expired, but its lock delay
	// (or a revoke's delay) keeps the key from everyone until it passes.
	WaitLockDelay
	// WaitSetMember: the key is free, but it is one key of an
	// all-or-nothing set (AcquireAll) another key of which is held.
	WaitSetMember
	// WaitHeldLocally: another caller of this process holds the key; the
	// acquire waits for it to be handed over in this process.
	WaitHeldLocally
	// WaitQueued: nothing holds the key, but other callers' tickets of
	// its fair queue go first (manager.Config.FairQueue): a try that
	// yields to them, or a queued waiter before its turn.
	WaitQueued
	NumWaitReasons
)

var waitNames = [NumWaitReasons]string{
	WaitNone:          "none",
	WaitHolder:        "holder",
	WaitSharedHolders: "shared_holders",
	WaitSemaphoreFull: "semaphore_full",
	WaitWriterMark:    "writer_mark",
	WaitLockDelay:     "lock_delay",
	WaitSetMember:     "set_member",
	WaitHeldLocally:   "held_locally",
	WaitQueued:        "queued",
}

// String returns the reason as recorded in pglease.wait.reason.
func (w WaitReason) String() string {
	if w < NumWaitReasons {
		return waitNames[w]
	}
	return "none"
}

func (w WaitReason) Norm() WaitReason {
	if w < NumWaitReasons {
		return w
	}
	return WaitNone
}

// KeyID is how telemetry identifies a lock key: a hash of the key, and the
// raw key only when the Recorder was built with Config.RawKeys.
//
// Build it once per request with Recorder.Key, outside the Manager loop (in
// the caller's goroutine), and pass it to StartAcquire. The zero KeyID is
// valid and identifies nothing (a nil Recorder returns it).
//
// KeyID's String, GoString and LogValue never print the raw key, even when
// it is kept for Config.RawKeys: the raw key reaches telemetry only as the
// separate attribute pglease.key.
type KeyID struct {
	hash string // HMAC (32 hex) or SyncGuard hashKey (24 hex)
	raw  string // only with Config.RawKeys
}

// Hash returns the key's hash: 32 lowercase hex digits (HMAC-SHA-256 keyed
// with the Config.KeySecret secret, truncated to 128 bits) or, without a
// secret, 24 lowercase hex digits (SyncGuard's hashKey, not secret).
func (k KeyID) Hash() string { return k.hash }

// String returns the hash.
func (k KeyID) String() string { return k.hash }

// LogValue makes slog print the hash only.
func (k KeyID) LogValue() slog.Value { return slog.StringValue(k.hash) }

// GoString returns the hash in Go syntax, so %#v cannot reveal the raw key.
func (k KeyID) GoString() string { return `obs.KeyID("` + k.hash + `")` }

// AcquireInfo describes an acquire when it starts.
type AcquireInfo struct {
	Kind LockKind      // lease, shared, permit or advisory
	TTL  time.Duration // lease TTL; 0 for advisory locks
	Try  bool          // TryAcquire: one attempt, no waiting
}

// QueueInfo describes how an acquire entered its key's local FIFO.
type QueueInfo struct {
	// Coalesced: another caller of this process already had an attempt
	// loop running for the key, and this one joined it.
	Coalesced bool
	// HeldLocally: another caller of this process holds the key, so this
	// one waits for a local handoff (counts as contended).
	HeldLocally bool
	// Position in the FIFO, 0 = first.
	Position int
}

// OverloadInfo describes the Manager's shedding state when it changes.
type OverloadInfo struct {
	// RoundTrip is the slow round trip that made the Manager start
	// shedding (entering), or the slowest one while it shed (leaving).
	RoundTrip time.Duration
	// Op is that round trip's operation (OpAcquireMany, OpExtendMany …).
	Op DBOperation
	// Gap is the pause the Manager keeps between two acquire round trips
	// (entering: the first one; leaving: the longest one).
	Gap time.Duration
	// Lasted is how long the Manager shed (leaving only).
	Lasted time.Duration
}

// Database names the database server and database the round trips go
// to: the semantic-convention attributes server.address, server.port and
// db.namespace on every database span and on db.client.operation.duration
// (empty or zero fields are left out). The Manager fills it from its
// pool's connection configuration.
type Database struct {
	Address   string
	Port      int
	Namespace string
}

// MaxLinks bounds the links StartDB gives one round trip's span: the
// OpenTelemetry SDK's default link limit per span, beyond which it would
// drop them anyway. A batch serving more callers links to the first
// MaxLinks (collect no more than that).
const MaxLinks = 128
