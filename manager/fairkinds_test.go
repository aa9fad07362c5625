package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager/internal/kernel"
)

// fairArrival is one caller of a fair-queue order test: which Manager it
// uses, and what it asks for (a writer, a reader, or a permit of limit).
type fairArrival struct {
	m      int
	reader bool
	limit  int
}

func (a fairArrival) opts() []AcquireOption {
	opts := []AcquireOption{WithAcquireTimeout(time.Minute)}
	switch {
	case a.reader:
		opts = append(opts, Shared())
	case a.limit > 0:
		opts = append(opts, WithLimit(a.limit))
	}
	return opts
}

// runArrivals makes the callers of arrivals wait for key, one after
// another (in fair mode each one's ticket is in the queue before the next
// comes; without, each waits 300 ms), while first is held; then first is
// released and every caller holds what it gets for hold. It returns each
// caller's fence.
func runArrivals(t *testing.T, fair bool, b *bundle, ms []*Manager, sigs []*kernel.Signals, key string, first []*Lock, arrivals []fairArrival, hold time.Duration) []pglease.Fence {
	t.Helper()
	ctx := ctxT(t)
	fences := make([]pglease.Fence, len(arrivals))
	var wg sync.WaitGroup
	errc := make(chan error, len(arrivals))
	for i, a := range arrivals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, err := ms[a.m].Acquire(ctx, key, a.opts()...)
			if err != nil {
				errc <- fmt.Errorf("caller %d: %w", i, err)
				return
			}
			fences[i] = lk.Fence()
			time.Sleep(hold)
			if err := lk.Release(ctx); err != nil {
				errc <- fmt.Errorf("caller %d release: %w", i, err)
			}
		}()
		wait(t, &sigs[a.m].Queued)
		if fair {
			waitTickets(t, b.admin, key, i+1) // its place taken before the next comes
		} else {
			time.Sleep(300 * time.Millisecond)
		}
	}
	for _, lk := range first {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if fair && !t.Failed() {
		waitTickets(t, b.admin, key, 0)
	}
	return fences
}

// TestFairReadersWritersAcrossManagers: readers and writers of three
// Managers queue for a key held by a writer, interleaved across the
// Managers. With the queue they are served in arrival order, writer
// preference inside it: a writer gets the key after every caller that
// came before it (its fence above all of theirs) and before every one
// that came after (a later reader's fence is at least the writer's: it
// reads the writer's state); readers in a row share the key.
func TestFairReadersWritersAcrossManagers(t *testing.T) {
	if n := rwOrderViolations(t, true); n > 0 {
		t.Fatalf("%d pairs served out of arrival order", n)
	}
}

// rwOrderViolations runs the reader-writer order test and counts the
// pairs of callers served out of arrival order.
func rwOrderViolations(t *testing.T, fair bool) int {
	const key = "fair:rw"
	b, ms, sigs := fairManagers(t, 3, fair)
	held, err := ms[0].Acquire(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}
	W := func(m int) fairArrival { return fairArrival{m: m} }
	R := func(m int) fairArrival { return fairArrival{m: m, reader: true} }
	arrivals := []fairArrival{R(1), R(2), W(0), R(1), R(2), W(1), R(0), W(2), R(1)}
	fences := runArrivals(t, fair, b, ms, sigs, key, []*Lock{held}, arrivals, 20*time.Millisecond)
	bad := 0
	for i := range arrivals {
		for j := i + 1; j < len(arrivals); j++ {
			switch {
			case !arrivals[j].reader && fences[j] <= fences[i]:
				bad++ // a writer served before (or with) one that came first
			case !arrivals[i].reader && fences[j] < fences[i]:
				bad++ // served before a writer that came first
			}
		}
	}
	t.Logf("fair=%v: fences %v, %d pairs out of order", fair, fences, bad)
	return bad
}

// TestFairPermitsAcrossManagers: permits of a semaphore of 2, asked for
// by callers of three Managers interleaved, while two permits are held:
// served in arrival order (each permit's fence is a fresh increment, so
// the fences rise with the arrival order).
func TestFairPermitsAcrossManagers(t *testing.T) {
	if n := permitOrderViolations(t, true); n > 0 {
		t.Fatalf("%d permits served out of arrival order", n)
	}
}

func permitOrderViolations(t *testing.T, fair bool) int {
	const key = "fair:permits"
	b, ms, sigs := fairManagers(t, 3, fair)
	ctx := ctxT(t)
	var first []*Lock
	for range 2 {
		lk, err := ms[0].Acquire(ctx, key, WithLimit(2))
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, lk)
	}
	P := func(m int) fairArrival { return fairArrival{m: m, limit: 2} }
	arrivals := []fairArrival{P(1), P(2), P(0), P(2), P(1), P(0), P(1), P(2)}
	fences := runArrivals(t, fair, b, ms, sigs, key, first, arrivals, 20*time.Millisecond)
	bad := 0
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			bad++
		}
	}
	t.Logf("fair=%v: fences %v, %d out of order", fair, fences, bad)
	return bad
}

// TestFairSetAgainstSingleKeyCallers: a set of 4 keys in one Manager,
// each key hammered by single-key callers of three other Managers (two
// per key and Manager, each holding it 2 ms, again and again). With the
// queue the set's tickets stand in each key's line like the others', and
// it is granted in its turn: every AcquireAll succeeds within 10 s.
func TestFairSetAgainstSingleKeyCallers(t *testing.T) {
	if n := setTimeouts(t, true, 3); n > 0 {
		t.Fatalf("%d of 3 sets timed out after 10 s", n)
	}
}

func setTimeouts(t *testing.T, fair bool, rounds int) int {
	_, ms, _ := fairManagers(t, 4, fair)
	keys := []string{"fair:set:a", "fair:set:b", "fair:set:c", "fair:set:d"}
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var wg sync.WaitGroup
	var singles atomic.Int64
	errc := make(chan error, 64)
	for _, m := range ms[1:] {
		for _, key := range keys {
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						lk, err := m.Acquire(ctx, key, WithAcquireTimeout(time.Minute))
						if err != nil {
							if ctx.Err() == nil {
								errc <- err
							}
							return
						}
						singles.Add(1)
						time.Sleep(2 * time.Millisecond)
						if err := lk.Release(context.Background()); err != nil && ctx.Err() == nil {
							errc <- err
							return
						}
					}
				}()
			}
		}
	}
	time.Sleep(500 * time.Millisecond) // the keys' lines are full
	timeouts := 0
	for range rounds {
		locks, err := ms[0].AcquireAll(ctxT(t), keys, WithAcquireTimeout(10*time.Second))
		if err != nil {
			if !errors.Is(err, pglease.ErrAcquisitionTimeout) {
				t.Fatalf("AcquireAll: %v", err)
			}
			timeouts++
			continue
		}
		time.Sleep(2 * time.Millisecond)
		for _, lk := range locks {
			if err := lk.Release(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		}
	}
	cancel()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	t.Logf("fair=%v: %d of %d sets timed out; %d single-key grants meanwhile", fair, timeouts, rounds, singles.Load())
	return timeouts
}

// TestFairSyncCommitTimeoutNeverGrants: with the fair queue, an attempt
// whose outcome is unknown must not become a grant either. With the
// synchronous standby gone, each QueueWait's commit waits past the
// statement timeout (ambiguous) and is committed locally when its wait
// is cancelled (as pgconn's cancel request does): the waiter's next
// QueueWait of the same ticket would find that unreplicated grant and
// answer "granted". The waiter takes a
// new ticket instead, the acquire fails typed, and the orphan grants are
// released.
func TestFairSyncCommitTimeoutNeverGrants(t *testing.T) {
	t.Parallel()
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{Sync: true})
	url := failoverURL(r)
	ctx := harnessCtx(t)
	c, _ := failoverManager(t, url, Config{StatementTimeout: time.Second, TTL: time.Minute, FairQueue: true}, kernel.TestHooks{})
	if err := c.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	admin := stopStandby(t, ctx, r)
	keys := []string{"forphan:a", "forphan:b", "forphan:c"}
	for _, key := range keys {
		lk, err := c.Acquire(ctx, key, WithAcquireTimeout(2*time.Second))
		if err == nil {
			t.Fatalf("Acquire of %s whose commits outlived the statement timeout: granted fence %v, want a typed error, never a grant", key, lk.Fence())
		}
		var pe *pglease.Error
		if !errors.As(err, &pe) || pe.Code == 0 {
			t.Fatalf("Acquire of %s whose commits outlived the statement timeout: %v, want a typed error", key, err)
		}
		cancelSyncRepWaits(t, ctx, admin) // commits whatever still waits, as pgconn's cancel request does
	}
	noLiveLeases(t, ctx, admin, "forphan:", len(keys), 15*time.Second)
}
