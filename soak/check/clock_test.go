package check

import (
	"testing"
	"time"
)

// TestClockMapping: server timestamps and expiries map to the monotonic
// clock through the server clock's steps. A backward step makes the
// server show a time twice: the row's neighbour (the hint) picks the
// right one. A forward step that jumps over an expiry ends the lease at
// the step.
func TestClockMapping(t *testing.T) {
	const s = int64(time.Second)
	r := &run{offset: 1000 * s}
	// At mono 10 s the server's clock goes 2 s back; at 20 s, 3 s ahead;
	// at 30 s, back to true time.
	r.addClockStep(10*s, -2*s, 0, 0)
	r.addClockStep(20*s, 3*s, 0, 0)
	r.addClockStep(30*s, 0, 0, 0)
	srv := func(mono int64) int64 { return mono + r.offset + r.offAt(mono) }
	for _, c := range []struct {
		name       string
		mono, hint int64
	}{
		{"before the steps", 5 * s, 5 * s},
		{"just before the back step", 9*s + s/2, 9 * s},
		{"after the back step, a time shown twice", 11 * s, 11 * s},
		{"ahead", 25 * s, 25 * s},
		{"true time again", 35 * s, 35 * s},
	} {
		if got := r.atMono(srv(c.mono), c.hint, 0); got != c.mono {
			t.Errorf("%s: server time of mono %v maps to %v", c.name, time.Duration(c.mono), time.Duration(got))
		}
	}
	// The same server time with the other hint is the other moment.
	if got := r.atMono(srv(11*s), 9*s, 0); got != 9*s {
		t.Errorf("a time shown twice, hint before the step: %v, want 9s", time.Duration(got))
	}
	// Expiries: one the forward step at 20 s jumps over ends at 20 s; one
	// past it ends 3 s early; one the back step moved ends 2 s late.
	for _, c := range []struct {
		name     string
		exp, end int64 // server ns, mono
	}{
		{"jumped over", 19*s + r.offset - 2*s + s/2 + 3*s/2, 20 * s},
		{"ahead", 26*s + r.offset, 23 * s},
		{"behind", 12*s + r.offset, 14 * s},
	} {
		if got := r.expMono(c.exp, 0); got != c.end {
			t.Errorf("expiry %s: ends at %v, want %v", c.name, time.Duration(got), time.Duration(c.end))
		}
	}
	// An expiry the server's clock passed before the back step at 10 s
	// and reaches again after it: set after the step, it ends the second
	// time; set before, the first.
	if got := r.expMono(9*s+r.offset, 10*s+s/2); got != 11*s {
		t.Errorf("expiry set after the back step: ends at %v, want 11s", time.Duration(got))
	}
	if got := r.expMono(9*s+r.offset, 5*s); got != 9*s {
		t.Errorf("expiry set before the back step: ends at %v, want 9s", time.Duration(got))
	}
	if got := r.expMono(3*s+r.offset, 5*s); got != 5*s {
		t.Errorf("expiry passed when set: ends at %v, want 5s (when it was set)", time.Duration(got))
	}
	// The step at 20 s is 5 s forward (from 2 s behind to 3 s ahead); the
	// others go back.
	if !r.forwardStepDuring(19*s, 21*s, 4*time.Second) || r.forwardStepDuring(19*s, 21*s, 5*time.Second) ||
		r.forwardStepDuring(29*s, 31*s, 0) || r.forwardStepDuring(9*s, 11*s, 0) || r.forwardStepDuring(21*s, 29*s, 0) {
		t.Error("forwardStepDuring")
	}
	if got := r.backStepMax(); got != 3*time.Second {
		t.Errorf("backStepMax = %v, want 3s (the step back from +3 s)", got)
	}
}

// TestClockMappingBySeq: after a backward step, a row far from its
// neighbour (sparse rows: an extend every third of the TTL) shows a time
// nearer the neighbour's moment before the step than its own after it.
// The step's bounds in the audits' sequence put it on the right side.
func TestClockMappingBySeq(t *testing.T) {
	const s = int64(time.Second)
	r := &run{offset: 1000 * s}
	// At mono 10 s the server's clock goes 2 s back; the driver drew 100
	// from the audits' sequence before the step, 102 after it.
	r.addClockStep(10*s, -2*s, 100, 102)
	srv := func(mono int64) int64 { return mono + r.offset + r.offAt(mono) }
	prev := int64(9*s + s/2) // the row before, numbered 50
	if got := r.atMono(srv(prev), 9*s, 50); got != prev {
		t.Fatalf("the row before the step maps to %v, want %v", time.Duration(got), time.Duration(prev))
	}
	// At mono 11.4 s the server shows 9.4 s: nearest the hint (9.5 s) is
	// the moment before the step, but the row is numbered after it.
	if got := r.atMono(srv(11*s+4*s/10), prev, 150); got != 11*s+4*s/10 {
		t.Errorf("a row numbered after the step maps to %v, want 11.4s", time.Duration(got))
	}
	// Without its number the nearest candidate wins (the old mapping).
	if got := r.atMono(srv(11*s+4*s/10), prev, 0); got != 9*s+4*s/10 {
		t.Errorf("a row without a number maps to %v, want 9.4s", time.Duration(got))
	}
	// A row numbered before the step is before it, whatever the hint.
	if got := r.atMono(srv(9*s+4*s/10), 11*s, 60); got != 9*s+4*s/10 {
		t.Errorf("a row numbered before the step maps to %v, want 9.4s", time.Duration(got))
	}
}
