package kernel

import (
	"cmp"
	"container/heap"
	"context"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// run is the Manager's one goroutine that owns all state. It never
// blocks on a caller (every reply channel has room) and never runs SQL:
// database work runs in goroutines it starts, which post their results
// back on the *DoneCh channels.
func (m *Kernel) run(st *LoopState) {
	defer close(m.Done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	closing := m.Closing
	lm := m.Rec.Loop() // busy ratio and queue depths: a clock read or an atomic store each
	for {
		st.flush()
		st.startWork(m.spawn) // the batches flush launched (effects.go)
		st.markListener()     // listener.go
		if m.Sig != nil {     // a test's Manager: the state after every event
			st.mustHold()
		}
		if st.closing && st.drained() {
			st.finish()
			return
		}
		w := st.nextWake()
		if w.IsZero() {
			timer.Stop()
		} else {
			timer.Reset(w.Sub(m.Now()))
		}
		st.reportDepth(lm)
		lm.Idle()
		select {
		case req := <-m.AcquireCh:
			lm.Busy()
			st.handleAcquire(req)
			st.drainWaiting()
		case req := <-m.releaseCh:
			lm.Busy()
			st.handleRelease(req)
			st.drainWaiting()
		case req := <-m.AbandonCh:
			lm.Busy()
			st.handleAbandon(req)
		case req := <-m.extendCh:
			lm.Busy()
			st.handleExtend(req)
		case d := <-m.acquireDoneCh:
			lm.Busy()
			st.handleAcquireDone(d)
			st.drainWaiting()
		case d := <-m.releaseDoneCh:
			lm.Busy()
			st.handleReleaseDone(d)
			st.drainWaiting()
		case d := <-m.extendDoneCh:
			lm.Busy()
			st.handleExtendDone(d)
		case d := <-m.refreshDoneCh:
			lm.Busy()
			st.handleRefreshDone(d) // fair.go
		case n := <-m.notifyCh:
			lm.Busy()
			st.handleNotice(n)
		case req := <-m.watchCh:
			lm.Busy()
			st.handleWatch(req) // watch.go
		case d := <-m.watchDoneCh:
			lm.Busy()
			st.handleWatchRead(d)
		case <-m.lossCh:
			lm.Busy()
			st.heartbeat(m.Now())
		case <-timer.C:
			lm.Busy()
			if m.Test.TimerFired != nil {
				m.Test.TimerFired(m.Now().Sub(w))
			}
			st.handleDue(m.Now())
		case st.lis.Mailbox() <- st.lis.Outbox():
			lm.Busy()
			st.lis.Handed() // the listener's now
		case <-st.lis.Done():
			lm.Busy()
			st.lis.Ended() // its subscribers are told (listener.go)
		case <-closing:
			lm.Busy()
			closing = nil // nil-channel gating: handled once
			st.beginDrain()
		}
	}
}

func (st *LoopState) handleAcquire(req *AcquireReq) {
	if st.closing {
		req.answered = true
		req.Reply <- AcquireReply{Err: ClosedErr("manager.Acquire")}
		return
	}
	if req.Set != nil {
		st.startSet(req) // sets.go
		return
	}
	ks := st.keyFor(req.Key, req.Hash)
	if req.Try {
		st.tryAcquire(ks, req) // tryattempt.go
		return
	}
	req.Acq.Queued(obs.QueueInfo{
		Coalesced:   len(ks.queue) > 0,
		HeldLocally: ks.heldHere(req),
		Position:    len(ks.queue),
	})
	ks.queue = append(ks.queue, req)
	st.queued(ks)
	st.waiting++
	st.sig().Queued.signal(req.Key)
	st.kick(ks)
}

// handleAbandon settles a caller who left (its wait context ended). The
// loop is the only sender on req.reply and the caller no longer reads it,
// so a non-blocking receive tells exactly where the request is:
//   - a grant is waiting in reply: the caller never got it; take it back,
//     release it (handing the key to the next waiter), answer "abandoned";
//   - an error or "locked" answer is waiting: pass it on unchanged;
//   - nothing: the request is still queued; remove it, answer "abandoned".
//
// The answer goes on req.final.
func (st *LoopState) handleAbandon(req *AcquireReq) {
	select {
	case r := <-req.Reply:
		if r.Lock == nil && r.Locks == nil {
			req.Final <- r
			return
		}
		for _, lk := range append(r.Locks, r.Lock) {
			if lk == nil || lk.h == nil {
				continue
			}
			if _, ok := st.held[lk.h]; ok {
				st.releaseHolding(lk.h, nil, trace.SpanContext{})
			}
		}
		req.answered = true
		req.Final <- AcquireReply{Abandoned: true}
		st.sig().TakenBack.signal(req.Key)
		return
	default:
	}
	if req.Set != nil {
		ans := st.abandonSet(req)
		req.answered = true
		req.Final <- ans
		st.sig().Abandoned.signal(req.Key)
		return
	}
	ks := st.keys[req.Key]
	ans := AcquireReply{Abandoned: true}
	if ks != nil {
		if i := slices.Index(ks.queue, req); i >= 0 {
			ks.queue = slices.Delete(ks.queue, i, i+1)
			st.waiting--
			st.unqueued(ks)
		}
		st.leaveTicket(req) // fair.go: a grant that raced with it is released
		// What the wait ended on (waitErr): a holder here, a holder
		// elsewhere (named by its last "locked" answer), or an outage.
		ans.HeldHere, ans.LastErr, ans.HeldBy = ks.heldHere(req), ks.lastErr, ks.heldBy()
		ans.Shed = st.shed.on
		if len(ks.queue) == 0 {
			st.clearRetry(ks) // an attempt in flight finds no waiter and releases its grant
		}
		st.gc(ks)
	}
	req.answered = true
	req.Final <- ans
	st.sig().Abandoned.signal(req.Key)
}

func (st *LoopState) handleRelease(req *ReleaseReq) {
	h := req.Lock.h
	if st.unkeep(h) {
		// Lost, but its row may still be on the server: the holder has
		// stopped, so the row can go now.
		st.releaseKept(h, req.Reply)
		return
	}
	if _, ok := st.held[h]; !ok || h == nil {
		req.Reply <- releasedAnswer(req.Lock)
		return
	}
	st.releaseHolding(h, req.Reply, req.Parent)
}

func (st *LoopState) attemptFailed(ks *KeyState, err error, now time.Time, db trace.SpanContext) {
	ks.lastErr = err
	if !retryable(err) {
		noteAttempt(ks.queue, db, obs.AttemptFailed, 0)
		st.failAll(ks, err)
		return
	}
	// Whether the key was free is unknown: register it as waited for
	// (waiters.go), or a release elsewhere that nobody else waits for
	// would not notify, and the waiters here would sleep through it until
	// their retry.
	st.wantWaiter(ks)
	if len(ks.queue) > 0 {
		st.scheduleRetry(ks, now, time.Time{})
		noteAttempt(ks.queue, db, obs.AttemptFailed, ks.retryAt.Sub(now))
	}
}

func (st *LoopState) handleReleaseDone(d releaseDone) {
	st.handleReleased(d)
	if d.then != nil {
		st.handleAcquireDone(*d.then) // a handoff's grant half
	}
}

// handleReleased handles a release batch's answer (or a handoff's
// release half).
func (st *LoopState) handleReleased(d releaseDone) {
	st.land(d.fl, &st.releaseSlots)
	now := st.m.Now()
	st.observe(d.fl, len(d.batch), d.err, now) // overload.go
	for _, t := range d.turns {
		st.handleTurn(t) // fair.go: the release served a waiter here
	}
	for i, it := range d.batch {
		var err error
		derr := d.err
		if it.leave {
			derr = d.leaveErr
		}
		// An unknown outcome is retried while the lease may be live on the
		// server and a retry can help (relretry.go); the key stays
		// "releasing" meanwhile.
		retried := derr != nil && retryable(derr) && st.retryRelease(it, now)
		if !retried && derr == nil && it.pending && !d.res[i] && !st.closing {
			// An ambiguous acquire's lockId, not (yet) held: its commit may
			// still land (releaseItem.pending). Retried in the background;
			// the key's waiters go on now.
			if it.ks != nil && !it.unblocked {
				it.ks.releasing--
				it.unblocked = true
				st.forceKick(it.ks)
			}
			if st.retryRelease(it, now) {
				continue
			}
		}
		if it.ks != nil && derr != nil {
			// The key's waiters wait for this release: it failing to
			// reach the database is how their wait may end (waitErr). Its
			// success clears nothing: the attempt it lets go decides.
			it.ks.lastErr = derr
		}
		switch {
		case it.lost != nil:
			err = it.lost
		case derr != nil && retried:
			err = pgerr.New(pglease.CodeOf(derr), "manager.Release",
				"release outcome unknown: the lock is no longer extended; the release is retried until the server answers or the lease expires", derr)
		case derr != nil:
			err = pgerr.New(pglease.CodeOf(derr), "manager.Release",
				"release outcome unknown: the lock is no longer extended and expires by itself", derr)
			if st.closeErr == nil && st.closing && it.handed {
				st.closeErr = err // a lock a caller held (Close)
			}
		case !d.res[i]:
			err = pgerr.New(pglease.CodeLockLost, "manager.Release", "the lock had already expired on the server", nil)
		}
		if !it.retry { // the first outcome: answer the caller, end the span
			it.rel.Served(d.db)
			it.rel.End(err)
			if it.reply != nil {
				it.reply <- err
			}
		}
		if retried {
			continue
		}
		if ks := it.ks; ks != nil {
			if !it.unblocked {
				ks.releasing--
			}
			st.sig().Released.signal(ks.Key)
			if st.fair() {
				st.fairAfterRelease(ks) // fair.go: the release served the queue
			} else {
				st.forceKick(ks) // local handoff: the next waiter tries at once
			}
			st.gc(ks)
		}
	}
	if len(st.fq.leaveAfter) > 0 {
		st.flushLeaves() // fair.go
	}
}

func (st *LoopState) handleExtendDone(d extendDone) {
	st.land(d.fl, &st.extendSlots)
	now := st.m.Now()
	st.observe(d.fl, len(d.batch), d.err, now) // overload.go
	if d.err != nil {
		st.sig().ExtendFailed.signal(d.err)
	}
	n, lost := 0, 0
	for i, h := range d.batch {
		if d.err != nil && d.start.After(h.unknownStart) {
			// It may have run: a kept row lives until TTL after it, even
			// if the lock was lost meanwhile (keptUntil).
			h.unknownStart = d.start
		}
		if _, ok := st.held[h]; !ok {
			continue // released or lost meanwhile
		}
		due := h.lease.NextExtend()
		h.lease.Pending = false
		switch {
		case d.err != nil:
			// Unknown outcome: not a success. The old trust window still
			// holds (an extend can only lengthen the lease); retry soon.
			h.lease.NotBefore = h.lease.RetryAt(now)
			h.ks.lastErr = d.err
			h.acq.ExtendFailed(d.err)
		case !d.res[i].OK && d.res[i].Revoked:
			// A revoke deleted the lease and its notification was missed
			// (the listening connection was being replaced, or notifications
			// are off): the server remembers the revoked lockId, so the lock
			// ends as revoked all the same.
			st.revoke(h)
			lost++
			continue
		case !d.res[i].OK:
			st.lose(h, lostCause("the server no longer has the lock"), false, obs.LossNotHeld, d.db)
			lost++
			continue
		case (h.lock.Ctx.Err() != nil && !st.pastLimit(h, now)) || !now.Before(h.lease.TrustedUntil()) || !st.loss.stop(h):
			// (Not trusted: the window passed though the timer may not have
			// fired yet, e.g. the process was stopped: see "After a pause".)
			// The trust window passed while the extend was in flight: the
			// lock is lost even though the late extend succeeded (and its
			// row, extended from d.start, is kept: see lose).
			h.lease.Start = d.start
			st.lose(h, lostCause("trust window passed without a successful extend"), true, obs.LossExpired, d.db)
			lost++
			continue
		default:
			// A lease past its hold limit (pastLimit made it Manual) keeps
			// this late extend but gets no more.
			st.sig().ExtendTimed.signal(ExtendTiming{Key: h.ks.Key, PrevStart: h.lease.Start, Due: due, Start: d.start})
			h.lease = heldLease{Lease: heartbeat.Lease{TTL: h.lock.TTL, Start: d.start, Margin: h.lease.Margin}, Manual: h.lease.Manual}
			st.loss.Start(h, h.lease.TrustedUntil())
			h.lock.setLease(h.lease.Lease, d.res[i].ExpiresAt)
			h.ks.lastErr = nil // the database answered
			h.acq.Extended(d.start.Sub(due))
			n++
		}
		st.noteEvent(h.lease.NextEvent())
	}
	st.answerExtends(d)
	d.hb.End(n, lost, d.err)
	if d.err == nil {
		st.sig().Extended.signal(n)
	}
}

// handleNotice hands a notice to its topic's subscribers (listener.go):
// release wake-ups (waiters.go), watch events (watch.go), revokes and
// release requests (revoke.go); a resync and a registration go to all.
func (st *LoopState) handleNotice(n notice) {
	st.lis.Deliver(n)
	if n.Resync {
		st.sig().Listening.signal(struct{}{}) // the listener (re)subscribed
	}
}

// handleDue runs what the timer found due: stuck batches (flight.go),
// retries and the heartbeat.
func (st *LoopState) handleDue(now time.Time) {
	st.checkStuck(now)
	st.dueReleases(now)
	if st.closing {
		return
	}
	st.dueWatch(now)
	st.shedDue(now) // overload.go
	st.fairDue(now) // fair.go
	for len(st.retries) > 0 && !st.retries[0].at.After(now) {
		e := heap.Pop(&st.retries).(retryEntry)
		switch {
		case e.stale():
		case e.turn:
			st.lapseTurn(e.w)
		case e.w != nil:
			e.w.retryAt = time.Time{}
			st.kickSet(e.w)
		default:
			e.ks.retryAt = time.Time{}
			st.kick(e.ks)
		}
	}
	if !st.hbNext.IsZero() && !now.Before(st.hbNext) {
		st.heartbeat(now)
	}
}

// heartbeat is one tick: every lease past its trust window is lost, and
// every lease due (or nearly due) for an extend joins one extend batch.
func (st *LoopState) heartbeat(now time.Time) {
	if st.closing {
		return
	}
	st.pruneKept(now)
	for h := range st.held {
		if h.lock.Ctx.Err() != nil && !st.pastLimit(h, now) { // its loss timer fired
			st.lose(h, nil, true, obs.LossExpired, trace.SpanContext{})
		}
	}
	t := collectLeases(now, st.leases)
	for _, h := range t.lost {
		st.lose(h, lostCause("trust window passed without a successful extend"), true, obs.LossExpired, trace.SpanContext{})
	}
	for _, h := range t.due {
		h.lease.Pending = true
		st.extends.add(h)
	}
	st.hbNext = t.next
}

// flush sends whatever is pending, lane by lane (lane.go). Handoffs go
// first: one that goes out as a plain release joins the releases.
func (st *LoopState) flush() {
	for _, l := range st.lanes {
		l.flush(st)
	}
	st.flushWatchReads() // watch.go
}

// isHeld reports whether a lease waiting for the next extend batch is
// still held (it may have been released or lost meanwhile).
func (st *LoopState) isHeld(h *holding) bool {
	_, ok := st.held[h]
	return ok
}

// sendReleases starts a release batch (loop side of sendRelease).
func (st *LoopState) sendReleases(fl *flight, batch []releaseItem) {
	parent, served := roundTripSpans(nil, batch)
	st.Start(fl, len(batch), func() { st.m.sendRelease(fl, batch, parent, served) })
}

// sendExtends starts an extend batch (loop side of sendExtend), bounded
// as extendDeadline says.
func (st *LoopState) sendExtends(fl *flight, batch []*holding) {
	m := st.m
	now := st.m.Now()
	reqs := make([]store.ExtendRequest, len(batch))
	for i, h := range batch {
		reqs[i] = store.ExtendRequest{LockID: h.lock.ID, TTL: h.lock.TTL}
		if h.ext != nil {
			h.ext.sent, h.ext.want = h.ext.want, nil // Extend callers this round trip answers
		}
	}
	deadline, slack := extendDeadline(now, m.cfg.StatementTimeout, batch)
	fl.slack = slack // overload.go
	// One heartbeat round per extend batch: the span ends when run
	// handles the result. Its round trip links to the acquire span of
	// each lock it extends.
	_, hb := m.Rec.StartHeartbeat(context.Background(), len(batch))
	var served []trace.SpanContext
	for _, h := range batch {
		if sc := h.acq.SpanContext(); sc.IsValid() && len(served) < obs.MaxLinks {
			served = append(served, sc)
		}
	}
	st.Start(fl, len(batch), func() { m.sendExtend(fl, batch, reqs, deadline, hb, served) })
}

// roundTripSpans returns where the span of a round trip carrying the
// attempts atts (one per key) and the releases rels goes (telemetry), and
// the spans it serves, which it links to (at most obs.MaxLinks).
// A round trip carrying one key is made for that key's head waiter (the
// caller it grants, if it grants), so it is a child of that waiter's
// acquire span, even when others wait behind it; one carrying one release
// only (a holder's, or an orphan's: rels[i].sc) is that release's child.
// A try's attempt serves that try alone. Otherwise (several keys,
// several releases) it is a root span. In every
// case it serves every waiter of its keys and every release it carries.
// Loop only: it reads the keys' queues.
func roundTripSpans(atts []*Attempt, rels []releaseItem) (parent trace.SpanContext, served []trace.SpanContext) {
	switch {
	case len(atts) == 1:
		atts[0].Kind.served(atts[0], func(acq *obs.Acquisition) bool {
			parent = acq.SpanContext()
			return false
		})
	case len(atts) == 0 && len(rels) == 1:
		parent = rels[0].sc
	}
	add := func(sc trace.SpanContext) bool {
		if sc.IsValid() {
			served = append(served, sc)
		}
		return len(served) < obs.MaxLinks
	}
	for _, it := range rels {
		if !add(it.sc) {
			return parent, served
		}
	}
	for _, a := range atts {
		if !a.Kind.served(a, func(acq *obs.Acquisition) bool { return add(acq.SpanContext()) }) {
			return parent, served
		}
	}
	return parent, served
}

// The send* functions run on a DB worker goroutine, never on the loop.

// spawn runs f on an idle DB worker, or on a new one when none is idle.
// Workers outlive their batch and wait for the next one until the loop
// has ended: a new goroutine per batch would grow its stack to pgx's
// depth every time (and be created and scheduled anew), which was a tenth
// of the Manager's CPU per cycle for a lone caller. There are at most as
// many as batches were ever in flight at once, which the caps bound.
func (m *Kernel) spawn(f func()) {
	select {
	case m.work <- f:
	default:
		go m.worker(f)
	}
}

func (m *Kernel) worker(f func()) {
	for {
		f()
		select {
		case f = <-m.work:
		case <-m.Done:
			return
		}
	}
}

func (m *Kernel) beforeBatch(kind BatchKind, n int) {
	if m.Sig != nil {
		m.Sig.BatchSent.signal(BatchInfo{kind, n})
	}
	if m.Test.BeforeBatch != nil {
		m.Test.BeforeBatch(kind, n)
	}
}

func (m *Kernel) sendRelease(fl *flight, batch []releaseItem, parent trace.SpanContext, served []trace.SpanContext) {
	reqs := make([]store.ReleaseRequest, len(batch))
	for i, it := range batch {
		reqs[i] = store.ReleaseRequest{LockID: it.lockID, Key: it.key}
	}
	timeout := m.cfg.StatementTimeout
	if m.IsClosing() {
		timeout = m.cfg.CloseTimeout
	}
	// Releases outlive every caller: detached, bounded by a timeout.
	ctx, cancel := context.WithTimeoutCause(context.Background(), timeout, pgerr.ErrStatementTimeout)
	defer cancel()
	m.beforeBatch(KindRelease, len(batch))
	ctx, db := m.Rec.StartDB(ctx, obs.OpReleaseMany, len(batch), parent, served...)
	var res []bool
	var turns []store.Turn
	var err, leaveErr error
	if m.cfg.FairQueue {
		res, turns, err, leaveErr = m.sendQueueRelease(ctx, batch) // fair.go
	} else {
		res, err = m.Store.ReleaseWaited(ctx, reqs)
	}
	ok := 0
	for _, r := range res {
		if r {
			ok++
		}
	}
	db.End(ok, cmp.Or(err, leaveErr))
	m.releaseDoneCh <- releaseDone{fl: fl, batch: batch, res: res, turns: turns, err: err, leaveErr: leaveErr, db: db.SpanContext()}
}

// extendDeadline returns when an extend batch sent at now gives up, and
// its slack (overload.go): the statement timeout, or the earliest trust
// deadline of its leases if that comes first (an answer after it is
// useless to that lease: it is lost). When no lease of the batch could
// be retried (RetryAt) before its own trust deadline after a timeout,
// the batch waits for the server's answer until the earliest trust
// deadline instead: giving up sooner could save no lease, and a slow
// server's answer that comes after the timeout but before that deadline
// keeps them all. (The fleet bench on a saturated server saw extends
// wait seconds for the commit flush; with a TTL up to about 10 s and the
// default 5 s timeout, a timed-out extend sent when due has no time left
// for a retry.) When one lease could still be retried, the timeout
// stands, so that its retry is not delayed. The slack stays the shorter
// bound, so overload detection does not change.
func extendDeadline(now time.Time, timeout time.Duration, batch []*holding) (deadline time.Time, slack time.Duration) {
	deadline = now.Add(timeout)
	if len(batch) == 0 {
		return deadline, timeout
	}
	first := batch[0].lease.TrustedUntil()
	room := false // some lease could be retried after a timeout
	for _, h := range batch {
		tu := h.lease.TrustedUntil()
		if tu.Before(first) {
			first = tu
		}
		if h.lease.RetryAt(deadline).Before(tu) {
			room = true
		}
	}
	if first.Before(deadline) {
		return first, first.Sub(now)
	}
	slack = deadline.Sub(now)
	if !room {
		deadline = first
	}
	return deadline, slack
}

func (m *Kernel) sendExtend(fl *flight, batch []*holding, reqs []store.ExtendRequest, deadline time.Time, hb obs.Heartbeat, served []trace.SpanContext) {
	// Bounded as extendDeadline says (sendExtends).
	ctx, cancel := context.WithTimeoutCause(m.workCtx, deadline.Sub(m.Now()), pgerr.ErrStatementTimeout)
	defer cancel()
	m.beforeBatch(KindExtend, len(batch))
	ctx, db := m.Rec.StartDB(ctx, obs.OpExtendMany, len(batch), hb.SpanContext(), served...)
	start := m.Now()
	res, err := m.Store.ExtendMany(ctx, reqs)
	ok := 0
	for _, r := range res {
		if r.OK {
			ok++
		}
	}
	db.End(ok, err)
	m.extendDoneCh <- extendDone{fl: fl, batch: batch, start: start, res: res, err: err, hb: hb, db: db.SpanContext()}
}

// drainBurst bounds how many more messages drainWaiting handles.
const drainBurst = 64

// drainWaiting handles the acquires, releases and answers of acquire and
// release batches already waiting on their channels, up to
// drainBurst, so that at high concurrency one turn of the loop (its
// flush, timers and select over every channel) serves many messages: an
// answer that grants 20 callers is followed by their 20 releases. A lone
// caller's request finds nothing more waiting. Every other channel waits
// for the next turn, at most drainBurst messages later.
func (st *LoopState) drainWaiting() {
	m := st.m
	for range drainBurst {
		if m.Sig != nil {
			st.mustHold() // after every event: the one before, too
		}
		select {
		case req := <-m.AcquireCh:
			st.handleAcquire(req)
		case req := <-m.releaseCh:
			st.handleRelease(req)
		case d := <-m.acquireDoneCh:
			st.handleAcquireDone(d)
		case d := <-m.releaseDoneCh:
			st.handleReleaseDone(d)
		default:
			return
		}
	}
}
