package heartbeat

import (
	"sync"
	"sync/atomic"
	"time"
)

// Now returns the time to measure a lease's trust window with: time.Now,
// moved ahead by the time this machine has spent suspended since the
// process started. Use it for Lease.Start and for the times compared with
// Lease.TrustedUntil.
//
// Go's monotonic clock, which time.Now's comparisons use, does not advance
// while the machine is suspended, but the server's clock does: a lease
// whose TTL ran out during a suspend expired on the server, and another
// holder may have it, while time.Since(Start) says almost no time passed.
// Now counts that time, so such a lease is no longer trusted as soon as
// the machine resumes. On Linux the suspended time is CLOCK_BOOTTIME −
// CLOCK_MONOTONIC, exact and unaffected by changes of the wall clock.
// Elsewhere it is how far the wall clock has moved ahead of the monotonic
// clock (by more than a millisecond at a time): a suspend, but also a
// forward step of the wall clock, which ends trust early (never late). It
// never moves back.
//
// Two readings of Now compare like two readings of time.Now (with the
// suspended time added); compare them with each other, not with time.Now.
// Reading it costs about one time.Now, and a system call after the wall
// clock moved against the monotonic one.
func Now() time.Time { return system.now() }

var system = newClock(wallGain(time.Now), bootOffset)

// gate is how far the wall clock may move against the monotonic clock
// between two checks before the suspended time is read again: reading
// noise stays below it, a suspend worth counting does not.
const gate = time.Millisecond

// clock adds the suspended time to the monotonic clock. Its readings are
// injectable, so that a test can suspend a machine.
type clock struct {
	// read returns the time (time.Now) and how far the wall clock has
	// moved ahead of the monotonic clock since the clock was made.
	read func() (time.Time, time.Duration)
	// slept returns the suspended time the operating system counts since
	// an arbitrary origin (Linux: CLOCK_BOOTTIME − CLOCK_MONOTONIC), and
	// false where there is no such count.
	slept  func() (time.Duration, bool)
	slept0 time.Duration // slept() when the clock was made

	gain  atomic.Int64 // read's gain at the last check, ns
	total atomic.Int64 // suspended time counted so far, ns; never decreases
	mu    sync.Mutex   // serialises checks
}

func newClock(read func() (time.Time, time.Duration), slept func() (time.Duration, bool)) *clock {
	c := &clock{read: read, slept: slept}
	c.slept0, _ = slept()
	return c
}

// wallGain returns a read for a clock: now's time, and how far its wall
// reading moved ahead of its monotonic reading since the first call.
func wallGain(now func() time.Time) func() (time.Time, time.Duration) {
	origin := now()
	return func() (time.Time, time.Duration) {
		t := now()
		return t, t.Round(0).Sub(origin.Round(0)) - t.Sub(origin)
	}
}

func (c *clock) now() time.Time {
	t, g := c.read()
	if absDiff(int64(g), c.gain.Load()) > int64(gate) {
		c.check(int64(g))
	}
	return t.Add(time.Duration(c.total.Load()))
}

// check counts the suspended time after the wall clock moved by more
// than gate against the monotonic one since the last check (its gain is
// now g).
func (c *clock) check(g int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.gain.Load()
	if absDiff(g, prev) <= int64(gate) {
		return // another reader has checked
	}
	var total int64
	if s, ok := c.slept(); ok {
		total = int64(s - c.slept0)
	} else {
		// No count of the system's: a wall clock that moved ahead was
		// suspended (or stepped forward); one that moved back was stepped
		// back, which says nothing about suspends.
		total = c.total.Load() + max(0, g-prev)
	}
	if total > c.total.Load() {
		c.total.Store(total)
	}
	c.gain.Store(g)
}

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}
