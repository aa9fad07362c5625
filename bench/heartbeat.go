package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/manager"
)

// heartbeatTTL makes ticks frequent: extends are due every TTL/3 = 1 s.
const heartbeatTTL = 3 * time.Second

// heartbeatPoolSize is the pool of the heartbeat scenario's Manager.
const heartbeatPoolSize = 10

// stmtTracer counts the statements sent on a pool, and the extend
// statements and their items; while tracking, it also records for each
// lockId how late each extend was sent relative to TTL/3 after the
// previous one. It also counts acquire statements and their items.
type stmtTracer struct {
	mu          sync.Mutex
	all         int64
	extendStmts int64
	extendItems int64
	acqStmts    int64
	acqItems    int64
	tracking    bool
	period      time.Duration
	last        map[string]time.Time
	lags        latencies // may be negative (sent early)
}

func (t *stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all++
	if strings.Contains(data.SQL, "pglease_acquire_") && len(data.Args) > 3 {
		ids, _ := data.Args[3].([]string)
		t.acqStmts++
		t.acqItems += int64(len(ids))
		return ctx
	}
	if !strings.Contains(data.SQL, "pglease_extend_") || len(data.Args) == 0 {
		return ctx
	}
	ids, _ := data.Args[0].([]string)
	t.extendStmts++
	t.extendItems += int64(len(ids))
	if t.tracking {
		for _, id := range ids {
			if prev, ok := t.last[id]; ok {
				t.lags = append(t.lags, now.Sub(prev.Add(t.period)))
			}
			t.last[id] = now
		}
	}
	return ctx
}

func (t *stmtTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *stmtTracer) reset(track bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all, t.extendStmts, t.extendItems, t.acqStmts, t.acqItems = 0, 0, 0, 0, 0
	t.tracking = track
	t.last = map[string]time.Time{}
	t.lags = nil
}

func runHeartbeat(ctx context.Context, cfg config, emit func(Result)) error {
	for _, n := range cfg.hbN {
		r, err := runHeartbeatPoint(ctx, cfg, n)
		if err != nil {
			return fmt.Errorf("N=%d: %w", n, err)
		}
		emit(r)
	}
	return nil
}

func heapAlloc() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func xactCommit(ctx context.Context, c *pgx.Conn) (int64, error) {
	var n int64
	err := c.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&n)
	return n, err
}

func runHeartbeatPoint(ctx context.Context, cfg config, n int) (Result, error) {
	url, d := cfg.url, cfg.hbDuration
	tr := &stmtTracer{period: heartbeatTTL / 3}
	pool, _, cleanup, err := benchSchema(ctx, url, heartbeatPoolSize, func(c *pgxpool.Config) {
		c.ConnConfig.Tracer = tr
	})
	if err != nil {
		return Result{}, err
	}
	defer cleanup()
	// Open every pool connection now, so their buffers are in the baseline.
	conns := make([]*pgxpool.Conn, heartbeatPoolSize)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			return Result{}, err
		}
	}
	for _, c := range conns {
		c.Release()
	}
	stat, err := pgx.Connect(ctx, url)
	if err != nil {
		return Result{}, err
	}
	defer stat.Close(ctx)
	m, err := manager.New(pool, manager.Config{})
	if err != nil {
		return Result{}, err
	}
	closed := false
	defer func() {
		if !closed {
			_ = m.Close(context.Background())
		}
	}()
	opts := []manager.AcquireOption{manager.WithTTL(heartbeatTTL), manager.WithAcquireTimeout(60 * time.Second)}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("hb:%d", i)
	}
	locks := make([]*manager.Lock, n)
	// Warm up: prepare the statements on the connections.
	for i := range 64 {
		lk, err := m.Acquire(ctx, fmt.Sprintf("hb-warm:%d", i), opts...)
		if err != nil {
			return Result{}, err
		}
		if err := lk.Release(ctx); err != nil {
			return Result{}, err
		}
	}
	base := heapAlloc()

	// Acquire N locks with 256 concurrent callers.
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 256)
	for w := range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 256 {
				lk, err := m.Acquire(ctx, keys[i], opts...)
				if err != nil {
					errs[w] = err
					return
				}
				locks[i] = lk
			}
		}()
	}
	wg.Wait()
	acqSecs := time.Since(t0).Seconds()
	for _, err := range errs {
		if err != nil {
			return Result{}, fmt.Errorf("acquire: %w", err)
		}
	}
	heapPerLock := (float64(heapAlloc()) - float64(base)) / float64(n)
	if cfg.memprofile != "" {
		if err := writeHeapProfile(fmt.Sprintf("%s.N%d", cfg.memprofile, n)); err != nil {
			return Result{}, err
		}
	}

	// Hold them for d.
	tr.reset(true)
	x0, err := xactCommit(ctx, stat)
	if err != nil {
		return Result{}, err
	}
	start := time.Now()
	time.Sleep(d) // the measured holding period
	elapsed := time.Since(start)
	x1, err := xactCommit(ctx, stat)
	if err != nil {
		return Result{}, err
	}
	tr.mu.Lock()
	stmts, items, all, lags := tr.extendStmts, tr.extendItems, tr.all, tr.lags
	tr.tracking = false
	tr.last = nil
	tr.mu.Unlock()
	lost := 0
	for _, lk := range locks {
		if lk.Err() != nil {
			lost++
		}
	}
	closed = true
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := m.Close(cctx); err != nil {
		return Result{}, fmt.Errorf("close: %w", err)
	}

	periods := elapsed.Seconds() / (heartbeatTTL / 3).Seconds()
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	r := Result{Scenario: "heartbeat", Impl: "manager", Callers: n, Seconds: elapsed.Seconds(), Errors: int64(lost),
		Cycles: items, CyclesPerSec: float64(items) / elapsed.Seconds()}
	r.Extra = map[string]float64{
		"locks":              float64(n),
		"stmts_per_tick":     float64(stmts) / periods,
		"items_per_stmt":     float64(items) / max(float64(stmts), 1),
		"xact_per_s":         float64(x1-x0-1) / elapsed.Seconds(), // minus the first stat query's own
		"client_stmts_per_s": float64(all) / elapsed.Seconds(),
		"heap_B_per_lock":    heapPerLock,
		"acquire_all_s":      acqSecs,
		"lost":               float64(lost),
	}
	if len(lags) > 0 {
		r.Extra["extend_lag_p50_ms"] = ms(percentile(lags, 0.5))
		r.Extra["extend_lag_p99_ms"] = ms(percentile(lags, 0.99))
		r.Extra["extend_lag_max_ms"] = ms(lags[len(lags)-1])
	}
	return r, nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("heap").WriteTo(f, 0)
}
