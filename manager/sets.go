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
	attempt  *attempt // pending or in flight (its kind: setKind)
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
func setOf(a *attempt) *setKind { return a.kind.(*setKind) }

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
	// In the fair queue a set takes its places at once, even while a key
	// is held here: the order, not this process, decides its turn.
	for _, k := range w.req.set.keys {
		if st.fair() && w.qids == nil {
			break
		}
		if ks := st.keys[k.key]; ks != nil && (ks.held() || ks.releasing > 0) {
			return
		}
	}
	st.newSetAttempt(w)
}

// newSetAttempt queues an attempt for w, with a new lockId per key.
func (st *loopState) newSetAttempt(w *setWait) {
	w.woken, w.lapsed = false, false
	sk := &setKind{w: w, ids: make([]string, len(w.req.set.keys)), inTurn: w.turn}
	if st.fair() && !w.req.try {
		st.setTickets(w) // fair.go
		sk.ids, sk.fair, sk.qch = w.qids, true, st.m.qch
	}
	for i := range sk.ids {
		if sk.ids[i] == "" {
			sk.ids[i] = keys.NewLockID()
		}
	}
	a := &attempt{lockID: sk.ids[0], ttl: w.req.ttl, delayMs: w.req.delayMs(), kind: sk}
	if w.req.try {
		a.try = w.req // try mode: answered at once
	}
	w.attempt = a
	st.setAcqs.add(a)
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
	if a := w.attempt; a == nil || !setOf(a).inTurn {
		st.endTurnOf(w)
		w.lapsed = true
	}
}

// endTurn ends the turn of the waiter of sk if sk was made during it
// (an attempt sent before the turn began does not end it): its keys' own
// attempts go on.
func (st *loopState) endTurn(sk *setKind) {
	if sk.inTurn {
		st.endTurnOf(sk.w)
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
	st.leaveSetTickets(w) // fair.go
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

// noteSet records one attempt on each key's telemetry of req.
func noteSet(req *acquireReq, db trace.SpanContext, o obs.AttemptOutcome, retryIn time.Duration) {
	for _, k := range req.set.keys {
		k.acq.Attempt(db, o, retryIn)
	}
}

func (sk *setKind) lane(st *loopState) *lane[*attempt] { return &st.setAcqs }

func (sk *setKind) statement() batchKind { return kindSets }

// exec sends one AcquireSets for the batch; its results, flattened, are in
// the order of the sets and of each set's keys.
func (sk *setKind) exec(ctx context.Context, s kernelStore, batch []*attempt) ([]store.AcquireResult, error) {
	if sk.fair {
		return fairSetExec(ctx, s, batch) // fair.go
	}
	n := 0
	reqs := make([][]store.AcquireRequest, len(batch))
	for i, a := range batch {
		k := setOf(a)
		reqs[i] = make([]store.AcquireRequest, len(k.ids))
		for j, key := range k.w.req.set.keys {
			reqs[i][j] = store.AcquireRequest{Key: key.key, TTL: a.ttl, LockID: k.ids[j], LockDelay: k.w.req.delay}
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

func (sk *setKind) holds(a *attempt) int { return len(sk.ids) }

func (sk *setKind) hold(a *attempt, j int) (lockID, key, hash string) {
	k := sk.w.req.set.keys[j]
	return sk.ids[j], k.key, k.hash
}

// unit: the set is one caller's, all of it or nothing.
func (sk *setKind) unit(a *attempt) int { return len(sk.ids) }

// fenceOK: each key's fence strictly above every fence seen for it.
func (sk *setKind) fenceOK(st *loopState, a *attempt, lo, hi int, rs []store.AcquireResult) bool {
	for j, k := range sk.w.req.set.keys {
		if !st.noteFence(st.keyFor(k.key, k.hash), rs[j].Fence) {
			return false
		}
	}
	return true
}

// heldHere: any of its keys held here (a caller here got it while the
// set's attempt was in flight).
func (sk *setKind) heldHere(st *loopState, a *attempt, to *acquireReq) bool {
	for _, k := range sk.w.req.set.keys {
		if ks := st.keys[k.key]; ks != nil && ks.held() {
			return true
		}
	}
	return false
}

// grant makes a lock of each key and answers the set's caller.
func (sk *setKind) grant(st *loopState, a *attempt, to *acquireReq, lo, hi int, rs []store.AcquireResult, lease heartbeat.Lease) {
	req := sk.w.req
	kss := make([]*keyState, len(req.set.keys))
	locks := make([]*Lock, len(req.set.keys))
	st.setServed(sk) // fair.go
	for j, k := range req.set.keys {
		kss[j] = st.keyFor(k.key, k.hash)
		locks[j] = st.hold(kss[j], req, k.acq, sk.ids[j], a.ttl, rs[j], lease)
	}
	for j, k := range req.set.keys {
		k.acq.Granted(rs[j].Fence) // before the reply: Lost/Release may follow at once
	}
	st.answerSet(sk.w, acquireReply{locks: locks})
	for _, ks := range kss {
		st.granted(ks)
	}
	for _, lk := range locks {
		st.checkRevokedEarly(lk.h) // revoke.go
	}
}

func (sk *setKind) waiters(st *loopState, a *attempt) waiters { return sk.w }

func (sk *setKind) serves(a *attempt, req *acquireReq) bool { return req == sk.w.req }

func (sk *setKind) refusal(st *loopState, a *attempt, r store.AcquireResult, now time.Time) time.Time {
	return takeoverAt(r, now) // (its waiter computes its own: setRefused)
}

// again: a set's attempt is not in a key's attempt chain, and never
// hedged.
func (sk *setKind) again(a *attempt, id string) attemptKind { return sk }

// landed: in the fair queue, the tickets of a set whose caller left
// meanwhile leave again (its attempt may have queued them after their
// leave), and a refusal's send time is recorded (fair.go).
func (sk *setKind) landed(st *loopState, a *attempt, d acquireDone, rs []store.AcquireResult) {
	if sk.fair {
		st.fairSetLanded(a, sk, d, rs)
	}
}

// owns: nothing; a set's attempt is never stale, and after an unknown
// outcome a fair set takes new tickets (fairSetLanded: the next
// QueueWait of the old ones would answer "granted" for a commit that may
// not survive), so its lockIds go back.
func (sk *setKind) owns(a *attempt, j int, unknown bool) bool { return false }

// keep: not once its caller left or was answered, nor during Close.
func (sk *setKind) keep(st *loopState, a *attempt) bool {
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
func (sk *setKind) served(a *attempt, add func(*obs.Acquisition) bool) bool {
	for _, k := range sk.w.req.set.keys {
		if !add(k.acq) {
			return false
		}
	}
	return true
}

func (sk *setKind) op(try bool) string { return "manager.AcquireAll" }

// A set waiter is the waiters of its set's attempts (acquire pipeline).

func (w *setWait) land(st *loopState, a *attempt) {
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

func (w *setWait) closed(st *loopState, a *attempt) {
	st.answerSet(w, acquireReply{err: closedErr("manager.AcquireAll")})
}

func (w *setWait) failed(st *loopState, a *attempt, err error, now time.Time, db trace.SpanContext) {
	w.lastErr = err
	noteSet(w.req, db, obs.AttemptFailed, 0)
	if !retryable(err) {
		st.answerSet(w, acquireReply{err: err})
		return
	}
	for _, k := range w.req.set.keys {
		st.wantWaiter(st.keys[k.key]) // free or not is unknown (attemptFailed)
	}
	st.setRetry(a, now, time.Time{})
}

func (w *setWait) fatal(st *loopState, a *attempt, err error, db trace.SpanContext) {
	noteSet(w.req, db, obs.AttemptFailed, 0)
	st.answerSet(w, acquireReply{err: err})
}

func (w *setWait) refused(st *loopState, a *attempt, rs []store.AcquireResult, r *store.AcquireResult, now time.Time, db trace.SpanContext) {
	st.setRefused(a, rs, now, db)
}

func (w *setWait) taker(a *attempt, lo, hi int) *acquireReq { return w.req }

func (w *setWait) takenHere(st *loopState, a *attempt, to *acquireReq) bool {
	return a.kind.heldHere(st, a, to)
}

// refuse: a fence regression fails the set; a late answer is retried.
func (w *setWait) refuse(st *loopState, a *attempt, to *acquireReq, err error, late bool, now time.Time, db trace.SpanContext) {
	noteSet(w.req, db, obs.AttemptFailed, 0)
	if !late {
		st.answerSet(w, acquireReply{err: err})
		return
	}
	w.lastErr = err
	st.setRetry(a, now, time.Time{})
}

func (w *setWait) unserved(st *loopState) {}

func (w *setWait) settled(st *loopState, a *attempt, granted bool, db trace.SpanContext) {}

// setRefused handles a set attempt a that found a key held: its waiter
// waits for a release of its keys (it holds their waiter locks) or its
// retry, whichever comes first.
func (st *loopState) setRefused(a *attempt, rs []store.AcquireResult, now time.Time, db trace.SpanContext) {
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
	for j, k := range req.set.keys {
		if !setOf(a).fair || foreignHolder(rs[j]) { // a queued set is told its turn on its own channel
			st.wantWaiter(st.keys[k.key])
		}
	}
	noteSet(req, db, obs.AttemptContended, st.setRetry(a, now, freeAt))
}

// setRetry schedules the next attempt of sa's waiter after sa failed or
// was refused: at once when it has its turn and sa was sent before it
// began (the turn's own attempt is still to come), or when a release was
// notified meanwhile; otherwise after its backoff or at freeAt (see
// scheduleSetRetry), ending the turn sa served. It returns the delay.
func (st *loopState) setRetry(a *attempt, now, freeAt time.Time) time.Duration {
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
