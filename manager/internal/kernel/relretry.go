package kernel

import (
	"math/rand/v2"
	"time"
)

// Releases whose outcome is unknown are retried. A release
// that fails because the database does not answer (a crash, a failover, a
// dead connection) may or may not have happened; until it does, the key's
// row blocks every acquirer, of this process and of others, until the
// lease expires (+ the 1 s takeover tolerance): at the default 30 s TTL,
// half a minute after a failover that took a second. Releasing by lockId
// is safe to repeat (a second release of a row that is gone, or that
// another grant has replaced, changes nothing), so the loop sends it again,
// with backoff, until the server answers, for as long as the lease can
// still be live on the server: its last acquire or extend was answered
// before the first failure, so it expires at most TTL after it (plus the
// statement timeout and a second of slack for an acquire whose outcome was
// unknown). During Close, all of them are sent once more at once; then
// the releases of locks handed to callers are retried until the end of
// CloseTimeout, and the others (lockIds no caller ever got) not at all.
//
// The caller of Release gets the first failure at once (the release goes
// on in the background); a retried release answers nobody. The key's
// local waiters keep waiting for it, as for any release in flight, and try
// as soon as it is answered.

// Release retry backoff: relRetryBase × 2^(n−1), capped at relRetryMax,
// with equal jitter.
const (
	relRetryBase = 100 * time.Millisecond
	relRetryMax  = 2 * time.Second
)

func relRetryDelay(n int, jitter func(time.Duration) time.Duration) time.Duration {
	d := relRetryBase
	for i := 1; i < n && d < relRetryMax; i++ {
		d *= 2
	}
	d = min(d, relRetryMax)
	if jitter == nil {
		jitter = rand.N[time.Duration]
	}
	return d/2 + jitter(d/2+1)
}

// retryRelease schedules it again after a failure with an unknown
// outcome, and reports whether it did (false: the lease has surely
// expired, or Close's time is up; the release is final).
func (st *LoopState) retryRelease(it releaseItem, now time.Time) bool {
	if it.until.IsZero() {
		ttl := it.ttl
		if ttl <= 0 {
			ttl = st.m.cfg.TTL
		}
		it.until = now.Add(ttl + st.m.cfg.StatementTimeout + time.Second)
	}
	bound := it.until
	if st.closing {
		if !it.handed {
			return false // best effort during Close: no caller holds it (Close)
		}
		if st.closeBy.Before(bound) {
			bound = st.closeBy
		}
	}
	it.tries++
	it.at = now.Add(relRetryDelay(it.tries, st.m.Test.jitter))
	if !it.at.Before(bound) {
		return false
	}
	it.retry = true
	st.relRetries = append(st.relRetries, it)
	st.sig().ReleaseRetry.signal(it.lockID)
	return true
}

// dueReleases moves the retries due at now to the next release batch.
func (st *LoopState) dueReleases(now time.Time) {
	keep := st.relRetries[:0]
	for _, it := range st.relRetries {
		if it.at.After(now) {
			keep = append(keep, it)
			continue
		}
		st.releases.add(it)
	}
	clear(st.relRetries[len(keep):])
	st.relRetries = keep
}

// nextReleaseRetry returns when the earliest retry is due (zero: none).
func (st *LoopState) nextReleaseRetry() time.Time {
	var next time.Time
	for _, it := range st.relRetries {
		if next.IsZero() || it.at.Before(next) {
			next = it.at
		}
	}
	return next
}
