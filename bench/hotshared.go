package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/manager"
)

// hotshared: -hot-shared-callers callers of one process (one Manager with
// the defaults, a pool of min(C, 64) + 2 connections) on one key, empty
// critical sections, against the flush bound measured right before and
// after (measureFlush, the bound the hot key is judged by):
//
//   - "semaphore": every caller takes a permit (WithLimit(-hot-limit)) and
//     releases it;
//   - "rwlock": every acquire is a writer (a plain Acquire) with
//     probability -hot-writers, else a reader (Shared).
//
// Each Acquire waits at most hotSharedWait (a longer wait counts as a
// timeout). The callers check the primitive as they go: more permits
// than the limit, or a writer with any other holder, at once in this
// process is a violation (0). Latency is the Acquire's wait;
// stmts_per_section counts every statement of the pool per section,
// shared_batch the waiters per shared acquire statement (coalescing);
// flush_share is the rate as a share of the flush bound.

// hotSharedWait caps each Acquire's wait in the hotshared scenario.
const hotSharedWait = 5 * time.Second

func runHotShared(ctx context.Context, cfg config, emit func(Result), note noteFunc) error {
	fd := min(cfg.duration, 2*time.Second)
	before, err := measureFlush(ctx, cfg.url, fd)
	if err != nil {
		return fmt.Errorf("flush bound: %w", err)
	}
	var res []Result
	for _, c := range cfg.hotSharedCallers {
		for _, kind := range []string{"semaphore", "rwlock"} {
			r, err := runHotSharedPoint(ctx, cfg, kind, c, note)
			if err != nil {
				return fmt.Errorf("%s C=%d: %w", kind, c, err)
			}
			res = append(res, r)
		}
	}
	after, err := measureFlush(ctx, cfg.url, fd)
	if err != nil {
		return fmt.Errorf("flush bound: %w", err)
	}
	f := mergeFlush(before, after)
	f.Scenario, f.Impl = "hotshared", "flush-bound"
	for _, r := range res {
		if f.CyclesPerSec > 0 {
			r.Extra["flush_share"] = r.CyclesPerSec / f.CyclesPerSec
		}
		emit(r)
	}
	emit(f)
	return nil
}

// hotSharedCaller is what one caller of a hotshared point saw.
type hotSharedCaller struct {
	sections, reads, writes int64
	timeouts, errs          int64
	readWaits, writeWaits   latencies
	firstErr                error
}

func runHotSharedPoint(ctx context.Context, cfg config, kind string, callers int, note noteFunc) (Result, error) {
	tr := &stmtTracer{}
	pool, _, cleanup, err := benchSchema(ctx, cfg.url, min(callers, 64)+2, func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = tr.recorder() })
	if err != nil {
		return Result{}, err
	}
	defer cleanup()
	m, closeM, err := newBenchManager(pool)
	if err != nil {
		return Result{}, err
	}
	const key = "bench:hotshared"
	limit := cfg.hotLimit
	writerShare := 0.0
	if kind == "rwlock" {
		writerShare = cfg.hotWriters
	}
	base := []manager.AcquireOption{manager.WithTTL(30 * time.Second), manager.WithAcquireTimeout(hotSharedWait)}
	readOpts := append(base[:len(base):len(base)], manager.Shared())
	if kind == "semaphore" {
		readOpts = append(base[:len(base):len(base)], manager.WithLimit(limit))
	}
	// What is held at once in this process (the callers count it between
	// Acquire returning and Release being called, inside the hold: with an
	// empty section a weak check, but one that sees no false violation).
	var readers, writers, violations atomic.Int64
	enter := func(write bool) {
		if write {
			if writers.Add(1) > 1 || readers.Load() > 0 {
				violations.Add(1)
			}
			return
		}
		if n := readers.Add(1); writers.Load() > 0 || kind == "semaphore" && n > int64(limit) {
			violations.Add(1)
		}
	}
	leave := func(write bool) {
		if write {
			writers.Add(-1)
		} else {
			readers.Add(-1)
		}
	}
	// cycle makes one acquire+release; a section counts when its grant
	// came before the window's end (end).
	cycle := func(write bool, st *hotSharedCaller, end time.Time) {
		opts := readOpts
		if write {
			opts = base
		}
		t0 := time.Now()
		lk, err := m.Acquire(ctx, key, opts...)
		if err != nil {
			if pglease.CodeOf(err) == pglease.CodeAcquisitionTimeout {
				st.timeouts++
			} else {
				st.errs++
				if st.firstErr == nil {
					st.firstErr = err
				}
			}
			return
		}
		granted := time.Now()
		enter(write)
		leave(write) // empty critical section
		if err := lk.Release(ctx); err != nil {
			st.errs++
			if st.firstErr == nil {
				st.firstErr = err
			}
			return
		}
		if granted.After(end) {
			return
		}
		st.sections++
		if write {
			st.writes++
			st.writeWaits = append(st.writeWaits, granted.Sub(t0))
		} else {
			st.reads++
			st.readWaits = append(st.readWaits, granted.Sub(t0))
		}
	}
	// run makes every caller cycle until d has passed. Waits in progress
	// at the end are not cancelled: a waiter that gives up leaves its mark
	// (a writer's keeps new readers away for 2 s), which would stall the
	// next window; they end with their grant or their timeout.
	run := func(d time.Duration, atEnd func()) []*hotSharedCaller {
		end := time.Now().Add(d)
		ended := make(chan struct{})
		timer := time.AfterFunc(d, func() { atEnd(); close(ended) })
		defer func() {
			if timer.Stop() { // the callers ended before the timer: it will not run
				atEnd()
				close(ended)
			}
			<-ended
		}()
		sts := make([]*hotSharedCaller, callers)
		var wg sync.WaitGroup
		for w := range callers {
			sts[w] = &hotSharedCaller{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 0x9e3779b97f4a7c15))
				for time.Now().Before(end) {
					cycle(rng.Float64() < writerShare, sts[w], end)
				}
			}()
		}
		wg.Wait()
		return sts
	}
	// Warm up: open the connections and prepare the statements.
	var warmErrs int64
	var warmErr error
	for _, st := range run(min(cfg.duration, 200*time.Millisecond), func() {}) {
		warmErrs += st.errs
		if warmErr == nil {
			warmErr = st.firstErr
		}
	}
	if warmErr != nil {
		note("hotshared %s C=%d: %d errors in the warm-up, the first: %v", kind, callers, warmErrs, warmErr)
	}
	tr.reset(false, 0)
	var stmts, shStmts, shItems int64
	sts := run(cfg.duration, func() { // the statements of the window
		tr.mu.Lock()
		stmts, shStmts, shItems = tr.all, tr.shStmts, tr.shItems
		tr.mu.Unlock()
	})
	elapsed := cfg.duration.Seconds()
	if err := closeM(); err != nil {
		return Result{}, err
	}
	r := Result{Scenario: "hotshared", Impl: kind, Callers: callers, Seconds: elapsed, Latency: "wait"}
	var reads, writes, timeouts, top int64
	var rw, ww []latencies
	var firstErr error
	for _, st := range sts {
		r.Cycles += st.sections
		reads += st.reads
		writes += st.writes
		timeouts += st.timeouts
		r.Errors += st.errs
		top = max(top, st.sections)
		rw, ww = append(rw, st.readWaits), append(ww, st.writeWaits)
		if firstErr == nil {
			firstErr = st.firstErr
		}
	}
	r.CyclesPerSec = float64(r.Cycles) / elapsed
	_, p50, p99, mx := summarize(append(rw[:len(rw):len(rw)], ww...))
	r.P50Ms, r.P99Ms, r.MaxMs = ms(p50), ms(p99), ms(mx)
	r.Extra = map[string]float64{"timeouts": float64(timeouts), "violations": float64(violations.Load()),
		"pool": float64(min(callers, 64) + 2)}
	if shStmts > 0 {
		r.Extra["shared_batch"] = float64(shItems) / float64(shStmts) // waiters per shared acquire statement
	}
	if r.Cycles > 0 {
		r.Extra["stmts_per_section"] = float64(stmts) / float64(r.Cycles)
		r.Extra["max_share"] = float64(top) / float64(r.Cycles)
	}
	if kind == "semaphore" {
		r.Extra["limit"] = float64(limit)
	} else {
		r.Extra["reads_per_s"] = float64(reads) / elapsed
		r.Extra["writes_per_s"] = float64(writes) / elapsed
		if r.Cycles > 0 {
			r.Extra["write_share"] = float64(writes) / float64(r.Cycles)
		}
		_, rp50, rp99, _ := summarize(rw)
		_, wp50, wp99, _ := summarize(ww)
		r.Extra["read_wait_p50_ms"], r.Extra["read_wait_p99_ms"] = ms(rp50), ms(rp99)
		r.Extra["write_wait_p50_ms"], r.Extra["write_wait_p99_ms"] = ms(wp50), ms(wp99)
	}
	if firstErr != nil {
		note("hotshared %s C=%d: %d errors, the first: %v", kind, callers, r.Errors, firstErr)
	}
	return r, nil
}
