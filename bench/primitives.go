package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// The primitives' scenarios (shared, sets, txlease, guard; hotshared is in
// hotshared.go): each runs its implementations at every C of
// -prim-callers, on a fresh schema and a pool of uncontendedPoolSize(C)
// connections each, interleaved over -rounds rounds like the uncontended
// points (the median run is reported), and counts every statement the
// pool sends (stmts_per_step: per acquire+release cycle, per set, per
// transaction).

// primImpl is one implementation of a primitives scenario.
type primImpl struct {
	name string
	// setup prepares C callers' steps on pool (a fresh schema's, whose name
	// is schema); closeFn undoes it.
	setup func(ctx context.Context, pool *pgxpool.Pool, schema string, callers int) (newStep func(w int) step, closeFn func() error, err error)
}

// runPrimScenario measures impls at every C of cfg.primCallers.
func runPrimScenario(ctx context.Context, cfg config, scenario string, impls []primImpl, emit func(Result)) error {
	for _, c := range cfg.primCallers {
		runs := make([][]Result, len(impls))
		for round := range max(cfg.rounds, 1) {
			for j := range impls {
				i := (j + round) % len(impls)
				r, err := runPrimPoint(ctx, cfg.url, scenario, impls[i], c, cfg.duration)
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

// runPrimPoint measures one implementation at C callers for d.
// stmts_per_step is every statement the pool sent (BEGIN and COMMIT
// included) per step of a caller; a step counts as many cycles as it
// returns (a set counts its keys).
func runPrimPoint(ctx context.Context, url, scenario string, impl primImpl, c int, d time.Duration) (Result, error) {
	tr := &stmtTracer{}
	pool, schema, cleanup, err := benchSchema(ctx, url, uncontendedPoolSize(c), func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = tr.recorder() })
	if err != nil {
		return Result{}, err
	}
	defer cleanup()
	newStep, closeImpl, err := impl.setup(ctx, pool, schema, c)
	if err != nil {
		return Result{}, err
	}
	var steps atomic.Int64
	counted := func(w int) step {
		st := newStep(w)
		return func(ctx context.Context, w, i int) (int, error) {
			n, err := st(ctx, w, i)
			if err == nil {
				steps.Add(1)
			}
			return n, err
		}
	}
	// Warm up: open the connections and prepare statements on them.
	_ = measure(ctx, "warmup", impl.name, c, min(d, 200*time.Millisecond), counted)
	tr.reset(false, 0)
	steps.Store(0)
	r := measure(ctx, scenario, impl.name, c, d, counted)
	tr.mu.Lock()
	all := tr.all
	tr.mu.Unlock()
	n := max(float64(steps.Load()), 1)
	r.Extra = map[string]float64{"pool": float64(uncontendedPoolSize(c)), "stmts_per_step": float64(all) / n,
		"steps_per_s": float64(steps.Load()) / r.Seconds}
	if err := closeImpl(); err != nil {
		return Result{}, err
	}
	return r, nil
}

// newBenchManager is a Manager with the defaults on pool and its closer.
func newBenchManager(pool *pgxpool.Pool) (*manager.Manager, func() error, error) {
	m, err := manager.New(pool, manager.Config{})
	if err != nil {
		return nil, nil, err
	}
	return m, func() error {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return m.Close(cctx)
	}, nil
}

// managerCycleImpl runs m.Acquire(key, opts…) + Release per step, on
// each caller's 64 keys.
func managerCycleImpl(name string, opts ...manager.AcquireOption) primImpl {
	return primImpl{name: name, setup: func(ctx context.Context, pool *pgxpool.Pool, _ string, _ int) (func(int) step, func() error, error) {
		m, closeFn, err := newBenchManager(pool)
		if err != nil {
			return nil, nil, err
		}
		opts := append([]manager.AcquireOption{manager.WithTTL(uncontendedTTL)}, opts...)
		return func(w int) step {
			keys := keySet(w)
			return func(ctx context.Context, w, i int) (int, error) {
				lk, err := m.Acquire(ctx, keys[i%len(keys)], opts...)
				if err != nil {
					return 0, err
				}
				if err := lk.Release(ctx); err != nil {
					return 0, err
				}
				return 1, nil
			}
		}, closeFn, nil
	}}
}

// primLimit is the semaphore's n in the uncontended shared scenario (its
// keys are uncontended: any n gives the same statements).
const primLimit = 4

// sharedImpls: the exclusive lease, a reader (Shared) and a permit
// (WithLimit) of distinct keys, acquire+release per cycle.
var sharedImpls = []primImpl{
	managerCycleImpl("exclusive"),
	managerCycleImpl("reader", manager.Shared()),
	managerCycleImpl("semaphore", manager.WithLimit(primLimit)),
}

func runShared(ctx context.Context, cfg config, emit func(Result), _ noteFunc) error {
	return runPrimScenario(ctx, cfg, "shared", sharedImpls, emit)
}

// setImpl runs AcquireAll of n of the caller's keys and the release of
// every lock (concurrent Releases, batched by the Manager when they meet,
// as manager's BenchmarkAcquireAll does); a step counts n keys.
func setImpl(n int) primImpl {
	return primImpl{name: fmt.Sprintf("set%d", n), setup: func(ctx context.Context, pool *pgxpool.Pool, _ string, _ int) (func(int) step, func() error, error) {
		m, closeFn, err := newBenchManager(pool)
		if err != nil {
			return nil, nil, err
		}
		return func(w int) step {
			keys := keySet(w)
			sets := make([][]string, len(keys)/n) // disjoint sets of n of the caller's keys
			for i := range sets {
				sets[i] = keys[i*n : (i+1)*n]
			}
			errs := make([]error, n)
			return func(ctx context.Context, w, i int) (int, error) {
				locks, err := m.AcquireAll(ctx, sets[i%len(sets)], manager.WithTTL(uncontendedTTL))
				if err != nil {
					return 0, err
				}
				var wg sync.WaitGroup
				for j, lk := range locks {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs[j] = lk.Release(ctx)
					}()
				}
				wg.Wait()
				for _, err := range errs[:len(locks)] {
					if err != nil {
						return 0, err
					}
				}
				return n, nil
			}
		}, closeFn, nil
	}}
}

// setImpls: single-key cycles, then sets of 2 and 8 keys.
var setImpls = []primImpl{managerCycleImpl("single"), setImpl(2), setImpl(8)}

func runSets(ctx context.Context, cfg config, emit func(Result), _ noteFunc) error {
	return runPrimScenario(ctx, cfg, "sets", setImpls, func(r Result) {
		if n := setSize(r.Impl); n > 0 {
			r.Extra["keys_per_set"] = float64(n)
		}
		emit(r)
	})
}

// setSize is the set size of a sets implementation ("set8": 8; "single": 1).
func setSize(impl string) int {
	var n int
	if _, err := fmt.Sscanf(impl, "set%d", &n); err == nil {
		return n
	}
	return 1
}

// txRowsTable is the table the txlease and guard writes update: one row
// per caller.
const txRowsTable = "bench_rows"

// createRows creates table (key text primary key, n bigint) with one row
// per caller, keyed rowKey(w).
func createRows(ctx context.Context, pool *pgxpool.Pool, table string, callers int) error {
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (key text PRIMARY KEY, n bigint NOT NULL DEFAULT 0)"); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, "INSERT INTO "+table+" (key) SELECT 'bench:row:' || g FROM generate_series(0, $1::int - 1) AS g", callers)
	return err
}

// rowKey is caller w's row key, and the lock key of the guard scenario.
func rowKey(w int) string { return fmt.Sprintf("bench:row:%d", w) }

// txleaseImpls: a lease taken, used and released in the caller's
// transaction (pg.New on the pgx.Tx: BEGIN; Acquire; UPDATE; Release;
// COMMIT) against the same work in autocommit statements (pg.Store on the
// pool: Acquire; UPDATE; Release) and against the UPDATE alone.
var txleaseImpls = []primImpl{
	{name: "tx-lease", setup: func(ctx context.Context, pool *pgxpool.Pool, _ string, callers int) (func(int) step, func() error, error) {
		if err := createRows(ctx, pool, txRowsTable, callers); err != nil {
			return nil, nil, err
		}
		upd := "UPDATE " + txRowsTable + " SET n = n + 1 WHERE key = $1"
		return func(w int) step {
			keys, row := keySet(w), rowKey(w)
			return func(ctx context.Context, w, i int) (int, error) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					return 0, err
				}
				defer func() { _ = tx.Rollback(context.Background()) }()
				st, err := pg.New(tx, pg.Config{})
				if err != nil {
					return 0, err
				}
				r, err := st.Acquire(ctx, keys[i%len(keys)], uncontendedTTL)
				if err != nil {
					return 0, err
				}
				if !r.OK {
					return 0, errLocked
				}
				if _, err := tx.Exec(ctx, upd, row); err != nil {
					return 0, err
				}
				if ok, err := st.Release(ctx, r.LockID); err != nil || !ok {
					return 0, fmt.Errorf("release failed: %v", err)
				}
				return 1, tx.Commit(ctx)
			}
		}, func() error { return nil }, nil
	}},
	{name: "plain-lease", setup: func(ctx context.Context, pool *pgxpool.Pool, _ string, callers int) (func(int) step, func() error, error) {
		if err := createRows(ctx, pool, txRowsTable, callers); err != nil {
			return nil, nil, err
		}
		st, err := pg.New(pool, pg.Config{})
		if err != nil {
			return nil, nil, err
		}
		upd := "UPDATE " + txRowsTable + " SET n = n + 1 WHERE key = $1"
		return func(w int) step {
			keys, row := keySet(w), rowKey(w)
			return func(ctx context.Context, w, i int) (int, error) {
				r, err := st.Acquire(ctx, keys[i%len(keys)], uncontendedTTL)
				if err != nil {
					return 0, err
				}
				if !r.OK {
					return 0, errLocked
				}
				if _, err := pool.Exec(ctx, upd, row); err != nil {
					return 0, err
				}
				if ok, err := st.Release(ctx, r.LockID); err != nil || !ok {
					return 0, fmt.Errorf("release failed: %v", err)
				}
				return 1, nil
			}
		}, func() error { return nil }, nil
	}},
	{name: "write-only", setup: func(ctx context.Context, pool *pgxpool.Pool, _ string, callers int) (func(int) step, func() error, error) {
		if err := createRows(ctx, pool, txRowsTable, callers); err != nil {
			return nil, nil, err
		}
		upd := "UPDATE " + txRowsTable + " SET n = n + 1 WHERE key = $1"
		return func(w int) step {
			row := rowKey(w)
			return func(ctx context.Context, w, i int) (int, error) {
				_, err := pool.Exec(ctx, upd, row)
				return 1, err
			}
		}, func() error { return nil }, nil
	}},
}

func runTxLease(ctx context.Context, cfg config, emit func(Result), _ noteFunc) error {
	return runPrimScenario(ctx, cfg, "txlease", txleaseImpls, emit)
}

// guardedWrite runs, per step, BEGIN; [lk.Guard(tx);] UPDATE of the
// caller's row; COMMIT. Each caller holds the lease of its row's key (a
// Manager lease, auto-extended) for the whole run. With trigger the table
// has the database guard (migrate.Migrator.Guard on its key column); with
// call the transaction calls Lock.Guard first (the guard needs both;
// Lock.Guard alone shows what its round trip and row lock cost).
func guardedWrite(name string, call, trigger bool) primImpl {
	return primImpl{name: name, setup: func(ctx context.Context, pool *pgxpool.Pool, _ string, callers int) (func(int) step, func() error, error) {
		if err := createRows(ctx, pool, txRowsTable, callers); err != nil {
			return nil, nil, err
		}
		if trigger {
			mg, err := migrate.New(pool, pg.Config{})
			if err != nil {
				return nil, nil, err
			}
			if err := mg.Guard(ctx, txRowsTable, "key"); err != nil {
				return nil, nil, err
			}
			// What is measured is the guarded path: a write without the
			// lease is refused.
			var pgErr *pgconn.PgError
			_, err = pool.Exec(ctx, "UPDATE "+txRowsTable+" SET n = n + 1 WHERE key = $1", rowKey(0))
			if !errors.As(err, &pgErr) || pgErr.Code != "PGL10" {
				return nil, nil, fmt.Errorf("the guarded table took a write without a lease: %v", err)
			}
		}
		m, closeM, err := newBenchManager(pool)
		if err != nil {
			return nil, nil, err
		}
		locks := make([]*manager.Lock, callers)
		for w := range locks {
			if locks[w], err = m.Acquire(ctx, rowKey(w), manager.WithTTL(uncontendedTTL)); err != nil {
				_ = closeM()
				return nil, nil, err
			}
		}
		upd := "UPDATE " + txRowsTable + " SET n = n + 1 WHERE key = $1"
		return func(w int) step {
				lk, row := locks[w], rowKey(w)
				return func(ctx context.Context, w, i int) (int, error) {
					tx, err := pool.Begin(ctx)
					if err != nil {
						return 0, err
					}
					defer func() { _ = tx.Rollback(context.Background()) }()
					if call {
						if err := lk.Guard(ctx, tx); err != nil {
							return 0, err
						}
					}
					tag, err := tx.Exec(ctx, upd, row)
					if err != nil {
						return 0, err
					}
					if tag.RowsAffected() != 1 {
						return 0, fmt.Errorf("updated %d rows", tag.RowsAffected())
					}
					return 1, tx.Commit(ctx)
				}
			}, func() error {
				for _, lk := range locks {
					if err := lk.Release(ctx); err != nil {
						_ = closeM()
						return err
					}
				}
				return closeM()
			}, nil
	}}
}

var guardImpls = []primImpl{
	guardedWrite("guarded", true, true),
	guardedWrite("guard-call-only", true, false),
	guardedWrite("unguarded", false, false),
}

func runGuard(ctx context.Context, cfg config, emit func(Result), _ noteFunc) error {
	return runPrimScenario(ctx, cfg, "guard", guardImpls, emit)
}
