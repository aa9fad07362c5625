// Package heartbeat is the lease-timing policy of pglease: for a held
// lease, when to extend it, until when it may be trusted, when to retry a
// failed extend, and the smallest TTL that can be extended automatically.
// The Manager (package manager) follows it for every lease it holds; code
// that takes leases itself with pg.Store follows the same rules by
// calling it. It is pure policy: it starts no goroutine, owns no timer and
// never sleeps; the caller arms its own timer for the times it returns.
//
// # The trust window
//
// Let t be the time taken just before the last successful acquire or
// extend was sent (the attempt's start, not its end), and ttl the TTL it
// asked for. The server computes expires_at = now_txn + ttl with
// now_txn ≥ t, and grants the key to somebody else only after expires_at
// plus its 1000 ms tolerance. So, on the holder's clock, the lease is
// certainly the holder's until t + ttl, and
//
//	trustedUntil = t + ttl − margin
//
// is where the holder stops trusting it. Anchoring at the attempt's start
// means a slow round trip shortens the window instead of stretching it.
// The margin absorbs the clock-rate error between this process and the
// server and the time the holder's code needs to notice the loss;
// A zero Lease.Margin is ttl/10 within [10 ms, 5 s].
//
//	t            t+ttl/3             t+ttl−margin   t+ttl      t+ttl+1s
//	|--- held ------|--- extend due ------|--- lost ---|-- expired --|-- others may acquire
//
// # Schedule
//
//   - The next extend is due at t + ttl/3 (etcd renews at ttl/3), which
//     leaves two more thirds of the TTL for retries of a failing extend.
//   - After a failed extend the next try is at RetryAt: ttl/10 later (at
//     least 10 ms), never after trustedUntil.
//   - Once now ≥ trustedUntil the lease is lost, whatever an in-flight
//     extend may still answer: stop writing (and fence the writes, because
//     no check closes the gap between it and the write).
//
// MinAutoExtendTTL (300 ms) is the smallest TTL a lease may have when it is
// extended automatically: below it the window left for retries is too short
// for a real network.
//
// # The clock
//
// Take t and now from Now, not from time.Now. Go's monotonic clock stops
// while the machine is suspended (golang/go#24595), but the server's clock
// does not: after a resume, time.Now would still trust a lease the server
// expired during the suspend. Now counts the suspended time (CLOCK_BOOTTIME
// on Linux; elsewhere, from how far the wall clock moved ahead of the
// monotonic clock). Now keeps one count of the suspended time for the
// process; everything else in the package is a function of its arguments.
package heartbeat
