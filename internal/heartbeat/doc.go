// Package heartbeat is the pure heartbeat policy of the Manager: given a held
// lease's TTL, the local start time of its last successful acquire or extend
// attempt, and the current time, it says when the next extend is due and
// until when the lease may be trusted. It starts no goroutine, owns no
// timer and never sleeps; the Manager loop carries its answers out.
//
// # The trust window
//
// Let t be the local monotonic time taken just before the last successful
// acquire or extend was sent (the attempt's start, not its end), and ttl the
// TTL it asked for. The server computes expires_at = now_txn + ttl with
// now_txn ≥ t, and grants the key to somebody else only after expires_at
// plus its 1000 ms tolerance. So, on the local clock, the lease is certainly
// ours until t + ttl, and
//
//	trustedUntil = t + ttl − margin
//
// is where the holder stops trusting it. Anchoring at the attempt's start
// means a slow round trip shortens the window instead of stretching it. The
// margin absorbs the clock-rate error between this process and the server
// and the time the holder's code needs to notice the loss; DefaultMargin is
// ttl/10 within [10 ms, 5 s].
//
//	t            t+ttl/3             t+ttl−margin   t+ttl      t+ttl+1s
//	|--- held ------|--- extend due ------|--- lost ---|-- expired --|-- others may acquire
//
// # Schedule
//
//   - The next extend is due at t + ttl/3 (etcd renews at ttl/3), which
//     leaves two more thirds of the TTL for retries of a failing extend.
//   - A lease whose extend is due within Slack(ttl) = ttl/12 of now is
//     extended in the same tick, so neighbouring leases share one round trip.
//   - After a failed extend the next try is at RetryAt: ttl/10 later (at
//     least 10 ms), never after trustedUntil.
//   - Once now ≥ trustedUntil the lease is lost, whatever an in-flight
//     extend may still answer.
//
// MinAutoExtendTTL (300 ms) is the smallest TTL a lease may have when it is
// extended automatically: below it the window left for retries is too short
// for a real network.
package heartbeat
