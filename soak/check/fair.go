package check

import (
	"fmt"
	"sort"
	"time"

	"github.com/pglease/pglease/soak/event"
)

// fairRTT is the fair-order tolerance's allowance for a waiter's first
// attempt, the statement that enqueues its ticket: one round trip on a
// loaded 2-core machine with -race workers, and the Manager's batching of
// the attempts of one key.
const fairRTT = 250 * time.Millisecond

// fairQuiet is how long after a fault heals its target's (every worker's,
// for a server fault) waiters are left out of fair-order, in TTLs: a
// ticket the fault let expire (life 3 s) was enqueued again at the tail,
// which the queue allows.
const fairQuiet = 3

// fairTolerance is how much earlier than another a waiter must have called
// Acquire for fair-order to require it be granted first: the Manager
// refreshes its tickets every min(3 s, TTL)/3 and a waiter's ticket is
// enqueued by its first attempt (at most a refresh interval after the call
// when a caller of its process holds the key or an attempt of the key is
// in flight), plus fairRTT.
func (r *run) fairTolerance() time.Duration {
	return min(3*time.Second, r.meta.TTL)/3 + fairRTT
}

// faultNear reports whether a fault hit worker w, or the server, during
// [from, to] or within fairQuiet TTLs before from.
func (r *run) faultNear(w int, from, to int64) bool {
	quiet := int64(fairQuiet * r.meta.TTL)
	for _, f := range r.faults {
		if f.w != w && f.w != -1 {
			continue
		}
		end := f.healT
		if end == 0 {
			end = r.endT
		}
		if f.startT <= to && end+quiet >= from {
			return true
		}
	}
	return false
}

// checkFair: the fair queue (manager.Config.FairQueue, docs/fairness.md)
// serves a key's waiters in arrival order across processes. For every two
// exclusive grants a and b of one key (lease keys, writers, exclusive
// grants of semaphore keys; not sets, whose tickets go back to the tail
// when a key of theirs was taken meanwhile) where a's Acquire was called
// more than the tolerance before b's and b was called while a still
// waited: a is granted first in the server's order, i.e. a's fence is the
// lower (fences per key increase in commit order: the fences check). A
// waiter that ended otherwise (timeout, cancel, error, death) has no
// grant and is in no pair. Pairs with a fault on either waiter's worker
// or on the server during the waits, or fairQuiet TTLs before, are
// skipped (a fault can let a ticket expire; its caller queues again at
// the tail). Only runs with -fair are checked.
func (r *run) checkFair() *Check {
	tol := r.fairTolerance()
	c := &Check{Name: CFair, Guarantee: fmt.Sprintf("fair queue: of two exclusive waiters of a key that waited at once, no fault near, the one that called Acquire more than %s earlier is granted first (the lower fence)", ms(tol))}
	byKey := map[int][]*grant{}
	for _, g := range r.grants {
		if g.kind == event.KindExclusive && g.okT > 0 && g.fence > 0 {
			byKey[g.key] = append(byKey[g.key], g)
		}
	}
	for _, gs := range byKey {
		sort.Slice(gs, func(i, j int) bool { return gs[i].callT < gs[j].callT })
		for i, a := range gs {
			censored := r.faultNear(a.w, a.callT, a.okT)
			for _, b := range gs[i+1:] {
				if b.callT >= a.okT {
					break // a was granted before b called
				}
				if time.Duration(b.callT-a.callT) <= tol {
					continue
				}
				if censored || r.faultNear(b.w, b.callT, b.okT) {
					c.Skipped++
					continue
				}
				c.Checked++
				if b.fence < a.fence {
					c.fail("%s: worker %d.%d called Acquire %s before worker %d.%d, both waited with no fault near, and was granted after it (fence %d, waited %s; the other's fence %d, waited %s)",
						kn(a.key), a.w, a.inc, ms(time.Duration(b.callT-a.callT)), b.w, b.inc,
						a.fence, ms(time.Duration(a.okT-a.callT)), b.fence, ms(time.Duration(b.okT-b.callT)))
				}
			}
		}
	}
	return c
}
