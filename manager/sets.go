package manager

import (
	"container/heap"
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
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

// maxSetKeys caps the keys of one AcquireAll.
const maxSetKeys = 100

// setTurnAfter is how many grants of its keys to other callers of this
// process a set waiter lets pass before it takes a turn; setTurnMax bounds
// a turn whose attempt cannot go out (one of its keys is held here).
const (
	setTurnAfter = 4
	setTurnMax   = time.Second
)

// setReq is what a set request adds to an acquireReq: its keys.
type setReq struct{ keys []setKey }

// setKey is one key of a set request: NFC key, hash, and that key's
// acquire telemetry (each key of a set is an acquire of its own, and each
// returned Lock an ordinary lease).
type setKey struct {
	key, hash string
	acq       *obs.Acquisition
}

// setWait is one AcquireAll or TryAcquireAll not answered yet. Owned by
// run. A waiting one (not a try) is in the sets of each of its keys'
// keyContention, which keeps those keyStates.
type setWait struct {
	req      *acquireReq
	attempt  *setAttempt // pending or in flight
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
}

// setAttempt is one attempt of a set: a lockId per key.
type setAttempt struct {
	w      *setWait
	ids    []string
	ttl    time.Duration
	inTurn bool // made during w's turn: its answer ends the turn
	// db is the span of the round trip that carried it: written by the DB
	// worker before it posts the result, read by run after.
	db trace.SpanContext
}

// AcquireAll waits for all of keys, exclusively, and returns their locks
// in the order of keys: all of them or none. Each attempt takes every key
// in one statement, or nothing (no key is ever held while the call waits
// for another, so sets with common keys never deadlock, in any order).
// Each returned Lock is an ordinary lease of its key (Acquire's): its own
// fence, heartbeat, loss signal and Release; release each (or let Close).
//
// It waits as Acquire does (the context, WithAcquireTimeout, the same
// errors), and is woken by the release of any of its keys, in this
// process or another. It never holds up callers waiting for one of its
// keys alone; in return it gets a turn: after 4 grants of its keys to
// other callers of this Manager while it waits, those callers wait until
// its next attempt has been answered, which goes out as soon as this
// Manager holds none of its keys (a turn lapses after a second if that
// does not happen: a long holder of one key does not block the others). Against other processes it has
// no priority: the database grants whoever comes first, and the set needs
// all its keys free at the same moment.
//
// keys must be 1 to 100 valid keys, none twice (after NFC normalization);
// WithTTL, WithAcquireTimeout, WithoutAutoExtend and WithHoldLimit apply
// to every lock; Shared and WithLimit do not apply (InvalidArgument).
// Bad input is InvalidArgument before any I/O.
func (m *Manager) AcquireAll(ctx context.Context, keys []string, opts ...AcquireOption) ([]*Lock, error) {
	const op = "manager.AcquireAll"
	req, timeout, err := m.newSetReq(op, ctx, keys, false, opts)
	if err != nil {
		return nil, err
	}
	m.startSetAcquire(ctx, req)
	var wctx context.Context
	var cancel context.CancelFunc
	if timeout > 0 {
		wctx, cancel = context.WithTimeoutCause(ctx, timeout, errWaitTimeout)
	} else {
		wctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	r := m.submit(op, wctx, req)
	switch {
	case r.locks != nil:
		return r.locks, nil
	case r.err != nil:
		err = userErr(op, r.err)
	default:
		err = waitErr(op, ctx, wctx, r)
	}
	failSet(req, err)
	return nil, err
}

// TryAcquireAll makes one attempt to take all of keys, exclusively, in one
// statement: ok is false (and err nil) when any of them is held, by
// another process or by this Manager, or when callers of this Manager wait
// for one of them (they come first). Otherwise it is AcquireAll without
// the wait (see TryAcquire for what a single attempt waits for).
func (m *Manager) TryAcquireAll(ctx context.Context, keys []string, opts ...AcquireOption) (locks []*Lock, ok bool, err error) {
	const op = "manager.TryAcquireAll"
	req, _, err := m.newSetReq(op, ctx, keys, true, opts)
	if err != nil {
		return nil, false, err
	}
	m.startSetAcquire(ctx, req)
	r := m.submit(op, ctx, req)
	switch {
	case r.locks != nil:
		return r.locks, true, nil
	case r.locked:
		for _, k := range req.set.keys {
			k.acq.NotAcquired()
		}
		return nil, false, nil
	case r.err != nil:
		err = userErr(op, r.err)
	default:
		err = waitErr(op, ctx, ctx, r)
	}
	failSet(req, err)
	return nil, false, err
}

// newSetReq validates a set request before any I/O.
func (m *Manager) newSetReq(op string, ctx context.Context, keyList []string, try bool, opts []AcquireOption) (*acquireReq, time.Duration, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, 0, err
	}
	switch {
	case len(keyList) == 0:
		return nil, 0, invalid(op, "no keys")
	case len(keyList) > maxSetKeys:
		return nil, 0, invalid(op, strconv.Itoa(len(keyList))+" keys, more than the "+strconv.Itoa(maxSetKeys)+" one set may have: "+
			"take one lock that stands for the whole group (a coarser key), or take smaller sets one after another in the same order in every process")
	}
	set := make([]setKey, len(keyList))
	seen := make(map[string]int, len(keyList))
	for i, k := range keyList {
		nk, err := keys.NormalizeKey(k)
		if err != nil {
			return nil, 0, reop(op, err)
		}
		if j, dup := seen[nk]; dup {
			return nil, 0, invalid(op, "a key given twice: keys["+strconv.Itoa(j)+"] and keys["+strconv.Itoa(i)+"] are equal after NFC normalization; give each key once")
		}
		seen[nk] = i
		set[i] = setKey{key: nk, hash: pglease.HashKey(nk)}
	}
	o, err := m.parseOpts(op, opts)
	if err != nil {
		return nil, 0, err
	}
	if o.shared {
		return nil, 0, invalid(op, "Shared and WithLimit do not apply to sets: AcquireAll takes exclusive leases")
	}
	if err := checkTTL(op, o.ttl, m.cfg.LossMargin, !o.manual); err != nil {
		return nil, 0, err
	}
	if m.isClosing() {
		return nil, 0, closedErr(op)
	}
	return &acquireReq{
		key:       set[0].key,
		hash:      set[0].hash,
		ttl:       o.ttl,
		manual:    o.manual,
		try:       try,
		holdLimit: o.holdLimit,
		set:       &setReq{keys: set},
		reply:     make(chan acquireReply, 1),
		final:     make(chan acquireReply, 1),
	}, o.timeout, nil
}

// failSet ends each key's acquire telemetry of a failed set: one log
// record for the set, not one per key.
func failSet(req *acquireReq, err error) {
	acqs := make([]*obs.Acquisition, len(req.set.keys))
	for i, k := range req.set.keys {
		acqs[i] = k.acq
	}
	obs.FailedSet(acqs, err)
}

// startSetAcquire starts one pglease.acquire span per key of the set, each
// a child of the span in ctx.
func (m *Manager) startSetAcquire(ctx context.Context, req *acquireReq) {
	for i := range req.set.keys {
		k := &req.set.keys[i]
		_, k.acq = m.rec.StartAcquire(ctx, m.rec.KeyHashed(k.key, k.hash), obs.AcquireInfo{
			Kind: obs.KindLease, TTL: req.ttl, Try: req.try,
		})
	}
	req.acq = req.set.keys[0].acq
}

// setWaiters returns the set waiters that want ks's key.
func (ks *keyState) setWaiters() []*setWait {
	if ks.cont == nil {
		return nil
	}
	return ks.cont.sets
}

// inTurn reports whether a set waiter that wants ks's key has its turn:
// the key's own attempts and handoffs wait.
func (ks *keyState) inTurn() bool {
	return ks.cont != nil && ks.cont.turns > 0
}

// startSet takes a new set request: a try is answered at once or sent; a
// waiter joins its keys and is kicked.
func (st *loopState) startSet(req *acquireReq) {
	w := &setWait{req: req}
	st.sets[req] = w
	if req.try {
		// Never queued: callers here that hold or wait for one of its
		// keys come first, as for TryAcquire.
		for _, k := range req.set.keys {
			if ks := st.keys[k.key]; ks != nil && (ks.heldHere(req) || len(ks.queue) > 0 || ks.inTurn() || len(ks.setWaiters()) > 0) {
				st.answerSet(w, acquireReply{locked: true})
				return
			}
		}
		for _, k := range req.set.keys {
			k.acq.Queued(obs.QueueInfo{})
		}
		st.newSetAttempt(w)
		return
	}
	w.bo = newBackOff(st.m.cfg.Retry)
	st.waiting++
	for _, k := range req.set.keys {
		ks := st.keyFor(k.key, k.hash)
		c := st.contended(ks)
		c.sets = append(c.sets, w)
		st.byHash[ks.hash] = ks // notifications of its releases wake the set
		k.acq.Queued(obs.QueueInfo{HeldLocally: ks.heldHere(req), Coalesced: len(ks.queue) > 0})
	}
	st.sig().queued.signal(req.key)
	st.kickSet(w)
}

// kickSet starts an attempt for w unless one is pending or in flight, a
// retry is scheduled, or one of its keys is held or being released by
// this process (a local release kicks it).
func (st *loopState) kickSet(w *setWait) {
	if st.closing || w.done || w.attempt != nil || !w.retryAt.IsZero() {
		return
	}
	for _, k := range w.req.set.keys {
		if ks := st.keys[k.key]; ks != nil && (ks.holder != nil || ks.nShared > 0 || ks.releasing > 0) {
			return
		}
	}
	st.newSetAttempt(w)
}

// newSetAttempt queues an attempt for w, with a new lockId per key.
func (st *loopState) newSetAttempt(w *setWait) {
	w.woken, w.lapsed = false, false
	sa := &setAttempt{w: w, ttl: w.req.ttl, ids: make([]string, len(w.req.set.keys)), inTurn: w.turn}
	for i := range sa.ids {
		sa.ids[i] = keys.NewLockID()
	}
	w.attempt = sa
	st.setAcqs.add(sa)
}

// kickSets tries the set waiters that want ks's key once more: the key
// was (probably) just freed, or a release of it was notified.
func (st *loopState) kickSets(ks *keyState) {
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
func (st *loopState) passSets(ks *keyState) {
	for _, w := range ks.setWaiters() {
		if w.turn || w.lapsed {
			continue
		}
		if w.passes++; w.passes < setTurnAfter {
			continue
		}
		w.turn = true
		for _, k := range w.req.set.keys {
			if c := st.keys[k.key].cont; c != nil {
				c.turns++
			}
		}
		// A turn whose attempt cannot go out soon (a key held here for
		// long) lapses: the keys' other callers wait at most setTurnMax.
		w.turnGen++
		heap.Push(&st.retries, retryEntry{at: st.m.now().Add(setTurnMax), w: w, gen: w.turnGen, turn: true})
		if w.attempt == nil {
			st.clearSetRetry(w)
			st.kickSet(w)
		}
	}
}

// lapseTurn ends w's turn at setTurnMax unless its attempt is in flight
// (whose answer ends it).
func (st *loopState) lapseTurn(w *setWait) {
	if sa := w.attempt; sa == nil || !sa.inTurn {
		st.endTurnOf(w)
		w.lapsed = true
	}
}

// endTurn ends the turn of sa's waiter if sa was made during it (an
// attempt sent before the turn began does not end it): its keys' own
// attempts go on.
func (st *loopState) endTurn(sa *setAttempt) {
	if sa.inTurn {
		st.endTurnOf(sa.w)
	}
}

func (st *loopState) endTurnOf(w *setWait) {
	if !w.turn {
		return
	}
	w.turn, w.passes = false, 0
	w.turnGen++
	for _, k := range w.req.set.keys {
		if ks := st.keys[k.key]; ks != nil && ks.cont != nil {
			ks.cont.turns--
			st.kick(ks)
		}
	}
}

// scheduleSetRetry schedules w's next attempt after its jittered backoff,
// or at freeAt if that comes first (zero: none).
func (st *loopState) scheduleSetRetry(w *setWait, now, freeAt time.Time) {
	w.retryAt = now.Add(w.bo.NextBackOff())
	if !freeAt.IsZero() && freeAt.Before(w.retryAt) {
		w.retryAt = freeAt
	}
	w.retryGen++
	heap.Push(&st.retries, retryEntry{at: w.retryAt, w: w, gen: w.retryGen})
	st.sig().retrying.signal(w.req.key)
}

func (st *loopState) clearSetRetry(w *setWait) {
	if !w.retryAt.IsZero() {
		w.retryAt = time.Time{}
		w.retryGen++
	}
}

// answerSet answers w's caller with r and forgets w.
func (st *loopState) answerSet(w *setWait, r acquireReply) {
	w.req.answered = true
	w.req.reply <- r
	st.endSet(w)
}

// endSet forgets w: its keys no longer wait for it (their states may go).
func (st *loopState) endSet(w *setWait) {
	if w.done {
		return
	}
	w.done = true
	delete(st.sets, w.req)
	st.clearSetRetry(w)
	if w.req.try {
		return
	}
	st.waiting--
	turn := w.turn
	w.turn = false
	for _, k := range w.req.set.keys {
		ks := st.keys[k.key]
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
func (st *loopState) abandonSet(req *acquireReq) acquireReply {
	ans := acquireReply{abandoned: true}
	w := st.sets[req]
	if w == nil {
		return ans
	}
	ans.lastErr, ans.heldBy = w.lastErr, w.heldBy
	for _, k := range req.set.keys {
		if ks := st.keys[k.key]; ks != nil && ks.heldHere(req) {
			ans.heldHere = true
		}
	}
	st.endSet(w)
	return ans
}

// keepSet reports whether flush sends a pending set attempt: not once its
// caller left or was answered, nor during Close.
func (st *loopState) keepSet(sa *setAttempt) bool {
	if st.closing || sa.w.done {
		if sa.w.attempt == sa {
			sa.w.attempt = nil
		}
		return false
	}
	return true
}

// noteSet records one attempt on each key's telemetry of req.
func noteSet(req *acquireReq, db trace.SpanContext, o obs.AttemptOutcome, retryIn time.Duration) {
	for _, k := range req.set.keys {
		k.acq.Attempt(db, o, retryIn)
	}
}

// setsDone handles the answer to a batch of set attempts.
func (st *loopState) setsDone(d acquireDone, now time.Time) {
	off := 0
	for _, sa := range d.sets {
		n := len(sa.ids)
		var rs []store.AcquireResult
		if d.err == nil {
			rs = d.res[off : off+n]
		}
		off += n
		st.setDone(sa, d, rs, now)
	}
}

// setDone handles the answer (rs, nil when the round trip failed) to the
// set attempt sa.
func (st *loopState) setDone(sa *setAttempt, d acquireDone, rs []store.AcquireResult, now time.Time) {
	w, req := sa.w, sa.w.req
	if w.attempt == sa {
		w.attempt = nil
	}
	// release sends the release of every lockId the attempt granted or
	// may have granted; the keys' attempts do not wait for them.
	release := func() {
		for j, k := range req.set.keys {
			if !mayHaveGranted(d.err) && (d.err != nil || !rs[j].OK) {
				continue
			}
			it := releaseItem{lockID: sa.ids[j], key: k.key, ttl: sa.ttl, sc: sa.db}
			if !st.closing {
				it.ks, it.unblocked = st.keyFor(k.key, k.hash), true
			}
			st.releases.add(it)
		}
	}
	if d.err == nil {
		w.lastErr = nil // it reached the database (waitErr)
	}
	switch {
	case w.done: // the caller left, or Close answered it
		release()
		return
	case st.closing:
		release()
		st.answerSet(w, acquireReply{err: closedErr("manager.AcquireAll")})
		return
	case d.err != nil:
		if mayHaveGranted(d.err) {
			release()
		}
		w.lastErr = d.err
		noteSet(req, d.db, obs.AttemptFailed, 0)
		if req.try || !retryable(d.err) {
			st.answerSet(w, acquireReply{err: d.err})
			return
		}
		for _, k := range req.set.keys {
			st.wantWaiter(st.keys[k.key]) // free or not is unknown (attemptFailed)
		}
		st.setRetry(sa, now, time.Time{})
		return
	}
	ok := true
	for j := range rs {
		if rs[j].Err != nil { // fence overflow: no retry fixes it
			release()
			noteSet(req, d.db, obs.AttemptFailed, 0)
			st.answerSet(w, acquireReply{err: rs[j].Err})
			return
		}
		ok = ok && rs[j].OK
	}
	lease := heartbeat.Lease{TTL: sa.ttl, Start: d.start, Margin: st.margin(sa.ttl)}
	conflict := false
	for _, k := range req.set.keys {
		if ks := st.keys[k.key]; ks != nil && (ks.holder != nil || ks.nShared > 0) {
			// A caller here got a key meanwhile (the server gave it the
			// set only after that holder's row was gone: it finds out at
			// its next extend). One holder here at a time: the set goes back.
			conflict = true
		}
	}
	switch {
	case !ok || conflict:
		if conflict {
			release()
		}
		st.setRefused(sa, d, rs, now)
		return
	case !now.Before(lease.TrustedUntil()):
		release()
		w.lastErr = pgerr.New(pglease.CodeNetworkTimeout, "manager.AcquireAll", "grant arrived after its trust window", nil)
		noteSet(req, d.db, obs.AttemptFailed, 0)
		if req.try {
			st.answerSet(w, acquireReply{err: w.lastErr})
			return
		}
		st.setRetry(sa, now, time.Time{})
		return
	}
	kss := make([]*keyState, len(req.set.keys))
	for j, k := range req.set.keys {
		kss[j] = st.keyFor(k.key, k.hash)
		if !st.noteFence(kss[j], rs[j].Fence) {
			release()
			noteSet(req, d.db, obs.AttemptFailed, 0)
			st.answerSet(w, acquireReply{err: fenceRegression("manager.AcquireAll")})
			return
		}
	}
	locks := make([]*Lock, len(req.set.keys))
	for j, k := range req.set.keys {
		k.acq.Attempt(d.db, obs.AttemptGranted, 0)
		locks[j] = st.hold(kss[j], req, k.acq, sa.ids[j], sa.ttl, rs[j], lease)
	}
	for j, k := range req.set.keys {
		k.acq.Granted(rs[j].Fence) // before the reply: Lost/Release may follow at once
	}
	st.answerSet(w, acquireReply{locks: locks})
	for _, ks := range kss {
		st.granted(ks)
	}
	for _, lk := range locks {
		st.checkRevokedEarly(lk.h) // revoke.go
	}
}

// setRefused handles a set attempt that found a key held: a try is
// answered; a waiter waits for a release of its keys (it holds their
// waiter locks) or its retry, whichever comes first.
func (st *loopState) setRefused(sa *setAttempt, d acquireDone, rs []store.AcquireResult, now time.Time) {
	w, req := sa.w, sa.w.req
	noteSetWaiting(req, rs)
	if req.try {
		noteSet(req, d.db, obs.AttemptContended, 0)
		st.answerSet(w, acquireReply{locked: true})
		return
	}
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
	for _, k := range req.set.keys {
		st.wantWaiter(st.keys[k.key])
	}
	noteSet(req, d.db, obs.AttemptContended, st.setRetry(sa, now, freeAt))
}

// setRetry schedules the next attempt of sa's waiter after sa failed or
// was refused: at once when it has its turn and sa was sent before it
// began (the turn's own attempt is still to come), or when a release was
// notified meanwhile; otherwise after its backoff or at freeAt (see
// scheduleSetRetry), ending the turn sa served. It returns the delay.
func (st *loopState) setRetry(sa *setAttempt, now, freeAt time.Time) time.Duration {
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

// sendSets starts a batch of set attempts (loop side of sendSetAcquire).
// A batch of one set is a child of its first key's acquire span; every
// round trip links to the acquire spans of the keys it carries.
func (st *loopState) sendSets(fl *flight, batch []*setAttempt) {
	var parent trace.SpanContext
	if len(batch) == 1 {
		parent = batch[0].w.req.set.keys[0].acq.SpanContext()
	}
	var served []trace.SpanContext
	reqs := make([][]store.AcquireRequest, len(batch))
	for i, sa := range batch {
		reqs[i] = make([]store.AcquireRequest, len(sa.ids))
		for j, k := range sa.w.req.set.keys {
			reqs[i][j] = store.AcquireRequest{Key: k.key, TTL: sa.ttl, LockID: sa.ids[j], LockDelay: sa.w.req.delay}
			if sc := k.acq.SpanContext(); sc.IsValid() && len(served) < obs.MaxLinks {
				served = append(served, sc)
			}
		}
	}
	st.m.spawn(func() { st.m.sendSetAcquire(fl, batch, reqs, parent, served) })
}

// sendSetAcquire runs on a DB worker: one AcquireSets for the batch.
func (m *Manager) sendSetAcquire(fl *flight, batch []*setAttempt, reqs [][]store.AcquireRequest, parent trace.SpanContext, served []trace.SpanContext) {
	n := 0
	for _, r := range reqs {
		n += len(r)
	}
	// Not cancelled by Close, as sendAcquire.
	ctx, cancel := context.WithTimeoutCause(context.Background(), m.cfg.StatementTimeout, pgerr.ErrStatementTimeout)
	defer cancel()
	m.beforeBatch(kindSets, n)
	ctx, db := m.rec.StartDB(ctx, obs.OpAcquireSets, n, parent, served...)
	start := m.now()
	res, err := m.store.AcquireSets(ctx, reqs)
	var flat []store.AcquireResult
	ok := 0
	if err == nil {
		flat = make([]store.AcquireResult, 0, n)
		for _, set := range res {
			flat = append(flat, set...)
			for _, r := range set {
				if r.OK {
					ok++
				}
			}
		}
	}
	db.End(ok, err)
	sc := db.SpanContext()
	for _, sa := range batch {
		sa.db = sc
	}
	m.acquireDoneCh <- acquireDone{fl: fl, sets: batch, start: start, res: flat, err: err, db: sc}
}
