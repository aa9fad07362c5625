package kernel

import (
	"errors"
	"time"

	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
)

// Renewals first. Under overload a lock service sheds new work and never
// lets held leases lapse, so extends win over acquires for connections,
// for the loop's attention and for the server's time:
//
//   - Connections: acquire, release and handoff batches take at most
//     max(1, the pool's MaxConns − 1) connections together, stuck ones
//     included, so an extend never waits for a pool connection behind
//     them (room, lane.go); with MaxConns 1 an extend waits for at most
//     one round trip. Other users of the pool (watch reads, Revoke,
//     elections' lookups, the caller's own queries) are not counted.
//   - Server time: every answered round trip's duration (from the moment
//     the loop launched it: waiting for a connection included) is watched.
//     One slower than slowRoundTrip (plus a little per item it carried),
//     or an extend slower than a quarter of its leases' slack (and than
//     slowRoundTripMin: a short TTL's slack is small), or an
//     extend that failed by its deadline, is pressure: the Manager starts
//     shedding. While it sheds, acquire batches (exclusive, shared, sets;
//     not releases, handoffs or extends) go out at most one per gap, and
//     stuck batches are not hedged (a slow server, not a dead connection,
//     is the likelier cause; a hedge would only add load).
//     The gap starts at the slow round trip's duration (at least
//     shedGapMin), doubles at each pressure one round trip or more after
//     the last doubling, up to shedGapMax, and shrinks by an eighth at
//     each round trip answered in less than a quarter of slowRoundTrip.
//     Shedding ends when no pressure has been seen, and no batch has been
//     in flight longer than slowRoundTrip, for shedCalm (shedDue, on
//     run's timer). Every Manager of a fleet does the same, so the
//     fleet's acquires back off together until the extends fit.
//   - Visibility: pglease.manager.overload is 1 while the Manager sheds,
//     one Warn log record says when it starts (the round trip that started
//     it), one Info record when it ends; an acquire that times out while
//     the Manager sheds says so in its error.
//
// Waiters are not failed by shedding: they wait longer (their acquire
// timeout or context bounds the wait), and releases go out as usual.
const (
	slowRoundTripMax = 500 * time.Millisecond
	slowRoundTripMin = 50 * time.Millisecond
	// slowPerItem is what one more item of a batch may add to its round
	// trip before it counts as slow (a 10,000-key batch: 200 ms).
	slowPerItem = 20 * time.Microsecond
	shedGapMin  = 20 * time.Millisecond
	shedGapMax  = 2 * time.Second
	shedCalm    = 5 * time.Second
)

// slowRoundTrip is the round trip beyond which an answered batch counts
// as pressure: a tenth of StatementTimeout, within [50 ms, 500 ms].
func (m *Kernel) slowRoundTrip() time.Duration {
	if m.Test.slowRoundTrip > 0 {
		return m.Test.slowRoundTrip
	}
	return min(max(m.cfg.StatementTimeout/10, slowRoundTripMin), slowRoundTripMax)
}

func (m *Kernel) shedCalm() time.Duration {
	if m.Test.ShedCalm > 0 {
		return m.Test.ShedCalm
	}
	return shedCalm
}

// overload is the Manager's shedding state. Owned by run.
type overload struct {
	on      bool
	gap     time.Duration // the pause between two acquire batches while on
	next    time.Time     // no acquire batch before (zero: any time)
	since   time.Time     // shedding began
	lastHit time.Time     // the last pressure
	lastCut time.Time     // the last doubling of gap
	// For the log record that ends it: the slowest round trip and the
	// longest gap while on.
	worst    time.Duration
	worstOp  obs.DBOperation
	worstGap time.Duration
}

// mayAcquire reports whether an acquire batch may go out at now.
func (o *overload) mayAcquire(now time.Time) bool {
	return !o.on || !now.Before(o.next)
}

// sentAcquire records an acquire batch sent at now.
func (o *overload) sentAcquire(now time.Time) {
	if o.on {
		o.next = now.Add(o.gap)
	}
}

// observe takes one answered (or, for an extend, timed-out) round trip
// of fl, carrying n items, into the shedding state.
func (st *LoopState) observe(fl *flight, n int, err error, now time.Time) {
	if fl == nil || st.closing {
		return
	}
	rt := now.Sub(fl.start)
	op := fl.spec.kind.op()
	slow := st.m.slowRoundTrip()
	switch {
	case fl.spec.kind == KindExtend && err != nil && errors.Is(err, pgerr.ErrStatementTimeout):
		st.pressure(rt, op, now)
	case err != nil:
		// Not answered: a dead connection or an outage, which the
		// stuck-batch and retry rules handle; no sign of overload.
	case rt > slow+time.Duration(n)*slowPerItem || (fl.spec.kind == KindExtend && fl.slack > 0 && rt > max(fl.slack/4, slowRoundTripMin)):
		st.pressure(rt, op, now)
	case rt < slow/4:
		st.calm(now)
	}
}

// pressure is a slow round trip (rt, of op) at now.
func (st *LoopState) pressure(rt time.Duration, op obs.DBOperation, now time.Time) {
	o := &st.shed
	o.lastHit = now
	if !o.on {
		*o = overload{on: true, gap: min(max(rt, shedGapMin), shedGapMax), since: now, lastHit: now, lastCut: now,
			worst: rt, worstOp: op}
		o.worstGap = o.gap
		o.next = now.Add(o.gap)
		st.m.Rec.Overload(true, obs.OverloadInfo{RoundTrip: rt, Op: op, Gap: o.gap})
		st.sig().Shedding.signal(true)
		return
	}
	if rt > o.worst {
		o.worst, o.worstOp = rt, op
	}
	if now.Sub(o.lastCut) >= max(rt, o.gap) {
		o.gap = min(2*o.gap, shedGapMax)
		o.worstGap = max(o.worstGap, o.gap)
		o.lastCut = now
	}
}

// calm is a round trip answered quickly at now: the gap shrinks.
func (st *LoopState) calm(now time.Time) {
	o := &st.shed
	if !o.on {
		return
	}
	o.gap = max(o.gap-o.gap/8, shedGapMin)
	st.shedDue(now)
}

// shedDue ends shedding when no pressure was seen for shedCalm (run's
// timer calls it at that time: nextShed).
func (st *LoopState) shedDue(now time.Time) {
	o := &st.shed
	if !o.on || now.Sub(o.lastHit) < st.m.shedCalm() {
		return
	}
	slow := st.m.slowRoundTrip()
	for fl := range st.flights {
		if now.Sub(fl.start) > slow {
			o.lastHit = now // a batch still unanswered is pressure too
			return
		}
	}
	st.m.Rec.Overload(false, obs.OverloadInfo{RoundTrip: o.worst, Op: o.worstOp, Gap: o.worstGap, Lasted: now.Sub(o.since)})
	*o = overload{}
	st.sig().Shedding.signal(false)
}

// nextShed returns when the loop must wake for shedding: when a paced
// lane with pending attempts may send again, or when shedding ends
// (zero: not shedding).
func (st *LoopState) nextShed() time.Time {
	o := &st.shed
	if !o.on {
		return time.Time{}
	}
	next := o.lastHit.Add(st.m.shedCalm())
	// A pace already past is no reason to wake: nextShed is asked after a
	// flush, which sent what the pace allowed, so what still waits waits
	// for a batch slot, and the landing batch wakes the loop (without
	// this the loop's timer stayed due and the loop spun until then).
	if !o.next.IsZero() && o.next.Before(next) && o.next.After(st.m.Now()) &&
		st.acquires.waiting()+st.sharedAcqs.waiting()+st.setAcqs.waiting() > 0 {
		next = o.next
	}
	return next
}

// ShedNote is what a wait that ended while the Manager shed adds to its
// error message.
const ShedNote = "; the database was overloaded and this Manager was holding back acquires so that held leases stay renewed"

// op names kind's round trip as telemetry does.
func (k BatchKind) op() obs.DBOperation {
	switch k {
	case KindAcquire:
		return obs.OpAcquireMany
	case KindRelease:
		return obs.OpReleaseMany
	case KindExtend:
		return obs.OpExtendMany
	case KindHandOff:
		return obs.OpHandOff
	case KindShared:
		return obs.OpAcquireShared
	case KindSets:
		return obs.OpAcquireSets
	}
	return obs.DBOperation(k)
}

// paced reports whether k's batches are acquires, which shedding paces
// (not releases, handoffs or extends).
func (k BatchKind) paced() bool {
	return k == KindAcquire || k == KindShared || k == KindSets
}
