package manager

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

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
