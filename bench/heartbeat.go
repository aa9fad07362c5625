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

	"github.com/pglease/pglease/internal/pgtest/pgrec"
	"github.com/pglease/pglease/manager"
)

// heartbeatTTL is the lease TTL of the heartbeat scenario's N locks. Up to
// 10,000 locks it is 3 s, which makes ticks frequent (extends due every
// TTL/3 = 1 s). From 100,000 locks it is the default TTL, 30 s: at 3 s,
// 100,000 locks would ask the server for 33,000 row updates per second,
// which measures the server's write rate rather than the heartbeat's
// batching (statements per tick, lag, losses) that this point is about.
func heartbeatTTL(n int) time.Duration {
	if n >= 100000 {
		return 30 * time.Second // the Manager's default TTL
	}
	return 3 * time.Second
}

// heartbeatWindow is how long the N locks are held and measured: d rounded
// to whole extend periods (TTL/3), at least two.
func heartbeatWindow(ttl, d time.Duration) time.Duration {
	period := ttl / 3
	k := max(2, int((d+period/2)/period))
	return time.Duration(k) * period
}

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
	shStmts     int64 // shared acquire statements (readers, permits)
	shItems     int64 // and their items (one per waiter served)
	tracking    bool  // record when each lockId was acquired or extended (last)
	window      bool  // collect extend lags (lags)
	period      time.Duration
	stmtTime    time.Duration // statements' time, send to last row read (recorderTimed)
	last        map[string]time.Time
	lags        latencies // may be negative (sent early)
}

// recorder returns a statement recorder that reports to t, to install as
// a pool's tracer.
func (t *stmtTracer) recorder() *pgrec.Recorder { return &pgrec.Recorder{OnStart: t.observe} }

// recorderTimed is recorder that also adds up the statements' time, from
// send to the last row read.
func (t *stmtTracer) recorderTimed() *pgrec.Recorder {
	return &pgrec.Recorder{OnStart: t.observe, OnEnd: func(st pgrec.Statement, _ error) {
		d := time.Since(st.Start)
		t.mu.Lock()
		t.stmtTime += d
		t.mu.Unlock()
	}}
}

// observe counts one statement started.
func (t *stmtTracer) observe(data pgrec.Statement) {
	now := data.Start
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all++
	if strings.Contains(data.SQL, "pglease_acquire_shared_") && len(data.Args) > 0 {
		keys, _ := data.Args[0].([]string)
		t.shStmts++
		t.shItems += int64(len(keys))
		return
	}
	if strings.Contains(data.SQL, "pglease_acquire_") && len(data.Args) > 3 {
		ids, _ := data.Args[3].([]string)
		t.acqStmts++
		t.acqItems += int64(len(ids))
		if t.tracking { // the first extend is due TTL/3 after the acquire was sent
			for _, id := range ids {
				t.last[id] = now
			}
		}
		return
	}
	if !strings.Contains(data.SQL, "pglease_extend_") || len(data.Args) == 0 {
		return
	}
	ids, _ := data.Args[0].([]string)
	t.extendStmts++
	t.extendItems += int64(len(ids))
	if t.tracking {
		for _, id := range ids {
			if prev, ok := t.last[id]; ok && t.window {
				t.lags = append(t.lags, now.Sub(prev.Add(t.period)))
			}
			t.last[id] = now
		}
	}
}

// reset zeroes the counters; with track, it starts recording acquire and
// extend times of up to n lockIds (the map is made here, at its full size,
// so that it does not grow while the heap is measured).
func (t *stmtTracer) reset(track bool, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all, t.extendStmts, t.extendItems, t.acqStmts, t.acqItems, t.shStmts, t.shItems = 0, 0, 0, 0, 0, 0, 0
	t.stmtTime = 0
	t.tracking, t.window = track, false
	t.last = nil
	if track {
		t.last = make(map[string]time.Time, n+128)
	}
	t.lags = nil
}

// startWindow zeroes the counters and starts collecting extend lags.
func (t *stmtTracer) startWindow() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all, t.extendStmts, t.extendItems, t.acqStmts, t.acqItems, t.shStmts, t.shItems = 0, 0, 0, 0, 0, 0, 0
	t.window = true
	t.lags = nil
}

func runHeartbeat(ctx context.Context, cfg config, emit func(Result), _ noteFunc) error {
	for _, n := range cfg.hbN {
		r, err := runHeartbeatPoint(ctx, cfg, n)
		if err != nil {
			return fmt.Errorf("with N=%d: %w", n, err)
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
	ttl := heartbeatTTL(n)
	if cfg.hbTTL > 0 {
		ttl = cfg.hbTTL
	}
	url, d := cfg.url, heartbeatWindow(ttl, cfg.hbDuration)
	tr := &stmtTracer{period: ttl / 3}
	pool, _, cleanup, err := benchSchema(ctx, url, heartbeatPoolSize, func(c *pgxpool.Config) {
		c.ConnConfig.Tracer = tr.recorder()
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
	opts := []manager.AcquireOption{manager.WithTTL(ttl), manager.WithAcquireTimeout(60 * time.Second)}
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
	tr.reset(true, n+64)
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
	tr.startWindow()
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
	tr.tracking, tr.window = false, false
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

	periods := elapsed.Seconds() / (ttl / 3).Seconds()
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
		"ttl_s":              ttl.Seconds(),
	}
	// The latency columns are the extend lag (Latency "lag"); with no
	// extend in the window there is none to print.
	if len(lags) > 0 {
		r.Latency = "lag"
		r.P50Ms, r.P99Ms, r.MaxMs = ms(percentile(lags, 0.5)), ms(percentile(lags, 0.99)), ms(lags[len(lags)-1])
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
