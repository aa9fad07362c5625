// Package backoff turns a retry.Policy into delays: the pure schedule
// (Nominal, Delay), its validation and defaults, and Backoff, the per-key
// state the Manager's loop keeps, built on cenkalti/backoff's
// ExponentialBackOff. It starts no goroutine, never sleeps and owns no
// timer; the caller asks for the next delay and arms its own timer.
//
// A Backoff never gives up: MaxElapsedTime of the underlying
// ExponentialBackOff is 0, because the caller's context or acquire
// timeout bounds the wait (backoff's 15-minute default would otherwise
// silently stop retrying). A Backoff is not safe for concurrent use
// (neither is ExponentialBackOff); keep one per key, owned by one
// goroutine. Randomness is injectable (Options.Rand), so tests can pin
// the jitter.
package backoff

import (
	"math/rand/v2"
	"time"

	cbackoff "github.com/cenkalti/backoff/v4"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/retry"
)

// Defaults of a Policy's zero fields (said in words in retry.Policy's
// documentation).
const (
	DefaultBase       = 100 * time.Millisecond
	DefaultMultiplier = 2.0
	DefaultMaxDelay   = 2 * time.Second
)

// maxMultiplier bounds Policy.Multiplier.
const maxMultiplier = 1000

// WithDefaults returns p with its zero fields set to the defaults.
func WithDefaults(p retry.Policy) retry.Policy {
	if p.Base == 0 {
		p.Base = DefaultBase
	}
	if p.Multiplier == 0 {
		p.Multiplier = DefaultMultiplier
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = max(DefaultMaxDelay, p.Base)
	}
	return p
}

// Validate reports a bad policy as a *pglease.Error with
// CodeInvalidArgument and the given op. Zero fields are valid (they mean
// the defaults).
func Validate(op string, p retry.Policy) error {
	bad := func(msg string) error { return pgerr.New(pglease.CodeInvalidArgument, op, "Retry: "+msg, nil) }
	if p.Jitter > retry.NoJitter {
		return bad("unknown jitter")
	}
	if p.Base < 0 {
		return bad("base delay must not be negative")
	}
	if p.Multiplier != 0 && !(p.Multiplier >= 1 && p.Multiplier <= maxMultiplier) {
		return bad("multiplier must be between 1 and 1000")
	}
	if p.MaxDelay < 0 {
		return bad("max delay must not be negative")
	}
	d := WithDefaults(p)
	if d.MaxDelay < d.Base {
		return bad("max delay must not be below the base delay")
	}
	return nil
}

// Nominal returns the nominal (un-jittered) delay before attempt n+1 after
// n failed attempts (n ≥ 1): Base·Multiplier^(n−1) capped at MaxDelay
// (Base for every n when Multiplier is 1). n < 1 counts as 1. p's zero
// fields mean the defaults.
func Nominal(p retry.Policy, n int) time.Duration {
	p = WithDefaults(p)
	// The same arithmetic as backoff.ExponentialBackOff, so Nominal(n) is
	// exactly the n-th interval of a Backoff.
	d := min(p.Base, p.MaxDelay)
	for i := 1; i < n; i++ {
		if float64(d) >= float64(p.MaxDelay)/p.Multiplier {
			return p.MaxDelay
		}
		d = time.Duration(float64(d) * p.Multiplier)
	}
	return d
}

// Apply returns the jittered delay for nominal delay d and a random number
// r in [0, 1): equal jitter d/2 + r·d/2, full jitter r·d, no jitter d.
// r outside [0, 1) is clamped into it.
func Apply(j retry.Jitter, d time.Duration, r float64) time.Duration {
	if d <= 0 {
		return 0
	}
	if !(r >= 0) { // also NaN
		r = 0
	}
	if r >= 1 {
		r = 1 - 1e-12
	}
	switch j {
	case retry.FullJitter:
		return time.Duration(r * float64(d))
	case retry.NoJitter:
		return d
	default:
		half := d / 2
		return half + time.Duration(r*float64(d-half))
	}
}

// Delay is the pure form of the policy: the delay after n failed attempts
// (n ≥ 1) given a random number r in [0, 1).
func Delay(p retry.Policy, n int, r float64) time.Duration {
	return Apply(p.Jitter, Nominal(p, n), r)
}

// Options injects the sources of randomness and time, for tests.
type Options struct {
	// Rand returns a number in [0, 1). Nil means math/rand/v2's Float64.
	Rand func() float64
	// Clock is handed to backoff's ExponentialBackOff. Nil means
	// backoff.SystemClock. With MaxElapsedTime 0 it only affects
	// GetElapsedTime, which pglease does not use for decisions.
	Clock cbackoff.Clock
}

// Backoff is one key's retry state. It implements backoff.BackOff: the
// growth of the nominal delay comes from a cenkalti/backoff
// ExponentialBackOff (randomisation off, MaxElapsedTime 0), and the jitter
// is applied on top with the injectable Rand. Not safe for concurrent use.
type Backoff struct {
	policy   retry.Policy
	exp      *cbackoff.ExponentialBackOff
	rand     func() float64
	attempts int
}

var _ cbackoff.BackOff = (*Backoff)(nil)

// New returns a fresh Backoff for p (zero fields mean the defaults). p must
// be valid (see Validate); an invalid p panics, as it is a programming
// error once the configuration has been validated.
func New(p retry.Policy, o Options) *Backoff {
	if err := Validate("backoff.New", p); err != nil {
		panic(err)
	}
	p = WithDefaults(p)
	clock := o.Clock
	if clock == nil {
		clock = cbackoff.SystemClock
	}
	exp := &cbackoff.ExponentialBackOff{
		InitialInterval:     min(p.Base, p.MaxDelay),
		RandomizationFactor: 0,
		Multiplier:          p.Multiplier,
		MaxInterval:         p.MaxDelay,
		MaxElapsedTime:      0, // never give up: ctx / acquire timeout bound the wait
		Stop:                cbackoff.Stop,
		Clock:               clock,
	}
	exp.Reset()
	r := o.Rand
	if r == nil {
		r = rand.Float64
	}
	return &Backoff{policy: p, exp: exp, rand: r}
}

// NextBackOff returns the delay to wait before the next attempt, after one
// more failed attempt. It never returns backoff.Stop.
func (b *Backoff) NextBackOff() time.Duration {
	b.attempts++
	return Apply(b.policy.Jitter, b.exp.NextBackOff(), b.rand())
}

// Reset starts the schedule again from Base (call it after a success).
func (b *Backoff) Reset() {
	b.attempts = 0
	b.exp.Reset()
}

// Attempts returns the number of NextBackOff calls since the last Reset.
func (b *Backoff) Attempts() int { return b.attempts }
