package heartbeat

import "time"

// MinAutoExtendTTL is the smallest TTL of a lease that is extended
// automatically: below it, the two thirds of the TTL left after the
// first extend falls due are too short to retry a failed extend over a
// real network before the trust window ends. (A lease that is not
// extended, only taken and released, may be shorter.)
const MinAutoExtendTTL = 300 * time.Millisecond

// Bounds of the default margin (Lease.Margin zero).
const (
	minMargin = 10 * time.Millisecond
	maxMargin = 5 * time.Second
)

// minRetry is the smallest pause between two failed extend attempts.
const minRetry = 10 * time.Millisecond

// defaultMargin is the margin of a Lease with a zero Margin: ttl/10,
// at least 10 ms and at most 5 s.
func defaultMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/10, minMargin), maxMargin)
}

// Lease is the timing of one held lease, as the holder sees it on its own
// clock: when to extend it, until when it may be trusted, when to retry a
// failed extend. Its methods are pure functions of its fields and the
// time given.
type Lease struct {
	// TTL is the TTL the last successful acquire or extend asked for.
	TTL time.Duration
	// Start is the time on this process's clock (Now) taken just before
	// that acquire or extend was sent: the window is anchored at the
	// send, so a slow round trip shortens it instead of stretching it.
	Start time.Time
	// Margin is cut from the end of the window. It must cover the
	// difference between the clock rates of this machine and the server
	// over one TTL, and the time the holder's code needs to notice the
	// loss and stop writing. Zero means TTL/10, at least 10 ms and at
	// most 5 s: min(max(TTL/10, 10 ms), 5 s), the Manager's default too
	// (manager.Config.LossMargin).
	Margin time.Duration
}

func (l Lease) margin() time.Duration {
	if l.Margin > 0 {
		return l.Margin
	}
	return defaultMargin(l.TTL)
}

// NextExtend returns when the lease should be extended: Start + TTL/3,
// as etcd renews its leases, which leaves the other two thirds of the
// TTL for retries of a failing extend.
func (l Lease) NextExtend() time.Time {
	return l.Start.Add(l.TTL / 3)
}

// TrustedUntil returns Start + TTL − margin: from then on the lease must
// be treated as lost, whatever an extend still in flight may answer. The
// server expires the lease at its own now() + TTL, with now() taken after
// Start, and gives the key to another holder only 1 s after that, so the
// holder stops trusting the lease first. The lease may be trusted at now
// (a time on the same clock as Start: Now) while
// now.Before(l.TrustedUntil()).
func (l Lease) TrustedUntil() time.Time {
	return l.Start.Add(l.TTL - l.margin())
}

// RetryAt returns when to try again after an extend failed at failedAt
// without an answer that the lease is gone (a timeout, a broken
// connection): TTL/10 later, at least 10 ms, so a short outage costs a few
// tries and not a flood; but no later than TrustedUntil, when the lease
// is lost anyway.
func (l Lease) RetryAt(failedAt time.Time) time.Time {
	at := failedAt.Add(max(l.TTL/10, minRetry))
	if end := l.TrustedUntil(); at.After(end) {
		return end
	}
	return at
}
