package kernel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// The acquire pipeline. Every acquire attempt, whatever it asks for, is
// settled by one protocol (settle), in this order:
//
//  1. land: the batch's slot is freed and the round trip observed
//     (handleAcquireDone: flight.go, overload.go);
//  2. stale chain: a superseded attempt (a hedge lost the race, flight.go)
//     serves nobody; whatever it granted, or may have granted, goes back;
//  3. the attempt leaves its in-flight slot (the key's, or the set
//     waiter's), and an answer from the database clears the outage record;
//  4. a caller who left (a try's, a set's): what it granted goes back;
//  5. closing: what it granted goes back, and a try or set is answered
//     "closed" (Close answers every waiter);
//  6. the round trip failed: when its outcome is unknown (ambiguity is
//     never success) every lockId it carried is released, then the
//     waiters retry with backoff or fail;
//  7. an item failed on its own (fence overflow): the waiters fail;
//  8. refused (contended): the waiters wait for a release, a retry after
//     their backoff, or the holder's takeover time;
//  9. granted: the fence must pass fence monotonicity, a caller must
//     still want the grant (and nobody here hold the key), and the answer
//     must have come within the grant's trust window; otherwise the grant
//     goes back.
//
// What differs between attempts is their kind (attemptKind: exclusive,
// shared holds, all-or-nothing sets): the statement it sends, what its
// grant means (its fence rule, the locks it makes), and who waits next
// (the key's queue, or a set waiter); and its mode: a try (a.try set)
// answers its one caller at once, whatever the outcome, where the others
// leave their waiters waiting and retrying. A new kind of acquire is one
// attemptKind (its file) and one store call (Store), plus its lane
// (LoopState, newLoopState) and the name of its batches (batchKind: its
// span name, op, and whether shedding paces it, paced).

// Attempt is one database acquire attempt. Created by run; the DB
// goroutine reads only lockID, ttl and what its kind sends.
type Attempt struct {
	Ks     *KeyState // its key; nil for a set (its keys are its kind's)
	lockID string    // pre-generated, so an ambiguous outcome can be released (ambiguity is never success)
	ttl    time.Duration
	// Owned by run (flight.go): chain numbers the key's attempt and its
	// hedges (an answer from any of them is the key's answer, the first
	// wins); hedges counts the hedges before this one in its chain; stale
	// marks an attempt superseded by a hedge or by another attempt's answer.
	chain  uint64
	hedges uint8
	stale  bool
	// yield: the attempt's items yield to their keys' fair queue
	// (store.AcquireRequest.Yield): a try of a Manager with FairQueue,
	// which takes no ticket, must not take a key a ticket waits for.
	yield bool
	// delayMs is the lock delay stored with the grant (WithLockDelay), in
	// ms (at most math.MaxInt32: kept in the padding after stale).
	delayMs int32
	// db is the span of the round trip that carried the attempt
	// (telemetry): an orphan release of its lockId goes in that span's
	// trace. Written by the DB goroutine before it posts the result, read
	// by run after.
	db trace.SpanContext
	// try is the caller this attempt alone answers, at once (try mode:
	// TryAcquire, TryAcquireAll); nil: it serves its kind's waiters (the
	// key's queue, or a set waiter). A single key's try is outside the
	// key's attempt chain: it never waits for the key's attempt, retry or
	// releases, and never serves the queue (tryattempt.go).
	try *AcquireReq
	// Kind is what the attempt asks for, and what its grant means; its
	// value holds what the kind needs beyond these fields.
	Kind attemptKind
}

// attemptKind is one kind of acquire attempt. Its methods run on the loop,
// except exec, which runs on a DB worker and reads only what is immutable
// once the attempt is made.
type attemptKind interface {
	// The statement: its lane, its batch kind (which names its span:
	// batchKind.op), and the store call that sends a batch of attempts of
	// this kind, answered one result per hold, in attempt order.
	lane(st *LoopState) *lane[*Attempt]
	statement() BatchKind
	exec(ctx context.Context, s Store, batch []*Attempt) ([]store.AcquireResult, error)
	// Holds is how many lockIds a asks for; hold returns the j-th, with its
	// key. unit is how many holds make one caller's grant: a's results
	// are split among callers in units of it.
	holds(a *Attempt) int
	hold(a *Attempt, j int) (lockID, key, hash string)
	unit(a *Attempt) int
	// What a grant means: whether the fences of holds [lo, hi) pass
	// fence monotonicity (recording them); whether a caller of this
	// process holds what a try's grant would take; the locks it makes for
	// to (answering it).
	FenceOK(st *LoopState, a *Attempt, lo, hi int, rs []store.AcquireResult) bool
	heldHere(st *LoopState, a *Attempt, to *AcquireReq) bool
	grant(st *LoopState, a *Attempt, to *AcquireReq, lo, hi int, rs []store.AcquireResult, lease heartbeat.Lease)
	// Who waits next: the waiters of a (not a try), as the protocol's
	// steps see them (see waiters); for the key's queue, whether its head
	// req can take a's grant, and until when at the latest its waiters
	// wait after the refusal r (zero: their backoff decides).
	waiters(st *LoopState, a *Attempt) waiters
	serves(a *Attempt, req *AcquireReq) bool
	refusal(st *LoopState, a *Attempt, r store.AcquireResult, now time.Time) time.Time
	// again returns the kind of a hedge of a (flight.go), whose first
	// lockId is id.
	again(a *Attempt, id string) attemptKind
	// landed settles, before the protocol does, what the kind alone knows
	// of a's answer (rs nil: the round trip failed); owns reports whether
	// a's j-th lockId stays with its waiter rather than going back when a
	// grant of it is refused or unknown: a grant of it was handed to the
	// caller by another way, or (unknown: a's outcome is unknown, or a is
	// stale) the waiter still waits with it (a fair-queue ticket, whose
	// next attempt answers a grant this one made).
	landed(st *LoopState, a *Attempt, d acquireDone, rs []store.AcquireResult)
	owns(a *Attempt, j int, unknown bool) bool
	// keep settles a pending attempt that is not to be sent any more (its
	// waiters left, Close began) and reports whether it is still to go.
	keep(st *LoopState, a *Attempt) bool
	// served enumerates the acquire spans a's round trip serves (it links
	// to them), first the one it is made for.
	served(a *Attempt, add func(*obs.Acquisition) bool) bool
	// op names the call in the errors a caller gets.
	op(try bool) string
}

// waiters is who an attempt that is not a try serves (its kind's
// waiters): the protocol's steps, for them. A pointer (no allocation).
type waiters interface {
	// land takes a out of its in-flight slot; reached records that its
	// round trip reached the database (err nil) or not.
	land(st *LoopState, a *Attempt)
	reached(err error)
	// left reports whether nobody waits for a any more; closed answers
	// them at Close.
	left() bool
	closed(st *LoopState, a *Attempt)
	// failed: the round trip failed with err (retry or fail); fatal: an
	// item failed on its own, which no retry fixes.
	failed(st *LoopState, a *Attempt, err error, now time.Time, db trace.SpanContext)
	fatal(st *LoopState, a *Attempt, err error, db trace.SpanContext)
	// refused: a found its key(s) held; rs are its results, r the first
	// refusal (nil when what refused it was a holder of this process).
	refused(st *LoopState, a *Attempt, rs []store.AcquireResult, r *store.AcquireResult, now time.Time, db trace.SpanContext)
	// taker returns who a grant of holds [lo, hi) of a goes to (nil:
	// nobody); takenHere reports whether a caller of this process holds
	// what that grant would take.
	taker(a *Attempt, lo, hi int) *AcquireReq
	takenHere(st *LoopState, a *Attempt, to *AcquireReq) bool
	// refuse: a grant to to was refused with err (a fence regression; a
	// late answer when late); unserved: a grant had no taker.
	refuse(st *LoopState, a *Attempt, to *AcquireReq, err error, late bool, now time.Time, db trace.SpanContext)
	unserved(st *LoopState)
	// settled runs once a's answer was settled (granted: something was).
	settled(st *LoopState, a *Attempt, granted bool, db trace.SpanContext)
}

// handleAcquireDone settles the answer to a batch of attempts.
func (st *LoopState) handleAcquireDone(d acquireDone) {
	st.land(d.fl, &st.acquireSlots)
	now := st.m.Now()
	st.observe(d.fl, len(d.batch), d.err, now) // overload.go
	off := 0
	for _, a := range d.batch {
		n := a.Kind.holds(a)
		var rs []store.AcquireResult
		if d.err == nil {
			rs = d.res[off : off+n]
		}
		off += n
		a.Kind.landed(st, a, d, rs)
		st.settle(a, d, rs, now)
	}
}

// settle is the acquire protocol (see above) for one attempt a; rs are
// its results (nil when the round trip failed).
func (st *LoopState) settle(a *Attempt, d acquireDone, rs []store.AcquireResult, now time.Time) {
	if st.settleStale(a, d, rs) { // flight.go
		return
	}
	if a.try != nil {
		st.settleTry(a, d, rs, now)
		return
	}
	w := a.Kind.waiters(st, a)
	w.land(st, a)
	w.reached(d.err)
	switch {
	case w.left():
		st.releaseHolds(a, d, rs, relUnblocked)
	case st.closing:
		st.releaseHolds(a, d, rs, relDetached)
		w.closed(st, a)
	case d.err != nil:
		if mayHaveGranted(d.err) {
			st.releaseUnknown(a, relBlocking)
		}
		w.failed(st, a, d.err, now, d.db)
	default:
		st.settleAnswer(a, w, d, rs, now)
		return
	}
	w.settled(st, a, false, d.db)
}

// settleAnswer settles the results rs of a round trip that reached the
// database, unit by unit (a unit: the holds one caller gets).
func (st *LoopState) settleAnswer(a *Attempt, w waiters, d acquireDone, rs []store.AcquireResult, now time.Time) {
	var refused *store.AcquireResult
	var fatal error // an item's own failure no retry fixes (fence overflow)
	granted := false
	lease := heartbeat.Lease{TTL: a.ttl, Start: d.start, Margin: st.margin(a.ttl)}
	n, size := a.Kind.holds(a), a.Kind.unit(a)
	for lo := 0; lo < n; lo += size {
		hi := lo + size
		if err := firstErr(rs[lo:hi]); err != nil {
			st.releaseUnit(a, lo, hi, rs, relUnblocked)
			fatal = err
			continue
		}
		if r := firstRefused(rs[lo:hi]); r != nil {
			if refused == nil {
				refused = r
			}
			continue
		}
		to := w.taker(a, lo, hi)
		switch {
		case !a.Kind.FenceOK(st, a, lo, hi, rs):
			// Fence monotonicity: a fence not above one already seen
			// means the database lost acknowledged grants. Refuse it;
			// the waiter it was for learns why.
			st.releaseUnit(a, lo, hi, rs, relBlocking)
			w.refuse(st, a, to, fenceRegression(a.Kind.op(false)), false, now, d.db)
		case to == nil:
			// The waiter it was for left (or the next one wants
			// another hold): release, then attempt again for it.
			st.releaseUnit(a, lo, hi, rs, relBlocking)
			w.unserved(st)
		case w.takenHere(st, a, to):
			// A caller here got a key meanwhile (the server granted
			// this only after that holder's row was gone: it finds
			// out at its next extend). One holder here at a time: the
			// grant goes back.
			st.releaseUnit(a, lo, hi, rs, relBlocking)
			w.refused(st, a, rs, nil, now, d.db)
		case !now.Before(lease.TrustedUntil()):
			// The answer came after the grant's own trust window.
			st.releaseUnit(a, lo, hi, rs, relBlocking)
			w.refuse(st, a, to, lateGrant(a.Kind.op(false)), true, now, d.db)
		default:
			noteCaller(to, d.db, obs.AttemptGranted, 0)
			a.Kind.grant(st, a, to, lo, hi, rs, lease)
			granted = true
		}
	}
	switch {
	case fatal != nil:
		w.fatal(st, a, fatal, d.db)
	case refused != nil:
		w.refused(st, a, rs, refused, now, d.db)
	}
	w.settled(st, a, granted, d.db)
}

// settleTry is the protocol in try mode: the one caller is answered at
// once, whatever the outcome (an error, "locked", or its lock).
func (st *LoopState) settleTry(a *Attempt, d acquireDone, rs []store.AcquireResult, now time.Time) {
	req := a.try
	k := a.Kind
	if a.Ks != nil {
		a.Ks = st.keyFor(a.Ks.Key, a.Ks.hash) // a.ks may have been forgotten meanwhile
	}
	if a.Ks == nil { // a set's try is its set waiter's attempt
		k.waiters(st, a).land(st, a)
	}
	if mayHaveGranted(d.err) {
		st.releaseHolds(a, d, rs, relUnblocked)
	}
	err := d.err
	if err == nil {
		err = firstErr(rs)
	}
	st.tryReached(a, d.err, err)
	var ans AcquireReply
	outcome := obs.AttemptFailed
	switch {
	case req.answered: // the caller left, or Close answered it
		if d.err == nil {
			st.releaseHolds(a, d, rs, relUnblocked)
		}
		st.tryDone(a)
		return
	case st.closing:
		if d.err == nil {
			st.releaseHolds(a, d, rs, relUnblocked)
		}
		ans.Err = ClosedErr(k.op(true))
	case err != nil:
		if d.err == nil {
			st.releaseHolds(a, d, rs, relUnblocked)
		}
		ans.Err = err
	case firstRefused(rs) != nil:
		ans.Locked, outcome = true, obs.AttemptContended
		st.noteTryWaiting(req, rs)
	case !k.FenceOK(st, a, 0, len(rs), rs):
		st.releaseHolds(a, d, rs, relUnblocked)
		ans.Err = fenceRegression(k.op(true))
	case k.heldHere(st, a, req):
		// A caller here got the key meanwhile (the server granted this
		// attempt only after that holder's row was gone: it finds out at
		// its next extend). One holder here at a time: this grant goes
		// back.
		st.releaseHolds(a, d, rs, relUnblocked)
		ans.Locked, outcome = true, obs.AttemptContended
	default:
		lease := heartbeat.Lease{TTL: a.ttl, Start: d.start, Margin: st.margin(a.ttl)}
		if !now.Before(lease.TrustedUntil()) {
			st.releaseHolds(a, d, rs, relUnblocked)
			ans.Err = lateGrant(k.op(true))
			break
		}
		noteCaller(req, d.db, obs.AttemptGranted, 0)
		k.grant(st, a, req, 0, len(rs), rs, lease) // answers req
		st.tryDone(a)
		return
	}
	noteCaller(req, d.db, outcome, 0)
	st.answerCaller(a, ans)
	st.tryDone(a)
}

// releaseMode is how an attempt's lockId is released: whether its key's
// attempts wait for the release.
type releaseMode uint8

const (
	relDetached  releaseMode = iota // during Close: nothing to kick
	relBlocking                     // the key's next attempt waits for it (a key's own attempt)
	relUnblocked                    // kicks the key when answered; its attempts do not wait (a try's, a set's, a stale one's)
)

// releaseHolds releases every lockId of a that its answer granted or may
// have granted (all of them when its outcome is unknown).
func (st *LoopState) releaseHolds(a *Attempt, d acquireDone, rs []store.AcquireResult, how releaseMode) {
	maybe := mayHaveGranted(d.err)
	for j := range a.Kind.holds(a) {
		if maybe || (d.err == nil && rs[j].OK) {
			st.releaseHold(a, j, how, maybe)
		}
	}
}

// releaseUnknown releases every lockId of a, whose outcome is unknown,
// that its waiter does not keep (owns).
func (st *LoopState) releaseUnknown(a *Attempt, how releaseMode) {
	for j := range a.Kind.holds(a) {
		if !a.Kind.owns(a, j, true) {
			st.releaseHold(a, j, how, true)
		}
	}
}

// releaseUnit releases the granted lockIds of holds [lo, hi) of a.
func (st *LoopState) releaseUnit(a *Attempt, lo, hi int, rs []store.AcquireResult, how releaseMode) {
	for j := lo; j < hi; j++ {
		if rs[j].OK {
			st.releaseHold(a, j, how, false)
		}
	}
}

// releaseHold queues the release of a's j-th lockId; pending: its grant
// is not known (releaseItem.pending).
func (st *LoopState) releaseHold(a *Attempt, j int, how releaseMode, pending bool) {
	if a.Kind.owns(a, j, false) {
		return // its caller holds the grant of this lockId
	}
	id, key, hash := a.Kind.hold(a, j)
	it := releaseItem{lockID: id, key: key, ttl: a.ttl, sc: a.db, pending: pending}
	if st.closing {
		how = relDetached
	}
	switch how {
	case relBlocking:
		if a.Ks != nil && a.try == nil {
			it.ks = a.Ks
			a.Ks.releasing++
			break
		}
		fallthrough // a try's or a set's release never holds up a key's attempts
	case relUnblocked:
		ks := a.Ks
		if ks == nil {
			ks = st.keyFor(key, hash)
		}
		it.ks, it.unblocked = ks, true
	}
	st.releases.add(it)
}

// answerCaller answers a try's caller with r.
func (st *LoopState) answerCaller(a *Attempt, r AcquireReply) {
	if a.try.Set != nil {
		st.answerSet(setOf(a).w, r) // sets.go
		return
	}
	a.try.answered = true
	a.try.Reply <- r
}

// tryReached records what a try's round trip found on its key's outage
// record (a set try has none): failed is the round trip's failure, err
// the attempt's.
func (st *LoopState) tryReached(a *Attempt, failed, err error) {
	if a.Ks == nil {
		return
	}
	switch {
	case failed != nil:
		a.Ks.lastErr = failed
	case err == nil:
		a.Ks.lastErr = nil // it reached the database
	}
}

// tryDone forgets the state of a try's key if nothing refers to it any
// more.
func (st *LoopState) tryDone(a *Attempt) {
	if a.Ks != nil {
		st.gc(a.Ks)
	}
}

// noteTryWaiting records, on a refused try's telemetry, why it waits.
func (st *LoopState) noteTryWaiting(req *AcquireReq, rs []store.AcquireResult) {
	if req.Set != nil {
		noteSetWaiting(req, rs)
		return
	}
	r := rs[0]
	req.Acq.Waiting(waitReasonOf(req.Shared, req.Limit, r), r.Holder)
	if foreignHolder(r) {
		st.m.Rec.ForeignHolder() // one Info record when the release trigger is missing
	}
}

// noteCaller records one database attempt on req's telemetry (each key's,
// for a set).
func noteCaller(req *AcquireReq, db trace.SpanContext, o obs.AttemptOutcome, retryIn time.Duration) {
	if req.Set != nil {
		noteSet(req, db, o, retryIn)
		return
	}
	req.Acq.Attempt(db, o, retryIn)
}

// firstErr returns the first item error of rs.
func firstErr(rs []store.AcquireResult) error {
	for j := range rs {
		if rs[j].Err != nil {
			return rs[j].Err
		}
	}
	return nil
}

// firstRefused returns the first refusal of rs (nil: all granted).
func firstRefused(rs []store.AcquireResult) *store.AcquireResult {
	for j := range rs {
		if !rs[j].OK {
			return &rs[j]
		}
	}
	return nil
}

// fenceRegression is the error of a grant refused by fence monotonicity.
func fenceRegression(op string) error {
	return pgerr.New(pglease.CodeFenceRegression, op,
		"fence not above one already seen for this key: the database lost acknowledged writes", nil)
}

// lateGrant is the error of a grant answered after its trust window.
func lateGrant(op string) error {
	return pgerr.New(pglease.CodeNetworkTimeout, op, "grant arrived after its trust window", nil)
}

// keepAttempt settles a pending acquire attempt that is not to be sent
// any more (its kind's keep; a try's: keepTry).
func (st *LoopState) keepAttempt(a *Attempt) bool {
	if a.try != nil && a.Ks != nil {
		return st.keepTry(a)
	}
	return a.Kind.keep(st, a)
}

// keepKeyAttempt reports whether flush sends a key's pending attempt:
// not once its waiters all left, nor during Close.
func (st *LoopState) keepKeyAttempt(a *Attempt) bool {
	if st.closing || len(a.Ks.queue) == 0 {
		a.Ks.attempt = nil // nobody left to serve
		st.gc(a.Ks)
		return false
	}
	return true
}

// keyServed enumerates the acquire spans a key's attempt serves: a try's
// caller alone, or every waiter of the key, the head first.
func keyServed(a *Attempt, add func(*obs.Acquisition) bool) bool {
	if a.try != nil {
		return add(a.try.Acq)
	}
	for _, req := range a.Ks.queue {
		if !add(req.Acq) {
			return false
		}
	}
	return true
}

// sendAttempts starts an acquire batch of one kind (loop side of
// sendAttempts).
func (st *LoopState) sendAttempts(fl *flight, batch []*Attempt) {
	fl.attempts = batch
	parent, served := roundTripSpans(batch, nil)
	st.Start(fl, len(batch), func() { st.m.sendAttempts(fl, batch, parent, served) })
}

// sendAttempts runs on a DB worker: one statement (the kind's store call)
// for the batch.
func (m *Kernel) sendAttempts(fl *flight, batch []*Attempt, parent trace.SpanContext, served []trace.SpanContext) {
	k := batch[0].Kind
	n := 0
	for _, a := range batch {
		n += k.holds(a)
	}
	// Not cancelled by Close: an acquire abandoned mid-statement has an
	// unknown outcome, and the server may commit it after the release of
	// its lockId has already run, leaving the row until it expires. Letting
	// the statement finish (bounded by StatementTimeout) gives a definite
	// answer, and the drain releases whatever it granted.
	ctx, cancel := context.WithTimeoutCause(context.Background(), m.cfg.StatementTimeout, pgerr.ErrStatementTimeout)
	defer cancel()
	kind := k.statement()
	m.beforeBatch(kind, n)
	ctx, db := m.Rec.StartDB(ctx, kind.op(), n, parent, served...)
	start := m.Now()
	res, err := k.exec(ctx, m.Store, batch)
	ok := 0
	for _, r := range res {
		if r.OK {
			ok++
		}
	}
	db.End(ok, err)
	if m.Test.AfterAcquire != nil && kind == KindAcquire {
		m.Test.AfterAcquire()
	}
	sc := db.SpanContext()
	for _, a := range batch {
		a.db = sc
	}
	m.acquireDoneCh <- acquireDone{fl: fl, batch: batch, start: start, res: res, err: err, db: sc}
}

// keyQueue is a key's queue as the waiters of the key's own attempt (an
// exclusive or shared one, not a try): they wait in FIFO order, and the
// attempt serves the head (and, shared, the coalescible waiters behind
// it).
type keyQueue KeyState

func (q *keyQueue) ks() *KeyState { return (*KeyState)(q) }

func (q *keyQueue) land(st *LoopState, a *Attempt) { q.attempt = nil }

func (q *keyQueue) reached(err error) {
	if err == nil {
		q.lastErr = nil // it reached the database: whatever it found, no outage (waitErr)
	}
}

func (q *keyQueue) left() bool { return false } // an attempt whose waiters left finds no taker

func (q *keyQueue) closed(st *LoopState, a *Attempt) {} // the drain answers the queue

func (q *keyQueue) failed(st *LoopState, a *Attempt, err error, now time.Time, db trace.SpanContext) {
	st.attemptFailed(q.ks(), err, now, db)
}

func (q *keyQueue) fatal(st *LoopState, a *Attempt, err error, db trace.SpanContext) {
	q.lastErr = err
	noteAttempt(q.queue, db, obs.AttemptFailed, 0)
	st.failAll(q.ks(), err)
}

// refused: the waiters wait for a release (they hold the key's waiter
// lock), their retry, or the holder's takeover time, whichever comes
// first; a release notified while the attempt was in flight makes them
// try again at once (the "locked" may predate it).
func (q *keyQueue) refused(st *LoopState, a *Attempt, rs []store.AcquireResult, r *store.AcquireResult, now time.Time, db trace.SpanContext) {
	ks := q.ks()
	latest := a.Kind.refusal(st, a, *r, now)
	if len(ks.queue) == 0 {
		return
	}
	noteWaiting(ks.queue, *r)
	st.wantWaiter(ks)
	st.contended(ks).heldBy = r.Holder
	var retryIn time.Duration
	if ks.woken {
		st.kick(ks)
	} else {
		st.scheduleRetry(ks, now, latest)
		retryIn = ks.retryAt.Sub(now)
	}
	noteAttempt(ks.queue, db, obs.AttemptContended, retryIn)
}

func (q *keyQueue) taker(a *Attempt, lo, hi int) *AcquireReq {
	if len(q.queue) > 0 && a.Kind.serves(a, q.queue[0]) {
		return q.queue[0]
	}
	return nil
}

func (q *keyQueue) takenHere(st *LoopState, a *Attempt, to *AcquireReq) bool {
	return false // the key's attempts are its only way to a holder here
}

func (q *keyQueue) refuse(st *LoopState, a *Attempt, to *AcquireReq, err error, late bool, now time.Time, db trace.SpanContext) {
	q.lastErr = err
	if to == nil {
		return
	}
	to.Acq.Attempt(db, obs.AttemptFailed, 0)
	if late {
		return // the head waits for the key's next attempt
	}
	st.popWaiter(q.ks())
	to.answered = true
	to.Reply <- AcquireReply{Err: err}
}

func (q *keyQueue) unserved(st *LoopState) { st.sig().Orphaned.signal(q.Key) }

func (q *keyQueue) settled(st *LoopState, a *Attempt, granted bool, db trace.SpanContext) {
	ks := q.ks()
	if granted && ks.holder != nil {
		// The others now wait for this holder: for them the key was taken.
		noteAttempt(ks.queue, db, obs.AttemptContended, 0)
	}
	// Everything asked for was granted (or settled): the waiters behind
	// are served by the key's next attempt (a no-op while the key is
	// held, released, retried or attempted).
	st.kick(ks)
	st.gc(ks)
}
