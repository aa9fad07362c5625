package backoff_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	cbackoff "github.com/cenkalti/backoff/v4"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/backoff"
	"github.com/pglease/pglease/retry"
)

const ms = time.Millisecond

func TestDefaultsAreSyncGuards(t *testing.T) {
	t.Parallel()
	p := backoff.WithDefaults(retry.Policy{})
	if p.Base != 100*ms || p.Multiplier != 2 || p.Jitter != retry.EqualJitter || p.MaxDelay != 2*time.Second {
		t.Fatalf("defaults = %+v", p)
	}
}

func TestDelayBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		p      retry.Policy
		n      int
		lo, hi time.Duration // inclusive bounds over r in [0,1)
	}{
		{"equal/1", retry.Policy{}, 1, 50 * ms, 100 * ms},
		{"equal/2", retry.Policy{}, 2, 100 * ms, 200 * ms},
		{"equal/3", retry.Policy{}, 3, 200 * ms, 400 * ms},
		{"equal/5", retry.Policy{}, 5, 800 * ms, 1600 * ms},
		{"equal/6 capped", retry.Policy{}, 6, 1000 * ms, 2000 * ms},
		{"equal/60 capped", retry.Policy{}, 60, 1000 * ms, 2000 * ms},
		{"equal/0 counts as 1", retry.Policy{}, 0, 50 * ms, 100 * ms},
		{"full/1", retry.Policy{Jitter: retry.FullJitter}, 1, 0, 100 * ms},
		{"full/4", retry.Policy{Jitter: retry.FullJitter}, 4, 0, 800 * ms},
		{"none/1", retry.Policy{Jitter: retry.NoJitter}, 1, 100 * ms, 100 * ms},
		{"none/4", retry.Policy{Jitter: retry.NoJitter}, 4, 800 * ms, 800 * ms},
		{"fixed/none/9", retry.Policy{Multiplier: 1, Jitter: retry.NoJitter, Base: 30 * ms}, 9, 30 * ms, 30 * ms},
		{"fixed/equal/9", retry.Policy{Multiplier: 1, Base: 30 * ms}, 9, 15 * ms, 30 * ms},
		{"custom x3", retry.Policy{Base: 10 * ms, Multiplier: 3, MaxDelay: time.Second, Jitter: retry.NoJitter}, 3, 90 * ms, 90 * ms},
		{"custom cap", retry.Policy{Base: 10 * ms, Multiplier: 3, MaxDelay: 50 * ms, Jitter: retry.NoJitter}, 3, 50 * ms, 50 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, r := range []float64{0, 1e-9, 0.25, 0.5, 0.999999999, 1 - 1e-16} {
				d := backoff.Delay(tt.p, tt.n, r)
				if d < tt.lo || d > tt.hi {
					t.Errorf("Delay(%d, %v) = %v, want in [%v, %v]", tt.n, r, d, tt.lo, tt.hi)
				}
			}
			// The extremes are reached: r=0 gives the lower bound.
			if d := backoff.Delay(tt.p, tt.n, 0); d != tt.lo {
				t.Errorf("Delay(%d, 0) = %v, want %v", tt.n, d, tt.lo)
			}
		})
	}
}

func TestJitterApplyClampsR(t *testing.T) {
	t.Parallel()
	for _, r := range []float64{-1, 2, 1} {
		if d := backoff.Apply(retry.EqualJitter, 100*ms, r); d < 50*ms || d > 100*ms {
			t.Errorf("Apply(r=%v) = %v", r, d)
		}
	}
	if d := backoff.Apply(retry.FullJitter, 0, 0.5); d != 0 {
		t.Errorf("Apply(0) = %v", d)
	}
}

// TestBackoffMatchesPureDelay checks that the stateful Backoff (built on
// backoff.ExponentialBackOff) yields exactly the pure Delay sequence for the
// same random numbers, and restarts after Reset.
func TestBackoffMatchesPureDelay(t *testing.T) {
	t.Parallel()
	for _, p := range []retry.Policy{
		{},
		{Jitter: retry.FullJitter},
		{Multiplier: 1, Base: 20 * ms},
		{Base: 7 * ms, Multiplier: 1.5, MaxDelay: 300 * ms},
	} {
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			t.Parallel()
			src := rand.New(rand.NewPCG(1, 2))
			var rs []float64
			b := backoff.New(p, backoff.Options{Rand: func() float64 {
				r := src.Float64()
				rs = append(rs, r)
				return r
			}})
			for round := 0; round < 2; round++ {
				for n := 1; n <= 20; n++ {
					got := b.NextBackOff()
					if want := backoff.Delay(p, n, rs[len(rs)-1]); got != want {
						t.Fatalf("round %d attempt %d: NextBackOff = %v, Delay = %v", round, n, got, want)
					}
					if got == cbackoff.Stop {
						t.Fatal("Backoff gave up")
					}
				}
				if b.Attempts() != 20 {
					t.Fatalf("Attempts = %d", b.Attempts())
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
	b := backoff.New(retry.Policy{}, backoff.Options{Clock: clk, Rand: func() float64 { return 0.5 }})
	for i := 0; i < 100; i++ {
		clk.now = clk.now.Add(time.Hour)
		if d := b.NextBackOff(); d == cbackoff.Stop || d <= 0 || d > 2*time.Second {
			t.Fatalf("attempt %d: delay %v", i+1, d)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	bad := []retry.Policy{
		{Jitter: 9},
		{Base: -1},
		{Multiplier: 0.5},
		{Multiplier: -2},
		{MaxDelay: -1},
		{Base: time.Second, MaxDelay: 10 * ms},
		{Base: 3 * time.Second}, // default MaxDelay follows Base: valid? see below
	}
	for i, p := range bad[:len(bad)-1] {
		err := backoff.Validate("op", p)
		if !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("%d %+v: err = %v, want InvalidArgument", i, p, err)
		}
	}
	// A Base above the default cap raises the default cap with it.
	if err := backoff.Validate("op", bad[len(bad)-1]); err != nil {
		t.Errorf("large base: %v", err)
	}
	for _, p := range []retry.Policy{{}, {Multiplier: 1}, {Multiplier: 1000}, {MaxDelay: 100 * ms}} {
		if err := backoff.Validate("op", p); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("New with an invalid policy did not panic")
		}
	}()
	backoff.New(retry.Policy{Base: -1}, backoff.Options{})
}

func ExampleDelay() {
	p := retry.Policy{} // SyncGuard's defaults
	for n := 1; n <= 4; n++ {
		fmt.Printf("attempt %d: %v..%v\n", n, backoff.Delay(p, n, 0), backoff.Nominal(p, n))
	}
	// Output:
	// attempt 1: 50ms..100ms
	// attempt 2: 100ms..200ms
	// attempt 3: 200ms..400ms
	// attempt 4: 400ms..800ms
}
