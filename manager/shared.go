package manager

import (
	"context"
	"math"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// Shared holds. A key is held exclusively (a lease: the SyncGuard row)
// or shared: by readers of a reader-writer lease (Shared), or by the
// permits of a counting semaphore (WithLimit), rows of the lock table's
// {lock}_shared table. The server decides every grant (store.AcquireSharedMany);
// the loop keeps what it needs to send no attempt it knows to be futile
// and to serve waiters in order:
//
//   - A key's queue stays one FIFO of exclusive and shared waiters. Its
//     one attempt serves the head: an exclusive head as before; a shared
//     head together with the shared waiters of the same limit and TTL that
//     follow it (coalescing: one item per waiter in one statement, as many
//     as the server grants; a semaphore's at most limit).
//   - Several callers of this process may hold a key shared at once
//     (keyState.nShared counts them, keyContention.sharedLims by limit:
//     callers may disagree on a semaphore's limit while it is changed).
//     A shared head waits for a local exclusive holder, a reader head for
//     local permits, a permit head for local readers, or for a local
//     permit when the local permits alone reach the smallest of its limit
//     and theirs (the server's rule, store.AcquireSharedMany). An
//     exclusive head does attempt while local shared holds exist: its
//     refusal marks the key as waited for by a writer, which keeps new
//     shared holds of every process away (writer preference; every
//     refused exclusive attempt marks the key, whatever refused it; the
//     mark lapses 2 s after the last one, and a waiting writer tries
//     again within writerRetry to keep it).
//   - A shared hold's release is a plain release (local handoffs are
//     exclusive to exclusive: the store hands over exclusive leases only,
//     and never while shared holds remain); it kicks the key, whose head
//     then tries at once. Releases and extends cover both tables.
//
// Fences: a permit's fence is a fresh increment of the key's counter, so
// it is checked like an exclusive grant's (fence monotonicity), against
// the highest fence seen when its attempt was made (permits of one key
// may be granted by attempts whose answers cross); a reader's is the
// counter as it was (the fence of the state it reads under), which may
// repeat, and is not checked.

// writerRetry is the longest an exclusive waiter goes between attempts of
// a key held elsewhere: each refused exclusive attempt marks the key as
// waited for by a writer for 2 s (no new reader or permit meanwhile:
// writer preference, store.AcquireSharedMany), so a waiter that tries
// again within 1 s keeps the key marked until it has had it, whatever
// holds it: another process's writer, readers or permits, a delay.
const writerRetry = time.Second

// keepMark returns when an exclusive waiter refused at now tries again
// at the latest: at freeAt (zero: unknown) if that comes first, else
// writerRetry after now.
func keepMark(freeAt, now time.Time) time.Time {
	if t := now.Add(writerRetry); freeAt.IsZero() || t.Before(freeAt) {
		return t
	}
	return freeAt
}

// maxCoalesce caps the shared waiters one attempt serves (and the holds
// it asks for).
const maxCoalesce = 64

// Shared makes the acquire a reader of the key's reader-writer lease:
// any number of readers, of any process, hold the key at once, never
// together with an exclusive holder (a plain Acquire: the writer), nor
// with permits (WithLimit). A waiting writer goes first: from its first
// refused attempt, whatever refused it (readers, permits, another
// writer, a delay), no new reader or permit is granted until it has had
// the key (writer preference: a steady stream of readers cannot starve
// it, and when the writer it waits behind releases, the readers waiting
// with it do not get in first). Each refused exclusive attempt marks the
// key for 2 s and a waiting writer tries again at least once a second,
// which keeps the mark (a key no reader or permit has contended for is
// marked a round trip after the first of them is refused on it, which
// wakes the waiting writers); a writer that dies or gives up waiting (a
// refused TryAcquire included) stops blocking readers 2 s after its last
// attempt.
// So, as with sync.RWMutex, a reader must not take the key again while
// it holds it: the second read would wait for a waiting writer, which
// waits for the first.
//
// A reader's Fence is the fence of the state it reads under: the key's
// fence counter at its grant, not incremented (the fence of the last
// exclusive grant or permit of the key; 0 if there was none), so readers
// may share a fence, and a writer's fence is above every reader's before
// it. Present it where a reader must show which writer's state it read.
//
// Shared locks are Locks like any: Release, Extend, heartbeat, loss
// signal, Context, WithTTL, WithHoldLimit, WithoutAutoExtend, and they
// work with Acquire, TryAcquire and Do. Guard refuses them (the database
// guard accepts exclusive leases only). SyncGuard processes sharing the
// tables do not see shared holds: they take the key as if nobody held it.
func Shared() AcquireOption {
	return func(o *acquireOpts) error {
		o.shared = true
		return nil
	}
}

// WithLimit makes the acquire a permit of a counting semaphore of n on
// the key: at most n permits, of any process, are held at once, never
// together with an exclusive holder or readers (Shared: a permit waits
// for readers to go, a reader for permits); n must be at least 1. A
// waiting exclusive acquire keeps new permits away as it keeps readers
// (see Shared). It implies Shared.
//
// Holders may disagree on n, so a limit can be changed in a live fleet
// by deploying the new n process by process: a permit is granted only
// while the live permits are fewer than the smallest n among them and
// the caller's, so the key never has more permits than the smallest n of
// a live permit. A raise takes effect once the permits taken with the old
// n are gone, a lowering as soon as the live permits are fewer than the
// new n (its callers wait until then). A caller whose n disagrees waits
// as for a full semaphore (TryAcquire answers "not acquired"), never an
// error: the disagreement lives in the database, between processes, and
// the same call succeeds later.
//
// Each permit's Fence is a fresh increment of the key's fence counter:
// fences strictly increase across the key's permits and exclusive grants,
// so a resource can refuse a write older than the last one it accepted.
// Permits are Locks like any (see Shared).
func WithLimit(n int) AcquireOption {
	return func(o *acquireOpts) error {
		if n < 1 || n > math.MaxInt32 {
			return invalid("manager.WithLimit", "limit must be at least 1 (and fit in 32 bits)")
		}
		o.shared, o.limit = true, int32(n)
		return nil
	}
}

// addShared counts a shared hold of ks with limit lim (0: a reader).
func (c *keyContention) addShared(ks *keyState, lim int32) {
	if c.sharedLims == nil {
		c.sharedLims = make(map[int32]int32, 1)
	}
	c.sharedLims[lim]++
	ks.nShared++
}

// dropShared uncounts a shared hold of ks with limit lim.
func (ks *keyState) dropShared(lim int32) {
	ks.nShared--
	if ks.cont == nil {
		return
	}
	if n := ks.cont.sharedLims[lim] - 1; n > 0 {
		ks.cont.sharedLims[lim] = n
	} else {
		delete(ks.cont.sharedLims, lim)
	}
}

// localShared describes this process's shared holds of ks: whether
// readers and permits are among them, and the smallest permit limit
// (meaningful when permits).
func (ks *keyState) localShared() (readers, permits bool, minLim int32) {
	if ks.nShared == 0 || ks.cont == nil {
		return false, false, 0
	}
	for lim := range ks.cont.sharedLims {
		switch {
		case lim == 0:
			readers = true
		case !permits || lim < minLim:
			permits, minLim = true, lim
		}
	}
	return readers, permits, minLim
}

// permitRoom returns how many more permits of limit lim the server could
// grant, judging by this process's holds alone: the smallest of lim and
// the local permits' limits, less the local permits (the server's rule,
// AcquireSharedMany; 0 while readers are held here).
func (ks *keyState) permitRoom(lim int32) int32 {
	readers, permits, minLim := ks.localShared()
	switch {
	case readers:
		return 0
	case permits:
		return max(0, min(lim, minLim)-ks.nShared)
	}
	return lim
}

// heldHere reports whether a hold of req's kind cannot be granted because
// of what callers of this Manager hold: an exclusive holder, any shared
// hold for an exclusive request, permits for a reader, readers for a
// permit, or permits that fill the smallest of req's limit and theirs.
func (ks *keyState) heldHere(req *acquireReq) bool {
	switch {
	case ks.holder != nil:
		return true
	case !req.shared:
		return ks.nShared > 0
	case req.limit > 0:
		return ks.permitRoom(req.limit) == 0
	}
	_, permits, _ := ks.localShared()
	return permits
}

// shareAttempt makes a, the key's new attempt for its shared head
// waiter, a shared attempt serving that waiter and the coalescible ones
// behind it.
func (st *loopState) shareAttempt(a *attempt, head *acquireReq) {
	ks := a.ks
	n := min(maxCoalesce, st.m.cfg.MaxBatch)
	if head.limit > 0 {
		n = min(n, max(1, int(ks.permitRoom(head.limit))))
	}
	k := 1
	for k < n && k < len(ks.queue) && coalescible(ks.queue[k], head) {
		k++
	}
	ids := make([]string, k)
	ids[0] = a.lockID
	for j := 1; j < k; j++ {
		ids[j] = keys.NewLockID()
	}
	a.sh = &sharedAttempt{limit: head.limit, floor: ks.fence, hasFloor: ks.hasFence, ids: ids}
}

// coalescible reports whether waiter q can share the attempt made for
// head: a shared hold of the same limit and TTL.
func coalescible(q, head *acquireReq) bool {
	return q.shared && !q.try && q.limit == head.limit && q.ttl == head.ttl
}

// sharedHead returns ks's head waiter if a's holds can serve it (nil
// otherwise: it left, or the head now wants another kind of hold).
func sharedHead(ks *keyState, a *attempt) *acquireReq {
	if len(ks.queue) == 0 {
		return nil
	}
	if q := ks.queue[0]; q.shared && !q.try && q.limit == a.limit() && q.ttl == a.ttl {
		return q
	}
	return nil
}

// checkFence applies fence monotonicity to a grant of f by a: an
// exclusive grant's fence must be above every fence seen for the key, a
// permit's above every fence seen before its attempt was made; a
// reader's is the counter as it was and is not checked. It records f.
func (st *loopState) checkFence(ks *keyState, a *attempt, f pglease.Fence) bool {
	switch {
	case a.sh == nil:
		return st.noteFence(ks, f)
	case a.sh.limit == 0:
		return true
	case a.sh.hasFloor && f <= a.sh.floor:
		return false
	}
	if !ks.hasFence || f > ks.fence {
		ks.fence, ks.hasFence = f, true
	}
	return true
}

// fenceRegression is the error of a grant refused by fence monotonicity.
func fenceRegression(op string) error {
	return pgerr.New(pglease.CodeFenceRegression, op,
		"fence not above one already seen for this key: the database lost acknowledged writes", nil)
}

// sharedDone handles the answer to a's holds (rs, nil when the round trip
// failed), a being ks's shared attempt.
func (st *loopState) sharedDone(a *attempt, d acquireDone, rs []store.AcquireResult, now time.Time) {
	ks := a.ks
	if st.settleStale(a, d, rs) {
		return
	}
	ks.attempt = nil
	if d.err == nil {
		ks.lastErr = nil // it reached the database (waitErr)
	}
	switch {
	case st.closing:
		for j := range a.items() {
			if mayHaveGranted(d.err) || (d.err == nil && rs[j].OK) {
				st.orphanReleaseID(nil, a, a.id(j))
			}
		}
		st.gc(ks)
		return
	case d.err != nil:
		if mayHaveGranted(d.err) {
			for j := range a.items() {
				st.orphanReleaseID(ks, a, a.id(j))
			}
		}
		st.attemptFailed(ks, d.err, now, d.db)
		st.gc(ks)
		return
	}
	lease := heartbeat.Lease{TTL: a.ttl, Start: d.start, Margin: st.margin(a.ttl)}
	var locked *store.AcquireResult
	var fatal error // an item's own failure no retry fixes (fence overflow)
	for j := range rs {
		r := &rs[j]
		id := a.id(j)
		switch {
		case r.Err != nil:
			fatal = r.Err
		case !r.OK:
			locked = r
		case !st.checkFence(ks, a, r.Fence):
			st.orphanReleaseID(ks, a, id)
			err := fenceRegression("manager.Acquire")
			ks.lastErr = err
			if req := sharedHead(ks, a); req != nil {
				st.popWaiter(ks)
				req.acq.Attempt(d.db, obs.AttemptFailed, 0)
				req.answered = true
				req.reply <- acquireReply{err: err}
			}
		case !now.Before(lease.TrustedUntil()):
			// The answer came after the grants' trust window.
			st.orphanReleaseID(ks, a, id)
			ks.lastErr = pgerr.New(pglease.CodeNetworkTimeout, "manager.Acquire", "grant arrived after its trust window", nil)
		default:
			req := sharedHead(ks, a)
			if req == nil {
				// The waiter it was for left.
				st.orphanReleaseID(ks, a, id)
				st.sig().orphaned.signal(ks.key)
				continue
			}
			st.popWaiter(ks)
			req.acq.Attempt(d.db, obs.AttemptGranted, 0)
			st.grant(ks, req, id, a.ttl, *r, lease)
		}
	}
	switch {
	case fatal != nil:
		ks.lastErr = fatal
		noteAttempt(ks.queue, d.db, obs.AttemptFailed, 0)
		st.failAll(ks, fatal)
	case len(ks.queue) == 0:
	case locked != nil:
		noteWaiting(ks.queue, *locked)
		st.wantWaiter(ks)
		st.contended(ks).heldBy = locked.Holder
		var retryIn time.Duration
		if ks.woken {
			st.kick(ks)
		} else {
			st.scheduleRetry(ks, now, takeoverAt(*locked, now))
			retryIn = ks.retryAt.Sub(now)
		}
		noteAttempt(ks.queue, d.db, obs.AttemptContended, retryIn)
	default:
		// Everything asked for was granted (or settled): the waiters
		// behind are served by the key's next attempt.
		st.kick(ks)
	}
	st.gc(ks)
}

// settleStale handles the answer of a superseded attempt (flight.go): it
// releases whatever the attempt granted or may have granted and reports
// true; or, for the first answer of the key's current chain, makes the
// attempt in flight the stale one and reports false.
func (st *loopState) settleStale(a *attempt, d acquireDone, rs []store.AcquireResult) bool {
	ks := a.ks
	if a.stale {
		ks.stale--
		if cur := ks.attempt; cur != nil && cur.chain == a.chain && !st.closing {
			// The first answer of the key's current attempt chain: it is
			// the key's answer, the hedge still in flight is superseded.
			cur.stale = true
			ks.stale++
			a.stale = false
		}
	}
	if !a.stale {
		return false
	}
	for j := range a.items() {
		if mayHaveGranted(d.err) || (d.err == nil && rs[j].OK) {
			// Not blocking the key's attempts: this release may meet a
			// dead connection too.
			st.releases.add(releaseItem{lockID: a.id(j), key: ks.key, ks: ks, unblocked: true, ttl: a.ttl, sc: a.db})
		}
	}
	st.gc(ks)
	return true
}

// sendShared starts a shared-hold batch (loop side of sendSharedAcquire).
func (st *loopState) sendShared(fl *flight, batch []*attempt) {
	fl.attempts = batch
	parent, served := roundTripSpans(batch, nil)
	st.m.spawn(func() { st.m.sendSharedAcquire(fl, batch, parent, served) })
}

// sendSharedAcquire runs on a DB worker: one AcquireSharedMany for every
// hold of the batch, as sendAcquire does for exclusive attempts.
func (m *Manager) sendSharedAcquire(fl *flight, batch []*attempt, parent trace.SpanContext, served []trace.SpanContext) {
	n := 0
	for _, a := range batch {
		n += a.items()
	}
	reqs := make([]store.SharedRequest, 0, n)
	for _, a := range batch {
		for j := range a.items() {
			reqs = append(reqs, store.SharedRequest{Key: a.ks.key, TTL: a.ttl, LockID: a.id(j), Limit: int(a.limit())})
		}
	}
	// Not cancelled by Close, as sendAcquire.
	ctx, cancel := context.WithTimeoutCause(context.Background(), m.cfg.StatementTimeout, pgerr.ErrStatementTimeout)
	defer cancel()
	m.beforeBatch(kindShared, len(reqs))
	ctx, db := m.rec.StartDB(ctx, obs.OpAcquireShared, len(reqs), parent, served...)
	start := m.now()
	res, err := m.store.AcquireSharedMany(ctx, reqs)
	ok := 0
	for _, r := range res {
		if r.OK {
			ok++
		}
	}
	db.End(ok, err)
	sc := db.SpanContext()
	for _, a := range batch {
		a.db = sc
	}
	m.acquireDoneCh <- acquireDone{fl: fl, batch: batch, start: start, res: res, err: err, db: sc}
}
