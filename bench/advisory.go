package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/pg/advisory"
)

func runAdvisory(ctx context.Context, cfg config, emit func(Result), _ noteFunc) error {
	for _, c := range cfg.advCallers {
		for _, impl := range []string{"session", "xact"} {
			r, err := runAdvisoryPoint(ctx, cfg.url, impl, c, cfg.duration)
			if err != nil {
				return fmt.Errorf("%s C=%d: %w", impl, c, err)
			}
			emit(r)
		}
	}
	return nil
}

// advisoryKey gives caller w its own key.
func advisoryKey(w int) advisory.Key { return advisory.Int64(0x5047_0000 + int64(w)) }

func runAdvisoryPoint(ctx context.Context, url, impl string, c int, d time.Duration) (Result, error) {
	tr := &stmtTracer{}
	pool, err := newPool(ctx, url, "", min(c, 64)+2, func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = tr.recorder() })
	if err != nil {
		return Result{}, err
	}
	defer pool.Close()
	var newStep func(w int) step
	var closeFn func() error
	switch impl {
	case "session":
		// One Session (one dedicated connection) per caller.
		sessions := make([]*advisory.Session, c)
		closeFn = func() error {
			var first error
			for _, s := range sessions {
				if s != nil {
					if err := s.Close(context.Background()); err != nil && first == nil {
						first = err
					}
				}
			}
			return first
		}
		for w := range sessions {
			if sessions[w], err = advisory.Open(ctx, pool, nil); err != nil {
				_ = closeFn()
				return Result{}, err
			}
		}
		newStep = func(w int) step {
			s, k := sessions[w], advisoryKey(w)
			return func(ctx context.Context, _, _ int) (int, error) {
				l, ok, err := s.TryLock(ctx, k)
				if err != nil {
					return 0, err
				}
				if !ok {
					return 0, errLocked
				}
				if err := l.Release(ctx); err != nil {
					return 0, fmt.Errorf("release failed: %v", err)
				}
				return 1, nil
			}
		}
	case "xact":
		closeFn = func() error { return nil }
		newStep = func(w int) step {
			k := advisoryKey(w)
			return func(ctx context.Context, _, _ int) (int, error) {
				if err := advisory.WithXactLock(ctx, pool, k, func(pgx.Tx) error { return nil }); err != nil {
					return 0, err
				}
				return 1, nil
			}
		}
	default:
		return Result{}, errors.New("unknown advisory impl")
	}
	_ = measure(ctx, "warmup", impl, c, 200*time.Millisecond, newStep)
	tr.reset(false, 0)
	r := measure(ctx, "advisory", impl, c, d, newStep)
	tr.mu.Lock()
	// Round trips per lock+unlock cycle (session: 2; xact: BEGIN, lock, COMMIT).
	r.Extra = map[string]float64{"stmts_per_cycle": float64(tr.all) / max(float64(r.Cycles), 1)}
	tr.mu.Unlock()
	if err := closeFn(); err != nil {
		return Result{}, err
	}
	return r, nil
}
