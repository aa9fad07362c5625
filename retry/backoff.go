package retry

import (
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// Defaults of a Policy's zero fields (said in words in Policy's
// documentation).
const (
	defaultBase       = 100 * time.Millisecond
	defaultMultiplier = 2.0
	defaultMaxDelay   = 2 * time.Second
)

// maxMultiplier bounds Policy.Multiplier.
const maxMultiplier = 1000

// withDefaults returns p with its zero fields set to the defaults.
func (p Policy) withDefaults() Policy {
	if p.Base == 0 {
		p.Base = defaultBase
	}
	if p.Multiplier == 0 {
		p.Multiplier = defaultMultiplier
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = max(defaultMaxDelay, p.Base)
	}
	return p
}

// validate reports a bad policy as a *pglease.Error with
// CodeInvalidArgument and the given op. Zero fields are valid (they mean
// the defaults).
func (p Policy) validate(op string) error {
	bad := func(msg string) error { return pgerr.New(pglease.CodeInvalidArgument, op, "Retry: "+msg, nil) }
	if p.Jitter > NoJitter {
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
	d := p.withDefaults()
	if d.MaxDelay < d.Base {
		return bad("max delay must not be below the base delay")
	}
	return nil
}

// nominal returns the nominal (un-jittered) delay before attempt n+1
// after n failed attempts (n ≥ 1): Base·Multiplier^(n−1) capped at
// MaxDelay (Base for every n when Multiplier is 1). n < 1 counts as 1.
// p's zero fields mean the defaults.
func nominal(p Policy, n int) time.Duration {
	p = p.withDefaults()
	// The same arithmetic as backoff.ExponentialBackOff, so nominal(n) is
	// exactly the n-th interval of a schedule.
	d := min(p.Base, p.MaxDelay)
	for i := 1; i < n; i++ {
		if float64(d) >= float64(p.MaxDelay)/p.Multiplier {
			return p.MaxDelay
		}
		d = time.Duration(float64(d) * p.Multiplier)
	}
	return d
}

// apply returns the jittered delay for nominal delay d and a random number
// r in [0, 1): equal jitter d/2 + r·d/2, full jitter r·d, no jitter d.
// r outside [0, 1) is clamped into it.
func apply(j Jitter, d time.Duration, r float64) time.Duration {
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
	case FullJitter:
		return time.Duration(r * float64(d))
	case NoJitter:
		return d
	default:
		half := d / 2
		return half + time.Duration(r*float64(d-half))
	}
}

// delay is the pure form of the policy: the delay after n failed attempts
// (n ≥ 1) given a random number r in [0, 1).
func delay(p Policy, n int, r float64) time.Duration {
	return apply(p.Jitter, nominal(p, n), r)
}

// NewBackOff returns the schedule p describes, as the
// github.com/cenkalti/backoff/v4 BackOff the Manager runs for each key it
// waits for: NextBackOff returns the delay before the next attempt, one
// failed attempt later, and Reset starts again from Base after a success.
// It never returns backoff.Stop (the caller's context bounds the wait, where
// backoff's own default gives up silently after 15 minutes), so it can be
// handed to backoff.Retry with backoff.WithContext, or drive a loop that
// arms its own timer. It is not safe for concurrent use: keep one per
// key, owned by one goroutine.
//
// A bad p (see Policy's fields) returns a nil BackOff and a
// *pglease.Error with CodeInvalidArgument.
func (p Policy) NewBackOff() (backoff.BackOff, error) {
	if err := p.validate("retry.Policy.NewBackOff"); err != nil {
		return nil, err
	}
	return newSchedule(p, rand.Float64, backoff.SystemClock), nil
}

// schedule is one key's retry state: the growth of the nominal delay
// comes from backoff's ExponentialBackOff (randomisation off,
// MaxElapsedTime 0), and the jitter is applied on top with an injectable
// source of random numbers. Not safe for concurrent use.
type schedule struct {
	jitter   Jitter
	exp      *backoff.ExponentialBackOff
	rand     func() float64 // in [0, 1)
	attempts int
}

// newSchedule returns a fresh schedule for a valid p. clock only affects
// ExponentialBackOff's GetElapsedTime, which decides nothing with
// MaxElapsedTime 0.
func newSchedule(p Policy, rnd func() float64, clock backoff.Clock) *schedule {
	p = p.withDefaults()
	exp := &backoff.ExponentialBackOff{
		InitialInterval:     min(p.Base, p.MaxDelay),
		RandomizationFactor: 0,
		Multiplier:          p.Multiplier,
		MaxInterval:         p.MaxDelay,
		MaxElapsedTime:      0, // never give up: ctx / acquire timeout bound the wait
		Stop:                backoff.Stop,
		Clock:               clock,
	}
	exp.Reset()
	return &schedule{jitter: p.Jitter, exp: exp, rand: rnd}
}

// NextBackOff returns the delay before the next attempt, after one more
// failed attempt. It never returns backoff.Stop.
func (s *schedule) NextBackOff() time.Duration {
	s.attempts++
	return apply(s.jitter, s.exp.NextBackOff(), s.rand())
}

// Reset starts the schedule again from Base (after a success).
func (s *schedule) Reset() {
	s.attempts = 0
	s.exp.Reset()
}
