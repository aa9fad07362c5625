package manager

import (
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/store"
)

// acquireReq is one Acquire or TryAcquire call. The caller fills the
// immutable fields and sends it on acquireCh; from then on only run
// touches answered, and only run sends on reply and final.
type acquireReq struct {
	key    string        // immutable: NFC-normalized key
	hash   string        // immutable: pglease.HashKey(key), for notifications
	ttl    time.Duration // immutable
	manual bool          // immutable: no auto-extend
	try    bool          // immutable: TryAcquire (one attempt, never queued behind others)
	// shared and limit are the hold asked for (immutable): exclusive
	// (shared false), a reader (shared, limit 0: Shared) or a permit of a
	// semaphore of limit (WithLimit).
	shared bool
	// answered: run has sent its answer (on reply, or on final after an
	// abandon). A try's attempt that comes back after that serves nobody.
	// Owned by run.
	answered bool
	limit    int32

	holdLimit time.Duration // immutable: WithHoldLimit; 0 for none
	delay     time.Duration // immutable: WithLockDelay; 0 for none

	// set, for AcquireAll and TryAcquireAll, is the set's keys (immutable;
	// key and hash are then its first key's): the request never joins a
	// key's queue, the loop keeps it in a setWait (sets.go).
	set *setReq

	// acq is the request's telemetry (the pglease.acquire span), started
	// by the caller before sending. The loop calls Queued, Attempt and
	// Granted (before replying); the caller calls Failed or NotAcquired
	// after its answer. Never nil (a Manager always has a Recorder), but
	// nil-safe anyway.
	acq *obs.Acquisition

	// reply has capacity 1; run sends on it at most once. After the
	// caller sent the request on abandonCh it never reads reply again:
	// run takes back whatever it finds there (a grant the caller never
	// received is released, handleAbandon) and sends the one final answer
	// on final (capacity 1).
	reply chan acquireReply
	final chan acquireReply
}

// acquireReply carries exactly one of: lock (granted), locked (TryAcquire
// found the key held), err, or abandoned (the caller left; lastErr is the
// key's outage record, keyState.lastErr; heldHere tells that a caller of
// this Manager held the key, and heldBy names the holder elsewhere that
// the key's last "locked" answer named, if any: keyState.heldBy).
type acquireReply struct {
	lock      *Lock
	locks     []*Lock // a set's, in the order of its keys
	locked    bool
	err       error
	abandoned bool
	heldHere  bool
	lastErr   error
	heldBy    string
	shed      bool // the Manager was holding back acquires when the wait ended (overload.go)
}

// releaseReq is one Lock.Release call.
type releaseReq struct {
	lock   *Lock
	reply  chan error        // cap 1; run sends exactly once
	parent trace.SpanContext // immutable: the caller's span, parent of the pglease.release span
}

// extendReq is one Lock.Extend call.
type extendReq struct {
	lock  *Lock
	reply chan error // cap 1; run sends exactly once
}

// attempt is one key's database acquire attempt. Created by run; the DB
// goroutine only reads lockID and ttl.
type attempt struct {
	ks     *keyState
	lockID string // pre-generated, so an ambiguous outcome can be released (ambiguity is never success)
	ttl    time.Duration
	// Owned by run (flight.go): chain numbers the key's attempt and its
	// hedges (an answer from any of them is the key's answer, the first
	// wins); hedges counts the hedges before this one in its chain; stale
	// marks an attempt superseded by a hedge or by another attempt's answer.
	chain  uint64
	hedges uint8
	stale  bool
	// delayMs is the lock delay stored with the grant (WithLockDelay), in
	// ms (at most math.MaxInt32: kept in the padding after stale).
	delayMs int32
	// db is the span of the round trip that carried the attempt
	// (telemetry): an orphan release of its lockId goes in that span's
	// trace. Written by the DB goroutine before it posts the result, read
	// by run after.
	db trace.SpanContext
	// try is the TryAcquire this attempt alone serves (nil: the key's
	// attempt, serving its queue). A try's attempt is outside the key's
	// attempt chain: it never waits for the key's attempt, retry or
	// releases, and never serves the queue (tryattempt.go).
	try *acquireReq

	// sh makes it a shared attempt (shared.go), which goes in the shared
	// lane; nil for an exclusive one (most: kept out of the attempt's
	// size class).
	sh *sharedAttempt
}

// sharedAttempt is what a shared attempt asks for: shared holds with
// limit (0: a reader), one per lockId of ids (ids[0] is the attempt's
// lockID; nil for a try's single hold), for as many shared waiters at the
// head of the key's queue. floor is the key's highest fence seen when the
// attempt was made (hasFloor: there was one): a permit's fence must be
// above it (fence monotonicity).
type sharedAttempt struct {
	limit    int32
	hasFloor bool
	floor    pglease.Fence
	ids      []string
}

// lockDelay returns the lock delay a's grant is stored with.
func (a *attempt) lockDelay() time.Duration { return time.Duration(a.delayMs) * time.Millisecond }

// delayMs returns req's lock delay in ms, as an attempt keeps it.
func (req *acquireReq) delayMs() int32 { return int32(req.delay / time.Millisecond) }

// items returns how many holds a asks for (its lockIds).
func (a *attempt) items() int {
	if a.sh == nil || a.sh.ids == nil {
		return 1
	}
	return len(a.sh.ids)
}

// id returns a's j-th lockId.
func (a *attempt) id(j int) string {
	if a.sh == nil || a.sh.ids == nil {
		return a.lockID
	}
	return a.sh.ids[j]
}

// limit returns a shared attempt's limit.
func (a *attempt) limit() int32 { return a.sh.limit }

// releaseItem is one lockId to release, with the reply of a user's
// Release call if there is one.
type releaseItem struct {
	lockID string
	key    string    // the key lockID holds (or may hold): decides whether the release notifies (waiters.go)
	ks     *keyState // the key to kick once released; nil during drain
	reply  chan error
	lost   error // the lock was lost before the release: reply with this
	// unblocked: ks's attempts did not wait for this release (a hedged
	// attempt's, flight.go); it only kicks ks when answered.
	unblocked bool
	// handed: the lockId was handed to a caller (a held lock, released by
	// its holder or by Close, or a lost one's kept row). Close reports on
	// these only; the others (lockIds no caller ever got) are best effort.
	handed bool

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
	batch []*attempt
	sets  []*setAttempt // a set batch's (batch is nil then)
	start time.Time     // local time just before the statement was sent
	// res answers the batch's holds in order: an exclusive attempt's
	// one, a shared attempt's items() (attempt.id order), a set's keys.
	res []store.AcquireResult
	err error
	db  trace.SpanContext // the round trip's pglease.acquire_many span
}

type releaseDone struct {
	fl    *flight
	batch []releaseItem
	res   []bool
	err   error
	db    trace.SpanContext // the round trip's pglease.release_many span
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
