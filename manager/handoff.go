package manager

import (
	"container/heap"
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// A local handoff: the holder of a key releases it while other callers of
// this process wait for the same key. Instead of a release round trip and
// then an acquire round trip for the next waiter, one statement
// (internal/store's HandOff) releases the holder's lockId and grants the key to a
// new lockId for the head waiter, in one transaction: one round trip and
// one durable commit per critical section of a hot key.
//
// The loop treats it as a release and an attempt of the key that travel
// together: the key's release counter and attempt slot are taken as for
// each of them, and the DB goroutine posts the outcome as a releaseDone
// and then an acquireDone, which run handles as usual (the releaser's
// answer, then the attempt's grant, contention or failure). An unknown
// outcome is unknown for both halves: the release answers as an unknown
// release does (the lock expires by itself if it was not handed over), and
// the attempt's lockId is released like any ambiguous attempt's (ambiguity is never success).

// maxLocalHandOffs bounds how many times in a row a key is handed over
// inside this process. The next release is a plain one: it notifies, and
// waiters of other processes (woken by it) race this process's next
// waiter for the key. Without the bound, a process whose callers keep
// coming back for a hot key would keep it forever, and other processes'
// waiters would time out. (A key shared with foreign holders has a
// stricter bound in time: see foreignKey.)
const maxLocalHandOffs = 4

// Keys shared with foreign holders. A SyncGuard process (or any process
// that takes the key without pglease) never LISTENs: its waiters poll with
// backoff (SyncGuard: 100 ms doubling, equal jitter, 5 s timeout), while a
// Manager hears every release at once and hands the key over locally in
// one statement. Left alone, the Managers keep such a key all the time:
// a poller finds it free only in the instant between a release and the
// next Manager's grant, and times out.
//
// So a Manager that has found a key held by a foreign holder (a "locked"
// answer naming no pglease holder: SyncGuard records none) shares the key
// in time, for foreignMemory after it last saw one:
//
//   - The Managers' stint: from the moment the Managers get the key back
//     (a grant here, a pglease holder found, or the release of the foreign
//     holder found last, which this Manager answers at once), for
//     foreignStint, the Managers use the key as usual (handoffs included).
//   - The window: the first release of the key by a Manager after the
//     stint (its own release here, or the notified release of another
//     Manager's holder) leaves the key to foreign pollers for
//     foreignWindow: no attempt of the key is sent before it ends, and no
//     handoff is made at the stint's end. A foreign holder that took the
//     key in the window and still holds it at its end is answered at its
//     release, as above.
//
// Every Manager applies the same rule on its own, from what it sees of the
// key (its attempts' answers, its grants, and the release notifications,
// which the release trigger sends for every deleted row: see
// docs/syncguard.md), so no Manager takes the key in another's window. A
// key never held by a foreign holder has no entry here: pure pglease
// fleets pay one length check of an empty map per attempt.
//
// With the defaults the Managers hold such a key at most ~1/6 of the time
// in stints of 10 ms (plus a foreign holder's overrun): a poller whose
// attempt falls in a stint finds the key free at its next poll 50–100 ms
// later with a probability of ~5/6.
const (
	foreignMemory  = 10 * time.Second
	maxForeignKeys = 10_000
)

// foreignStint and foreignWindow are variables for tests only.
var (
	foreignStint  = 10 * time.Millisecond
	foreignWindow = 50 * time.Millisecond
)

// foreignKey is what a Manager knows of a key shared with foreign holders
// (loopState.foreign, by key hash: it outlives the key's keyState, which
// goes when no caller here wants the key). Owned by run.
type foreignKey struct {
	seen time.Time // last "locked" answer that named a foreign holder
	// heldForeign: that answer is the latest news of the key, so the next
	// release notified is the foreign holder's.
	heldForeign bool
	stintEnd    time.Time // end of the Managers' stint (zero: none running)
	windowEnd   time.Time // end of the window left to foreign pollers
}

// foreignHolder reports whether the "locked" answer r names a holder that
// is not a pglease process: an exclusive row (its expiry known) without a
// holder identity (every pglease grant records one, SyncGuard's none),
// and no shared holds.
func foreignHolder(r store.AcquireResult) bool {
	return !r.OK && r.Err == nil && r.Holder == "" && r.SharedHolders == 0 && !r.ExpiresAt.IsZero()
}

// foreignKeyOf returns hash's entry while it is fresh (nil otherwise, and
// a stale one is forgotten).
func (st *loopState) foreignKeyOf(hash string, now time.Time) *foreignKey {
	f := st.foreign[hash]
	if f != nil && now.Sub(f.seen) > foreignMemory {
		delete(st.foreign, hash)
		return nil
	}
	return f
}

// noteLocked takes a "locked" answer r of an attempt of ks's key.
func (st *loopState) noteLocked(ks *keyState, r store.AcquireResult, now time.Time) {
	if foreignHolder(r) {
		f := st.foreign[ks.hash]
		if f == nil {
			if len(st.foreign) >= maxForeignKeys {
				for h, o := range st.foreign {
					if now.Sub(o.seen) > foreignMemory {
						delete(st.foreign, h)
					}
				}
				if len(st.foreign) >= maxForeignKeys {
					return
				}
			}
			f = &foreignKey{}
			st.foreign[ks.hash] = f
		}
		f.seen, f.heldForeign = now, true
		return
	}
	if f := st.foreignKeyOf(ks.hash, now); f != nil {
		f.heldForeign = false
		if r.Holder != "" {
			f.startStint(now) // another Manager has the key
		}
	}
}

// startStint starts the Managers' stint at now, unless one or a window
// is running.
func (f *foreignKey) startStint(now time.Time) {
	if now.Before(f.stintEnd) || now.Before(f.windowEnd) {
		return
	}
	f.stintEnd = now.Add(foreignStint)
}

// noteForeignGrant: this process got ks's key.
func (st *loopState) noteForeignGrant(ks *keyState, now time.Time) {
	if f := st.foreignKeyOf(ks.hash, now); f != nil {
		f.heldForeign = false
		if !now.Before(f.stintEnd) {
			f.stintEnd = now.Add(foreignStint)
		}
	}
}

// noteReleased takes the notification of a release of the key whose hash
// is hash, by any process (this one's included).
func (st *loopState) noteReleased(hash string) {
	if len(st.foreign) == 0 {
		return
	}
	now := time.Now()
	f := st.foreignKeyOf(hash, now)
	switch {
	case f == nil:
	case f.heldForeign:
		// The foreign holder let go: the Managers' stint starts.
		f.heldForeign = false
		f.windowEnd = time.Time{}
		f.stintEnd = now.Add(foreignStint)
	case now.Before(f.stintEnd) || now.Before(f.windowEnd):
	default:
		f.windowEnd = now.Add(foreignWindow) // a Manager's release after the stint
	}
}

// yieldForeign is run at a plain release of ks's key here: after the
// stint it opens the window. It reports whether a handoff may be made
// instead (the stint is running, or the key is not shared).
func (st *loopState) yieldForeign(ks *keyState) bool {
	if len(st.foreign) == 0 {
		return true
	}
	now := time.Now()
	f := st.foreignKeyOf(ks.hash, now)
	if f == nil || now.Before(f.stintEnd) {
		return true
	}
	f.windowEnd = now.Add(foreignWindow)
	return false
}

// foreignWait reports whether ks's key is in a window left to foreign
// pollers, and if so schedules its next attempt for the window's end.
func (st *loopState) foreignWait(ks *keyState) bool {
	if len(st.foreign) == 0 {
		return false
	}
	now := time.Now()
	f := st.foreignKeyOf(ks.hash, now)
	if f == nil || !now.Before(f.windowEnd) {
		return false
	}
	ks.retryAt = f.windowEnd
	ks.retryGen++
	heap.Push(&st.retries, retryEntry{at: ks.retryAt, ks: ks, gen: ks.retryGen})
	return true
}

// handOffItem is one handoff: the holder's release and the head waiter's
// attempt.
type handOffItem struct {
	rel releaseItem
	a   *attempt
}

// queueHandOff turns the release it of an exclusive lease of a key with
// local waiters into a handoff, when nothing else is going on for the
// key: no attempt, no other release in flight (it's own is counted in
// ks.releasing), the lock not lost, an exclusive waiter at the head (the
// store hands over exclusive leases only), no shared hold left here, no
// set waiter's turn (sets.go), and fewer than maxLocalHandOffs handoffs
// of the key in a row. It reports whether it did; otherwise the caller
// queues a plain release.
func (st *loopState) queueHandOff(it releaseItem) bool {
	ks := it.ks
	if ks == nil {
		return false
	}
	if !st.yieldForeign(ks) || st.closing || it.lost != nil || len(ks.queue) == 0 || ks.queue[0].shared || ks.nShared > 0 || ks.inTurn() ||
		ks.attempt != nil || ks.releasing != 1 || ks.handOffs >= maxLocalHandOffs {
		ks.handOffs = 0
		return false
	}
	ks.handOffs++
	st.clearRetry(ks)
	ks.woken = false
	ks.chains++
	a := &attempt{ks: ks, lockID: keys.NewLockID(), ttl: ks.queue[0].ttl, delayMs: ks.queue[0].delayMs(), chain: ks.chains}
	ks.attempt = a
	st.handOffs.add(handOffItem{rel: it, a: a})
	return true
}

// keepHandOff settles a pending handoff whose waiters all left meanwhile,
// or any during Close: it goes out as a plain release.
func (st *loopState) keepHandOff(h handOffItem) bool {
	if st.closing || len(h.a.ks.queue) == 0 {
		h.a.ks.attempt = nil
		st.releases.add(h.rel)
		return false
	}
	return true
}

// sendHandOffs starts a handoff batch (loop side of sendHandOff). Its
// lane sends as many as the acquire cap allows (a handoff's grant is an
// acquire: durable); both halves are posted back (releaseDone,
// acquireDone), each landing the slot of its kind.
func (st *loopState) sendHandOffs(fl *flight, batch []handOffItem) {
	atts := make([]*attempt, len(batch))
	rels := make([]releaseItem, len(batch))
	for i, h := range batch {
		atts[i], rels[i] = h.a, h.rel
	}
	fl.attempts = atts
	// A handoff of one key is made for the head waiter (it grants it):
	// a child of that waiter's acquire span, linked to the releaser's
	// release span and the other waiters (roundTripSpans).
	parent, served := roundTripSpans(atts, rels)
	st.m.spawn(func() { st.m.sendHandOff(fl, batch, parent, served) })
}

// sendHandOff runs in its own goroutine, never on the loop.
func (m *Manager) sendHandOff(fl *flight, batch []handOffItem, parent trace.SpanContext, served []trace.SpanContext) {
	reqs := make([]store.HandOffRequest, len(batch))
	rels := make([]releaseItem, len(batch))
	atts := make([]*attempt, len(batch))
	for i, h := range batch {
		reqs[i] = store.HandOffRequest{Old: h.rel.lockID, Key: h.a.ks.key, TTL: h.a.ttl, LockID: h.a.lockID, LockDelay: h.a.lockDelay()}
		rels[i], atts[i] = h.rel, h.a
	}
	// Like an acquire batch: not cancelled by Close, bounded by the
	// statement timeout, so that its outcome is known.
	ctx, cancel := context.WithTimeoutCause(context.Background(), m.cfg.StatementTimeout, pgerr.ErrStatementTimeout)
	defer cancel()
	m.beforeBatch(kindHandOff, len(batch))
	ctx, db := m.rec.StartDB(ctx, obs.OpHandOff, len(batch), parent, served...)
	start := time.Now()
	res, err := m.store.HandOff(ctx, reqs)
	var released []bool
	var granted []store.AcquireResult
	ok := 0
	if err == nil {
		released = make([]bool, len(res))
		granted = make([]store.AcquireResult, len(res))
		for i, r := range res {
			released[i], granted[i] = r.Released, r.AcquireResult
			if r.OK {
				ok++
			}
		}
	}
	db.End(ok, err)
	sc := db.SpanContext()
	for _, a := range atts {
		a.db = sc
	}
	m.releaseDoneCh <- releaseDone{fl: fl, batch: rels, res: released, err: err, db: sc}
	m.acquireDoneCh <- acquireDone{fl: fl, batch: atts, start: start, res: granted, err: err, db: sc}
}
