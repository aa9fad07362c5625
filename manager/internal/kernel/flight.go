package kernel

import (
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// A statement sent on a dead pooled connection (half-open, blackholed)
// gets no answer until its deadline (Config.StatementTimeout). Two things
// keep such a connection from stalling more than the callers it carried:
//
//   - In-flight caps count only batches younger than stuckAfter: an older
//     one no longer holds back the batches of its kind that come after it
//     (the total stays bounded by the cap plus the pool's MaxConns).
//   - The attempts of an acquire batch (or handoff) older than stuckAfter
//     are hedged: each key whose current attempt it carries gets a new
//     attempt, with a new lockId, in the same chain, on another connection
//     (at most maxHedges per chain). The first answer of any attempt of
//     the chain is the key's answer (granted, locked or failed); the
//     others become stale: whatever they grant, or leave unknown, is
//     released when their answer comes (ambiguity is never success), and they never grant a
//     waiter. All are ordinary acquires, serialized by the server per key,
//     so at most one can be granted while another is live.
//
// So a dead connection costs the callers whose statement it carried about
// stuckAfter, not the statement timeout, and nobody else anything; an
// attempt that is merely slow (a lock wait on the server) still gets its
// answer, from whichever attempt of its chain answers first.

// StuckAfterMax bounds stuckAfter; with a statement timeout shorter than
// twice that, stuckAfter is half the statement timeout.
const StuckAfterMax = time.Second

func (m *Kernel) stuckAfter() time.Duration {
	if m.Test.StuckAfter > 0 {
		return m.Test.StuckAfter
	}
	return min(StuckAfterMax, m.cfg.StatementTimeout/2)
}

// flight is one batch in flight. Owned by run; the DB worker only
// carries the pointer back in its done messages (a handoff posts two: one
// for each slot it took).
type flight struct {
	spec     *batchSpec // its lane's kind and slots (lane.go)
	start    time.Time
	landed   uint8         // bit i: the done message for spec.slots[i] has landed
	attempts []*Attempt    // the attempts it carries (acquires, handoffs): hedged when it is stuck
	stuck    bool          // older than stuckAfter: the caps no longer count it
	slack    time.Duration // an extend batch: from its start to the earliest trust deadline of its leases (overload.go)
}

// checkStuck marks the batches older than stuckAfter as stuck and hedges
// their attempts.
func (st *LoopState) checkStuck(now time.Time) {
	after := st.m.stuckAfter()
	for fl := range st.flights {
		if fl.stuck || now.Sub(fl.start) < after {
			continue
		}
		fl.stuck = true
		for i, s := range fl.spec.slots {
			if fl.landed&(1<<i) == 0 { // still counted there
				s.stuck++
			}
		}
		if st.closing || st.shed.on {
			continue // shedding: a slow server, not a dead connection, is the likelier cause (overload.go)
		}
		for _, a := range fl.attempts {
			st.noAnswer(a, after)
			st.hedge(a)
		}
		st.sig().Stuck.signal(fl.spec.kind)
	}
}

// maxHedges bounds the hedges of one attempt: an attempt that is merely
// slow (waiting for a lock on the server) must not make the key pile up
// attempts, each holding a connection.
const maxHedges = 2

// hedge starts a new attempt for a's key in a's chain if a is the key's
// current attempt and may still be hedged; a becomes stale.
func (st *LoopState) hedge(a *Attempt) {
	ks := a.Ks
	if ks == nil || ks.attempt != a || a.hedges >= maxHedges || len(ks.queue) == 0 || ks.holder != nil || ks.releasing > 0 {
		return
	}
	a.stale = true
	ks.stale++
	h := &Attempt{Ks: ks, lockID: keys.NewLockID(), ttl: a.ttl, delayMs: a.delayMs, chain: a.chain, hedges: a.hedges + 1}
	h.Kind = a.Kind.again(a, h.lockID)
	ks.attempt = h
	h.Kind.lane(st).add(h)
}

// noAnswer records, for a key whose current attempt a is stuck and that
// has no failure on record, that the database has not answered: a wait
// that ends before any answer comes ended on an outage, not on contention
// (waitErr). The next answer that reaches the database clears it.
func (st *LoopState) noAnswer(a *Attempt, after time.Duration) {
	ks := a.Ks
	if a.try != nil || ks == nil || ks.attempt == nil || ks.attempt.chain != a.chain || ks.lastErr != nil {
		return
	}
	ks.lastErr = pgerr.New(pglease.CodeNetworkTimeout, "manager.Acquire",
		"no answer from the database within "+after.String(), nil)
}

// nextStuck returns when the oldest batch not yet stuck becomes stuck
// (zero: none in flight).
func (st *LoopState) nextStuck() time.Time {
	var next time.Time
	after := st.m.stuckAfter()
	for fl := range st.flights {
		if fl.stuck {
			continue
		}
		if at := fl.start.Add(after); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next
}

// settleStale handles the answer of a superseded attempt: it releases
// whatever the attempt granted or may have granted and reports true; or,
// for the first answer of the key's current chain, makes the attempt in
// flight the stale one and reports false. (Tries and sets are never
// stale: they are in no key's attempt chain.)
func (st *LoopState) settleStale(a *Attempt, d acquireDone, rs []store.AcquireResult) bool {
	ks := a.Ks
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
	for j := range a.Kind.holds(a) {
		if a.Kind.owns(a, j, true) {
			// Its caller holds the grant of this lockId, or still waits
			// with it (its kind's). A release now could end a later
			// grant of the same lockId.
			continue
		}
		if mayHaveGranted(d.err) || (d.err == nil && rs[j].OK) {
			// Not blocking the key's attempts: this release may meet a
			// dead connection too.
			id, _, _ := a.Kind.hold(a, j)
			st.releases.add(releaseItem{lockID: id, key: ks.Key, ks: ks, unblocked: true, ttl: a.ttl, sc: a.db, pending: mayHaveGranted(d.err)})
		}
	}
	st.gc(ks)
	return true
}
