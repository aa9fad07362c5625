package retry

import "time"

// Jitter is how a nominal delay d is randomised, so that processes that
// found a key held at the same moment do not all retry at the same
// moment again.
type Jitter uint8

const (
	// EqualJitter draws the delay uniformly from [d/2, d] (the default,
	// SyncGuard's "equal"): spread out, yet never much shorter than d.
	EqualJitter Jitter = iota
	// FullJitter draws the delay uniformly from [0, d): the widest spread,
	// at the cost of some retries coming almost at once.
	FullJitter
	// NoJitter uses d itself: predictable delays, for tests and for a
	// single waiter.
	NoJitter
)

// Policy is the retry schedule of a contended key: how long a Manager
// waits after an attempt that found the key held (or failed) before it
// tries again, set as manager.Config.Retry. The zero value is SyncGuard's
// default: exponential backoff from a 100 ms base, ×2 per failed attempt,
// equal jitter, capped at 2 s. A bad value (see each field) makes
// manager.New fail with InvalidArgument.
//
// The n-th delay (n counted from 1) is drawn by Jitter from the nominal
// delay d = min(Base · Multiplier^(n−1), MaxDelay). A release in this
// process, or a release notification from another, starts the next
// attempt at once, whatever the delay.
type Policy struct {
	// Base is the first nominal delay. Zero means 100 ms; negative is
	// invalid.
	Base time.Duration
	// MaxDelay caps the nominal delay. Zero means 2 s, or Base when Base
	// is larger; negative, or below Base, is invalid.
	MaxDelay time.Duration
	// Multiplier is the growth of the nominal delay from one attempt to
	// the next. Zero means 2. 1 keeps every nominal delay at Base: a
	// fixed delay (Jitter still applies; NoJitter makes it exact). Other
	// values below 1, and values above 1000, are invalid.
	Multiplier float64
	// Jitter is how each delay is randomised: EqualJitter (the zero
	// value, the default), FullJitter or NoJitter. Other values are
	// invalid.
	Jitter Jitter
}
