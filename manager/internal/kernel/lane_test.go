package kernel

import (
	"testing"
	"time"
)

// TestStuckHandOffLandsEachSlotOnce: a handoff batch takes an acquire and
// a release slot, and its two done messages land one each. When it turns
// stuck between the two (the release half answered, the acquire half not
// yet), only the slot still open counts it as stuck, so the release cap
// does not grow by one for good.
func TestStuckHandOffLandsEachSlotOnce(t *testing.T) {
	m := &Kernel{cfg: Config{StatementTimeout: time.Second, MaxBatch: 10}, AcqLimit: 1, relLimit: 1, extLimit: 1, maxConns: 4}
	st := newLoopState(m)
	defer st.loss.Close()
	fl := st.launch(&st.handOffs.batchSpec)
	if st.acquireSlots.n != 1 || st.releaseSlots.n != 1 {
		t.Fatalf("a handoff in flight: acquire %d, release %d batches; want 1, 1", st.acquireSlots.n, st.releaseSlots.n)
	}
	st.land(fl, &st.releaseSlots)
	st.checkStuck(fl.start.Add(time.Hour))
	if st.acquireSlots.stuck != 1 || st.releaseSlots.stuck != 0 {
		t.Fatalf("stuck after the release half landed: acquire %d, release %d; want 1, 0", st.acquireSlots.stuck, st.releaseSlots.stuck)
	}
	st.land(fl, &st.acquireSlots)
	for name, s := range map[string]slots{"acquire": st.acquireSlots, "release": st.releaseSlots} {
		if s.n != 0 || s.stuck != 0 {
			t.Errorf("%s slots after both halves landed: %d in flight, %d stuck; want 0, 0", name, s.n, s.stuck)
		}
	}
	if len(st.flights) != 0 {
		t.Errorf("%d flights remembered after both halves landed, want 0", len(st.flights))
	}
}

// TestLaneRoom: the caps of a lane, as the Manager has always applied
// them: MaxInFlight batches not stuck, one more for an adaptive lane
// while a full batch waits (within (MaxConns−1)/2), never more than the
// cap + MaxConns in all, and no cap for a draining lane during Close.
func TestLaneRoom(t *testing.T) {
	m := &Kernel{cfg: Config{StatementTimeout: time.Second, MaxBatch: 10}, AcqLimit: 1, relLimit: 1, extLimit: 1, maxConns: 6}
	st := newLoopState(m)
	defer st.loss.Close()
	s := &slots{limit: 1}
	if !st.room(s, false, 1, false) {
		t.Fatal("no room with nothing in flight")
	}
	s.n = 1
	if st.room(s, false, 1, false) || st.room(s, true, FullBatch-1, false) {
		t.Fatal("room beyond the cap")
	}
	if !st.room(s, true, FullBatch, false) {
		t.Fatal("an adaptive lane with a full batch waiting has no second batch")
	}
	s.n, s.stuck = 3, 3
	if !st.room(s, false, 1, false) {
		t.Fatal("stuck batches still counted by the cap")
	}
	s.n, s.stuck = 7, 7 // cap + MaxConns
	if st.room(s, false, 1, false) {
		t.Fatal("room beyond the cap + MaxConns")
	}
	st.closing = true
	if !st.room(s, false, 1, true) {
		t.Fatal("a draining lane is capped during Close")
	}
}
