package kernel

import (
	"context"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// The fair queue (Config.FairQueue; docs/fairness.md). Each waiting
// caller has a ticket in its key's queue table: its lockId
// (acquireReq.qid), made at its first attempt and kept for the whole
// wait. The key's attempt is one QueueWait for the key's waiters
// (fairKind): exclusive ones, readers and permits alike, each with its
// ticket; the server grants those whose tickets may go (an exclusive one
// at the head, a reader with no writer or permit ahead: writer
// preference inside the order, a permit with nothing ahead) and keeps
// the others' places. A release (QueueRelease) serves the head of the
// key's queue in its own transaction and notifies only the head's
// process, on its own channel (Manager.qch): the notice (notifier.Turn)
// carries the grant, which handleTurn hands to the waiter, or says
// "attempt now". When the head is a waiter of the releasing process, the
// release returns that notice in its answer instead of sending it
// (sendQueueRelease), so a handoff within a process takes one statement
// and no notification. An AcquireAll waiter (setWait.qids) has a ticket per
// key, queued together as one set in the acquire's global key order
// (setKind with fair: fairSetExec); a release never grants a set's
// ticket, it tells the set's process its turn (the key stays free for
// it), and the set's next QueueWait takes all its keys or none. The
// tickets are refreshed together, one statement every min(ticketLife,
// TTL)/3 (fairDue); a refresh also finds grants whose notice was lost. A
// waiter that leaves (its context, Close, a failure) leaves its tickets
// (QueueLeave, a release item of its own kind), which also releases a
// grant that raced with the leaving. Tries never queue.

// TicketLife is the life of a ticket after each statement that refreshes
// it: a dead process's tickets stop blocking their keys at most this long
// after its last refresh.
const TicketLife = 3 * time.Second

// maxFairItems caps the waiters of one key one attempt carries.
const maxFairItems = 64

// fairLoop is the loop's fair-queue state. Owned by run.
type fairLoop struct {
	// byLock: the waiters with a ticket, by ticket hash (what a turn
	// names); a waiter leaves it when granted or when it leaves.
	byLock map[string]*AcquireReq
	// strays: lockIds of granted waiters that an attempt may have queued
	// again after the caller released the grant (fairLanded), by hash,
	// until their ticket has surely expired: a turn that grants one
	// finds nobody waiting, and releases it.
	strays map[string]stray
	// orphans: granted turns that named no waiter and no stray, by
	// lockId hash, until when: a stray noted later (its attempt landed
	// after the turn came) was granted.
	orphans map[string]time.Time
	// setTix: the set waiters with tickets (setWait.qids), by ticket
	// hash: a turn for one of them makes the set attempt.
	setTix map[string]*setWait
	// leaveAfter: leaves of lockIds whose attempt's outcome was unknown
	// after their callers released them (leaveUnknown), by key, waiting
	// for the key's releases in flight.
	leaveAfter map[string][]releaseItem
	refreshAt  time.Time // next refresh of the tickets (zero: none due)
	refreshing bool      // a refresh is in flight (one at a time)
}

// fair reports whether the Manager queues its waiters (Config.FairQueue).
func (st *LoopState) fair() bool { return st.m.cfg.FairQueue }

// fairKind is the kind of a key's attempt in fair mode: a QueueWait for
// its waiters (in queue order, the head first: exclusive ones, readers
// and permits alike), each under its ticket's lockId; the server grants
// those whose tickets may go (writer preference and limits inside the
// order). floor is the key's highest fence seen when the attempt was
// made (hasFloor: there was one): a permit's fence must be above it.
// Its fields are set by the loop when the attempt is made; pos is
// written by the DB worker before it posts the answer.
type fairKind struct {
	reqs     []*AcquireReq
	items    []store.WaitRequest
	ch       string
	pos      []int
	gone     []bool // store.WaitResult.Gone, written with pos
	hasFloor bool
	floor    pglease.Fence
}

// fairAttempt makes the attempt of ks in fair mode (kick). While a
// caller here holds the key, or its release is in flight, the attempt
// carries only the waiters without a place (new arrivals, a ticket that
// expired or was renewed): that release serves the queue, so the waiters
// with a place need no attempt (the refresh keeps their tickets), and an
// attempt that refreshed them all would hold the key's advisory lock for
// as many rows, on a hot key once per section. Otherwise it carries every
// waiter, in order: one of them may be able to go.
func (st *LoopState) fairAttempt(ks *KeyState, chain uint64) *Attempt {
	k := &fairKind{ch: st.m.qch, floor: ks.Fence, hasFloor: ks.HasFence}
	arrivals := (ks.holder != nil || ks.releasing > 0) && st.unticketed(ks)
	var ttl time.Duration
	for _, req := range ks.queue {
		if arrivals && !req.qsent.IsZero() && !req.qgone {
			continue
		}
		if req.qid == "" {
			st.ticketFor(req)
		}
		k.reqs = append(k.reqs, req)
		// A ticket a statement found queued is only refreshed from then
		// on: an attempt still in flight when its waiter's grant came
		// and was released must not queue the lockId again (a stray
		// grant a later release would make for nobody).
		k.items = append(k.items, store.WaitRequest{Key: ks.Key, TTL: req.TTL, LockID: req.qid,
			LockDelay: time.Duration(req.delayMs()) * time.Millisecond, Shared: req.Shared, Limit: int(req.Limit),
			Refresh: !req.qsent.IsZero() && !req.qgone})
		if ttl == 0 || req.TTL < ttl {
			ttl = req.TTL // the trust check of the pipeline uses the shortest
		}
		if len(k.reqs) == maxFairItems {
			break
		}
	}
	k.pos, k.gone = make([]int, len(k.reqs)), make([]bool, len(k.reqs))
	head := k.reqs[0]
	return &Attempt{Ks: ks, lockID: head.qid, ttl: ttl, delayMs: head.delayMs(), chain: chain, Kind: k}
}

// ticketFor gives req its ticket's lockId.
func (st *LoopState) ticketFor(req *AcquireReq) {
	req.qid = keys.NewLockID()
	req.qhash = pglease.HashKey(req.qid)
	req.qmade = st.m.Now()
	if st.fq.byLock == nil {
		st.fq.byLock = make(map[string]*AcquireReq)
	}
	st.fq.byLock[req.qhash] = req
}

// renewTicket gives req, whose ticket's last attempt had an unknown
// outcome, a new ticket (at the tail, by its next attempt): the old
// lockId is released by the protocol (releaseUnknown, retried while its
// commit may still land), its place leaves, and a turn that grants it
// later finds a stray (released).
func (st *LoopState) renewTicket(req *AcquireReq, now time.Time) {
	old, oldHash := req.qid, req.qhash
	if st.fq.byLock[oldHash] == req {
		delete(st.fq.byLock, oldHash)
	}
	st.leave(old, req.Key, req.TTL)
	st.noteStray(oldHash, old, req.Key, now)
	st.ticketFor(req)
	req.qsent, req.qpos, req.qgone = time.Time{}, 0, false
}

// leaveTicket takes the ticket of req, a waiter that will not be granted
// by it (it left, failed or was closed), out of its key's queue.
func (st *LoopState) leaveTicket(req *AcquireReq) {
	if req.qid == "" || req.qgranted || st.fq.byLock[req.qhash] != req {
		return
	}
	delete(st.fq.byLock, req.qhash)
	st.leave(req.qid, req.Key, req.TTL)
}

// leave queues the leave of ticket id of key.
func (st *LoopState) leave(id, key string, ttl time.Duration) {
	st.releases.add(releaseItem{lockID: id, key: key, ttl: ttl, leave: true})
}

// removeWaiter takes req, wherever it is, out of ks's queue.
func (st *LoopState) removeWaiter(ks *KeyState, req *AcquireReq) {
	if i := slices.Index(ks.queue, req); i >= 0 {
		ks.queue = slices.Delete(ks.queue, i, i+1)
		st.waiting--
		st.unqueued(ks)
	}
}

func (k *fairKind) lane(st *LoopState) *lane[*Attempt] { return &st.fairAcqs }

func (k *fairKind) statement() BatchKind { return KindAcquire }

func (k *fairKind) exec(ctx context.Context, s Store, batch []*Attempt) ([]store.AcquireResult, error) {
	var reqs []store.WaitRequest
	for _, a := range batch {
		reqs = append(reqs, a.Kind.(*fairKind).items...)
	}
	res, err := s.QueueWait(ctx, reqs, k.ch, TicketLife)
	if err != nil {
		return nil, err
	}
	out := make([]store.AcquireResult, len(res))
	off := 0
	for _, a := range batch {
		fk := a.Kind.(*fairKind)
		for j := range fk.items {
			out[off] = res[off].AcquireResult
			fk.pos[j], fk.gone[j] = res[off].Position, res[off].Gone
			off++
		}
	}
	return out, nil
}

func (k *fairKind) holds(a *Attempt) int { return len(k.items) }

func (k *fairKind) hold(a *Attempt, j int) (lockID, key, hash string) {
	return k.items[j].LockID, a.Ks.Key, a.Ks.hash
}

func (k *fairKind) unit(a *Attempt) int { return 1 }

// FenceOK: an exclusive grant's fence must be above every fence seen; a
// permit's above every fence seen when a statement last found its ticket
// queued (permits of one key may be granted by statements whose answers
// cross); a reader's is the counter as it was, not checked (as
// SharedKind.fenceOK). For a ticket no statement has found queued yet,
// that is this attempt's floor. Once one has, it is that statement's: the
// grant came after it, but it may have come before this attempt was made
// (another process's release served the queue, and its notice had not
// been handled here) while a later permit's fence was seen here, so this
// attempt's floor may be above it.
func (k *fairKind) FenceOK(st *LoopState, a *Attempt, lo, hi int, rs []store.AcquireResult) bool {
	req := k.reqs[lo]
	hasFloor, floor := k.hasFloor, k.floor
	if !req.qsent.IsZero() {
		hasFloor, floor = true, req.qfloor
	}
	return st.fairFence(a.Ks, req, rs[lo].Fence, hasFloor, floor)
}

// fairFence applies fence monotonicity to a grant of req's ticket with
// fence f (see fairKind.fenceOK); floor is the highest fence seen when
// the statement that last found the ticket queued was sent (hasFloor:
// there was one), for a permit.
func (st *LoopState) fairFence(ks *KeyState, req *AcquireReq, f pglease.Fence, hasFloor bool, floor pglease.Fence) bool {
	switch {
	case !req.Shared:
		return st.noteFence(ks, f)
	case req.Limit == 0:
		return true
	case hasFloor && f <= floor:
		return false
	}
	if !ks.HasFence || f > ks.Fence {
		ks.Fence, ks.HasFence = f, true
	}
	return true
}

func (k *fairKind) heldHere(st *LoopState, a *Attempt, to *AcquireReq) bool { return a.Ks.held() }

func (k *fairKind) grant(st *LoopState, a *Attempt, to *AcquireReq, lo, hi int, rs []store.AcquireResult, lease heartbeat.Lease) {
	st.removeWaiter(a.Ks, to)
	st.ticketServed(to, rs[lo].Fence)
	lease.TTL, lease.Margin = to.TTL, st.margin(to.TTL)
	st.grant(a.Ks, to, to.qid, to.TTL, rs[lo], lease)
}

func (k *fairKind) waiters(st *LoopState, a *Attempt) waiters { return (*fairQueue)(a.Ks) }

func (k *fairKind) serves(a *Attempt, req *AcquireReq) bool { return true }

// refusal: as an exclusive attempt's when a writer waits (its retries
// keep the key marked as waited for by a writer), else as a shared one's.
func (k *fairKind) refusal(st *LoopState, a *Attempt, r store.AcquireResult, now time.Time) time.Time {
	for _, req := range k.reqs {
		if !req.Shared && !req.answered {
			return ExclusiveKind{}.refusal(st, a, r, now)
		}
	}
	return takeoverAt(r, now)
}

// again: a hedge carries the same tickets (their lockIds are the
// waiters' places); whichever answer comes second is stale, and its
// release skips a lockId its caller was granted (settleStale).
func (k *fairKind) again(a *Attempt, id string) attemptKind {
	return &fairKind{reqs: k.reqs, items: k.items, ch: k.ch, pos: make([]int, len(k.items)), gone: make([]bool, len(k.items)),
		hasFloor: k.hasFloor, floor: k.floor}
}

func (k *fairKind) keep(st *LoopState, a *Attempt) bool { return st.keepKeyAttempt(a) }

func (k *fairKind) served(a *Attempt, add func(*obs.Acquisition) bool) bool {
	for _, req := range k.reqs {
		if !add(req.Acq) {
			return false
		}
	}
	return true
}

func (k *fairKind) op(try bool) string { return "manager.Acquire" }

// landed: the waiters granted or gone while a was in flight, and the
// places of the others (fairLanded).
func (k *fairKind) landed(st *LoopState, a *Attempt, d acquireDone, rs []store.AcquireResult) {
	st.fairLanded(a, k, d, rs)
}

// owns: a lockId whose grant was handed to its caller (by a turn or a
// refresh) stays the caller's; and when a is stale, a waiter still
// waiting with it keeps it too: the next QueueWait of its ticket answers
// a grant this one made (granted, idempotently), where a release sent now
// could end that later grant of the same lockId. A ticket its waiter gave
// up is nobody's: after an unknown outcome (fairLanded) the waiter takes
// a new ticket, since the next QueueWait of the old one would answer
// "granted" for a commit that may not survive (a synchronous commit whose
// wait was cancelled: ambiguity is never success). A waiter that left
// leaves its ticket (fairLanded: a leave releases a grant).
func (k *fairKind) owns(a *Attempt, j int, unknown bool) bool {
	req := k.reqs[j]
	return req.qid == k.items[j].LockID && (req.qgranted || (unknown && !req.answered))
}

// ticketServed records that req's ticket was granted to it, with fence f.
func (st *LoopState) ticketServed(req *AcquireReq, f pglease.Fence) {
	req.qgranted, req.qfence = true, f
	if st.fq.byLock[req.qhash] == req {
		delete(st.fq.byLock, req.qhash)
	}
}

// fairLanded settles, before the pipeline does, what only a fair attempt
// has: the waiters that were granted by a turn or a refresh while it was
// in flight (its answer for them is that grant's, not its own: neither
// granted again nor released — unless the statement ran after the caller
// had released that grant: then it queued the lockId again, or was even
// granted it anew, a grant with another fence, and that ticket leaves or
// that grant goes back), the waiters that left meanwhile (their tickets,
// which the attempt may have queued again after their leave, leave
// again), and the places of the others.
func (st *LoopState) fairLanded(a *Attempt, k *fairKind, d acquireDone, rs []store.AcquireResult) {
	now := st.m.Now()
	unknown := mayHaveGranted(d.err)
	for j, req := range k.reqs {
		if id := k.items[j].LockID; id != req.qid {
			// A ticket its waiter gave up (after an unknown outcome): a
			// grant of it goes back (no taker), an unknown outcome is
			// released (owns), a place it took again leaves.
			if rs != nil && !rs[j].OK && k.pos[j] > 0 {
				st.leave(id, a.Ks.Key, req.TTL)
			}
			continue
		}
		if unknown && !req.answered && !req.qgranted {
			st.renewTicket(req, now)
			continue
		}
		switch {
		case req.qgranted:
			if rs == nil {
				if unknown && !st.holdsLockID(a.Ks, k.items[j].LockID) {
					st.leaveUnknown(a.Ks, req, now)
				}
				break // a caller here holds it: the attempt found its lease
			}
			id := k.items[j].LockID
			switch {
			case rs[j].Err != nil:
			case !rs[j].OK && k.pos[j] > 0 && k.items[j].Refresh:
				// It only refreshed the ticket, so it ran before the
				// grant, which consumed the ticket: nothing is left.
			case !rs[j].OK && k.pos[j] > 0:
				// It ran before the grant, or queued the lockId again
				// after its grant was released: not knowing which, a
				// leave could release the caller's lease. Such a ticket
				// expires in ticketLife; a grant of it goes back (stray).
				// During Close nothing hears that grant, and the drain has
				// released (or is releasing) the caller's lock: it leaves.
				if st.closing {
					st.leave(id, a.Ks.Key, req.TTL)
				} else {
					st.noteStray(req.qhash, id, a.Ks.Key, now)
				}
			case rs[j].OK && k.items[j].Refresh && rs[j].Fence == req.qfence:
				// The caller's own grant, answered again: an attempt that
				// only refreshes neither queues nor grants a lockId anew,
				// so it ran before the caller's release, which ends it.
			case rs[j].OK && (rs[j].Fence != req.qfence || !st.holdsLockID(a.Ks, id)):
				// Another grant of the lockId (a new fence), or one made
				// after the caller's release of its grant: a reader's
				// grant has the fence of the one before, so only the
				// caller's hold tells them apart. While the caller holds
				// the lock, the answer is that hold; once released, it
				// is a hold nobody has (released again: a no-op if the
				// statement ran before the release).
				st.releases.add(releaseItem{lockID: id, key: a.Ks.Key, ks: a.Ks, unblocked: true, ttl: req.TTL, sc: a.db})
			}
			rs[j] = store.AcquireResult{}
		case req.answered:
			if d.err != nil || !rs[j].OK {
				st.leave(k.items[j].LockID, a.Ks.Key, req.TTL)
			}
		case d.err == nil && k.gone[j]:
			// Expired (a grant would have been answered): the next
			// attempt, at once (unticketed), queues it again at the tail.
			req.qgone = true
		case d.err == nil && !rs[j].OK && rs[j].Err == nil && k.pos[j] > 0:
			req.qgone = false
			if d.start.After(req.qsent) {
				req.qsent, req.qfloor = d.start, k.floor
			}
			st.notePosition(req, k.pos[j])
			st.scheduleRefresh(now, req.TTL)
		}
	}
}

// leaveUnknown: an attempt that carried the ticket of req, a waiter
// granted by a turn (or a refresh) whose caller has released that grant,
// had an unknown outcome. If its statement ran after that release, it
// queued the lockId again, or was granted it anew: a ticket or a lease
// for nobody, which would hold up the key's queue until the ticket
// expired or, granted, until its TTL. The lockId leaves at once (a leave
// releases a grant too), retried while the attempt's commit may still
// land (pending), and a turn that grants it meanwhile is released (a
// stray). The leave waits for the key's releases in flight: the caller's
// release of that lockId may be one, and a leave that came first would
// end the caller's lease before it, which would then report the lock
// lost.
func (st *LoopState) leaveUnknown(ks *KeyState, req *AcquireReq, now time.Time) {
	st.noteStray(req.qhash, req.qid, ks.Key, now)
	it := releaseItem{lockID: req.qid, key: ks.Key, ttl: req.TTL, leave: true, pending: true}
	if ks.releasing == 0 || st.closing {
		st.releases.add(it)
		return
	}
	if st.fq.leaveAfter == nil {
		st.fq.leaveAfter = make(map[string][]releaseItem)
	}
	st.fq.leaveAfter[ks.Key] = append(st.fq.leaveAfter[ks.Key], it)
}

// flushLeaves sends the leaves that waited for their keys' releases
// (leaveUnknown) once none is in flight.
func (st *LoopState) flushLeaves() {
	for key, its := range st.fq.leaveAfter {
		if ks := st.keys[key]; ks != nil && ks.releasing > 0 && !st.closing {
			continue
		}
		for _, it := range its {
			st.releases.add(it)
		}
		delete(st.fq.leaveAfter, key)
	}
}

// holdsLockID reports whether a caller here holds the lock of lockId id
// of ks's key (or was told it lost, and its row is kept for its release).
func (st *LoopState) holdsLockID(ks *KeyState, id string) bool {
	for _, m := range []map[*holding]struct{}{st.held, st.kept} {
		for h := range m {
			if h.ks == ks && h.lock.ID == id {
				return true
			}
		}
	}
	return false
}

// notePosition records req's place in its key's queue (a trace event when
// it changed).
func (st *LoopState) notePosition(req *AcquireReq, pos int) {
	if int32(pos) != req.qpos {
		req.qpos = int32(pos)
		req.Acq.Ticket(pos)
		st.sig().ticket.signal(pos)
	}
}

// scheduleRefresh makes sure the tickets are refreshed within
// min(ticketLife, ttl)/3 of now.
func (st *LoopState) scheduleRefresh(now time.Time, ttl time.Duration) {
	at := now.Add(min(TicketLife, ttl) / 3)
	if st.fq.refreshAt.IsZero() || at.Before(st.fq.refreshAt) {
		st.fq.refreshAt = at
	}
}

// fairQueue is a key's queue as the waiters of a fair attempt: a grant
// goes to the waiter whose ticket it is, wherever it stands here.
type fairQueue KeyState

func (q *fairQueue) kq() *keyQueue   { return (*keyQueue)(q) }
func (q *fairQueue) ks() *KeyState   { return (*KeyState)(q) }
func (q *fairQueue) left() bool      { return false }
func (q *fairQueue) reached(e error) { q.kq().reached(e) }

func (q *fairQueue) land(st *LoopState, a *Attempt)   { q.kq().land(st, a) }
func (q *fairQueue) closed(st *LoopState, a *Attempt) {}

func (q *fairQueue) failed(st *LoopState, a *Attempt, err error, now time.Time, db trace.SpanContext) {
	q.kq().failed(st, a, err, now, db)
}

func (q *fairQueue) fatal(st *LoopState, a *Attempt, err error, db trace.SpanContext) {
	q.kq().fatal(st, a, err, db)
}

// refused: as a key's queue (keyQueue.refused), except that a waiter
// with a ticket needs no waiter lock (its process is told on its own
// channel): only a key a foreign holder holds is subscribed, since its
// release notifies only there. A waiter that has no place yet (it came
// while the attempt was in flight) is queued at once.
func (q *fairQueue) refused(st *LoopState, a *Attempt, rs []store.AcquireResult, r *store.AcquireResult, now time.Time, db trace.SpanContext) {
	ks := q.ks()
	if r == nil || len(ks.queue) == 0 {
		return
	}
	latest := a.Kind.refusal(st, a, *r, now)
	noteWaiting(ks.queue, *r)
	if foreignHolder(*r) {
		st.wantWaiter(ks)
	}
	st.contended(ks).heldBy = r.Holder
	var retryIn time.Duration
	if ks.woken || st.unticketed(ks) {
		st.kick(ks)
	} else {
		st.scheduleRetry(ks, now, latest)
		retryIn = ks.retryAt.Sub(now)
	}
	noteAttempt(ks.queue, db, obs.AttemptContended, retryIn)
}

// unticketed reports whether a waiter of ks that its next attempt
// carries has no place in its key's queue yet.
func (st *LoopState) unticketed(ks *KeyState) bool {
	n := 0
	for _, req := range ks.queue {
		if req.qsent.IsZero() || req.qgone {
			return true
		}
		if n++; n == maxFairItems {
			break
		}
	}
	return false
}

func (q *fairQueue) taker(a *Attempt, lo, hi int) *AcquireReq {
	k := a.Kind.(*fairKind)
	req := k.reqs[lo]
	if req.answered || req.qid != k.items[lo].LockID {
		return nil
	}
	return req
}

// takenHere: a caller here holds the key (fair attempts go while it is
// held here, to keep their places): one holder here at a time.
func (q *fairQueue) takenHere(st *LoopState, a *Attempt, to *AcquireReq) bool { return q.holder != nil }

// refuse: a grant to to was refused (its fence; a late answer): to fails
// (a late grant consumed its ticket: it would go to the tail).
func (q *fairQueue) refuse(st *LoopState, a *Attempt, to *AcquireReq, err error, late bool, now time.Time, db trace.SpanContext) {
	q.lastErr = err
	if to == nil {
		return
	}
	to.Acq.Attempt(db, obs.AttemptFailed, 0)
	st.removeWaiter(q.ks(), to)
	st.leaveTicket(to)
	to.answered = true
	to.Reply <- AcquireReply{Err: err}
}

func (q *fairQueue) unserved(st *LoopState) { q.kq().unserved(st) }

func (q *fairQueue) settled(st *LoopState, a *Attempt, granted bool, db trace.SpanContext) {
	q.kq().settled(st, a, granted, db)
}

// stray is a lockId that may have a ticket nobody waits with.
type stray struct {
	id, key string
	until   time.Time
}

// noteStray remembers lockId id of key (hash) as a possible stray ticket.
func (st *LoopState) noteStray(hash, id, key string, now time.Time) {
	if st.fq.strays == nil {
		st.fq.strays = make(map[string]stray)
	}
	for h, s := range st.fq.strays {
		if now.After(s.until) {
			delete(st.fq.strays, h)
		}
	}
	st.fq.strays[hash] = stray{id: id, key: key, until: now.Add(2 * TicketLife)}
	if until, ok := st.fq.orphans[hash]; ok {
		delete(st.fq.orphans, hash)
		if now.Before(until) {
			st.strayGrant(hash)
		}
	}
}

// leaveStrays: Close began; nothing will hear the grant of a stray
// ticket any more, and the callers' locks are being released: every
// stray ticket leaves (after the releases of the drain's batch, or with
// them: a leave that finds a caller's lease still there releases it,
// which the drain does anyway).
func (st *LoopState) leaveStrays() {
	now := st.m.Now()
	for h, s := range st.fq.strays {
		if now.Before(s.until) {
			st.leave(s.id, s.key, TicketLife)
		}
		delete(st.fq.strays, h)
	}
}

// noteOrphan remembers a granted turn that named no waiter here.
func (st *LoopState) noteOrphan(hash string, now time.Time) {
	if st.fq.orphans == nil {
		st.fq.orphans = make(map[string]time.Time)
	}
	for h, until := range st.fq.orphans {
		if now.After(until) {
			delete(st.fq.orphans, h)
		}
	}
	st.fq.orphans[hash] = now.Add(2 * TicketLife)
}

// strayGrant releases the grant of a stray ticket (hash), unless a
// caller here holds that lockId (then it is not a stray's: the caller's
// own grant, told twice).
func (st *LoopState) strayGrant(hash string) {
	s, ok := st.fq.strays[hash]
	if !ok {
		return
	}
	delete(st.fq.strays, hash)
	if ks := st.keys[s.key]; ks != nil && ks.holder != nil && ks.holder.lock.ID == s.id {
		return
	}
	ks := st.keyFor(s.key, pglease.HashKey(s.key))
	st.releases.add(releaseItem{lockID: s.id, key: s.key, ks: ks, unblocked: true, ttl: TicketLife})
}

// handleTurn: a queue notice for a ticket of this process (on its queue
// channel, or in the answer of a release of its own). A grant goes to its
// waiter (fairGrant); "your turn" makes the key's waiters attempt at
// once. A ticket nobody here waits with any more left (or is leaving):
// its leave releases a grant that raced with it.
func (st *LoopState) handleTurn(t store.Turn) {
	req := st.fq.byLock[t.LockHash]
	if w := st.fq.setTix[t.LockHash]; req == nil && w != nil {
		st.wakeSet(w) // a set's ticket is not granted by a release: its turn
		return
	}
	if req == nil && t.Granted {
		if _, ok := st.fq.strays[t.LockHash]; ok {
			st.strayGrant(t.LockHash)
		} else {
			st.noteOrphan(t.LockHash, st.m.Now())
		}
	}
	if req == nil || req.answered {
		return
	}
	ks := st.keys[req.Key]
	if ks == nil {
		return
	}
	if !t.Granted || t.Unconfirmed {
		// An unconfirmed grant (synchronous standbys) may be on the
		// primary alone: the attempt it wakes finds the ticket granted,
		// and that answer commits, waiting for the standby, before it is
		// a grant.
		st.wakeFair(ks)
		return
	}
	st.fairGrant(ks, req, t.Fence, t.ExpiresAt)
}

// wakeFair makes ks's waiters attempt now (or as soon as its attempt in
// flight lands).
func (st *LoopState) wakeFair(ks *KeyState) {
	if ks.attempt != nil {
		ks.woken = true
		return
	}
	st.forceKick(ks)
}

// fairGrant hands req the grant a release made to its ticket (a turn, or
// a refresh that found it granted): fence and server expiry. It is
// trusted from the send time of the latest statement that found the
// ticket queued (the grant came after it; before any answered, the time
// the ticket was made, which came before its first enqueue) plus the
// TTL: a grant past that window, or whose fence is not above one seen,
// is released and its waiter fails, as the pipeline does.
func (st *LoopState) fairGrant(ks *KeyState, req *AcquireReq, fence pglease.Fence, exp time.Time) {
	now := st.m.Now()
	start := req.qsent
	if start.IsZero() {
		start = req.qmade
	}
	lease := heartbeat.Lease{TTL: req.TTL, Start: start, Margin: st.margin(req.TTL)}
	var err error
	switch {
	case !now.Before(lease.TrustedUntil()):
		err = lateGrant("manager.Acquire")
	case !st.fairFence(ks, req, fence, !req.qsent.IsZero(), req.qfloor):
		err = fenceRegression("manager.Acquire")
	case ks.holder != nil:
		// A caller here holds the key (its row must be gone on the
		// server): one holder here at a time. The grant goes back, and
		// the waiter's ticket, consumed, is queued again by its next
		// attempt.
		st.releases.add(releaseItem{lockID: req.qid, key: req.Key, ks: ks, unblocked: true, ttl: req.TTL})
		req.qsent = time.Time{}
		return
	}
	if err != nil {
		st.releases.add(releaseItem{lockID: req.qid, key: req.Key, ks: ks, unblocked: true, ttl: req.TTL})
		if st.fq.byLock[req.qhash] == req {
			delete(st.fq.byLock, req.qhash) // its release is its leave
		}
		st.removeWaiter(ks, req)
		req.Acq.Attempt(trace.SpanContext{}, obs.AttemptFailed, 0)
		req.answered = true
		req.Reply <- AcquireReply{Err: err}
		st.gc(ks)
		return
	}
	st.removeWaiter(ks, req)
	st.ticketServed(req, fence)
	req.Acq.Attempt(trace.SpanContext{}, obs.AttemptGranted, 0)
	r := store.AcquireResult{OK: true, Fence: fence, AcquiredAt: exp.Add(-req.TTL), ExpiresAt: exp}
	st.grant(ks, req, req.qid, req.TTL, r, lease)
}

// refreshDone is the answer to a refresh of the tickets of reqs (the
// first len(reqs) of ids; floors: their keys' highest fences seen at
// start) and of set waiters ws (the rest of ids, one per ticket), sent
// at start.
type refreshDone struct {
	reqs   []*AcquireReq
	floors []pglease.Fence
	ws     []*setWait
	ids    []string
	start  time.Time
	res    []store.TicketState
	err    error
}

// fairDue refreshes every ticket of this process in one statement when
// due (handleDue).
func (st *LoopState) fairDue(now time.Time) {
	f := &st.fq
	if !st.fair() || f.refreshing || st.closing || f.refreshAt.IsZero() || now.Before(f.refreshAt) {
		return
	}
	f.refreshAt = time.Time{}
	var reqs []*AcquireReq
	var floors []pglease.Fence
	var ws []*setWait
	var ids []string
	var ttl time.Duration
	for _, req := range f.byLock {
		if req.qsent.IsZero() {
			continue // not queued yet: its attempt queues it
		}
		reqs = append(reqs, req)
		var fl pglease.Fence
		if ks := st.keys[req.Key]; ks != nil {
			fl = ks.Fence
		}
		floors = append(floors, fl)
		ids = append(ids, req.qid)
		if ttl == 0 || req.TTL < ttl {
			ttl = req.TTL
		}
	}
	for _, w := range st.sets {
		if w.done || w.qids == nil || w.qsent.IsZero() {
			continue
		}
		for _, id := range w.qids {
			ws = append(ws, w)
			ids = append(ids, id)
		}
		if ttl == 0 || w.req.TTL < ttl {
			ttl = w.req.TTL
		}
	}
	if len(ids) == 0 {
		return
	}
	st.scheduleRefresh(now, ttl)
	f.refreshing = true
	m := st.m
	go func() {
		ctx, cancel := context.WithTimeoutCause(m.workCtx, m.cfg.StatementTimeout, pgerr.ErrStatementTimeout)
		defer cancel()
		start := m.Now()
		res, err := m.Store.QueueRefresh(ctx, ids, TicketLife)
		m.refreshDoneCh <- refreshDone{reqs: reqs, floors: floors, ws: ws, ids: ids, start: start, res: res, err: err}
	}()
}

// handleRefreshDone: a ticket found granted is handed to its waiter (its
// notice was missed), one still queued is trusted from the refresh's send
// time, one gone (it expired) is queued again, at the tail, by an attempt
// now.
func (st *LoopState) handleRefreshDone(d refreshDone) {
	st.fq.refreshing = false
	if d.err != nil || st.closing {
		return
	}
	for i, req := range d.reqs {
		if req.answered || req.qgranted || req.qid != d.ids[i] {
			continue
		}
		ks := st.keys[req.Key]
		if ks == nil {
			continue
		}
		t := d.res[i]
		switch {
		case t.Granted:
			st.fairGrant(ks, req, t.Fence, t.ExpiresAt)
		case t.Position > 0:
			if d.start.After(req.qsent) {
				req.qsent, req.qfloor = d.start, d.floors[i]
			}
			st.notePosition(req, t.Position)
		default:
			req.qgone = true // its next attempt queues it again
			st.wakeFair(ks)
		}
	}
	for j, w := range d.ws {
		i := len(d.reqs) + j
		if w.done || !slices.Contains(w.qids, d.ids[i]) {
			continue
		}
		if t := d.res[i]; t.Position > 0 && !t.Granted {
			if d.start.After(w.qsent) {
				w.qsent = d.start
			}
			continue
		}
		// Gone (expired: its next attempt queues it again) or granted
		// (an attempt whose answer was lost: its next QueueWait answers
		// that grant): the set attempts now.
		st.wakeSet(w)
	}
}

// fairResync: the listener (re)subscribed, and turns may have been
// missed: the tickets are refreshed now.
func (st *LoopState) fairResync() {
	if len(st.fq.byLock) > 0 || len(st.fq.setTix) > 0 {
		st.fq.refreshAt = st.m.Now()
	}
}

// nextRefresh is when the tickets' refresh is due (zero: none).
func (st *LoopState) nextRefresh() time.Time {
	if st.closing || st.fq.refreshing || (len(st.fq.byLock) == 0 && len(st.fq.setTix) == 0) {
		return time.Time{}
	}
	return st.fq.refreshAt
}

// fairAfterRelease: a release of ks's key came back. In fair mode the
// release served the key's queue: the waiters here with a place wait for
// their turn; only those without one yet attempt now.
func (st *LoopState) fairAfterRelease(ks *KeyState) {
	if len(ks.queue) > 0 && st.unticketed(ks) {
		st.forceKick(ks)
		return
	}
	st.kick(ks)
	st.kickSets(ks)
}

// sendQueueRelease runs on a DB worker: the release batch in fair mode,
// one statement for the tickets that leave (QueueLeave) and one for the
// releases (QueueRelease, serving each key's queue unless an item's key
// is left to foreign pollers). res answers each item; the leaves' error
// is their own. turns are the notices for this process's own tickets,
// which the release returns instead of sending (a grant to a waiter here
// is handed over with the answer, as a local handoff is without the
// queue).
func (m *Kernel) sendQueueRelease(ctx context.Context, batch []releaseItem) (res []bool, turns []store.Turn, err, leaveErr error) {
	res = make([]bool, len(batch))
	var rels []store.ReleaseRequest
	var relIdx, leaveIdx []int
	var leaves []string
	grant := true
	for i, it := range batch {
		if it.leave {
			leaves = append(leaves, it.lockID)
			leaveIdx = append(leaveIdx, i)
			continue
		}
		rels = append(rels, store.ReleaseRequest{LockID: it.lockID, Key: it.key})
		relIdx = append(relIdx, i)
		if it.noServe {
			grant = false
		}
	}
	if len(leaves) > 0 {
		var lr []store.LeaveResult
		lr, leaveErr = m.Store.QueueLeave(ctx, leaves)
		for k, r := range lr {
			res[leaveIdx[k]] = r.Left || r.Released
			if r.Released && m.Sig != nil {
				m.Sig.LeftGranted.signal(batch[leaveIdx[k]].key)
			}
		}
	}
	if len(rels) > 0 {
		var rr []store.QueueReleaseResult
		rr, err = m.Store.QueueRelease(ctx, rels, grant, m.qch)
		for k, r := range rr {
			res[relIdx[k]] = r.Released
			turns = append(turns, r.Turns...)
		}
	}
	return res, turns, err, leaveErr
}

// setTickets gives set waiter w its tickets (a lockId per key) unless it
// has them.
func (st *LoopState) setTickets(w *setWait) {
	if w.qids != nil {
		return
	}
	if st.fq.setTix == nil {
		st.fq.setTix = make(map[string]*setWait)
	}
	w.qids = make([]string, len(w.req.Set.Keys))
	for i := range w.qids {
		w.qids[i] = keys.NewLockID()
		st.fq.setTix[pglease.HashKey(w.qids[i])] = w
	}
}

// forgetSetTickets takes w's tickets out of the loop's state.
func (st *LoopState) forgetSetTickets(w *setWait) {
	for _, id := range w.qids {
		delete(st.fq.setTix, pglease.HashKey(id))
	}
	w.qids, w.qsent = nil, time.Time{}
}

// leaveSetTickets: w ends without a grant of its tickets (answered
// otherwise, abandoned, closed): they leave their keys' queues (a leave
// also releases a grant that raced with it).
func (st *LoopState) leaveSetTickets(w *setWait) {
	if w.qids == nil {
		return
	}
	for i, id := range w.qids {
		st.leave(id, w.req.Set.Keys[i].Key, w.req.TTL)
	}
	st.forgetSetTickets(w)
}

// setServed: sk's grant is about to be made; in fair mode its tickets
// were consumed by it (they are its locks' lockIds now).
func (st *LoopState) setServed(sk *setKind) {
	if sk.fair && sk.w.qids != nil {
		st.forgetSetTickets(sk.w)
	}
}

// wakeSet makes set waiter w attempt now (or as soon as its attempt in
// flight lands).
func (st *LoopState) wakeSet(w *setWait) {
	if w.done {
		return
	}
	if w.attempt != nil {
		w.woken = true
		return
	}
	st.clearSetRetry(w)
	st.kickSet(w)
}

// fairSetExec sends one QueueWait for a batch of fair set attempts: each
// set's tickets, as set i+1 of the batch (all or nothing, in the
// acquire's global key order); the results are in the order of the sets
// and of each set's keys.
func fairSetExec(ctx context.Context, s Store, batch []*Attempt) ([]store.AcquireResult, error) {
	var reqs []store.WaitRequest
	for i, a := range batch {
		sk := setOf(a)
		for j, key := range sk.w.req.Set.Keys {
			reqs = append(reqs, store.WaitRequest{Key: key.Key, TTL: a.ttl, LockID: sk.ids[j], LockDelay: sk.w.req.Delay, Set: i + 1})
		}
	}
	res, err := s.QueueWait(ctx, reqs, setOf(batch[0]).qch, TicketLife)
	if err != nil {
		return nil, err
	}
	out := make([]store.AcquireResult, len(res))
	for i := range res {
		out[i] = res[i].AcquireResult
	}
	return out, nil
}

// fairSetLanded: the answer to a fair set's attempt. A grant consumed
// the set's tickets; a set whose caller left meanwhile leaves its tickets again (the attempt may have queued
// them after their leave; a grant goes back by the protocol: its waiter
// left); a refusal that reached the database is the latest statement
// that found its tickets queued, and the tickets are refreshed from then.
func (st *LoopState) fairSetLanded(a *Attempt, sk *setKind, d acquireDone, rs []store.AcquireResult) {
	w := sk.w
	if w.done {
		if d.err != nil || firstRefused(rs) != nil {
			for j, id := range sk.ids {
				st.leave(id, w.req.Set.Keys[j].Key, w.req.TTL)
			}
		}
		return
	}
	if mayHaveGranted(d.err) && w.qids != nil {
		// Unknown: the protocol releases the lockIds (retried while the
		// commit may still land); their places leave, and the next
		// attempt queues new tickets, at the tail.
		for j, id := range sk.ids {
			st.leave(id, w.req.Set.Keys[j].Key, w.req.TTL)
		}
		st.forgetSetTickets(w)
		return
	}
	if d.err == nil && len(rs) > 0 && firstRefused(rs) == nil && firstErr(rs) == nil {
		// Granted: the grant consumed the tickets. If it goes back (a key
		// got here meanwhile, a late answer), the next attempt queues new
		// ones, at the tail: the same lockIds queued again could be
		// granted before that release lands, and be released with it.
		st.forgetSetTickets(w)
		return
	}
	if d.err == nil && firstRefused(rs) != nil && firstErr(rs) == nil && w.qids != nil {
		if d.start.After(w.qsent) {
			w.qsent = d.start
		}
		st.scheduleRefresh(st.m.Now(), w.req.TTL)
	}
}
