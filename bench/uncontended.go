package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
)

// uncontendedPoolSize is the pool size of every implementation at C
// callers, so they are compared on equal connections.
func uncontendedPoolSize(callers int) int { return min(callers, 64) + 2 }

// setbasedDrivers is how many drivers the set-based ceiling uses for C
// callers: the Manager may have two acquire and two release batches in
// flight by default, so at most four statements run at once.
func setbasedDrivers(callers int) int { return min(callers, 4) }

const uncontendedTTL = 30 * time.Second

func runUncontended(ctx context.Context, cfg config, emit func(Result), _ noteFunc) error {
	var impls []uncontendedImpl
	for _, impl := range uncontendedImpls {
		if cfg.impls != nil && !cfg.impls[impl.name] || cfg.impls == nil && impl.optional {
			continue
		}
		impls = append(impls, impl)
	}
	for _, c := range cfg.callers {
		// With -rounds N, every implementation runs N times, interleaved
		// (round r starts with implementation r mod len), and the run with
		// the median throughput is reported: load that comes and goes hits
		// them all alike.
		runs := make([][]Result, len(impls))
		for round := range max(cfg.rounds, 1) {
			for j := range impls {
				i := (j + round) % len(impls)
				r, err := runUncontendedPoint(ctx, cfg.url, impls[i], c, cfg.duration)
				if err != nil {
					return fmt.Errorf("%s C=%d: %w", impls[i].name, c, err)
				}
				runs[i] = append(runs[i], r)
			}
		}
		for i := range impls {
			emit(medianRun(runs[i]))
		}
	}
	return nil
}

// medianRun returns the run with the median throughput; with several runs
// it notes their number and the lowest and highest throughput.
func medianRun(runs []Result) Result {
	if len(runs) == 1 {
		return runs[0]
	}
	sorted := slices.Clone(runs)
	slices.SortFunc(sorted, func(a, b Result) int { return cmp.Compare(a.CyclesPerSec, b.CyclesPerSec) })
	r := sorted[len(sorted)/2]
	r.Extra = maps.Clone(r.Extra)
	r.Extra["rounds"] = float64(len(runs))
	r.Extra["min_per_s"] = sorted[0].CyclesPerSec
	r.Extra["max_per_s"] = sorted[len(sorted)-1].CyclesPerSec
	return r
}

func runUncontendedPoint(ctx context.Context, url string, impl uncontendedImpl, c int, d time.Duration) (Result, error) {
	tr := &stmtTracer{}
	rec := tr.recorder()
	if c == 1 {
		// One caller: its cycle is its statements' time plus the time
		// outside them (the caller's own code, and the Manager's).
		rec = tr.recorderTimed()
	}
	pool, _, cleanup, err := benchSchema(ctx, url, uncontendedPoolSize(c), func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = rec })
	if err != nil {
		return Result{}, err
	}
	defer cleanup()
	workers, newStep, closeImpl, err := impl.setup(ctx, pool, c)
	if err != nil {
		return Result{}, err
	}
	// Warm up: open the connections and prepare statements on them.
	_ = measure(ctx, "warmup", impl.name, workers, 200*time.Millisecond, newStep)
	tr.reset(false, 0)
	r := measure(ctx, "uncontended", impl.name, workers, d, newStep)
	r.Callers = c
	tr.mu.Lock()
	r.Extra = map[string]float64{"pool": float64(uncontendedPoolSize(c)),
		"stmts_per_cycle": float64(tr.all) / max(float64(r.Cycles), 1)}
	if tr.acqStmts > 0 {
		r.Extra["acq_batch"] = float64(tr.acqItems) / float64(tr.acqStmts)
	}
	if c == 1 && r.Cycles > 0 && r.CyclesPerSec > 0 {
		stmt := float64(tr.stmtTime.Microseconds()) / float64(r.Cycles)
		r.Extra["stmt_us_per_cycle"] = stmt
		r.Extra["outside_us_per_cycle"] = 1e6/r.CyclesPerSec - stmt
	}
	tr.mu.Unlock()
	if impl.name == "pg-setbased" {
		r.Extra["drivers"] = float64(workers)
		r.Latency = "step"
	}
	if err := closeImpl(); err != nil {
		return Result{}, err
	}
	return r, nil
}

type uncontendedImpl struct {
	name string
	// optional implementations run only when -impls names them.
	optional bool
	// setup returns how many workers to run for C callers and their steps.
	setup func(ctx context.Context, pool *pgxpool.Pool, callers int) (workers int, newStep func(w int) step, closeFn func() error, err error)
}

// keySet returns 64 distinct keys for slot s (a caller, or one item of a
// set-based batch); slots never share keys.
func keySet(s int) []string {
	ks := make([]string, 64)
	for i := range ks {
		ks[i] = fmt.Sprintf("bench:%d:%d", s, i)
	}
	return ks
}

var errLocked = errors.New("uncontended key was locked")

var uncontendedImpls = []uncontendedImpl{
	{name: "syncguard-protocol", setup: func(ctx context.Context, pool *pgxpool.Pool, callers int) (int, func(int) step, func() error, error) {
		sg := newSyncGuardProtocol(pool, "syncguard_locks", "syncguard_fence_counters")
		return callers, func(w int) step {
			keys := keySet(w)
			return func(ctx context.Context, w, i int) (int, error) {
				id, err := sg.acquire(ctx, keys[i%len(keys)], uncontendedTTL)
				if err != nil {
					return 0, err
				}
				if id == "" {
					return 0, errLocked
				}
				ok, err := sg.release(ctx, id)
				if err != nil || !ok {
					return 0, fmt.Errorf("release failed: %v", err)
				}
				return 1, nil
			}
		}, func() error { return nil }, nil
	}},
	{name: "pg-single", setup: func(ctx context.Context, pool *pgxpool.Pool, callers int) (int, func(int) step, func() error, error) {
		st, err := pg.New(pool, pg.Config{})
		if err != nil {
			return 0, nil, nil, err
		}
		return callers, func(w int) step {
			keys := keySet(w)
			return func(ctx context.Context, w, i int) (int, error) {
				r, err := st.Acquire(ctx, keys[i%len(keys)], uncontendedTTL)
				if err != nil {
					return 0, err
				}
				if !r.OK {
					return 0, errLocked
				}
				ok, err := st.Release(ctx, r.LockID)
				if err != nil || !ok {
					return 0, fmt.Errorf("release failed: %v", err)
				}
				return 1, nil
			}
		}, func() error { return nil }, nil
	}},
	{name: "pg-setbased", setup: func(ctx context.Context, pool *pgxpool.Pool, callers int) (int, func(int) step, func() error, error) {
		st, err := store.New("pg.New", pool, store.Config{})
		if err != nil {
			return 0, nil, nil, err
		}
		drivers := setbasedDrivers(callers)
		return drivers, func(w int) step {
			// Driver w owns batch slots [lo, hi) of the C callers' slots.
			lo, hi := w*callers/drivers, (w+1)*callers/drivers
			sets := make([][]store.AcquireRequest, 64)
			for i := range sets {
				sets[i] = make([]store.AcquireRequest, 0, hi-lo)
			}
			for s := lo; s < hi; s++ {
				for i, k := range keySet(s) {
					sets[i] = append(sets[i], store.AcquireRequest{Key: k, TTL: uncontendedTTL})
				}
			}
			ids := make([]string, hi-lo)
			return func(ctx context.Context, w, i int) (int, error) {
				res, err := st.AcquireMany(ctx, sets[i%len(sets)])
				if err != nil {
					return 0, err
				}
				for j, r := range res {
					if !r.OK {
						return 0, errLocked
					}
					ids[j] = r.LockID
				}
				oks, err := st.ReleaseMany(ctx, ids)
				if err != nil {
					return 0, err
				}
				for _, ok := range oks {
					if !ok {
						return 0, errors.New("release failed")
					}
				}
				return len(ids), nil
			}
		}, func() error { return nil }, nil
	}},
	{name: "manager", setup: managerSetup(manager.Config{})},
	{name: "actor-floor", setup: actorFloorSetup(false)},
	{name: "actor-floor-plain", optional: true, setup: actorFloorSetup(true)},
	{name: "manager-nonotify", optional: true, setup: managerSetup(manager.Config{DisableNotify: true})},
	// In-flight cap variants (only with -impls), for A/B runs of the caps.
	{name: "manager-inflight2", optional: true, setup: managerSetup(manager.Config{MaxInFlight: 2})},
	{name: "manager-inflight4", optional: true, setup: managerSetup(manager.Config{MaxInFlight: 4})},
}

// managerSetup runs each caller as m.Acquire + lk.Release on a Manager
// with mcfg.
func managerSetup(mcfg manager.Config) func(ctx context.Context, pool *pgxpool.Pool, callers int) (int, func(int) step, func() error, error) {
	return func(ctx context.Context, pool *pgxpool.Pool, callers int) (int, func(int) step, func() error, error) {
		m, err := manager.New(pool, mcfg)
		if err != nil {
			return 0, nil, nil, err
		}
		return callers, func(w int) step {
				keys := keySet(w)
				return func(ctx context.Context, w, i int) (int, error) {
					lk, err := m.Acquire(ctx, keys[i%len(keys)], manager.WithTTL(uncontendedTTL))
					if err != nil {
						return 0, err
					}
					if err := lk.Release(ctx); err != nil {
						return 0, err
					}
					return 1, nil
				}
			}, func() error {
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				return m.Close(cctx)
			}, nil
	}
}
