package manager

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/pglease/pglease"
)

// permitTracker keeps the permits of one key that this test's callers
// hold, by limit: a caller adds its permit after its grant and removes it
// before its release, so the tracked permits are always a subset of the
// server's live ones, and a count above the smallest tracked limit is a
// count above the smallest live limit.
type permitTracker struct {
	mu         sync.Mutex
	lims       map[int]int
	n, most    int
	violations []string
}

func (p *permitTracker) add(lim int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lims[lim]++
	p.n++
	p.most = max(p.most, p.n)
	least := lim
	for l := range p.lims {
		least = min(least, l)
	}
	if p.n > least && len(p.violations) < 10 {
		p.violations = append(p.violations, fmt.Sprintf("%d permits held with limits %v", p.n, p.lims))
	}
}

func (p *permitTracker) remove(lim int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lims[lim]--; p.lims[lim] == 0 {
		delete(p.lims, lim)
	}
	p.n--
}

// fleetStats counts what one fleet's callers got.
type fleetStats struct {
	grants, timeouts atomic.Int64
	mu               sync.Mutex
	errs             []error
}

// runFleet starts, for each Manager of ms, callers goroutines that take
// a permit of key with limit lim, hold it 1-15 ms and release it, until
// stop closes. Waits end after 2 s (AcquisitionTimeout is counted, every
// other error kept).
func runFleet(ctx context.Context, wg *sync.WaitGroup, ms []*Manager, callers int, key string, lim int, tr *permitTracker, st *fleetStats, stop <-chan struct{}) {
	for _, m := range ms {
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					lk, err := m.Acquire(ctx, key, WithLimit(lim), WithAcquireTimeout(2*time.Second))
					switch {
					case errors.Is(err, pglease.ErrAcquisitionTimeout):
						st.timeouts.Add(1)
						continue
					case err != nil:
						st.mu.Lock()
						st.errs = append(st.errs, err)
						st.mu.Unlock()
						time.Sleep(10 * time.Millisecond)
						continue
					}
					st.grants.Add(1)
					tr.add(lim)
					time.Sleep(time.Duration(1+rand.IntN(15)) * time.Millisecond)
					tr.remove(lim)
					if err := lk.Release(ctx); err != nil {
						st.mu.Lock()
						st.errs = append(st.errs, err)
						st.mu.Unlock()
					}
				}
			}()
		}
	}
}

func (st *fleetStats) check(t *testing.T, what string) {
	t.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	if n := len(st.errs); n > 0 {
		codes := map[pglease.Code]int{}
		for _, err := range st.errs {
			codes[pglease.CodeOf(err)]++
		}
		t.Errorf("%s: %d errors (by code %v), first: %v", what, n, codes, st.errs[0])
	}
}

// TestSemaphoreLimitChange: a rolling deploy that changes a semaphore's
// limit. Managers with the old limit and Managers with the new one take
// permits of one key at once, then the old ones stop: no caller gets an
// error (the disagreement is contention), the key never has more permits
// than the smallest limit of the live ones, and once the old Managers are
// gone the new limit applies (a raise: more permits at once than the old
// limit allowed; a lowering: the new Managers get permits, never more than
// the new limit).
func TestSemaphoreLimitChange(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	var ms []*Manager
	for range 3 {
		p, _ := b.newPeer(t, Config{})
		ms = append(ms, p)
	}
	for _, c := range []struct {
		name     string
		old, new int
	}{{"lower", 6, 2}, {"raise", 1, 4}} {
		t.Run(c.name, func(t *testing.T) {
			key := "sem:rolling:" + c.name
			tr := &permitTracker{lims: map[int]int{}}
			var oldSt, newSt fleetStats
			var oldWG, newWG sync.WaitGroup
			stopOld, stopNew := make(chan struct{}), make(chan struct{})
			defer func() {
				select {
				case <-stopOld:
				default:
					close(stopOld)
				}
				select {
				case <-stopNew:
				default:
					close(stopNew)
				}
				oldWG.Wait()
				newWG.Wait()
			}()
			runFleet(ctx, &oldWG, []*Manager{b.m, ms[0]}, 6, key, c.old, tr, &oldSt, stopOld)
			runFleet(ctx, &newWG, ms[1:], 6, key, c.new, tr, &newSt, stopNew)
			time.Sleep(3 * time.Second)
			// The old fleet goes (a rolling deploy's last old process
			// stops); the new one carries on.
			close(stopOld)
			oldWG.Wait()
			tr.mu.Lock()
			mixedMost := tr.most
			tr.most = tr.n
			tr.mu.Unlock()
			newBefore := newSt.grants.Load()
			deadline := time.Now().Add(2 * waitTimeout())
			for {
				tr.mu.Lock()
				most := tr.most
				tr.mu.Unlock()
				got := newSt.grants.Load() - newBefore
				if got >= 20 && (c.new <= c.old || most > c.old) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("new limit %d alone: %d grants, at most %d permits at once; want 20 grants and, for a raise, more than %d at once",
						c.new, got, most, c.old)
				}
				time.Sleep(20 * time.Millisecond)
			}
			close(stopNew)
			newWG.Wait()
			oldSt.check(t, fmt.Sprintf("old fleet (limit %d)", c.old))
			newSt.check(t, fmt.Sprintf("new fleet (limit %d)", c.new))
			tr.mu.Lock()
			defer tr.mu.Unlock()
			if len(tr.violations) > 0 {
				t.Errorf("more permits than the smallest live limit: %v", tr.violations)
			}
			if c.new < c.old && tr.most > c.new {
				t.Errorf("new limit %d alone: %d permits at once", c.new, tr.most)
			}
			t.Logf("old fleet (limit %d): %d grants, %d timeouts; new fleet (limit %d): %d grants, %d timeouts; at most %d permits at once while mixed",
				c.old, oldSt.grants.Load(), oldSt.timeouts.Load(), c.new, newSt.grants.Load(), newSt.timeouts.Load(), mixedMost)
		})
	}
}

// TestWriterPreferenceBehindWriter: writers of two Managers wait behind an
// exclusive holder of a third; readers of two more Managers arrive later.
// When the holder releases, every waiting writer has the key before any
// of those readers, across the Managers, round after round.
func TestWriterPreferenceBehindWriter(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	var writers, readers []*Manager
	var wsigs, rsigs []*kernel.Signals
	for range 2 {
		m, s := b.newPeer(t, Config{})
		writers, wsigs = append(writers, m), append(wsigs, s)
		m, s = b.newPeer(t, Config{})
		readers, rsigs = append(readers, m), append(rsigs, s)
	}
	const rounds, writersEach, readersEach = 4, 2, 8
	for round := range rounds {
		key := fmt.Sprintf("rw:pref:%d", round)
		h, err := b.m.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		var seq atomic.Int64
		var wg sync.WaitGroup
		var mu sync.Mutex
		var writerSeqs, readerSeqs []int64
		var errs []error
		take := func(m *Manager, seqs *[]int64, hold time.Duration, opts ...AcquireOption) {
			defer wg.Done()
			lk, err := m.Acquire(ctx, key, append(opts, WithAcquireTimeout(time.Minute))...)
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			n := seq.Add(1)
			mu.Lock()
			*seqs = append(*seqs, n)
			mu.Unlock()
			time.Sleep(hold)
			if err := lk.Release(ctx); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}
		for i, m := range writers {
			drain(&wsigs[i].Retrying)
			for range writersEach {
				wg.Add(1)
				go take(m, &writerSeqs, 50*time.Millisecond)
			}
			// Its first attempt was refused by the holder.
			waitFor(t, &wsigs[i].Retrying, func(k string) bool { return k == key })
		}
		for i, m := range readers {
			drain(&rsigs[i].Retrying)
			for range readersEach {
				wg.Add(1)
				go take(m, &readerSeqs, 5*time.Millisecond, Shared())
			}
			waitFor(t, &rsigs[i].Retrying, func(k string) bool { return k == key })
		}
		// Everybody waits; some hundreds of milliseconds pass, then the
		// holder goes.
		time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("round %d: %d acquires failed, first: %v", round, len(errs), errs[0])
		}
		lastWriter, firstReader := int64(0), int64(1<<62)
		for _, n := range writerSeqs {
			lastWriter = max(lastWriter, n)
		}
		for _, n := range readerSeqs {
			firstReader = min(firstReader, n)
		}
		if firstReader < lastWriter {
			t.Errorf("round %d: a reader that arrived after the waiting writers was granted before one of them: writers got grants %v, readers %v",
				round, writerSeqs, readerSeqs)
		}
	}
}
