// Package retry is the pure retry policy of pglease: it computes how long to
// wait before the next attempt to take a contended lock. It starts no
// goroutine, never sleeps and owns no timer; the caller (the Manager loop)
// asks for the next delay and arms its own timer.
//
// # Defaults (SyncGuard's)
//
// The zero Policy is SyncGuard's acquisition default: exponential backoff
// from a 100 ms base, ×2 per failed attempt, with equal jitter, so the n-th
// delay (n counted from 1) is uniform in [d/2, d] where
// d = min(100 ms · 2^(n−1), MaxDelay):
//
//	attempt   1        2         3         4         5          6
//	delay     50–100   100–200   200–400   400–800   800–1600   1000–2000 ms (capped)
//
// Full jitter gives [0, d) and no jitter gives d; Fixed backoff keeps
// d = Base for every attempt. MaxDelay (default 2 s) caps the nominal delay
// d; SyncGuard has no cap, but its 5 s acquire timeout makes delays beyond
// 3.2 s unreachable, and a cap keeps the polling fallback responsive when a
// wake-up notification is lost during a long wait.
//
// # Guarantees
//
//   - Every delay lies in the bounds above; a delay is never negative and
//     never exceeds MaxDelay.
//   - A Backoff never gives up: MaxElapsedTime of the underlying
//     cenkalti/backoff ExponentialBackOff is 0, because the caller's context
//     or acquire timeout bounds the wait (backoff's 15-minute default would
//     otherwise silently stop retrying).
//   - A Backoff is not safe for concurrent use (neither is backoff's
//     ExponentialBackOff); keep one per key, owned by one goroutine.
//   - Randomness is injectable (Options.Rand), so tests can pin the jitter.
package retry
