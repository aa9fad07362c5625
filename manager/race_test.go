package manager

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/pglease/pglease"
)

// TestLateGrantCancelBeforeEnqueue: a context that ended before the
// request reached the loop costs no I/O and leaves nothing behind.
func TestLateGrantCancelBeforeEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := b.m.Acquire(ctx, "k")
	if !errors.Is(err, pglease.ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	select {
	case <-b.sig.Queued.Ch:
		t.Fatal("request reached the loop")
	default:
	}
	// And the wait bound, not the context, gives AcquisitionTimeout.
	holder, err := b.m.Acquire(ctxT(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.m.Acquire(ctxT(t), "k", WithAcquireTimeout(50*time.Millisecond))
	if !errors.Is(err, pglease.ErrAcquisitionTimeout) {
		t.Fatalf("err = %v", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer dcancel()
	if _, err = b.m.Acquire(dctx, "k"); !errors.Is(err, pglease.ErrAcquisitionTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx deadline: err = %v", err)
	}
	if err := holder.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestLateGrantCancelInFlight: the caller leaves while its key's database
// attempt is in flight; the attempt then succeeds with nobody to take the
// lock, and the loop releases it.
func TestLateGrantCancelInFlight(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	var once sync.Once
	b := setup(t, setupOpts{hooks: kernel.TestHooks{BeforeBatch: func(kind kernel.BatchKind, n int) {
		if kind == kernel.KindAcquire {
			once.Do(func() { <-gate }) // hold the first acquire batch
		}
	}}})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := b.m.Acquire(ctx, "inflight")
		errc <- err
	}()
	waitFor(t, &b.sig.BatchSent, func(bi kernel.BatchInfo) bool { return bi.Kind == kernel.KindAcquire })
	cancel()
	if err := <-errc; !errors.Is(err, pglease.ErrAborted) {
		t.Fatalf("err = %v", err)
	}
	wait(t, &b.sig.Abandoned)
	close(gate) // the attempt now runs and succeeds
	if k := wait(t, &b.sig.Orphaned); k != "inflight" {
		t.Fatalf("orphaned %q", k)
	}
	wait(t, &b.sig.Released)
	if _, ok := lockRow(t, b.pool, "inflight"); ok {
		t.Fatal("leaked lock row")
	}
	lk, ok, err := b.m.TryAcquire(ctxT(t), "inflight")
	if err != nil || !ok {
		t.Fatalf("key not free afterwards: %v %v", ok, err)
	}
	if err := lk.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestLateGrantCancelAfterGrant: the loop granted (the lock sits in the
// reply) but the caller left before reading it. The abandon takes the
// grant back and releases it; the caller gets an error, not a lock.
func TestLateGrantCancelAfterGrant(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	m := b.m
	req, _, err := m.newAcquireReq("test", ctxT(t), "granted", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.k.AcquireCh <- req // as Acquire does
	wait(t, &b.sig.Granted)
	if _, ok := lockRow(t, b.pool, "granted"); !ok {
		t.Fatal("not granted in the database")
	}
	m.k.AbandonCh <- req // the caller's ctx ended before it read the reply
	r := <-req.Final
	if r.Lock != nil || !r.Abandoned {
		t.Fatalf("reply after abandon = %+v", r)
	}
	wait(t, &b.sig.TakenBack)
	wait(t, &b.sig.Released)
	if _, ok := lockRow(t, b.pool, "granted"); ok {
		t.Fatal("leaked lock row")
	}
}

// TestLateGrantRandomCancels races many short waits against grants and
// hand-offs on one key: whatever the interleaving, no row is leaked and
// every lock a caller did get was really held.
func TestLateGrantRandomCancels(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var wg sync.WaitGroup
	var got, timedOut, aborted int64
	var mu sync.Mutex
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 7))
			for range 10 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(3000))*time.Microsecond)
				lk, err := b.m.Acquire(ctx, "hot")
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					got++
				case errors.Is(err, pglease.ErrAcquisitionTimeout):
					timedOut++
				case errors.Is(err, pglease.ErrAborted):
					aborted++
				default:
					t.Error(err)
				}
				mu.Unlock()
				if err == nil {
					if id, ok := lockRow(t, b.pool, "hot"); !ok || id != lk.hd.ID {
						t.Error("granted lock not held in the database")
					}
					if err := lk.Release(context.Background()); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("granted %d, timed out %d, aborted %d", got, timedOut, aborted)
	// Let in-flight attempts and releases settle, then the key must be free.
	lk, err := b.m.Acquire(ctxT(t), "hot", WithAcquireTimeout(waitTimeout()))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := countLocks(t, b.pool); n != 0 {
		t.Fatalf("%d rows leaked", n)
	}
}

// TestReleaseWithEndedContext: a Release whose context has already ended
// answers Aborted but still stops the heartbeat and releases the lock.
func TestReleaseWithEndedContext(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	lk, err := b.m.Acquire(ctxT(t), "ended")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lk.Release(ctx); !errors.Is(err, pglease.ErrAborted) {
		t.Fatalf("err = %v", err)
	}
	wait(t, &b.sig.Released) // asynchronous: Release did not wait for it
	if !errors.Is(lk.Err(), pglease.ErrReleased) {
		t.Fatalf("cause = %v", lk.Err())
	}
	if _, ok := lockRow(t, b.pool, "ended"); ok {
		t.Fatal("row still there")
	}
}
