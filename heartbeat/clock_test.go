package heartbeat

import (
	"sync"
	"testing"
	"time"
)

// fakeMachine is a machine whose clocks a test moves: mono is how far
// Go's monotonic clock moved, wall how far the wall clock moved, and
// slept the suspended time the operating system counts (CLOCK_BOOTTIME −
// CLOCK_MONOTONIC); hasCount false is a system without such a count. A
// suspend moves wall and slept, not mono.
type fakeMachine struct {
	mu                sync.Mutex
	mono, wall, slept time.Duration
	hasCount          bool
	base              time.Time
}

func (f *fakeMachine) read() (time.Time, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.base.Add(f.mono), f.wall - f.mono
}

// monoOnly is the clock before: Go's monotonic clock alone (time.Now).
func (f *fakeMachine) monoOnly() time.Time { t, _ := f.read(); return t }

func (f *fakeMachine) count() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slept, f.hasCount
}

func (f *fakeMachine) move(mono, wall, slept time.Duration) {
	f.mu.Lock()
	f.mono += mono
	f.wall += wall
	f.slept += slept
	f.mu.Unlock()
}
func (f *fakeMachine) run(d time.Duration)      { f.move(d, d, 0) }
func (f *fakeMachine) suspend(d time.Duration)  { f.move(0, d, d) }
func (f *fakeMachine) stepWall(d time.Duration) { f.move(0, d, 0) }

// TestTrustCountsSuspend suspends a fake machine for 10 s, 1 s into a
// lease of 3 s: its monotonic clock stops, its boot clock (and wall
// clock) jump. A lease timed with Now's clock is no longer trusted after
// the resume; timed with Go's monotonic clock alone (the clock before,
// the negative control) it still is, for 1.7 s more, although the server
// expired it 7 s ago.
func TestTrustCountsSuspend(t *testing.T) {
	t.Parallel()
	for _, hasCount := range []bool{true, false} {
		f := &fakeMachine{base: time.Now(), hasCount: hasCount}
		c := newClock(f.read, f.count)

		l := Lease{TTL: 3 * time.Second, Start: c.now()}
		lOld := Lease{TTL: 3 * time.Second, Start: f.monoOnly()}
		f.run(time.Second)
		if !c.now().Before(l.TrustedUntil()) || !f.monoOnly().Before(lOld.TrustedUntil()) {
			t.Fatalf("count %v: not trusted 1 s into a 3 s lease", hasCount)
		}
		f.suspend(10 * time.Second)
		if c.now().Before(l.TrustedUntil()) {
			t.Errorf("count %v: still trusted after a 10 s suspend 1 s into a 3 s lease", hasCount)
		}
		if !f.monoOnly().Before(lOld.TrustedUntil()) {
			t.Errorf("count %v: the monotonic clock alone counted the suspend: the fake does not suspend", hasCount)
		}
		if got := c.now().Sub(l.Start); got != 11*time.Second {
			t.Errorf("count %v: %v passed on the trust clock, want 11s", hasCount, got)
		}
	}
}

// TestTrustClockWallSteps: with the system's count of suspended time, a
// step of the wall clock, either way, is no suspend; without it, a
// forward step counts as one (trust ends early, never late) and a step
// back is ignored, and a suspend after a step back still counts in full.
// Noise below the gate is never counted, however often it comes.
func TestTrustClockWallSteps(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		hasCount bool
		moves    func(f *fakeMachine, read func())
		want     time.Duration // suspended time counted
	}{
		{"count/forward step", true, func(f *fakeMachine, read func()) { f.stepWall(5 * time.Second) }, 0},
		{"count/back step then suspend", true, func(f *fakeMachine, read func()) {
			f.stepWall(-time.Hour)
			read()
			f.suspend(2 * time.Second)
		}, 2 * time.Second},
		{"count/two suspends", true, func(f *fakeMachine, read func()) {
			f.suspend(2 * time.Second)
			read()
			f.run(time.Second)
			read()
			f.suspend(3 * time.Second)
		}, 5 * time.Second},
		{"wall/forward step", false, func(f *fakeMachine, read func()) { f.stepWall(5 * time.Second) }, 5 * time.Second},
		{"wall/back step", false, func(f *fakeMachine, read func()) { f.stepWall(-time.Hour) }, 0},
		{"wall/back step then suspend", false, func(f *fakeMachine, read func()) {
			f.stepWall(-time.Hour)
			read()
			f.suspend(2 * time.Second)
		}, 2 * time.Second},
		{"wall/two suspends", false, func(f *fakeMachine, read func()) {
			f.suspend(2 * time.Second)
			read()
			f.run(time.Second)
			read()
			f.suspend(3 * time.Second)
		}, 5 * time.Second},
		{"wall/noise", false, func(f *fakeMachine, read func()) {
			for range 1000 {
				f.stepWall(gate / 2)
				read()
				f.stepWall(-gate / 2)
				read()
				f.stepWall(gate)
				read()
				f.stepWall(-gate)
				read()
			}
		}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeMachine{base: time.Now(), hasCount: tt.hasCount}
			c := newClock(f.read, f.count)
			start := c.now()
			ranFor := f.mono
			tt.moves(f, func() { c.now() })
			now := c.now()
			if got := now.Sub(start) - (f.mono - ranFor); got != tt.want {
				t.Errorf("counted %v suspended, want %v", got, tt.want)
			}
			if later := c.now(); later.Before(now) {
				t.Errorf("the clock went back")
			}
		})
	}
}

// TestTrustClockSystem reads the real clock: it runs with the monotonic
// clock (no suspend in a test run), and on Linux the count of suspended
// time is there.
func TestTrustClockSystem(t *testing.T) {
	t.Parallel()
	a, ta := Now(), time.Now()
	time.Sleep(20 * time.Millisecond)
	b, tb := Now(), time.Now()
	if d, dt := b.Sub(a), tb.Sub(ta); d < 20*time.Millisecond || d > dt+gate {
		t.Errorf("Now advanced %v while time.Now advanced %v", d, dt)
	}
	if _, ok := bootOffset(); !ok && testingOnLinux {
		t.Error("no CLOCK_BOOTTIME on Linux")
	}
}

// BenchmarkNow: heartbeat.Now against time.Now. The count of suspended
// time is read (two system calls on Linux) only after the wall clock
// moved against the monotonic one, so a reading costs about one time.Now.
func BenchmarkNow(b *testing.B) {
	b.Run("heartbeat.Now", func(b *testing.B) {
		for b.Loop() {
			Now()
		}
	})
	b.Run("time.Now", func(b *testing.B) {
		for b.Loop() {
			time.Now()
		}
	})
	b.Run("bootOffset", func(b *testing.B) {
		for b.Loop() {
			bootOffset()
		}
	})
}
