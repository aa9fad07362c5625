package kernel

import (
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/store"
)

// AcquireReq is one Acquire or TryAcquire call. The caller fills the
// immutable fields and sends it on acquireCh; from then on only run
// touches answered, and only run sends on reply and final.
type AcquireReq struct {
	Key    string        // immutable: NFC-normalized key
	Hash   string        // immutable: pglease.HashKey(key), for notifications
	TTL    time.Duration // immutable
	Manual bool          // immutable: no auto-extend
	Try    bool          // immutable: TryAcquire (one attempt, never queued behind others)
	// Shared and limit are the hold asked for (immutable): exclusive
	// (shared false), a reader (shared, limit 0: Shared) or a permit of a
	// semaphore of limit (WithLimit).
	Shared bool
	// answered: run has sent its answer (on reply, or on final after an
	// abandon). A try's attempt that comes back after that serves nobody.
	// Owned by run.
	answered bool
	Limit    int32

	HoldLimit time.Duration // immutable: WithHoldLimit; 0 for none
	Delay     time.Duration // immutable: WithLockDelay; 0 for none

	// The caller's ticket in the key's fair queue (Config.FairQueue,
	// fair.go), owned by run: qid is its lockId (made at its first
	// attempt, kept for the whole wait, so every attempt keeps its place;
	// the grant's lockId), qhash its hash (what a turn names), qsent the
	// local send time of the latest statement that found it queued (a
	// turn's grant is trusted from there, or from qmade before any such
	// answer came), qpos its last known place,
	// qgranted that a grant of qid was handed to the caller.
	qid, qhash string
	qsent      time.Time
	qmade      time.Time // when qid was made: before any statement that queued it
	qpos       int32
	qgranted   bool
	// qgone: a statement found the ticket gone (expired): the next
	// attempt queues it again. Until then, and from the first answer
	// that found it queued, an attempt only refreshes it
	// (store.WaitRequest.Refresh).
	qgone  bool
	qfence pglease.Fence // the fence of the grant of qid handed to the caller
	qfloor pglease.Fence // the key's highest fence seen when qsent's statement was sent (a permit's grant must be above it)

	// Set, for AcquireAll and TryAcquireAll, is the set's keys (immutable;
	// key and hash are then its first key's): the request never joins a
	// key's queue, the loop keeps it in a setWait (sets.go).
	Set *SetReq

	// Acq is the request's telemetry (the pglease.acquire span), started
	// by the caller before sending. The loop calls Queued, Attempt and
	// Granted (before replying); the caller calls Failed or NotAcquired
	// after its answer. Never nil (a Manager always has a Recorder), but
	// nil-safe anyway.
	Acq *obs.Acquisition

	// Reply has capacity 1; run sends on it at most once. After the
	// caller sent the request on abandonCh it never reads reply again:
	// run takes back whatever it finds there (a grant the caller never
	// received is released, handleAbandon) and sends the one final answer
	// on final (capacity 1).
	Reply chan AcquireReply
	Final chan AcquireReply
}

// AcquireReply carries exactly one of: lock (granted), locked (TryAcquire
// found the key held), err, or abandoned (the caller left; lastErr is the
// key's outage record, KeyState.lastErr; heldHere tells that a caller of
// this Manager held the key, and heldBy names the holder elsewhere that
// the key's last "locked" answer named, if any: KeyState.heldBy).
type AcquireReply struct {
	Lock      *Hold
	Locks     []*Hold // a set's, in the order of its keys
	Locked    bool
	Err       error
	Abandoned bool
	HeldHere  bool
	LastErr   error
	HeldBy    string
	Shed      bool // the Manager was holding back acquires when the wait ended (overload.go)
}

// ReleaseReq is one Lock.Release call.
type ReleaseReq struct {
	Lock   *Hold
	Reply  chan error        // cap 1; run sends exactly once
	Parent trace.SpanContext // immutable: the caller's span, parent of the pglease.release span
}

// ExtendReq is one Lock.Extend call.
type ExtendReq struct {
	Lock  *Hold
	Reply chan error // cap 1; run sends exactly once
}

// lockDelay returns the lock delay a's grant is stored with.
func (a *Attempt) lockDelay() time.Duration { return time.Duration(a.delayMs) * time.Millisecond }

// delayMs returns req's lock delay in ms, as an attempt keeps it.
func (req *AcquireReq) delayMs() int32 { return int32(req.Delay / time.Millisecond) }

// releaseItem is one lockId to release, with the reply of a user's
// Release call if there is one.
type releaseItem struct {
	lockID string
	key    string    // the key lockID holds (or may hold): decides whether the release notifies (waiters.go)
	ks     *KeyState // the key to kick once released; nil during drain
	reply  chan error
	lost   error // the lock was lost before the release: reply with this
	// unblocked: ks's attempts did not wait for this release (a hedged
	// attempt's, flight.go); it only kicks ks when answered.
	unblocked bool
	// leave: the lockId is a waiter's fair-queue ticket to take out of
	// its key's queue (store.QueueLeave), not a lease to release;
	// noServe: release without serving the key's queue (a key left to
	// foreign pollers for a while, foreign.go).
	leave, noServe bool
	// handed: the lockId was handed to a caller (a held lock, released by
	// its holder or by Close, or a lost one's kept row). Close reports on
	// these only; the others (lockIds no caller ever got) are best effort.
	handed bool
	// pending: the lockId is an ambiguous acquire's (its answer was lost),
	// whose commit may land after this release looked. PostgreSQL keeps a
	// committing transaction in progress while it waits for a synchronous
	// standby, and a cancel request (pgconn sends one when a statement
	// times out) ends the wait with the commit kept: a "not held" answer
	// then proves nothing, and the release is retried (relretry.go),
	// without holding up the key's waiters, until the lease would have
	// expired. Otherwise the grant would hold the key for no one until
	// its TTL.
	pending bool

	// Retries of a release whose outcome was unknown (relretry.go): ttl is
	// the lease's TTL, until the time after which the server has surely
	// expired the row, at when the next try is due, tries how many failed;
	// retry is set once the caller was answered (a retry answers nobody).
	ttl   time.Duration
	until time.Time
	at    time.Time
	tries int
	retry bool

	rel obs.Release // the pglease.release span; zero for orphan releases
	// sc is the span the release is made for: rel's, or for an orphan
	// release the round trip whose attempt it undoes (attempt.db). The
	// parent of a DB span carrying only this item; linked from one
	// carrying more.
	sc trace.SpanContext
}

// Results posted by DB goroutines to run, one type per kind.
type acquireDone struct {
	fl    *flight
	batch []*Attempt // of one kind
	start time.Time  // local time just before the statement was sent
	// res answers the batch's holds in order: each attempt's holds, in
	// the order of its kind's hold (an exclusive attempt's one, a shared
	// attempt's lockIds, a set's keys).
	res []store.AcquireResult
	err error
	db  trace.SpanContext // the round trip's pglease.acquire_many span
}

type releaseDone struct {
	fl    *flight
	batch []releaseItem
	// leaveErr is the outcome of the batch's leave items (a statement of
	// their own, fair.go); err is the others'.
	leaveErr error
	res      []bool
	// turns are the release's notices for this process's own tickets
	// (fair.go: sendQueueRelease), returned instead of sent.
	turns []store.Turn
	err   error
	db    trace.SpanContext // the round trip's pglease.release_many span
	// then, for a handoff batch, is its grant half: handled right after
	// the release half, in the same event (handoff.go), so that the next
	// holder is answered without a loop turn in between.
	then *acquireDone
}

type extendDone struct {
	fl    *flight
	batch []*holding
	start time.Time // local time just before the statement was sent
	res   []store.ExtendResult
	err   error
	hb    obs.Heartbeat     // the round's pglease.heartbeat span, ended by run
	db    trace.SpanContext // the round trip's pglease.extend_many span
}

// LockKind is req's lock kind for telemetry: lease (exclusive), shared (a
// reader) or permit.
func (req *AcquireReq) LockKind() obs.LockKind {
	switch {
	case !req.Shared:
		return obs.KindLease
	case req.Limit == 0:
		return obs.KindShared
	}
	return obs.KindPermit
}
