// Command peers measures the lock libraries users would otherwise pick,
// cirello.io/pglock and github.com/bsm/redislock, with the same scenarios
// and the same output as the pglease bench (../main.go), which builds and
// runs it when its "peers" scenario is on. It is a module of its own so
// that pglease's go.mod gains no dependency.
//
//	DATABASE_URL=postgres://... go run . -callers 1,8,64,256 -hot-callers 8,64 -duration 3s
//
// It prints one JSON object per line: a result (the fields of the pglease
// bench's Result) or a note ({"note": "..."}, e.g. when redis-server is not
// installed).
//
// Scenarios, as in the pglease bench:
//
//   - uncontended: C callers acquire and release distinct keys (64 per
//     caller) in a loop. pglock: Client.AcquireContext + ReleaseContext on
//     lib/pq (three statements per cycle: nextval, upsert, delete), lease
//     30 s, heartbeat 10 s; database/sql pool of min(C, 64) + 2
//     connections, like the pglease implementations. redislock:
//     Obtain + Release (SET NX PX, then a Lua compare-and-delete) on a
//     go-redis pool of the same size, against a throwaway redis-server
//     without persistence (--save "" --appendonly no) on loopback.
//   - hotkey: C callers in this one process take one key in a loop with an
//     empty critical section. pglock's AcquireContext waits a whole lease
//     after finding the key taken (its documented behaviour), so a waiter
//     rarely gets the key; max_share reports the busiest caller's share of
//     all sections. redislock retries every 1 ms (LinearBackoff), its
//     fastest sensible setting.
package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"cirello.io/pglock"
	"github.com/bsm/redislock"
	_ "github.com/lib/pq"
	"github.com/redis/go-redis/v9"
)

// Result is the pglease bench's Result (same JSON).
type Result struct {
	Scenario     string             `json:"scenario"`
	Impl         string             `json:"impl"`
	Callers      int                `json:"callers"`
	Processes    int                `json:"processes,omitempty"`
	Seconds      float64            `json:"seconds"`
	Cycles       int64              `json:"cycles"`
	CyclesPerSec float64            `json:"cycles_per_sec"`
	P50Ms        float64            `json:"p50_ms"`
	P99Ms        float64            `json:"p99_ms"`
	MaxMs        float64            `json:"max_ms"`
	Latency      string             `json:"latency,omitempty"`
	Errors       int64              `json:"errors"`
	Extra        map[string]float64 `json:"extra,omitempty"`
}

type config struct {
	url        string
	duration   time.Duration
	callers    []int
	hotCallers []int
	scenarios  map[string]bool
	impls      map[string]bool
}

func main() {
	var cfg config
	var callers, hot, scen, impls string
	flag.DurationVar(&cfg.duration, "duration", 3*time.Second, "measuring time per point")
	flag.StringVar(&callers, "callers", "1,8,64,256", "uncontended: concurrent callers")
	flag.StringVar(&hot, "hot-callers", "8,64", "hotkey: callers (one process)")
	flag.StringVar(&scen, "scenarios", "uncontended,hotkey", "scenarios to run")
	flag.StringVar(&impls, "impls", "pglock,redislock", "peers to run")
	flag.Parse()
	cfg.url = os.Getenv("DATABASE_URL")
	var err error
	if cfg.callers, err = parseInts(callers); err != nil {
		fatal(err)
	}
	if cfg.hotCallers, err = parseInts(hot); err != nil {
		fatal(err)
	}
	cfg.scenarios = set(scen)
	cfg.impls = set(impls)
	out := json.NewEncoder(os.Stdout)
	emit := func(v any) { _ = out.Encode(v) }
	ctx := context.Background()
	if cfg.impls["pglock"] {
		if cfg.url == "" {
			emit(note{"pglock: skipped, DATABASE_URL is unset"})
		} else if err := runPglock(ctx, cfg, emit); err != nil {
			fatal(fmt.Errorf("pglock: %w", err))
		}
	}
	if cfg.impls["redislock"] {
		path, err := exec.LookPath("redis-server")
		if err != nil {
			emit(note{"redislock: skipped, redis-server is not installed (apt-get install redis-server)"})
		} else if err := runRedislock(ctx, cfg, path, emit); err != nil {
			fatal(fmt.Errorf("redislock: %w", err))
		}
	}
}

type note struct {
	Note string `json:"note"`
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "peers:", err)
	os.Exit(1)
}

func set(s string) map[string]bool {
	m := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			m[p] = true
		}
	}
	return m
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, c := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad number %q", c)
		}
		out = append(out, n)
	}
	return out, nil
}

func poolSize(c int) int { return min(c, 64) + 2 }

// locker is one peer: acquire key (waiting when wait is set, until ctx
// ends) and return its release.
type locker interface {
	acquire(ctx context.Context, key string, wait bool) (release func(context.Context) error, err error)
}

var errLocked = errors.New("uncontended key was locked")

// uncontended runs c callers for d, each cycling over 64 keys of its own.
func uncontended(ctx context.Context, impl string, l locker, c int, d time.Duration) Result {
	run := func(d time.Duration) ([][]time.Duration, int64) {
		lats := make([][]time.Duration, c)
		errs := make([]int64, c)
		var wg sync.WaitGroup
		deadline := time.Now().Add(d)
		for w := range c {
			wg.Add(1)
			go func() {
				defer wg.Done()
				keys := make([]string, 64)
				for i := range keys {
					keys[i] = fmt.Sprintf("bench:%d:%d", w, i)
				}
				for i := 0; time.Now().Before(deadline); i++ {
					t0 := time.Now()
					rel, err := l.acquire(ctx, keys[i%len(keys)], false)
					if err == nil {
						err = rel(ctx)
					}
					if err != nil {
						if errs[w]++; errs[w] == 1 && os.Getenv("PGLEASE_BENCH_DEBUG") != "" {
							fmt.Fprintf(os.Stderr, "peers: %s worker %d: %v\n", impl, w, err)
						}
						continue
					}
					lats[w] = append(lats[w], time.Since(t0))
				}
			}()
		}
		wg.Wait()
		var n int64
		for _, e := range errs {
			n += e
		}
		return lats, n
	}
	run(200 * time.Millisecond) // warm-up: connections
	start := time.Now()
	lats, nerr := run(d)
	el := time.Since(start).Seconds()
	all := merge(lats)
	r := Result{Scenario: "uncontended", Impl: impl, Callers: c, Seconds: el, Cycles: int64(len(all)),
		CyclesPerSec: float64(len(all)) / el, Latency: "cycle", Errors: nerr,
		Extra: map[string]float64{"pool": float64(poolSize(c))}}
	r.P50Ms, r.P99Ms, r.MaxMs = pct(all, 0.5), pct(all, 0.99), pct(all, 1)
	return r
}

// hotkey runs c callers on one key for d with an empty critical section.
func hotkey(ctx context.Context, impl string, l locker, c int, d time.Duration) Result {
	// Warm up: every caller takes a key of its own once (opens the
	// connections).
	var warm sync.WaitGroup
	for w := range c {
		warm.Add(1)
		go func() {
			defer warm.Done()
			if rel, err := l.acquire(ctx, fmt.Sprintf("bench:warm:%d", w), false); err == nil {
				_ = rel(ctx)
			}
		}()
	}
	warm.Wait()
	runCtx, cancel := context.WithCancel(ctx)
	counts := make([]int64, c)
	errs := make([]int64, c)
	waits := make([][]time.Duration, c)
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.AfterFunc(d, cancel)
	defer timer.Stop()
	for w := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				t0 := time.Now()
				rel, err := l.acquire(runCtx, "bench:hot", true)
				if err != nil {
					if runCtx.Err() == nil {
						errs[w]++
					}
					continue
				}
				waits[w] = append(waits[w], time.Since(t0))
				if err := rel(ctx); err != nil {
					errs[w]++
					continue
				}
				counts[w]++
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	var total, top, nerr int64
	for w := range c {
		total += counts[w]
		top = max(top, counts[w])
		nerr += errs[w]
	}
	all := merge(waits)
	r := Result{Scenario: "hotkey", Impl: impl, Callers: c, Processes: 1, Seconds: el, Cycles: total,
		CyclesPerSec: float64(total) / el, Latency: "wait", Errors: nerr,
		Extra: map[string]float64{"timeouts": 0, "max_share": float64(top) / max(float64(total), 1)}}
	r.P50Ms, r.P99Ms, r.MaxMs = pct(all, 0.5), pct(all, 0.99), pct(all, 1)
	return r
}

func merge(ls [][]time.Duration) []time.Duration {
	var all []time.Duration
	for _, l := range ls {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return all
}

func pct(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(p*float64(len(sorted)-1))]) / float64(time.Millisecond)
}

// ---- cirello.io/pglock ----

type pglockPeer struct{ c *pglock.Client }

func (p pglockPeer) acquire(ctx context.Context, key string, wait bool) (func(context.Context) error, error) {
	var opts []pglock.LockOption
	if !wait {
		opts = append(opts, pglock.FailIfLocked())
	}
	l, err := p.c.AcquireContext(ctx, key, opts...)
	if err != nil {
		if errors.Is(err, pglock.ErrNotAcquired) && !wait {
			return nil, errLocked
		}
		return nil, err
	}
	return func(ctx context.Context) error { return p.c.ReleaseContext(ctx, l) }, nil
}

func runPglock(ctx context.Context, cfg config, emit func(any)) error {
	table := fmt.Sprintf("pglock_bench_%d", time.Now().UnixNano())
	open := func(c int) (*sql.DB, *pglock.Client, error) {
		db, err := sql.Open("postgres", cfg.url)
		if err != nil {
			return nil, nil, err
		}
		db.SetMaxOpenConns(poolSize(c))
		db.SetMaxIdleConns(poolSize(c))
		cl, err := pglock.New(db, pglock.WithCustomTable(table),
			pglock.WithLeaseDuration(30*time.Second), pglock.WithHeartbeatFrequency(10*time.Second))
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return db, cl, nil
	}
	db, cl, err := open(1)
	if err != nil {
		return err
	}
	if err := cl.CreateTable(); err != nil {
		db.Close()
		return err
	}
	defer func() {
		_ = cl.DropTable() // drops its sequence too (OWNED BY)
		db.Close()
	}()
	points := []struct {
		scenario string
		cs       []int
		f        func(context.Context, string, locker, int, time.Duration) Result
	}{{"uncontended", cfg.callers, uncontended}, {"hotkey", cfg.hotCallers, hotkey}}
	for _, p := range points {
		if !cfg.scenarios[p.scenario] {
			continue
		}
		for _, c := range p.cs {
			pdb, pcl, err := open(c)
			if err != nil {
				return err
			}
			r := p.f(ctx, "pglock", pglockPeer{pcl}, c, cfg.duration)
			r.Extra["stmts_per_cycle"] = 3 // nextval, upsert, delete
			pdb.Close()
			if _, err := db.ExecContext(ctx, "DELETE FROM "+table); err != nil {
				return err
			}
			emit(r)
		}
	}
	return nil
}

// ---- github.com/bsm/redislock ----

type redisPeer struct{ c *redislock.Client }

func (p redisPeer) acquire(ctx context.Context, key string, wait bool) (func(context.Context) error, error) {
	opt := &redislock.Options{RetryStrategy: redislock.NoRetry()}
	if wait {
		opt.RetryStrategy = redislock.LinearBackoff(time.Millisecond)
	}
	l, err := p.c.Obtain(ctx, key, 30*time.Second, opt)
	if err != nil {
		if errors.Is(err, redislock.ErrNotObtained) && !wait {
			return nil, errLocked
		}
		return nil, err
	}
	return l.Release, nil
}

func runRedislock(ctx context.Context, cfg config, path string, emit func(any)) error {
	addr, stop, err := startRedis(path)
	if err != nil {
		return err
	}
	defer stop()
	points := []struct {
		scenario string
		cs       []int
		f        func(context.Context, string, locker, int, time.Duration) Result
	}{{"uncontended", cfg.callers, uncontended}, {"hotkey", cfg.hotCallers, hotkey}}
	for _, p := range points {
		if !cfg.scenarios[p.scenario] {
			continue
		}
		for _, c := range p.cs {
			rc := redis.NewClient(&redis.Options{Addr: addr, PoolSize: poolSize(c), MinIdleConns: poolSize(c)})
			r := p.f(ctx, "redislock", redisPeer{redislock.New(rc)}, c, cfg.duration)
			r.Extra["stmts_per_cycle"] = 2 // SET NX PX, EVALSHA release
			if err := rc.FlushAll(ctx).Err(); err != nil {
				rc.Close()
				return err
			}
			rc.Close()
			emit(r)
		}
	}
	return nil
}

// startRedis starts a throwaway redis-server without persistence on a free
// loopback port and returns its address and a stop function.
func startRedis(path string) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "peers-redis")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no", "--protected-mode", "yes")
	stderr, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	go func() { // drain its log
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
		}
	}()
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rc.Ping(ctx).Err()
		cancel()
		if err == nil {
			return addr, stop, nil
		}
		if i == 100 {
			stop()
			return "", nil, fmt.Errorf("redis-server did not start: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
