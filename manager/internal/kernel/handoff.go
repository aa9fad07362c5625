package kernel

import (
	"context"

	"go.opentelemetry.io/otel/trace"

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
// each of them, and the DB goroutine posts the outcome as one releaseDone
// carrying an acquireDone (then), which run handles as usual, one after
// the other in the same event (the releaser's answer, then the attempt's
// grant, contention or failure). An unknown
// outcome is unknown for both halves: the release answers as an unknown
// release does (the lock expires by itself if it was not handed over), and
// the attempt's lockId is released like any ambiguous attempt's (ambiguity is never success).

// MaxLocalHandOffs bounds how many times in a row a key is handed over
// inside this process. The next release is a plain one: it notifies, and
// waiters of other processes (woken by it) race this process's next
// waiter for the key. Without the bound, a process whose callers keep
// coming back for a hot key would keep it forever, and other processes'
// waiters would time out. (A key shared with foreign holders has a
// stricter bound, in time: see foreign.go.)
const MaxLocalHandOffs = 4

// handOffItem is one handoff: the holder's release and the head waiter's
// attempt.
type handOffItem struct {
	rel releaseItem
	a   *Attempt
}

// queueHandOff turns the release it of an exclusive lease of a key with
// local waiters into a handoff, when nothing else is going on for the
// key: no attempt, no other release in flight (it's own is counted in
// ks.releasing), the lock not lost, an exclusive waiter at the head (the
// store hands over exclusive leases only), no shared hold left here, no
// set waiter's turn (sets.go), and fewer than maxLocalHandOffs handoffs
// of the key in a row. It reports whether it did; otherwise the caller
// queues a plain release.
func (st *LoopState) queueHandOff(it releaseItem) bool {
	ks := it.ks
	if ks == nil {
		return false
	}
	if st.fair() || !st.yieldForeign(ks) || st.closing || it.lost != nil || len(ks.queue) == 0 || ks.queue[0].Shared || ks.nShared > 0 || ks.inTurn() ||
		ks.attempt != nil || ks.releasing != 1 || ks.handOffs >= MaxLocalHandOffs {
		ks.handOffs = 0
		return false
	}
	ks.handOffs++
	st.clearRetry(ks)
	ks.woken = false
	ks.chains++
	a := newAttempt(ks, ks.queue[0], ks.chains)
	ks.attempt = a
	st.handOffs.add(handOffItem{rel: it, a: a})
	return true
}

// keepHandOff settles a pending handoff whose waiters all left meanwhile,
// or any during Close: it goes out as a plain release.
func (st *LoopState) keepHandOff(h handOffItem) bool {
	if st.closing || len(h.a.Ks.queue) == 0 {
		h.a.Ks.attempt = nil
		st.releases.add(h.rel)
		return false
	}
	return true
}

// sendHandOffs starts a handoff batch (loop side of sendHandOff). Its
// lane sends as many as the acquire cap allows (a handoff's grant is an
// acquire: durable); both halves are posted back (releaseDone,
// acquireDone), each landing the slot of its kind.
func (st *LoopState) sendHandOffs(fl *flight, batch []handOffItem) {
	atts := make([]*Attempt, len(batch))
	rels := make([]releaseItem, len(batch))
	for i, h := range batch {
		atts[i], rels[i] = h.a, h.rel
	}
	fl.attempts = atts
	// A handoff of one key is made for the head waiter (it grants it):
	// a child of that waiter's acquire span, linked to the releaser's
	// release span and the other waiters (roundTripSpans).
	parent, served := roundTripSpans(atts, rels)
	st.Start(fl, len(batch), func() { st.m.sendHandOff(fl, batch, parent, served) })
}

// sendHandOff runs in its own goroutine, never on the loop.
func (m *Kernel) sendHandOff(fl *flight, batch []handOffItem, parent trace.SpanContext, served []trace.SpanContext) {
	reqs := make([]store.HandOffRequest, len(batch))
	rels := make([]releaseItem, len(batch))
	atts := make([]*Attempt, len(batch))
	for i, h := range batch {
		reqs[i] = store.HandOffRequest{Old: h.rel.lockID, Key: h.a.Ks.Key, TTL: h.a.ttl, LockID: h.a.lockID, LockDelay: h.a.lockDelay()}
		rels[i], atts[i] = h.rel, h.a
	}
	// Like an acquire batch: not cancelled by Close, bounded by the
	// statement timeout, so that its outcome is known.
	ctx, cancel := context.WithTimeoutCause(context.Background(), m.cfg.StatementTimeout, pgerr.ErrStatementTimeout)
	defer cancel()
	m.beforeBatch(KindHandOff, len(batch))
	ctx, db := m.Rec.StartDB(ctx, obs.OpHandOff, len(batch), parent, served...)
	start := m.Now()
	res, err := m.Store.HandOff(ctx, reqs)
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
	// One event, the release half first: the releaser's answer, then the
	// grant (or contention, or failure) of the head waiter.
	m.releaseDoneCh <- releaseDone{fl: fl, batch: rels, res: released, err: err, db: sc,
		then: &acquireDone{fl: fl, batch: atts, start: start, res: granted, err: err, db: sc}}
}
