package retry

import (
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// Kind is how the nominal delay grows from one attempt to the next.
type Kind uint8

const (
	// Exponential multiplies the nominal delay by Multiplier after every
	// attempt (the default).
	Exponential Kind = iota
	// Fixed keeps the nominal delay at Base.
	Fixed
)

// Jitter is how a nominal delay d is randomised.
type Jitter uint8

const (
	// EqualJitter draws the delay uniformly from [d/2, d] (the default,
	// SyncGuard's "equal").
	EqualJitter Jitter = iota
	// FullJitter draws the delay uniformly from [0, d).
	FullJitter
	// NoJitter uses d itself.
	NoJitter
)

// Defaults of Policy's zero fields.
const (
	DefaultBase       = 100 * time.Millisecond
	DefaultMultiplier = 2.0
	DefaultMaxDelay   = 2 * time.Second
)

// Policy describes a retry schedule. The zero value is SyncGuard's default
// (exponential, 100 ms base, ×2, equal jitter) with a 2 s cap.
type Policy struct {
	// Kind selects exponential (default) or fixed backoff.
	Kind Kind
	// Jitter selects equal (default), full or no jitter.
	Jitter Jitter
	// Base is the first nominal delay. Zero means DefaultBase (100 ms);
	// negative is invalid.
	Base time.Duration
	// Multiplier is the growth factor of exponential backoff. Zero means
	// DefaultMultiplier (2); values below 1 other than zero are invalid.
	// Ignored for Fixed.
	Multiplier float64
	// MaxDelay caps the nominal delay. Zero means DefaultMaxDelay (2 s);
	// negative or below Base is invalid.
	MaxDelay time.Duration
}

// WithDefaults returns p with its zero fields set to the defaults.
func (p Policy) WithDefaults() Policy {
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
// CodeInvalidArgument. Zero fields are valid (they mean the defaults).
func (p Policy) Validate() error {
	const op = "retry.Policy"
	bad := func(msg string) error { return pgerr.New(pglease.CodeInvalidArgument, op, msg, nil) }
	if p.Kind > Fixed {
		return bad("unknown backoff kind")
	}
	if p.Jitter > NoJitter {
		return bad("unknown jitter")
	}
	if p.Base < 0 {
		return bad("base delay must not be negative")
	}
	if p.Multiplier != 0 && !(p.Multiplier >= 1 && p.Multiplier <= 1000) {
		return bad("multiplier must be between 1 and 1000")
	}
	if p.MaxDelay < 0 {
		return bad("max delay must not be negative")
	}
	d := p.WithDefaults()
	if d.MaxDelay < d.Base {
		return bad("max delay must not be below the base delay")
	}
	return nil
}

// Nominal returns the nominal (un-jittered) delay before attempt n+1 after
// n failed attempts (n ≥ 1): Base·Multiplier^(n−1) capped at MaxDelay for
// Exponential, Base for Fixed. n < 1 counts as 1. p's zero fields mean the
// defaults.
func (p Policy) Nominal(n int) time.Duration {
	p = p.WithDefaults()
	if p.Kind == Fixed {
		return min(p.Base, p.MaxDelay)
	}
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
func (j Jitter) Apply(d time.Duration, r float64) time.Duration {
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

// Delay is the pure form of the policy: the delay after n failed attempts
// (n ≥ 1) given a random number r in [0, 1).
func (p Policy) Delay(n int, r float64) time.Duration {
	return p.Jitter.Apply(p.Nominal(n), r)
}

// Options injects the sources of randomness and time, for tests.
type Options struct {
	// Rand returns a number in [0, 1). Nil means math/rand/v2's Float64.
	Rand func() float64
	// Clock is handed to backoff's ExponentialBackOff. Nil means
	// backoff.SystemClock. With MaxElapsedTime 0 it only affects
	// GetElapsedTime, which pglease does not use for decisions.
	Clock backoff.Clock
}

// Backoff is one key's retry state. It implements backoff.BackOff: the
// growth of the nominal delay comes from a cenkalti/backoff
// ExponentialBackOff (randomisation off, MaxElapsedTime 0), and the jitter
// is applied on top with the injectable Rand. Not safe for concurrent use.
type Backoff struct {
	policy   Policy
	exp      *backoff.ExponentialBackOff
	rand     func() float64
	attempts int
}

var _ backoff.BackOff = (*Backoff)(nil)

// New returns a fresh Backoff for p (zero fields mean the defaults). p must
// be valid (see Validate); an invalid p panics, as it is a programming
// error once the configuration has been validated.
func New(p Policy, o Options) *Backoff {
	if err := p.Validate(); err != nil {
		panic(err)
	}
	p = p.WithDefaults()
	mult := p.Multiplier
	if p.Kind == Fixed {
		mult = 1
	}
	clock := o.Clock
	if clock == nil {
		clock = backoff.SystemClock
	}
	exp := &backoff.ExponentialBackOff{
		InitialInterval:     min(p.Base, p.MaxDelay),
		RandomizationFactor: 0,
		Multiplier:          mult,
		MaxInterval:         p.MaxDelay,
		MaxElapsedTime:      0, // never give up: ctx / acquire timeout bound the wait
		Stop:                backoff.Stop,
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
	return b.policy.Jitter.Apply(b.exp.NextBackOff(), b.rand())
}

// Reset starts the schedule again from Base (call it after a success).
func (b *Backoff) Reset() {
	b.attempts = 0
	b.exp.Reset()
}

// Attempts returns the number of NextBackOff calls since the last Reset.
func (b *Backoff) Attempts() int { return b.attempts }
