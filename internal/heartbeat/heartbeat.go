package heartbeat

import (
	"iter"
	"time"
)

// MinAutoExtendTTL is the smallest TTL accepted for an auto-extended lease.
const MinAutoExtendTTL = 300 * time.Millisecond

// Bounds of DefaultMargin.
const (
	MinMargin = 10 * time.Millisecond
	MaxMargin = 5 * time.Second
)

// minRetry is the smallest pause between two failed extend attempts.
const minRetry = 10 * time.Millisecond

// DefaultMargin returns the default safety margin for ttl: ttl/10, at least
// MinMargin and at most MaxMargin.
func DefaultMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/10, MinMargin), MaxMargin)
}

// ValidMargin reports whether margin is usable with ttl: positive and small
// enough that the trust window still extends past the first extend
// (t + ttl/3 < t + ttl − margin).
func ValidMargin(ttl, margin time.Duration) bool {
	return margin > 0 && margin < ttl-ttl/3
}

// Slack returns how early, before its due time, a lease is extended when
// another lease's extend goes out anyway: ttl/12.
func Slack(ttl time.Duration) time.Duration { return ttl / 12 }

// Lease is the heartbeat view of one held lease.
type Lease struct {
	// TTL is the TTL the last successful acquire or extend asked for.
	TTL time.Duration
	// Start is the local monotonic time taken just before that attempt was
	// sent.
	Start time.Time
	// Margin is subtracted from the end of the window; zero means
	// DefaultMargin(TTL).
	Margin time.Duration
	// Manual is true for a lease that is not extended automatically: it is
	// never due, but its trust deadline still applies.
	Manual bool
	// Pending is true while an extend of this lease is in flight: it is not
	// due again, but its trust deadline still applies.
	Pending bool
	// NotBefore, if set, is the earliest time of the next extend attempt
	// (after a failure; see RetryAt).
	NotBefore time.Time
}

func (l Lease) margin() time.Duration {
	if l.Margin > 0 {
		return l.Margin
	}
	return DefaultMargin(l.TTL)
}

// NextExtend returns when the next extend is due: Start + TTL/3, or
// NotBefore if that is later.
func (l Lease) NextExtend() time.Time {
	at := l.Start.Add(l.TTL / 3)
	if l.NotBefore.After(at) {
		return l.NotBefore
	}
	return at
}

// TrustedUntil returns Start + TTL − margin: from then on the lease is
// lost.
func (l Lease) TrustedUntil() time.Time {
	return l.Start.Add(l.TTL - l.margin())
}

// Trusted reports whether the lease may still be trusted at now.
func (l Lease) Trusted(now time.Time) bool {
	return now.Before(l.TrustedUntil())
}

// Due reports whether an extend should be sent at now: the lease is trusted,
// auto-extended, has no extend in flight, and its NextExtend is at most
// Slack(TTL) away.
func (l Lease) Due(now time.Time) bool {
	if l.Manual || l.Pending || !l.Trusted(now) {
		return false
	}
	if now.Before(l.NotBefore) {
		return false
	}
	return !now.Before(l.NextExtend().Add(-Slack(l.TTL)))
}

// NextEvent returns the earliest time at which something happens to the
// lease: its extend falls due, or its trust runs out.
func (l Lease) NextEvent() time.Time {
	end := l.TrustedUntil()
	if l.Manual || l.Pending {
		return end
	}
	if ne := l.NextExtend(); ne.Before(end) {
		return ne
	}
	return end
}

// RetryAt returns when to try again after an extend of l failed at
// failedAt (with no answer from the server that the lease is gone):
// failedAt + max(TTL/10, 10 ms), but no later than the lease's trust
// deadline (when it is lost anyway).
func RetryAt(l Lease, failedAt time.Time) time.Time {
	at := failedAt.Add(max(l.TTL/10, minRetry))
	if end := l.TrustedUntil(); at.After(end) {
		return end
	}
	return at
}

// Tick is what one heartbeat tick found.
type Tick[K comparable] struct {
	// Due lists the leases to extend now, in one batch.
	Due []K
	// Lost lists the leases whose trust window has passed.
	Lost []K
	// Next is the earliest NextEvent among the leases that are neither
	// due nor lost (zero when there are none): when to tick again.
	Next time.Time
}

// Collect classifies every lease at now: lost (trust ran out), due (extend
// in this tick's batch), or neither, and returns when the next tick is
// needed. It is the one call per tick of the Manager loop.
func Collect[K comparable](now time.Time, leases iter.Seq2[K, Lease]) Tick[K] {
	var t Tick[K]
	for k, l := range leases {
		switch {
		case !l.Trusted(now):
			t.Lost = append(t.Lost, k)
			continue
		case l.Due(now):
			t.Due = append(t.Due, k)
			// An extend about to go out: its deadline still matters.
			l.Pending = true
		}
		if ev := l.NextEvent(); t.Next.IsZero() || ev.Before(t.Next) {
			t.Next = ev
		}
	}
	return t
}
