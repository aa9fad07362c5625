package kernel

import (
	"iter"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/retry"
)

// Now reads the clock the Manager times everything with: heartbeat.Now,
// which counts the time the machine was suspended, where Go's monotonic
// clock (time.Now) stops, so that a lease the server expired during a
// suspend is not trusted after the resume ("The trust window" in the
// package documentation). Every time the loop keeps, compares or arms a
// timer for comes from it: a time from time.Now would be off by the
// suspended time. Safe from any goroutine.
func (m *Kernel) Now() time.Time {
	if m.Test.Clock != nil {
		return m.Test.Clock()
	}
	return heartbeat.Now()
}

// DefaultMargin is the loss margin of a lease of ttl when
// Config.LossMargin is zero: the margin package heartbeat cuts from a
// Lease with a zero Margin (TTL/10 within [10 ms, 5 s]), read from
// heartbeat itself so the two can not drift apart.
func DefaultMargin(ttl time.Duration) time.Duration {
	var start time.Time
	return ttl - heartbeat.Lease{TTL: ttl, Start: start}.TrustedUntil().Sub(start)
}

// newBackOff returns p's schedule (retry.Policy.NewBackOff) for one key
// or one wait. New validated p, so an error here is a bug.
func newBackOff(p retry.Policy) backoff.BackOff {
	b, err := p.NewBackOff()
	if err != nil {
		panic(err)
	}
	return b
}

// heldLease is a held lease's heartbeat state: package heartbeat's
// policy (Start, TTL, Margin: when to extend, until when to trust) plus
// what the loop tracks for it. Owned by run.
type heldLease struct {
	heartbeat.Lease
	// Manual is true for a lease that is not extended automatically
	// (WithoutAutoExtend, or past its hold limit): it is never due, but
	// its trust deadline still applies.
	Manual bool
	// Pending is true while an extend of this lease is queued or in
	// flight: it is not due again, but its trust deadline still applies.
	Pending bool
	// NotBefore, if set, is the earliest time of the next extend attempt
	// (after a failure: heartbeat.Lease.RetryAt).
	NotBefore time.Time
}

// slack returns how early, before its due time, a lease is extended when
// another lease's extend goes out anyway: ttl/12, so neighbouring leases
// share one round trip.
func slack(ttl time.Duration) time.Duration { return ttl / 12 }

// ValidMargin reports whether margin is usable with an auto-extended ttl:
// positive and small enough that the trust window still reaches past the
// first extend (t + ttl/3 < t + ttl − margin).
func ValidMargin(ttl, margin time.Duration) bool {
	return margin > 0 && margin < ttl-ttl/3
}

// NextExtend returns when the next extend is due: the policy's, or
// NotBefore if that is later.
func (l heldLease) NextExtend() time.Time {
	at := l.Lease.NextExtend()
	if l.NotBefore.After(at) {
		return l.NotBefore
	}
	return at
}

// due reports whether an extend should be sent at now: the lease is
// trusted, auto-extended, has no extend pending, and its NextExtend is at
// most slack(TTL) away.
func (l heldLease) due(now time.Time) bool {
	if l.Manual || l.Pending || !now.Before(l.TrustedUntil()) {
		return false
	}
	if now.Before(l.NotBefore) {
		return false
	}
	return !now.Before(l.NextExtend().Add(-slack(l.TTL)))
}

// NextEvent returns the earliest time at which something happens to the
// lease: its extend falls due, or its trust runs out.
func (l heldLease) NextEvent() time.Time {
	end := l.TrustedUntil()
	if l.Manual || l.Pending {
		return end
	}
	if ne := l.NextExtend(); ne.Before(end) {
		return ne
	}
	return end
}

// hbTick is what one heartbeat tick found.
type hbTick[K comparable] struct {
	due  []K       // the leases to extend now, in one batch
	lost []K       // the leases whose trust window has passed
	next time.Time // the earliest NextEvent of the others (zero: none): when to tick again
}

// collectLeases classifies every lease at now: lost (trust ran out), due
// (extend in this tick's batch), or neither, and returns when the next
// tick is needed. It is the one call per tick of the loop.
func collectLeases[K comparable](now time.Time, leases iter.Seq2[K, heldLease]) hbTick[K] {
	var t hbTick[K]
	for k, l := range leases {
		switch {
		case !now.Before(l.TrustedUntil()):
			t.lost = append(t.lost, k)
			continue
		case l.due(now):
			t.due = append(t.due, k)
			// An extend about to go out: its deadline still matters.
			l.Pending = true
		}
		if ev := l.NextEvent(); t.next.IsZero() || ev.Before(t.next) {
			t.next = ev
		}
	}
	return t
}
