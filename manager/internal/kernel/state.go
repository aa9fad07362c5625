package kernel

import (
	"container/heap"
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// maxFenceMemory caps how many keys' highest fences the loop remembers for
// the fence-regression check (fence monotonicity); beyond it, entries of idle keys are
// dropped.
const maxFenceMemory = 100_000

// LoopState is every map, queue and counter the loop owns. It is touched
// only by (*Kernel).run and the methods it calls: no mutex. Every field
// is owned by run, as is everything it reaches (KeyState, holding,
// attempt, the lanes' items), except where a comment says otherwise: the
// loss watch, shared with its timer goroutine under its own mutex.
type LoopState struct {
	m *Kernel // immutable

	keys    map[string]*KeyState     // owned by run: keys with waiters, an attempt, a holder or a release in flight
	byHash  map[string]*KeyState     // owned by run: pglease.HashKey(key) → key with waiters, for notifications (queued/unqueued)
	held    map[*holding]struct{}    // owned by run: locks this process holds
	kept    map[*holding]struct{}    // owned by run: lost locks whose row may still be on the server: released by Lock.Release or Close (timely loss signal)
	Fences  map[string]pglease.Fence // owned by run: highest fence seen per key not in keys (fence monotonicity; KeyState.fence for the others)
	retries retryHeap                // owned by run: scheduled retries, earliest first
	hbNext  time.Time                // owned by run: next heartbeat event (zero: none)
	// loss holds the loss deadlines of the held leases (losswatch.go):
	// written by run (start, stop), read by its timer goroutine, which
	// ends the leases whose deadline passed; guarded by loss.mu.
	loss *lossWatch

	// Owned by run: the batched statements, one lane per kind (lane.go),
	// and the batches in flight of each kind against its cap. A handoff
	// batch takes an acquire and a release slot. The DB worker of a batch
	// reads only what it was handed (its flight pointer and items).
	acquires                                lane[*Attempt]
	sharedAcqs                              lane[*Attempt] // shared attempts (shared.go)
	setAcqs                                 lane[*Attempt] // set attempts (sets.go)
	fairAcqs                                lane[*Attempt] // fair-queue attempts (fair.go)
	releases                                lane[releaseItem]
	extends                                 lane[*holding]
	handOffs                                lane[handOffItem]
	lanes                                   []batchLane // in flush order
	acquireSlots, releaseSlots, extendSlots slots
	flights                                 map[*flight]struct{} // the batches in flight (flight.go)
	work                                    []dbWork             // batches launched, to start on DB workers (effects.go)

	waiting int // owned by run: callers in all keys' queues and set waiters (telemetry: queue depth "waiters")

	sets map[*AcquireReq]*setWait // owned by run: AcquireAll and TryAcquireAll calls not answered yet (sets.go)

	closing bool         // owned by run: Close began (beginDrain)
	lis     listenerLink // owned by run: the listener's mailbox and lifetime (waiters.go, listener.go)
	// lisActive: the listener was told something here waits for a notice
	// (markListener); lisIdleAt: when it may be told nothing does (zero:
	// not yet due).
	lisActive bool
	lisIdleAt time.Time

	closeErr error     // owned by run: first release failure during the drain, handed to Close through Manager.closeErr
	closeBy  time.Time // owned by run: when the drain gives up retrying releases (beginDrain + CloseTimeout)

	relRetries []releaseItem // owned by run: releases with an unknown outcome, to send again (relretry.go)

	// revokedEarly: owned by run: revoke notifications that matched no
	// lock held here, by lockId hash, until when they are remembered
	// (revoke.go); nil while there are none.
	revokedEarly map[string]time.Time
	watch        watchLoop // owned by run: the watched keys (watch.go)

	shed      overload // owned by run: holding back acquires under overload (overload.go)
	busyConns int      // owned by run: batches in flight other than extends, stuck ones included (lane.go: room)

	// foreign: owned by run: keys found held by a foreign (non-pglease)
	// holder lately, by key hash, shared with them in time
	// (foreign.go); nil in pure pglease fleets.
	foreign map[string]*foreignKey

	fq fairLoop // owned by run: the fair queue's tickets (fair.go)
}

// KeyState is one key's FIFO queue and attempt loop. Owned by run.
// (Field sizes and order keep it at 160 bytes: one is kept per held
// lock. What only some keys need is in cont.)
type KeyState struct {
	Key, hash string
	queue     []*AcquireReq  // FIFO; the head is served by the next grant; nil when empty
	attempt   *Attempt       // the one attempt pending or in flight
	holder    *holding       // this process's holder
	releasing int32          // releases in flight for this key's lockIds; attempts wait for them
	stale     int32          // superseded attempts of this key still in flight (flight.go)
	retryAt   time.Time      // scheduled retry (zero: none)
	retryGen  uint64         // invalidates stale retryHeap entries
	cont      *keyContention // made on the key's first failed or "locked" attempt (most keys have none)
	lastErr   error          // failure of the key's last attempt, or of a later release or extend of it, until an attempt or extend reaches the database (waitErr)
	chains    uint64         // numbers the key's attempt chains (flight.go)
	Fence     pglease.Fence  // highest fence seen for the key, if hasFence (fence monotonicity; st.fences keeps it when ks goes)
	HasFence  bool
	woken     bool  // a release notification came while an attempt was in flight
	waitReg   bool  // its waiter lock is asked for (waiters.go)
	handOffs  uint8 // local handoffs of the key in a row (handoff.go)
	nShared   int32 // shared holds (readers, permits) this process holds (shared.go); by limit in cont.sharedLims
}

// keyContention is what a contended key keeps between attempts, and
// what only some keys need: the set waiters that want it, and the limit
// of its shared holds here.
type keyContention struct {
	bo backoff.BackOff // the key's backoff (not thread-safe; loop-owned)
	// heldBy is the holder identity the last "locked" answer named ("":
	// none known), for the error of a wait that ends without the lock
	// (heldBy).
	heldBy string
	// sets are the set waiters (AcquireAll) that want the key; turns how
	// many of them have their turn, during which the key's own attempts
	// and handoffs wait (sets.go).
	sets  []*setWait
	turns int32
	// sharedLims counts this process's shared holds of the key by limit
	// (0: readers); holders may disagree on a semaphore's limit while it
	// is being changed (shared.go).
	sharedLims map[int32]int32
}

// heldBy returns the holder of ks's key as its last "locked" answer
// named it ("" when unknown): the identity the holder's store
// recorded, e.g. "worker[4242]@web-1". Never a key or lockId.
func (ks *KeyState) heldBy() string {
	if ks.cont == nil {
		return ""
	}
	return ks.cont.heldBy
}

// holding is a held lock, as the loop sees it. Owned by run, except the
// loss-watch fields (guarded by st.loss.mu) and limitTimer's callback.
type holding struct {
	lock  *Hold // a shared hold (lock.shared) is counted in ks.nShared, an exclusive one is ks.holder
	limit int32 // a shared hold's limit (0: a reader), counted in ks.cont.sharedLims
	ks    *KeyState
	acq   *obs.Acquisition // the grant's telemetry: Extended, Lost, StartRelease
	lease heldLease        // last successful attempt; Pending/NotBefore/Manual
	// unknownStart is when the latest extend whose outcome is unknown was
	// sent (zero: none since the last success): it may have run on the
	// server, which then keeps the row until TTL after it (keptUntil).
	unknownStart time.Time
	// lossAt is lease.TrustedUntil() in st.loss, which ends the lock at
	// that time independently of the loop; lossIdx is the holding's
	// position in st.loss's heap (-1: not in it), lossFired tells that
	// the deadline fired. All three guarded by st.loss.mu.
	lossAt    int64
	lossIdx   int32
	lossFired bool
	// limitTimer fires at the hold limit (WithHoldLimit; nil without
	// one): its callback, on a timer goroutine, ends the lock's context
	// with the hold-limit cause and nudges the loop (lossCh), which then
	// stops extending the lease (pastLimit). Set and stopped by run.
	limitTimer *time.Timer
	// ext holds the Lock.Extend callers (extend.go); nil while there are
	// none, as for most locks.
	ext *extWaiters
}

// extWaiters are a holding's Lock.Extend callers: want wait for the next
// extend sent, sent for the one in flight. Answered by answerExtends, or
// by dropHolding when the lock ends first.
type extWaiters struct {
	want, sent []chan error
}

// retryEntry is a scheduled retry of a key's attempt (ks), or of a set
// waiter's (w, ks nil), or the end of a set waiter's turn (turn).
type retryEntry struct {
	at   time.Time
	ks   *KeyState
	w    *setWait
	gen  uint64
	turn bool
}

// stale reports whether e's retry was cancelled or superseded.
func (e retryEntry) stale() bool {
	switch {
	case e.turn:
		return e.gen != e.w.turnGen || !e.w.turn || e.w.done
	case e.w != nil:
		return e.gen != e.w.retryGen || e.w.retryAt.IsZero()
	}
	return e.gen != e.ks.retryGen || e.ks.retryAt.IsZero()
}

type retryHeap []retryEntry

func (h retryHeap) Len() int           { return len(h) }
func (h retryHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h retryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *retryHeap) Push(x any)        { *h = append(*h, x.(retryEntry)) }
func (h *retryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newLoopState(m *Kernel) *LoopState {
	st := &LoopState{
		m:            m,
		keys:         make(map[string]*KeyState),
		byHash:       make(map[string]*KeyState),
		held:         make(map[*holding]struct{}),
		kept:         make(map[*holding]struct{}),
		flights:      make(map[*flight]struct{}),
		sets:         make(map[*AcquireReq]*setWait),
		Fences:       make(map[string]pglease.Fence),
		loss:         newLossWatch((*Hold).lossTimerFired),
		acquireSlots: slots{limit: m.AcqLimit},
		releaseSlots: slots{limit: m.relLimit},
		extendSlots:  slots{limit: m.extLimit},
	}
	st.acquires = lane[*Attempt]{batchSpec: batchSpec{KindAcquire, []*slots{&st.acquireSlots}},
		maxBatch: m.cfg.MaxBatch, adaptive: true, keep: st.keepAttempt, send: st.sendAttempts}
	st.sharedAcqs = lane[*Attempt]{batchSpec: batchSpec{KindShared, []*slots{&st.acquireSlots}},
		maxBatch: max(1, m.cfg.MaxBatch/maxCoalesce), adaptive: true, keep: st.keepAttempt, send: st.sendAttempts}
	st.setAcqs = lane[*Attempt]{batchSpec: batchSpec{KindSets, []*slots{&st.acquireSlots}},
		maxBatch: max(1, m.cfg.MaxBatch/MaxSetKeys), keep: st.keepAttempt, send: st.sendAttempts}
	st.fairAcqs = lane[*Attempt]{batchSpec: batchSpec{KindAcquire, []*slots{&st.acquireSlots}},
		maxBatch: max(1, m.cfg.MaxBatch/maxFairItems), adaptive: true, keep: st.keepAttempt, send: st.sendAttempts}
	st.releases = lane[releaseItem]{batchSpec: batchSpec{KindRelease, []*slots{&st.releaseSlots}},
		maxBatch: m.cfg.MaxBatch, adaptive: true, drains: true, send: st.sendReleases}
	st.extends = lane[*holding]{batchSpec: batchSpec{KindExtend, []*slots{&st.extendSlots}},
		maxBatch: m.ExtBatch, keep: st.isHeld, keepLazily: true, send: st.sendExtends}
	st.handOffs = lane[handOffItem]{batchSpec: batchSpec{KindHandOff, []*slots{&st.acquireSlots, &st.releaseSlots}},
		maxBatch: m.cfg.MaxBatch, keep: st.keepHandOff, send: st.sendHandOffs}
	st.loss.now = m.Now
	st.lanes = []batchLane{&st.handOffs, &st.acquires, &st.fairAcqs, &st.sharedAcqs, &st.setAcqs, &st.releases, &st.extends}
	return st
}

// keyFor returns the state of key, creating it.
func (st *LoopState) keyFor(key, hash string) *KeyState {
	ks := st.keys[key]
	if ks == nil {
		ks = &KeyState{Key: key, hash: hash} // cont is made on first contention
		if f, ok := st.Fences[key]; ok {
			ks.Fence, ks.HasFence = f, true
			delete(st.Fences, key)
		}
		st.keys[key] = ks
	}
	return ks
}

// queued adds ks to byHash when its queue got its first waiter:
// notifications only matter to keys with waiters (in the queue or set
// waiters), and a held key without waiters (most of them) then costs no
// byHash entry.
func (st *LoopState) queued(ks *KeyState) {
	if len(ks.queue) == 1 {
		st.byHash[ks.hash] = ks
	}
}

// unqueued drops ks from byHash, its queue's backing array and its
// waiter registration, when its queue is empty (and no set waits for
// it): nobody here waits for the key any more (its last waiter was
// granted it, or left). A registration kept while the key is held here
// made the holder's own release notify (its listener held the waiter
// lock) and read that notification back.
func (st *LoopState) unqueued(ks *KeyState) {
	if len(ks.queue) > 0 {
		return
	}
	ks.queue = nil
	if len(ks.setWaiters()) == 0 {
		st.dropWaiter(ks)
		if st.byHash[ks.hash] == ks {
			delete(st.byHash, ks.hash)
		}
	}
}

// popWaiter removes and returns the head of ks's queue. The vacated slot is
// cleared: the backing array outlives the pop (it stays with ks while the
// key is held), and would otherwise keep the request alive.
func (st *LoopState) popWaiter(ks *KeyState) *AcquireReq {
	req := ks.queue[0]
	ks.queue[0] = nil
	ks.queue = ks.queue[1:]
	st.waiting--
	st.unqueued(ks)
	return req
}

// gc forgets ks when nothing refers to it any more.
func (st *LoopState) gc(ks *KeyState) {
	if !ks.idle() {
		return
	}
	st.clearRetry(ks)
	st.dropWaiter(ks)
	if st.keys[ks.Key] == ks {
		delete(st.keys, ks.Key)
		if ks.HasFence {
			st.rememberFence(ks.Key, ks.Fence)
		}
	}
	if st.byHash[ks.hash] == ks {
		delete(st.byHash, ks.hash)
	}
}

// kick starts an attempt for ks if it has waiters and nothing stands in
// the way: no attempt in flight, no local exclusive holder, no release of
// its lockIds in flight, no retry scheduled, no set waiter's turn
// (sets.go), and for a shared head, no local shared hold it cannot join
// (shared.go: permits for a reader, readers for a permit, or as many
// permits as its semaphore allows).
func (st *LoopState) kick(ks *KeyState) {
	if st.closing || len(ks.queue) == 0 || ks.inTurn() {
		return
	}
	head := ks.queue[0]
	// In fair mode an exclusive waiter takes its place in the key's queue
	// at once (fair.go): even while a caller here holds the key, or a
	// retry is scheduled.
	fair := st.fair()
	newcomer := fair && st.unticketed(ks)
	if !ks.retryAt.IsZero() && !newcomer {
		return
	}
	if ks.busy() && !(fair && ks.attempt == nil && ks.releasing == 0) {
		return
	}
	if !fair && head.Shared && ks.heldHere(head) {
		return // a local release kicks the key (in fair mode the server decides, in the queue's order)
	}
	if st.foreignWait(ks) {
		return // the key is left to foreign pollers for a while (foreign.go)
	}
	ks.woken = false
	ks.chains++
	if fair {
		st.clearRetry(ks)
		a := st.fairAttempt(ks, ks.chains) // fair.go
		ks.attempt = a
		a.Kind.lane(st).add(a)
		return
	}
	a := newAttempt(ks, head, ks.chains)
	ks.attempt = a
	if head.Shared {
		st.shareAttempt(a, head) // shared.go
	}
	a.Kind.lane(st).add(a)
}

// forceKick cancels a scheduled retry and kicks: the key was (probably)
// just freed. The set waiters that want the key try too (sets.go).
func (st *LoopState) forceKick(ks *KeyState) {
	st.clearRetry(ks)
	st.kick(ks)
	st.kickSets(ks)
}

// scheduleRetry schedules ks's next attempt after its jittered backoff,
// or at freeAt if that comes first (zero: none): when the holder's lease,
// as the last "locked" answer saw it, can be taken over (takeoverAt).
// Polling with backoff goes on either way: the holder may extend.
func (st *LoopState) scheduleRetry(ks *KeyState, now, freeAt time.Time) {
	ks.retryAt = now.Add(st.contended(ks).bo.NextBackOff())
	if !freeAt.IsZero() && freeAt.Before(ks.retryAt) {
		ks.retryAt = freeAt
	}
	ks.retryGen++
	heap.Push(&st.retries, retryEntry{at: ks.retryAt, ks: ks, gen: ks.retryGen})
	st.sig().Retrying.signal(ks.Key)
}

// contended returns ks's contention state, making it on first use: most
// keys are never contended and keep none.
func (st *LoopState) contended(ks *KeyState) *keyContention {
	if ks.cont == nil {
		ks.cont = &keyContention{bo: newBackOff(st.m.cfg.Retry)}
	}
	return ks.cont
}

// takeoverAt is when a key found held can be taken over on this process's
// monotonic clock, if its holder neither extends nor releases it: r is
// the "locked" answer, received by now. The server grants the key from
// the holder's expires_at + 1 s (keys.TimeTolerance) on its own clock,
// r.RetryAfter after its clock reading during the attempt, which came
// before now: now + RetryAfter is not early, and late by at most the
// round trip. 1 ms + 500 ppm of the wait cover the clocks' rates. Zero
// when the answer did not say (RetryAfter 0).
func takeoverAt(r store.AcquireResult, now time.Time) time.Time {
	if r.RetryAfter <= 0 {
		return time.Time{}
	}
	return now.Add(r.RetryAfter + r.RetryAfter/2000 + time.Millisecond)
}

func (st *LoopState) clearRetry(ks *KeyState) {
	if !ks.retryAt.IsZero() {
		ks.retryAt = time.Time{}
		ks.retryGen++
	}
}

// noteEvent makes sure the heartbeat runs at t.
func (st *LoopState) noteEvent(t time.Time) {
	if st.hbNext.IsZero() || t.Before(st.hbNext) {
		st.hbNext = t
	}
}

// nextWake returns when the loop's one timer must fire (zero: never).
func (st *LoopState) nextWake() time.Time {
	if st.closing {
		return st.nextReleaseRetry()
	}
	next := st.hbNext
	if r := st.nextReleaseRetry(); !r.IsZero() && (next.IsZero() || r.Before(next)) {
		next = r
	}
	if s := st.nextStuck(); !s.IsZero() && (next.IsZero() || s.Before(next)) {
		next = s
	}
	if s := st.nextWatchWake(); !s.IsZero() && (next.IsZero() || s.Before(next)) {
		next = s
	}
	if s := st.nextShed(); !s.IsZero() && (next.IsZero() || s.Before(next)) {
		next = s
	}
	if s := st.nextRefresh(); !s.IsZero() && (next.IsZero() || s.Before(next)) {
		next = s
	}
	if s := st.nextListenerIdle(); !s.IsZero() && (next.IsZero() || s.Before(next)) {
		next = s
	}
	for len(st.retries) > 0 {
		e := st.retries[0]
		if e.stale() {
			heap.Pop(&st.retries)
			continue
		}
		if next.IsZero() || e.at.Before(next) {
			next = e.at
		}
		break
	}
	return next
}

func (st *LoopState) margin(ttl time.Duration) time.Duration {
	if st.m.cfg.LossMargin > 0 {
		return st.m.cfg.LossMargin
	}
	return DefaultMargin(ttl)
}

// dropHolding forgets h and ends its lock's context with cause (the first
// cause wins: a lock already lost stays lost).
func (st *LoopState) dropHolding(h *holding, cause error) {
	if _, ok := st.held[h]; ok && h.lock.Shared {
		h.ks.dropShared(h.limit)
	}
	delete(st.held, h)
	st.loss.stop(h)
	if h.limitTimer != nil {
		h.limitTimer.Stop()
	}
	h.lock.cancel(cause)
	if h.ks.holder == h {
		h.ks.holder = nil
	}
	if h.ext != nil { // the error is built only for someone waiting
		h.answerExtendWaiters(EndedExtend(h.lock.Err()))
	}
}

// releaseHolding drops h and queues the release of its lockId; reply, if
// set, gets the outcome. parent is the releasing caller's span (invalid
// when the loop releases on its own): the pglease.release span's parent.
func (st *LoopState) releaseHolding(h *holding, reply chan error, parent trace.SpanContext) {
	h.lock.checkTrust(st.m.Now()) // a lock past its trust window was lost, even if its timer has not fired yet (after a pause)
	st.dropHolding(h, releasedCause)
	// A grant taken back from a caller who left (no reply) was never
	// handed to anyone.
	it := releaseItem{lockID: h.lock.ID, key: h.ks.Key, ks: h.ks, reply: reply, ttl: h.lock.TTL, handed: reply != nil}
	if c := context.Cause(h.lock.Ctx); errors.Is(c, pglease.ErrLockLost) {
		it.lost = pgerr.New(pglease.CodeLockLost, "manager.Release", "the lock had been lost before it was released", c)
		// Its loss timer fired before the loop noticed: report the loss.
		h.acq.Lost(obs.LossExpired, trace.SpanContext{})
	}
	it.rel, it.sc = startRelease(h, parent)
	h.ks.releasing++
	if st.fair() {
		// The release serves the key's queue, unless the key is left to
		// foreign pollers for a while (foreign.go).
		it.noServe = !st.yieldForeign(h.ks)
	} else if !h.lock.Shared && st.queueHandOff(it) { // local waiters: release and grant in one statement
		return
	}
	st.releases.add(it)
}

// startRelease starts h's pglease.release span (loop), as a child of
// parent when it is valid, and returns it with its span context.
func startRelease(h *holding, parent trace.SpanContext) (obs.Release, trace.SpanContext) {
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, parent)
	}
	rctx, rel := h.acq.StartRelease(ctx)
	return rel, trace.SpanContextFromContext(rctx)
}

// lose declares h lost: its context is cancelled with cause (unless it
// already ended). lc and by are for telemetry: the loss cause and the span
// that found it (the extend round trip; invalid when the local clock did).
//
// When the server may still have the row (rowMayRemain: the trust window
// passed, or a late extend succeeded after it), the row is not released:
// the loss margin and the server's 1 s takeover tolerance protect a holder
// slow to notice its loss, and releasing now would give them away (timely loss signal).
// The row stays until the holder calls Release (it has stopped: releasing
// is safe then), Close, or its expiry. Otherwise (the server refused the
// extend: no row of ours is left) local waiters try at once.
func (st *LoopState) lose(h *holding, cause error, rowMayRemain bool, lc obs.LossCause, by trace.SpanContext) {
	ks := h.ks
	st.dropHolding(h, cause)
	h.acq.Lost(lc, by)
	st.sig().Lost.signal(ks.Key)
	if rowMayRemain {
		st.keep(h)
	}
	st.forceKick(ks)
}

// keep remembers a lost lock whose row may still be on the server, until
// the server has expired it for sure: the last successful acquire or
// extend was sent at lease.Start (or a later extend whose outcome is
// unknown at unknownStart) and ran within StatementTimeout, or, when no
// retry could have followed its timeout, until the lease's trust deadline
// (extendDeadline), so the server's expires_at is at most that end + TTL
// (plus a second for the clocks' rates).
func (st *LoopState) keep(h *holding) {
	st.kept[h] = struct{}{}
}

// keptUntil is when the server has expired a kept row (see keep) for
// sure: forgetting it is safe after that. (h.lease no longer changes once
// h is lost.)
func (st *LoopState) keptUntil(h *holding) time.Time {
	start := h.lease.Start
	if h.unknownStart.After(start) {
		start = h.unknownStart // an extend that may have run after the last success
	}
	end := start.Add(st.m.cfg.StatementTimeout)
	// An extend after whose timeout this lease had no time for a retry
	// may have waited until its trust deadline (extendDeadline).
	if tu := h.lease.TrustedUntil(); tu.After(end) && !h.lease.RetryAt(end).Before(tu) {
		end = tu
	}
	return end.Add(h.lock.TTL + time.Second)
}

// unkeep forgets h and returns whether it was kept.
func (st *LoopState) unkeep(h *holding) bool {
	if h == nil {
		return false
	}
	if _, ok := st.kept[h]; !ok {
		return false
	}
	delete(st.kept, h)
	return true
}

// pruneKept forgets kept rows the server has surely expired.
func (st *LoopState) pruneKept(now time.Time) {
	for h := range st.kept {
		if now.After(st.keptUntil(h)) {
			delete(st.kept, h)
		}
	}
}

// releaseKept queues the release of a lost lock's kept row (its holder
// called Release, or Close); reply, if set, gets the loss as the outcome.
func (st *LoopState) releaseKept(h *holding, reply chan error) {
	it := releaseItem{lockID: h.lock.ID, key: h.ks.Key, reply: reply, ttl: h.lock.TTL, handed: true,
		lost: pgerr.New(pglease.CodeLockLost, "manager.Release", "the lock had been lost before it was released", context.Cause(h.lock.Ctx))}
	if !st.closing {
		ks := st.keyFor(h.ks.Key, h.ks.hash) // h.ks may have been forgotten since
		ks.releasing++
		it.ks = ks
	}
	st.releases.add(it)
}

// expire ends l as lost because its trust window passed: what its loss
// timer does (from the timer's goroutine), and what anyone who finds the
// window passed before the timer fired does (checkTrust). It then nudges
// the loop. Idempotent: the first cause wins.
func (l *Hold) expire() {
	l.cancel(lostCause("trust window passed without a successful extend"))
	select {
	case l.M.lossCh <- struct{}{}:
	default:
	}
}

// lossTimerFired is what st.loss calls, from its timer's goroutine, for a
// lease whose deadline passed.
func (l *Hold) lossTimerFired() {
	if l.M.Test.TimerFired != nil {
		l.M.Test.TimerFired(l.M.Now().Sub(l.Start.Add(time.Duration(l.Lease.TrustedNs.Load()))))
	}
	l.expire()
}

// checkTrust ends l as lost if its trust window has passed at now, on the
// monotonic clock, whether or not its loss timer has fired: after the
// process was stopped (SIGSTOP, a VM pause) longer than the window, the
// timer fires only some time after the process runs again, and until then
// the context alone would still say "held" (after a pause). Safe from any
// goroutine; a no-op for a lock that already ended.
func (l *Hold) checkTrust(now time.Time) {
	if l.Lease == nil || l.Ctx.Err() != nil {
		return
	}
	if !now.Before(l.Start.Add(time.Duration(l.Lease.TrustedNs.Load()))) {
		l.expire()
	}
}

func lostCause(msg string) error {
	return pgerr.New(pglease.CodeLockLost, "manager.Lock", msg, nil)
}

var ClosedCause = pgerr.New(pglease.CodeClosed, "manager.Close", "manager closed", nil)

// holdLimitCause is the cause of a lock's context at its hold limit.
func holdLimitCause(d time.Duration) error {
	return pgerr.New(pglease.CodeHoldLimitExceeded, "manager.Lock",
		"the lock reached its hold limit ("+d.String()+"); stop and release it (it is held until Release or expiry, no longer extended)", nil)
}

// pastLimit reports whether h's context ended at its hold limit while its
// trust window has not passed: the lock is still held, but no longer
// extended (its lease is made Manual here). It is lost as usual when the
// trust window passes, and its row then kept until Release or expiry.
func (st *LoopState) pastLimit(h *holding, now time.Time) bool {
	if !errors.Is(context.Cause(h.lock.Ctx), pglease.ErrHoldLimitExceeded) || !now.Before(h.lease.TrustedUntil()) {
		return false
	}
	h.lease.Manual = true
	return true
}

func (st *LoopState) sig() *Signals {
	if st.m.Sig == nil {
		return &noSignals
	}
	return st.m.Sig
}

var noSignals Signals // all channels nil: every signal is a no-op

// grant makes a holding of lockID for req from a successful attempt and
// answers req.
func (st *LoopState) grant(ks *KeyState, req *AcquireReq, lockID string, ttl time.Duration, r store.AcquireResult, lease heartbeat.Lease) {
	lk := st.hold(ks, req, req.Acq, lockID, ttl, r, lease)
	req.answered = true
	req.Acq.Granted(r.Fence) // before the reply: Lost/Release may follow at once
	req.Reply <- AcquireReply{Lock: lk}
	st.granted(ks)
	st.passSets(ks)            // a set waiter that wants the key was passed over (sets.go)
	st.checkRevokedEarly(lk.h) // revoke.go
}

// granted resets ks's contention state after a grant.
func (st *LoopState) granted(ks *KeyState) {
	if ks.cont != nil {
		ks.cont.bo.Reset()
		ks.cont.heldBy = ""
	}
	st.noteForeignGrant(ks) // keys shared with foreign holders (foreign.go)
	ks.lastErr = nil
	st.sig().Granted.signal(ks.Key)
}

// hold makes the holding of a grant of ks to lockID for req (acq its
// telemetry), with its loss and hold-limit timers, and returns its Lock.
// The caller answers req.
func (st *LoopState) hold(ks *KeyState, req *AcquireReq, acq *obs.Acquisition, lockID string, ttl time.Duration, r store.AcquireResult, lease heartbeat.Lease) *Hold {
	m := st.m
	lctx, cancel := context.WithCancelCause(context.Background())
	lk := &Hold{M: m, Key: ks.Key, ID: lockID, Fence: r.Fence, TTL: ttl, AcquiredMs: r.AcquiredAt.UnixMilli(),
		Start: lease.Start, Ctx: lctx, cancel: cancel, Lease: &leaseState{}, Shared: req.Shared}
	lk.setLease(lease, r.ExpiresAt)
	h := &holding{lock: lk, ks: ks, lease: heldLease{Lease: lease, Manual: req.Manual}, acq: acq, lossIdx: -1}
	lk.h = h
	// The loss deadline does not depend on the loop: st.loss's timer
	// cancels the lock's context by itself, then nudges the loop.
	st.loss.Start(h, lease.TrustedUntil())
	if d := req.HoldLimit; d > 0 {
		// Measured from the grant. Like the loss timer, it ends the
		// context by itself; the loop then stops extending (pastLimit).
		h.limitTimer = time.AfterFunc(d, func() {
			cancel(holdLimitCause(d))
			select {
			case m.lossCh <- struct{}{}:
			default:
			}
		})
	}
	if req.Shared {
		h.limit = req.Limit
		st.contended(ks).addShared(ks, req.Limit)
	} else {
		ks.holder = h
	}
	st.held[h] = struct{}{}
	st.noteEvent(h.lease.NextEvent())
	return lk
}

// noteFence records the highest fence seen for ks's key and reports
// whether f is acceptable (strictly above every fence seen before).
func (st *LoopState) noteFence(ks *KeyState, f pglease.Fence) bool {
	if ks.HasFence && f <= ks.Fence {
		return false
	}
	ks.Fence, ks.HasFence = f, true
	return true
}

// rememberFence keeps the highest fence of a key whose state goes away,
// for when it comes back; beyond maxFenceMemory keys, some are forgotten.
func (st *LoopState) rememberFence(key string, f pglease.Fence) {
	if len(st.Fences) >= maxFenceMemory {
		for k := range st.Fences { // every entry is an idle key's
			delete(st.Fences, k)
			if len(st.Fences) < maxFenceMemory/2 {
				break
			}
		}
	}
	st.Fences[key] = f
}

// noteAttempt records one database attempt, carried by the round trip
// db, on behalf of every waiter in reqs: attempts are counted per caller.
// Call it before answering them.
func noteAttempt(reqs []*AcquireReq, db trace.SpanContext, o obs.AttemptOutcome, retryIn time.Duration) {
	for _, r := range reqs {
		r.Acq.Attempt(db, o, retryIn)
	}
}

// reportDepth publishes the loop's queue depths (atomic stores only).
func (st *LoopState) reportDepth(l *obs.Loop) {
	if l == nil {
		return
	}
	l.SetDepth(obs.QueueWaiters, st.waiting)
	l.SetDepth(obs.QueueMailbox, st.pendingItems())
	l.SetDepth(obs.QueueInflight, st.inFlight())
	l.SetDepth(obs.QueueDue, len(st.retries)+len(st.held))
}

// failAll answers every waiter of ks with err.
func (st *LoopState) failAll(ks *KeyState, err error) {
	for _, req := range ks.queue {
		st.leaveTicket(req) // fair.go
		req.answered = true
		req.Reply <- AcquireReply{Err: err}
	}
	st.waiting -= len(ks.queue)
	ks.queue = nil
	st.unqueued(ks)
	st.clearRetry(ks)
}

// retryable reports whether an attempt error leaves waiters waiting (and
// retrying) rather than failing them: everything except bad input,
// authentication and internal errors of the item itself.
func retryable(err error) bool {
	switch pglease.CodeOf(err) {
	case pglease.CodeInvalidArgument, pglease.CodeAuthFailed, pglease.CodeClosed:
		return false // CodeClosed: the pool was closed under the Manager
	}
	return true
}

// leases iterates the held locks for collectLeases.
func (st *LoopState) leases(yield func(*holding, heldLease) bool) {
	for h := range st.held {
		if !yield(h, h.lease) {
			return
		}
	}
}
