// Package retry is pglease's retry schedule: the Policy a Manager follows
// between two attempts to take a contended key (manager.Config.Retry), and
// the schedule itself (Policy.NewBackOff, a github.com/cenkalti/backoff/v4
// BackOff), which the Manager runs for each key it waits for and which
// code that retries on its own, with pg.Store for instance, can run too.
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
// Full jitter gives [0, d) and no jitter gives d; a Multiplier of 1 keeps
// d = Base for every attempt (a fixed delay). MaxDelay (default 2 s) caps
// the nominal delay d; SyncGuard has no cap, but its 5 s acquire timeout
// makes delays beyond 3.2 s unreachable, and a cap keeps the polling
// fallback responsive when a wake-up notification is lost during a long
// wait.
//
// # Guarantees
//
//   - Every delay lies in the bounds above; a delay is never negative and
//     never exceeds MaxDelay.
//   - The schedule never gives up: the caller's context, or the acquire
//     timeout, bounds the wait.
//   - The schedule is pure: it starts no goroutine, owns no timer and never
//     sleeps. Each key waited for has its own (NewBackOff), owned by the
//     Manager's loop, which arms its own timer; a success starts the key's
//     schedule again from Base (Reset).
package retry
