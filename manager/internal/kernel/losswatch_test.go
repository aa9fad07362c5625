package kernel

import (
	"testing"
	"time"
)

// TestLossWatchFiresInOrder: the shared loss timer (losswatch.go) ends
// each watched lease at its own deadline, not before, in deadline order,
// without any loop running; a lease stopped in time is never ended, and
// stop reports a deadline that already fired (as time.Timer.Stop does).
func TestLossWatchFiresInOrder(t *testing.T) {
	t.Parallel()
	type fired struct {
		l  *Hold
		at time.Time
	}
	ch := make(chan fired, 8)
	w := newLossWatch(func(l *Hold) { ch <- fired{l, time.Now()} })
	defer w.Close()
	start := time.Now()
	hs := make([]*holding, 4)
	for i := range hs {
		hs[i] = &holding{lock: &Hold{}, lossIdx: -1}
	}
	// deadlines out of order; hs[3] is stopped before its deadline.
	deadlines := []time.Duration{60 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 30 * time.Millisecond}
	for i, h := range hs {
		w.Start(h, start.Add(deadlines[i]))
	}
	if !w.stop(hs[3]) {
		t.Fatal("stop of a lease before its deadline reported it fired")
	}
	want := []int{1, 2, 0}
	for _, i := range want {
		select {
		case f := <-ch:
			if f.l != hs[i].lock {
				t.Fatalf("fired out of order: want lease %d", i)
			}
			if f.at.Before(start.Add(deadlines[i])) {
				t.Fatalf("lease %d ended %v before its deadline", i, start.Add(deadlines[i]).Sub(f.at))
			}
		case <-time.After(waitTimeout()):
			t.Fatalf("lease %d never ended", i)
		}
	}
	select {
	case <-ch:
		t.Fatal("a stopped lease was ended")
	case <-time.After(100 * time.Millisecond):
	}
	for _, i := range want {
		if w.stop(hs[i]) {
			t.Fatalf("stop after lease %d fired reported it still watched", i)
		}
	}
	// Moving a deadline (an extend: stop, then start again) keeps the
	// lease until the new one.
	h := &holding{lock: &Hold{}, lossIdx: -1}
	w.Start(h, time.Now().Add(20*time.Millisecond))
	if !w.stop(h) {
		t.Fatal("stop before the deadline failed")
	}
	moved := time.Now().Add(80 * time.Millisecond)
	w.Start(h, moved)
	select {
	case f := <-ch:
		if f.at.Before(moved) {
			t.Fatalf("extended lease ended %v before its new deadline", moved.Sub(f.at))
		}
	case <-time.After(waitTimeout()):
		t.Fatal("extended lease never ended")
	}
}
