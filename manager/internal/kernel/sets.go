package kernel

import (
	"container/heap"
	"context"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/store"
)

// All-or-nothing sets. AcquireAll takes several keys exclusively in one
// statement per attempt (store.AcquireSets), all of them or none: its
// waiter (a setWait) has an attempt loop of its own, beside the keys'
// queues, and never joins them:
//
//   - It does not block the keys' single-key waiters: their attempts,
//     handoffs and grants go on while it waits (outside its turn, below).
//   - It attempts when none of its keys is held or being released by
//     this process (its attempt could only be refused), and again on every
//     release of any of its keys, in this process or, notified, in another
//     (it holds the waiter lock of each of its keys once refused), with
//     the keys' backoff in between, or when the latest of its holders'
//     leases can be taken over, if sooner.
//   - Its turn: once the keys of a set waiter have been granted
//     setTurnAfter times to single-key callers of this process while it
//     waited, the keys' own attempts and local handoffs hold back, and
//     TryAcquire of them answers "held", until the set's next attempt is
//     answered; that attempt goes out as soon as none of its keys is held
//     here, or lapses after setTurnMax if that does not happen (a key
//     held here for long), and then no new turn begins before its next
//     attempt. So callers of this process that hold its keys briefly
//     cannot starve it: it is tried with all its keys free here at least
//     once per setTurnAfter of their grants (plus what the holders of that
//     moment take to release); and a long holder of one of its keys makes
//     the callers of the others wait setTurnMax once, not again and again.
//     Across processes there is no order, as for single keys: the server
//     grants whoever comes first, and a set needs all its keys free at
//     once.

// MaxSetKeys caps the keys of one AcquireAll.
const MaxSetKeys = 100

// setTurnAfter is how many grants of its keys to other callers of this
// process a set waiter lets pass before it takes a turn; setTurnMax bounds
// a turn whose attempt cannot go out (one of its keys is held here).
const (
	setTurnAfter = 4
	setTurnMax   = time.Second
)

// SetReq is what a set request adds to an acquireReq: its keys.
type SetReq struct{ Keys []SetKey }

// SetKey is one key of a set request: NFC key, hash, and that key's
// acquire telemetry (each key of a set is an acquire of its own, and each
// returned Lock an ordinary lease).
type SetKey struct {
	Key, Hash string
	Acq       *obs.Acquisition
}

// setWait is one AcquireAll or TryAcquireAll not answered yet. Owned by
// run. A waiting one (not a try) is in the sets of each of its keys'
// keyContention, which keeps those keyStates.
type setWait struct {
	req      *AcquireReq
	attempt  *Attempt // pending or in flight (its kind: setKind)
	bo       backoff.BackOff
	retryAt  time.Time // scheduled retry (zero: none)
	retryGen uint64    // invalidates stale retryHeap entries
	heldBy   string    // holder named by the last refusal, for waitErr
	lastErr  error     // failure of the last attempt (waitErr)
	passes   int       // grants of its keys to others since it waits (or since its last turn)
	woken    bool      // a release of one of its keys came while an attempt was in flight
	turn     bool      // its keys' own attempts hold back for it
	turnGen  uint64    // invalidates the retryHeap entry that ends a turn at setTurnMax
	lapsed   bool      // its last turn lapsed: no new one before its next attempt
	done     bool      // answered: an attempt still in flight serves nobody
	// In the fair queue (Config.FairQueue, fair.go): qids are the set's
	// tickets, a lockId per key (made at its first attempt, kept for the
	// whole wait: its places, and its grant's lockIds); qsent the send
	// time of the latest statement that found them queued (zero: none
	// yet).
	qids  []string
	qsent time.Time
}

// setKind is the kind of a set's attempt (acquire pipeline:
// pipeline.go): a lockId per key, all granted or none, in one
// AcquireSets; its waiter is w (a set waiter, or in try mode its caller).
type setKind struct {
	w      *setWait
	ids    []string
	inTurn bool // made during w's turn: its answer ends the turn
	// fair: a QueueWait of the set's tickets (ids are w.qids) on the
	// process's queue channel qch (fair.go).
	fair bool
	qch  string
}

// setOf returns the set kind of a set's attempt a.
func setOf(a *Attempt) *setKind { return a.Kind.(*setKind) }

// setWaiters returns the set waiters that want ks's key.
func (ks *KeyState) setWaiters() []*setWait {
	if ks.cont == nil {
		return nil
	}
	return ks.cont.sets
}

// inTurn reports whether a set waiter that wants ks's key has its turn:
// the key's own attempts and handoffs wait.
func (ks *KeyState) inTurn() bool {
	return ks.cont != nil && ks.cont.turns > 0
}

// startSet takes a new set request: a try is answered at once or sent; a
// waiter joins its keys and is kicked.
func (st *LoopState) startSet(req *AcquireReq) {
	w := &setWait{req: req}
	st.sets[req] = w
	if req.Try {
		// Never queued: callers here that hold or wait for one of its
		// keys come first, as for TryAcquire.
		for _, k := range req.Set.Keys {
			if ks := st.keys[k.Key]; ks != nil && (ks.heldHere(req) || len(ks.queue) > 0 || ks.inTurn() || len(ks.setWaiters()) > 0) {
				st.answerSet(w, AcquireReply{Locked: true})
				return
			}
		}
		for _, k := range req.Set.Keys {
			k.Acq.Queued(obs.QueueInfo{})
		}
		st.newSetAttempt(w)
		return
	}
	w.bo = newBackOff(st.m.cfg.Retry)
	st.waiting++
	for _, k := range req.Set.Keys {
		ks := st.keyFor(k.Key, k.Hash)
		c := st.contended(ks)
		c.sets = append(c.sets, w)
		st.byHash[ks.hash] = ks // notifications of its releases wake the set
		k.Acq.Queued(obs.QueueInfo{HeldLocally: ks.heldHere(req), Coalesced: len(ks.queue) > 0})
	}
	st.sig().Queued.signal(req.Key)
	st.kickSet(w)
}

// kickSet starts an attempt for w unless one is pending or in flight, a
// retry is scheduled, or one of its keys is held or being released by
// this process (a local release kicks it).
func (st *LoopState) kickSet(w *setWait) {
	if st.closing || w.done || w.attempt != nil || !w.retryAt.IsZero() {
		return
	}
	// In the fair queue a set takes its places at once, even while a key
	// is held here: the order, not this process, decides its turn.
	for _, k := range w.req.Set.Keys {
		if st.fair() && w.qids == nil {
			break
		}
		if ks := st.keys[k.Key]; ks != nil && (ks.held() || ks.releasing > 0) {
			return
		}
	}
	st.newSetAttempt(w)
}

// newSetAttempt queues an attempt for w, with a new lockId per key.
func (st *LoopState) newSetAttempt(w *setWait) {
	w.woken, w.lapsed = false, false
	sk := &setKind{w: w, ids: make([]string, len(w.req.Set.Keys)), inTurn: w.turn}
	if st.fair() && !w.req.Try {
		st.setTickets(w) // fair.go
		sk.ids, sk.fair, sk.qch = w.qids, true, st.m.qch
	}
	for i := range sk.ids {
		if sk.ids[i] == "" {
			sk.ids[i] = keys.NewLockID()
		}
	}
	a := &Attempt{lockID: sk.ids[0], ttl: w.req.TTL, delayMs: w.req.delayMs(), Kind: sk}
	if w.req.Try {
		a.try = w.req       // try mode: answered at once
		a.yield = st.fair() // a try never queues: it yields to the tickets
	}
	w.attempt = a
	st.setAcqs.add(a)
}

// kickSets tries the set waiters that want ks's key once more: the key
// was (probably) just freed, or a release of it was notified.
func (st *LoopState) kickSets(ks *KeyState) {
	for _, w := range ks.setWaiters() {
		if w.attempt != nil {
			w.woken = true // the attempt in flight may have missed the release
			continue
		}
		st.clearSetRetry(w)
		st.kickSet(w)
	}
}

// passSets counts a grant of ks's key to another caller against each set
// waiter that wants it, and gives a waiter its turn at setTurnAfter.
func (st *LoopState) passSets(ks *KeyState) {
	if st.fair() {
		return // the queue's order gives a set its turn
	}
	for _, w := range ks.setWaiters() {
		if w.turn || w.lapsed {
			continue
		}
		if w.passes++; w.passes < setTurnAfter {
			continue
		}
		w.turn = true
		for _, k := range w.req.Set.Keys {
			if c := st.keys[k.Key].cont; c != nil {
				c.turns++
			}
		}
		// A turn whose attempt cannot go out soon (a key held here for
		// long) lapses: the keys' other callers wait at most setTurnMax.
		w.turnGen++
		heap.Push(&st.retries, retryEntry{at: st.m.Now().Add(setTurnMax), w: w, gen: w.turnGen, turn: true})
		if w.attempt == nil {
			st.clearSetRetry(w)
			st.kickSet(w)
		}
	}
}

// lapseTurn ends w's turn at setTurnMax unless its attempt is in flight
// (whose answer ends it).
func (st *LoopState) lapseTurn(w *setWait) {
	if a := w.attempt; a == nil || !setOf(a).inTurn {
		st.endTurnOf(w)
		w.lapsed = true
	}
}

// endTurn ends the turn of the waiter of sk if sk was made during it
// (an attempt sent before the turn began does not end it): its keys' own
// attempts go on.
func (st *LoopState) endTurn(sk *setKind) {
	if sk.inTurn {
		st.endTurnOf(sk.w)
	}
}

func (st *LoopState) endTurnOf(w *setWait) {
	if !w.turn {
		return
	}
	w.turn, w.passes = false, 0
	w.turnGen++
	for _, k := range w.req.Set.Keys {
		if ks := st.keys[k.Key]; ks != nil && ks.cont != nil {
			ks.cont.turns--
			st.kick(ks)
		}
	}
}

// scheduleSetRetry schedules w's next attempt after its jittered backoff,
// or at freeAt if that comes first (zero: none).
func (st *LoopState) scheduleSetRetry(w *setWait, now, freeAt time.Time) {
	w.retryAt = now.Add(w.bo.NextBackOff())
	if !freeAt.IsZero() && freeAt.Before(w.retryAt) {
		w.retryAt = freeAt
	}
	w.retryGen++
	heap.Push(&st.retries, retryEntry{at: w.retryAt, w: w, gen: w.retryGen})
	st.sig().Retrying.signal(w.req.Key)
}

func (st *LoopState) clearSetRetry(w *setWait) {
	if !w.retryAt.IsZero() {
		w.retryAt = time.Time{}
		w.retryGen++
	}
}

// answerSet answers w's caller with r and forgets w.
func (st *LoopState) answerSet(w *setWait, r AcquireReply) {
	w.req.answered = true
	w.req.Reply <- r
	st.endSet(w)
}

// endSet forgets w: its keys no longer wait for it (their states may go).
func (st *LoopState) endSet(w *setWait) {
	if w.done {
		return
	}
	w.done = true
	delete(st.sets, w.req)
	st.clearSetRetry(w)
	st.leaveSetTickets(w) // fair.go
	if w.req.Try {
		return
	}
	st.waiting--
	turn := w.turn
	w.turn = false
	for _, k := range w.req.Set.Keys {
		ks := st.keys[k.Key]
		if ks == nil || ks.cont == nil {
			continue
		}
		c := ks.cont
		c.sets = slices.DeleteFunc(c.sets, func(x *setWait) bool { return x == w })
		if len(c.sets) == 0 {
			c.sets = nil
		}
		st.unqueued(ks)
		if turn {
			c.turns--
			st.kick(ks)
		}
		st.gc(ks)
	}
}

// abandonSet answers a set waiter whose caller left (handleAbandon).
func (st *LoopState) abandonSet(req *AcquireReq) AcquireReply {
	ans := AcquireReply{Abandoned: true}
	w := st.sets[req]
	if w == nil {
		return ans
	}
	ans.LastErr, ans.HeldBy = w.lastErr, w.heldBy
	for _, k := range req.Set.Keys {
		if ks := st.keys[k.Key]; ks != nil && ks.heldHere(req) {
			ans.HeldHere = true
		}
	}
	st.endSet(w)
	return ans
}

// noteSet records one attempt on each key's telemetry of req.
func noteSet(req *AcquireReq, db trace.SpanContext, o obs.AttemptOutcome, retryIn time.Duration) {
	for _, k := range req.Set.Keys {
		k.Acq.Attempt(db, o, retryIn)
	}
}

func (sk *setKind) lane(st *LoopState) *lane[*Attempt] { return &st.setAcqs }

func (sk *setKind) statement() BatchKind { return KindSets }

// exec sends one AcquireSets for the batch; its results, flattened, are in
// the order of the sets and of each set's keys.
func (sk *setKind) exec(ctx context.Context, s Store, batch []*Attempt) ([]store.AcquireResult, error) {
	if sk.fair {
		return fairSetExec(ctx, s, batch) // fair.go
	}
	n := 0
	reqs := make([][]store.AcquireRequest, len(batch))
	for i, a := range batch {
		k := setOf(a)
		reqs[i] = make([]store.AcquireRequest, len(k.ids))
		for j, key := range k.w.req.Set.Keys {
			reqs[i][j] = store.AcquireRequest{Key: key.Key, TTL: a.ttl, LockID: k.ids[j], LockDelay: k.w.req.Delay, Yield: a.yield}
		}
		n += len(k.ids)
	}
	res, err := s.AcquireSets(ctx, reqs)
	if err != nil {
		return nil, err
	}
	flat := make([]store.AcquireResult, 0, n)
	for _, set := range res {
		flat = append(flat, set...)
	}
	return flat, nil
}

func (sk *setKind) holds(a *Attempt) int { return len(sk.ids) }

func (sk *setKind) hold(a *Attempt, j int) (lockID, key, hash string) {
	k := sk.w.req.Set.Keys[j]
	return sk.ids[j], k.Key, k.Hash
}

// unit: the set is one caller's, all of it or nothing.
func (sk *setKind) unit(a *Attempt) int { return len(sk.ids) }

// FenceOK: each key's fence strictly above every fence seen for it.
func (sk *setKind) FenceOK(st *LoopState, a *Attempt, lo, hi int, rs []store.AcquireResult) bool {
	for j, k := range sk.w.req.Set.Keys {
		if !st.noteFence(st.keyFor(k.Key, k.Hash), rs[j].Fence) {
			return false
		}
	}
	return true
}

// heldHere: any of its keys held here (a caller here got it while the
// set's attempt was in flight).
func (sk *setKind) heldHere(st *LoopState, a *Attempt, to *AcquireReq) bool {
	for _, k := range sk.w.req.Set.Keys {
		if ks := st.keys[k.Key]; ks != nil && ks.held() {
			return true
		}
	}
	return false
}

// grant makes a lock of each key and answers the set's caller.
func (sk *setKind) grant(st *LoopState, a *Attempt, to *AcquireReq, lo, hi int, rs []store.AcquireResult, lease heartbeat.Lease) {
	req := sk.w.req
	kss := make([]*KeyState, len(req.Set.Keys))
	locks := make([]*Hold, len(req.Set.Keys))
	st.setServed(sk) // fair.go
	for j, k := range req.Set.Keys {
		kss[j] = st.keyFor(k.Key, k.Hash)
		locks[j] = st.hold(kss[j], req, k.Acq, sk.ids[j], a.ttl, rs[j], lease)
	}
	for j, k := range req.Set.Keys {
		k.Acq.Granted(rs[j].Fence) // before the reply: Lost/Release may follow at once
	}
	st.answerSet(sk.w, AcquireReply{Locks: locks})
	for _, ks := range kss {
		st.granted(ks)
	}
	for _, lk := range locks {
		st.checkRevokedEarly(lk.h) // revoke.go
	}
}

func (sk *setKind) waiters(st *LoopState, a *Attempt) waiters { return sk.w }

func (sk *setKind) serves(a *Attempt, req *AcquireReq) bool { return req == sk.w.req }

func (sk *setKind) refusal(st *LoopState, a *Attempt, r store.AcquireResult, now time.Time) time.Time {
	return takeoverAt(r, now) // (its waiter computes its own: setRefused)
}

// again: a set's attempt is not in a key's attempt chain, and never
// hedged.
func (sk *setKind) again(a *Attempt, id string) attemptKind { return sk }

// landed: in the fair queue, the tickets of a set whose caller left
// meanwhile leave again (its attempt may have queued them after their
// leave), and a refusal's send time is recorded (fair.go).
func (sk *setKind) landed(st *LoopState, a *Attempt, d acquireDone, rs []store.AcquireResult) {
	if sk.fair {
		st.fairSetLanded(a, sk, d, rs)
	}
}

// owns: nothing; a set's attempt is never stale, and after an unknown
// outcome a fair set takes new tickets (fairSetLanded: the next
// QueueWait of the old ones would answer "granted" for a commit that may
// not survive), so its lockIds go back.
func (sk *setKind) owns(a *Attempt, j int, unknown bool) bool { return false }

// keep: not once its caller left or was answered, nor during Close.
func (sk *setKind) keep(st *LoopState, a *Attempt) bool {
	if st.closing || sk.w.done {
		if sk.w.attempt == a {
			sk.w.attempt = nil
		}
		return false
	}
	return true
}

// served: a round trip carrying a set is made for its first key's
// acquire span, and serves every key's.
func (sk *setKind) served(a *Attempt, add func(*obs.Acquisition) bool) bool {
	for _, k := range sk.w.req.Set.Keys {
		if !add(k.Acq) {
			return false
		}
	}
	return true
}

func (sk *setKind) op(try bool) string { return "manager.AcquireAll" }

// A set waiter is the waiters of its set's attempts (acquire pipeline).

func (w *setWait) land(st *LoopState, a *Attempt) {
	if w.attempt == a {
		w.attempt = nil
	}
}

func (w *setWait) reached(err error) {
	if err == nil {
		w.lastErr = nil // it reached the database (waitErr)
	}
}

func (w *setWait) left() bool { return w.done } // the caller left, or Close answered it

func (w *setWait) closed(st *LoopState, a *Attempt) {
	st.answerSet(w, AcquireReply{Err: ClosedErr("manager.AcquireAll")})
}

func (w *setWait) failed(st *LoopState, a *Attempt, err error, now time.Time, db trace.SpanContext) {
	w.lastErr = err
	noteSet(w.req, db, obs.AttemptFailed, 0)
	if !retryable(err) {
		st.answerSet(w, AcquireReply{Err: err})
		return
	}
	for _, k := range w.req.Set.Keys {
		st.wantWaiter(st.keys[k.Key]) // free or not is unknown (attemptFailed)
	}
	st.setRetry(a, now, time.Time{})
}

func (w *setWait) fatal(st *LoopState, a *Attempt, err error, db trace.SpanContext) {
	noteSet(w.req, db, obs.AttemptFailed, 0)
	st.answerSet(w, AcquireReply{Err: err})
}

func (w *setWait) refused(st *LoopState, a *Attempt, rs []store.AcquireResult, r *store.AcquireResult, now time.Time, db trace.SpanContext) {
	st.setRefused(a, rs, now, db)
}

func (w *setWait) taker(a *Attempt, lo, hi int) *AcquireReq { return w.req }

func (w *setWait) takenHere(st *LoopState, a *Attempt, to *AcquireReq) bool {
	return a.Kind.heldHere(st, a, to)
}

// refuse: a fence regression fails the set; a late answer is retried.
func (w *setWait) refuse(st *LoopState, a *Attempt, to *AcquireReq, err error, late bool, now time.Time, db trace.SpanContext) {
	noteSet(w.req, db, obs.AttemptFailed, 0)
	if !late {
		st.answerSet(w, AcquireReply{Err: err})
		return
	}
	w.lastErr = err
	st.setRetry(a, now, time.Time{})
}

func (w *setWait) unserved(st *LoopState) {}

func (w *setWait) settled(st *LoopState, a *Attempt, granted bool, db trace.SpanContext) {}

// setRefused handles a set attempt a that found a key held: its waiter
// waits for a release of its keys (it holds their waiter locks) or its
// retry, whichever comes first.
func (st *LoopState) setRefused(a *Attempt, rs []store.AcquireResult, now time.Time, db trace.SpanContext) {
	w := setOf(a).w
	req := w.req
	noteSetWaiting(req, rs)
	// The set can be taken when the last of its holders' leases can be
	// taken over (unknown when one of them did not say).
	var freeAt time.Time
	known := true
	w.heldBy = ""
	for j := range rs {
		r := rs[j]
		if r.OK || (r.RetryAfter <= 0 && r.ExpiresAt.IsZero() && r.Holder == "" && r.SharedHolders == 0) {
			continue // granted or free: its set was refused for another key
		}
		if w.heldBy == "" {
			w.heldBy = r.Holder
		}
		t := takeoverAt(r, now)
		if t.IsZero() {
			known = false
		} else if t.After(freeAt) {
			freeAt = t
		}
	}
	if !known {
		freeAt = time.Time{}
	}
	freeAt = keepMark(freeAt, now) // its refused keys are marked as waited for by a writer
	for j, k := range req.Set.Keys {
		if !setOf(a).fair || foreignHolder(rs[j]) { // a queued set is told its turn on its own channel
			st.wantWaiter(st.keys[k.Key])
		}
	}
	noteSet(req, db, obs.AttemptContended, st.setRetry(a, now, freeAt))
}

// setRetry schedules the next attempt of sa's waiter after sa failed or
// was refused: at once when it has its turn and sa was sent before it
// began (the turn's own attempt is still to come), or when a release was
// notified meanwhile; otherwise after its backoff or at freeAt (see
// scheduleSetRetry), ending the turn sa served. It returns the delay.
func (st *LoopState) setRetry(a *Attempt, now, freeAt time.Time) time.Duration {
	sa := setOf(a)
	w := sa.w
	switch {
	case w.turn && !sa.inTurn:
		st.kickSet(w)
	case w.woken:
		st.endTurn(sa)
		st.kickSet(w)
	default:
		st.scheduleSetRetry(w, now, freeAt)
		st.endTurn(sa)
		return w.retryAt.Sub(now)
	}
	return 0
}
