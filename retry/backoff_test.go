package retry

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	cbackoff "github.com/cenkalti/backoff/v4"

	"github.com/pglease/pglease"
)

const ms = time.Millisecond

func TestDefaultsAreSyncGuards(t *testing.T) {
	t.Parallel()
	p := Policy{}.withDefaults()
	if p.Base != 100*ms || p.Multiplier != 2 || p.Jitter != EqualJitter || p.MaxDelay != 2*time.Second {
		t.Fatalf("defaults = %+v", p)
	}
}

func TestDelayBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		p      Policy
		n      int
		lo, hi time.Duration // inclusive bounds over r in [0,1)
	}{
		{"equal/1", Policy{}, 1, 50 * ms, 100 * ms},
		{"equal/2", Policy{}, 2, 100 * ms, 200 * ms},
		{"equal/3", Policy{}, 3, 200 * ms, 400 * ms},
		{"equal/5", Policy{}, 5, 800 * ms, 1600 * ms},
		{"equal/6 capped", Policy{}, 6, 1000 * ms, 2000 * ms},
		{"equal/60 capped", Policy{}, 60, 1000 * ms, 2000 * ms},
		{"equal/0 counts as 1", Policy{}, 0, 50 * ms, 100 * ms},
		{"full/1", Policy{Jitter: FullJitter}, 1, 0, 100 * ms},
		{"full/4", Policy{Jitter: FullJitter}, 4, 0, 800 * ms},
		{"none/1", Policy{Jitter: NoJitter}, 1, 100 * ms, 100 * ms},
		{"none/4", Policy{Jitter: NoJitter}, 4, 800 * ms, 800 * ms},
		{"fixed/none/9", Policy{Multiplier: 1, Jitter: NoJitter, Base: 30 * ms}, 9, 30 * ms, 30 * ms},
		{"fixed/equal/9", Policy{Multiplier: 1, Base: 30 * ms}, 9, 15 * ms, 30 * ms},
		{"custom x3", Policy{Base: 10 * ms, Multiplier: 3, MaxDelay: time.Second, Jitter: NoJitter}, 3, 90 * ms, 90 * ms},
		{"custom cap", Policy{Base: 10 * ms, Multiplier: 3, MaxDelay: 50 * ms, Jitter: NoJitter}, 3, 50 * ms, 50 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, r := range []float64{0, 1e-9, 0.25, 0.5, 0.999999999, 1 - 1e-16} {
				d := delay(tt.p, tt.n, r)
				if d < tt.lo || d > tt.hi {
					t.Errorf("Delay(%d, %v) = %v, want in [%v, %v]", tt.n, r, d, tt.lo, tt.hi)
				}
			}
			// The extremes are reached: r=0 gives the lower bound.
			if d := delay(tt.p, tt.n, 0); d != tt.lo {
				t.Errorf("Delay(%d, 0) = %v, want %v", tt.n, d, tt.lo)
			}
		})
	}
}

func TestJitterApplyClampsR(t *testing.T) {
	t.Parallel()
	for _, r := range []float64{-1, 2, 1} {
		if d := apply(EqualJitter, 100*ms, r); d < 50*ms || d > 100*ms {
			t.Errorf("Apply(r=%v) = %v", r, d)
		}
	}
	if d := apply(FullJitter, 0, 0.5); d != 0 {
		t.Errorf("Apply(0) = %v", d)
	}
}

// TestBackoffMatchesPureDelay checks that the stateful schedule (built on
// backoff.ExponentialBackOff) yields exactly the pure delay sequence for the
// same random numbers, and restarts after Reset.
func TestBackoffMatchesPureDelay(t *testing.T) {
	t.Parallel()
	for _, p := range []Policy{
		{},
		{Jitter: FullJitter},
		{Multiplier: 1, Base: 20 * ms},
		{Base: 7 * ms, Multiplier: 1.5, MaxDelay: 300 * ms},
	} {
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			t.Parallel()
			src := rand.New(rand.NewPCG(1, 2))
			var rs []float64
			b := newSchedule(p, func() float64 {
				r := src.Float64()
				rs = append(rs, r)
				return r
			}, cbackoff.SystemClock)
			for round := 0; round < 2; round++ {
				for n := 1; n <= 20; n++ {
					got := b.NextBackOff()
					if want := delay(p, n, rs[len(rs)-1]); got != want {
						t.Fatalf("round %d attempt %d: NextBackOff = %v, Delay = %v", round, n, got, want)
					}
					if got == cbackoff.Stop {
						t.Fatal("Backoff gave up")
					}
				}
				if b.attempts != 20 {
					t.Fatalf("attempts = %d", b.attempts)
				}
				b.Reset()
			}
		})
	}
}

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

// TestBackoffNeverStops moves an injected clock far past backoff's
// default 15-minute MaxElapsedTime: the delay keeps coming.
func TestBackoffNeverStops(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{now: time.Unix(0, 0)}
	b := newSchedule(Policy{}, func() float64 { return 0.5 }, clk)
	for i := 0; i < 100; i++ {
		clk.now = clk.now.Add(time.Hour)
		if d := b.NextBackOff(); d == cbackoff.Stop || d <= 0 || d > 2*time.Second {
			t.Fatalf("attempt %d: delay %v", i+1, d)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	bad := []Policy{
		{Jitter: 9},
		{Base: -1},
		{Multiplier: 0.5},
		{Multiplier: -2},
		{MaxDelay: -1},
		{Base: time.Second, MaxDelay: 10 * ms},
		{Base: 3 * time.Second}, // default MaxDelay follows Base: valid? see below
	}
	for i, p := range bad[:len(bad)-1] {
		err := p.validate("op")
		if !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("%d %+v: err = %v, want InvalidArgument", i, p, err)
		}
	}
	// A Base above the default cap raises the default cap with it.
	if err := bad[len(bad)-1].validate("op"); err != nil {
		t.Errorf("large base: %v", err)
	}
	for _, p := range []Policy{{}, {Multiplier: 1}, {Multiplier: 1000}, {MaxDelay: 100 * ms}} {
		if err := p.validate("op"); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	// NewBackOff refuses a bad policy with a typed error, before any
	// attempt, and hands out nothing.
	if b, err := (Policy{Base: -1}).NewBackOff(); b != nil || !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("NewBackOff(bad) = %v, %v", b, err)
	}
	if b, err := (Policy{}).NewBackOff(); b == nil || err != nil {
		t.Errorf("NewBackOff(zero) = %v, %v", b, err)
	}
}

// TestDelaySchedule prints the nominal delays and their equal-jitter
// floors of the zero Policy, SyncGuard's defaults, as the package
// documentation's table gives them.
func TestDelaySchedule(t *testing.T) {
	t.Parallel()
	want := [][2]time.Duration{{50 * ms, 100 * ms}, {100 * ms, 200 * ms}, {200 * ms, 400 * ms}, {400 * ms, 800 * ms}, {800 * ms, 1600 * ms}, {1000 * ms, 2000 * ms}}
	for i, w := range want {
		if lo, hi := delay(Policy{}, i+1, 0), nominal(Policy{}, i+1); lo != w[0] || hi != w[1] {
			t.Errorf("attempt %d: %v..%v, want %v..%v", i+1, lo, hi, w[0], w[1])
		}
	}
}
