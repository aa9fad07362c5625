package manager

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"
)

// TestLossWatchFiresInOrder: the shared loss timer (losswatch.go) ends
// each watched lease at its own deadline, not before, in deadline order,
// without any loop running; a lease stopped in time is never ended, and
// stop reports a deadline that already fired (as time.Timer.Stop does).
func TestLossWatchFiresInOrder(t *testing.T) {
	t.Parallel()
	type fired struct {
		l  *kernel.Hold
		at time.Time
	}
	ch := make(chan fired, 8)
	w := kernel.NewLossWatch(func(l *kernel.Hold) { ch <- fired{l, time.Now()} })
	defer w.Close()
	start := time.Now()
	hs := make([]*kernel.Holding, 4)
	for i := range hs {
		hs[i] = &kernel.Holding{Lock: &kernel.Hold{}, LossIdx: -1}
	}
	// Deadlines out of order; hs[3] is stopped before its deadline.
	deadlines := []time.Duration{60 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 30 * time.Millisecond}
	for i, h := range hs {
		w.Start(h, start.Add(deadlines[i]))
	}
	if !w.Stop(hs[3]) {
		t.Fatal("stop of a lease before its deadline reported it fired")
	}
	want := []int{1, 2, 0}
	for _, i := range want {
		select {
		case f := <-ch:
			if f.l != hs[i].Lock {
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
		if w.Stop(hs[i]) {
			t.Fatalf("stop after lease %d fired reported it still watched", i)
		}
	}
	// Moving a deadline (an extend: stop, then start again) keeps the
	// lease until the new one.
	h := &kernel.Holding{Lock: &kernel.Hold{}, LossIdx: -1}
	w.Start(h, time.Now().Add(20*time.Millisecond))
	if !w.Stop(h) {
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

// TestHeapPerHeldLock: ≤ 1 KiB of Go heap per held
// lock (everything the Manager keeps for it: handle, context, loop
// records, telemetry, map entries), measured on 5,000 locks held at once.
// No extend is due while measuring (60 s TTL), so only the held state is
// counted, not a heartbeat batch in flight.
func TestHeapPerHeldLock(t *testing.T) {
	if testing.Short() {
		t.Skip("acquires 5,000 locks")
	}
	const n, callers = 5000, 64
	b := setup(t, setupOpts{noSignals: true})
	ctx := ctxT(t)
	opts := []AcquireOption{WithTTL(time.Minute), WithAcquireTimeout(waitTimeout())}
	// Warm up: pool connections and prepared statements.
	for i := range 2 * callers {
		lk, err := b.m.Acquire(ctx, fmt.Sprintf("warm:%d", i), opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("heap:%d", i)
	}
	locks := make([]*Lock, n)
	errs := make([]error, callers)
	base := liveHeap()
	var wg sync.WaitGroup
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += callers {
				lk, err := b.m.Acquire(ctx, keys[i], opts...)
				if err != nil {
					errs[w] = err
					return
				}
				locks[i] = lk
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	perLock := (float64(liveHeap()) - float64(base)) / n
	t.Logf("%.0f B of Go heap per held lock", perLock)
	if perLock > 1024 {
		t.Errorf("%.0f B of Go heap per held lock, want ≤ 1024", perLock)
	}
	// Close (setup's cleanup) releases them all in one statement.
}

func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
