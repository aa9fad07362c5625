// Command bench measures pglease against SyncGuard's protocol and the
// database's set-based ceiling on the same PostgreSQL, in one run.
//
//	make bench                       # throwaway durable PostgreSQL when DATABASE_URL is unset
//	make bench BENCHFLAGS='-duration 3s -docs'
//	go run ./bench -json             # one JSON object per scenario result
//	go run ./bench -scenarios uncontended -callers 1,64 -duration 3s
//
// # Scenarios
//
// uncontended: C callers (-callers) acquire and release distinct keys in a
// loop for -duration. Implementations, all on a pool of the same size for
// a given C (MaxConns = min(C, 64) + 2, so at C = 256 callers queue for
// connections the same way in every implementation; the Manager's LISTEN
// connection is opened outside the pool):
//
//   - "syncguard-protocol" (baseline a): SyncGuard 2.5.2's PostgreSQL
//     protocol replayed statement for statement with pgx (8 round trips to
//     acquire, 5 to release), see syncguard.go.
//   - "pg-single" (baseline b): pg.Store.Acquire then pg.Store.Release per
//     cycle, without the Manager (2 round trips).
//   - "pg-setbased" (ceiling c): the set-based statements driven directly.
//     The C outstanding keys are split over D = min(C, 4) drivers; each
//     driver's step is one AcquireMany of its ⌈C/D⌉ (or ⌊C/D⌋) keys then
//     one ReleaseMany of them, and counts one cycle per key. This keeps the
//     two things the Manager is allowed equal: C keys in flight, and at most
//     four statements in flight (the Manager's default caps: two acquire
//     and two release batches). Its latency is the step's.
//   - "manager": manager.New(pool, manager.Config{}) with defaults; each
//     caller runs m.Acquire(key, WithTTL(30 s)) then lk.Release.
//   - "manager-nonotify" (only with -impls): the same with
//     Config.DisableNotify, to show what the release notifications cost.
//
// A pgx QueryTracer counts the statements each cycle sends
// (stmts_per_cycle) and the items per acquire statement (acq_batch).
//
// Every caller cycles through 64 keys of its own, so keys never collide
// between callers and the fence table stays small.
//
// hotkey: C callers (-hot-callers) split over P processes (-hot-procs; the
// bench re-executes itself as worker processes, see runWorkerMode), each
// process with its own Manager, contend for one key with an empty critical
// section. Reported: critical sections/s, acquisition timeouts, and the
// handoff latency from one holder calling Release to the next holder's
// Acquire returning. The handoff is measured on the machine's wall clock
// (CLOCK_REALTIME, shared by the processes of one machine): every holder
// records (fence, grant time, release time); the records of all processes
// are sorted by fence (grant order) and each grant is paired with the
// previous holder's release. p50/p99/max of that scenario are handoff
// latency; "xproc_*" extras are handoffs between different processes.
//
// heartbeat: one Manager holds N locks (-heartbeat-n; 100,000 with
// -heartbeat-100k) with TTL 3 s (extends due every second) for
// -heartbeat-duration. A pgx QueryTracer on the pool counts the extend
// statements and their items; statements per tick = extend statements per
// TTL/3 period. Transactions/s is the xact_commit delta of
// pg_stat_database (PostgreSQL flushes backend statistics at most once a
// second, so short windows are approximate). Go heap per held lock is
// HeapAlloc after runtime.GC with the locks held minus the same before
// acquiring them, divided by N. The Manager does not expose extend lag, so
// it is measured by the tracer: for every lock, the time its extend was
// sent minus (its previous extend's send time + TTL/3); negative = sent
// early (the heartbeat batches extends due within TTL/12).
//
// advisory: C callers (-advisory-callers) with distinct keys: "session"
// runs Session.TryLock + Lock.Unlock on one advisory.Session per caller;
// "xact" runs advisory.WithXactLock with an empty function on a pool of
// min(C, 64) + 2 connections.
//
// The uncontended results are drawn as an SVG (-plot; -docs also writes
// docs/bench-throughput.svg). -cpuprofile writes a CPU profile of the run
// (hotkey workers write theirs to <file>.worker<i>); -memprofile writes a
// heap profile of the heartbeat scenario with its N locks held.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Result is one measured (scenario, implementation, callers) point.
// P50Ms/P99Ms/MaxMs are the latency of the scenario's unit: one
// acquire+release cycle (uncontended, advisory; for pg-setbased one
// batched step), one handoff (hotkey); unused for heartbeat, whose
// Cycles count lock extends and Callers the locks held.
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
	Errors       int64              `json:"errors"`
	Extra        map[string]float64 `json:"extra,omitempty"`
}

type config struct {
	url        string
	duration   time.Duration
	callers    []int
	hotCallers []int
	hotProcs   []int
	hbN        []int
	hbDuration time.Duration
	advCallers []int
	scenarios  map[string]bool
	json       bool
	plot       string
	docs       bool
	cpuprofile string
	memprofile string
	impls      map[string]bool // uncontended implementations to run; nil = all
}

func main() {
	if runWorkerMode() {
		return
	}
	var cfg config
	var callers, hotCallers, hotProcs, hbN, advCallers, scen string
	var hb100k bool
	var impls string
	flag.DurationVar(&cfg.duration, "duration", 3*time.Second, "measuring time per point")
	flag.StringVar(&callers, "callers", "1,8,64,256", "uncontended: concurrent callers (comma separated)")
	flag.StringVar(&hotCallers, "hot-callers", "8,64", "hotkey: total callers over all processes")
	flag.StringVar(&hotProcs, "hot-procs", "1,2", "hotkey: processes")
	flag.StringVar(&hbN, "heartbeat-n", "1000,10000", "heartbeat: locks held")
	flag.BoolVar(&hb100k, "heartbeat-100k", false, "heartbeat: also hold 100,000 locks")
	flag.DurationVar(&cfg.hbDuration, "heartbeat-duration", 6*time.Second, "heartbeat: holding time per point")
	flag.StringVar(&advCallers, "advisory-callers", "1,8,64", "advisory: callers (distinct keys)")
	flag.StringVar(&scen, "scenarios", "uncontended,hotkey,heartbeat,advisory", "scenarios to run")
	flag.BoolVar(&cfg.json, "json", false, "print one JSON object per result instead of a table")
	flag.StringVar(&cfg.plot, "plot", "bench/out/throughput.svg", "SVG plot of the uncontended results (empty: none)")
	flag.BoolVar(&cfg.docs, "docs", false, "also write the plot to docs/bench-throughput.svg (committed copy)")
	flag.StringVar(&cfg.cpuprofile, "cpuprofile", "", "write a CPU profile of the run to this file")
	flag.StringVar(&impls, "impls", "", "uncontended: only these implementations (comma separated; default all)")
	flag.StringVar(&cfg.memprofile, "memprofile", "", "heartbeat: write a heap profile with the N locks held to <file>.N<n>")
	flag.Parse()
	cfg.url = os.Getenv("DATABASE_URL")
	if cfg.url == "" {
		fmt.Fprintln(os.Stderr, "bench: DATABASE_URL is unset (run `make bench`, which starts a throwaway PostgreSQL)")
		os.Exit(2)
	}
	var err error
	for _, p := range []struct {
		name string
		s    string
		dst  *[]int
	}{{"callers", callers, &cfg.callers}, {"hot-callers", hotCallers, &cfg.hotCallers}, {"hot-procs", hotProcs, &cfg.hotProcs},
		{"heartbeat-n", hbN, &cfg.hbN}, {"advisory-callers", advCallers, &cfg.advCallers}} {
		if *p.dst, err = parseInts(p.s); err != nil {
			fmt.Fprintf(os.Stderr, "bench: bad -%s %q\n", p.name, p.s)
			os.Exit(2)
		}
	}
	if impls != "" {
		cfg.impls = map[string]bool{}
		for _, s := range strings.Split(impls, ",") {
			cfg.impls[strings.TrimSpace(s)] = true
		}
	}
	if cfg.memprofile != "" {
		runtime.MemProfileRate = 1 // exact heap profile (slow allocations)
	}
	if hb100k {
		cfg.hbN = append(cfg.hbN, 100000)
	}
	cfg.scenarios = map[string]bool{}
	for _, s := range strings.Split(scen, ",") {
		s = strings.TrimSpace(s)
		if !knownScenario(s) {
			fmt.Fprintf(os.Stderr, "bench: unknown scenario %q\n", s)
			os.Exit(2)
		}
		cfg.scenarios[s] = true
	}
	if cfg.cpuprofile != "" {
		f, err := os.Create(cfg.cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
	_, err = run(context.Background(), cfg, os.Stdout)
	if cfg.cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
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

func knownScenario(name string) bool {
	for _, s := range scenarioOrder {
		if s.name == name {
			return true
		}
	}
	return false
}

func run(ctx context.Context, cfg config, out io.Writer) ([]Result, error) {
	if !cfg.json {
		host, _ := os.Hostname()
		fmt.Fprintf(out, "# pglease bench on %s: %s/%s, %d CPUs, GOMAXPROCS=%d, %s per point, %s\n",
			host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), cfg.duration, runtime.Version())
		if v, err := serverInfo(ctx, cfg.url); err == nil {
			fmt.Fprintf(out, "# %s\n", v)
		}
	}
	var results []Result
	emit := func(r Result) {
		results = append(results, r)
		if cfg.json {
			_ = json.NewEncoder(out).Encode(r)
			return
		}
		fmt.Fprintf(out, "%-11s %-18s C=%-4d P=%d %9.0f/s  p50 %6.2f ms  p99 %7.2f ms  max %7.2f ms  errors %d%s\n",
			r.Scenario, r.Impl, r.Callers, max(r.Processes, 1), r.CyclesPerSec, r.P50Ms, r.P99Ms, r.MaxMs, r.Errors, extraString(r.Extra))
	}
	for _, s := range scenarioOrder {
		if !cfg.scenarios[s.name] {
			continue
		}
		if err := s.run(ctx, cfg, emit); err != nil {
			return results, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	const title = "pglease vs baselines: uncontended acquire+release (same PostgreSQL)"
	if cfg.plot != "" {
		_ = os.MkdirAll(dirOf(cfg.plot), 0o755)
		if err := writePlot(cfg.plot, title, results); err != nil {
			return results, err
		}
	}
	if cfg.docs {
		_ = os.MkdirAll("docs", 0o755)
		if err := writePlot("docs/bench-throughput.svg", title, results); err != nil {
			return results, err
		}
	}
	return results, nil
}

func dirOf(p string) string {
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[:i]
	}
	return "."
}

func extraString(m map[string]float64) string {
	if len(m) == 0 {
		return ""
	}
	var b strings.Builder
	for _, k := range sortedKeys(m) {
		fmt.Fprintf(&b, "  %s=%.4g", k, m[k])
	}
	return b.String()
}

type scenario struct {
	name string
	run  func(ctx context.Context, cfg config, emit func(Result)) error
}

var scenarioOrder = []scenario{
	{"uncontended", runUncontended},
	{"hotkey", runHotKey},
	{"heartbeat", runHeartbeat},
	{"advisory", runAdvisory},
}

// step performs one unit of work for worker w and returns how many
// acquire+release cycles it completed (a set-based step completes many).
type step func(ctx context.Context, w int, iter int) (int, error)

// measure runs callers workers for d, each calling its step in a loop,
// and summarises throughput and per-step latency.
func measure(ctx context.Context, scenarioName, impl string, callers int, d time.Duration, newStep func(w int) step) Result {
	var wg sync.WaitGroup
	lats := make([]latencies, callers)
	counts := make([]int64, callers)
	errs := make([]int64, callers)
	steps := make([]step, callers)
	for w := range callers {
		steps[w] = newStep(w)
	}
	start := time.Now()
	deadline := start.Add(d)
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := steps[w]
			for i := 0; time.Now().Before(deadline); i++ {
				t0 := time.Now()
				n, err := st(ctx, w, i)
				if err != nil {
					errs[w]++
					if errs[w] == 1 && os.Getenv("PGLEASE_BENCH_DEBUG") != "" {
						fmt.Fprintf(os.Stderr, "bench: %s/%s worker %d: %v\n", scenarioName, impl, w, err)
					}
					continue
				}
				lats[w] = append(lats[w], time.Since(t0))
				counts[w] += int64(n)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	var total, nerr int64
	for w := range callers {
		total += counts[w]
		nerr += errs[w]
	}
	_, p50, p99, mx := summarize(lats)
	return Result{Scenario: scenarioName, Impl: impl, Callers: callers, Seconds: elapsed, Cycles: total,
		CyclesPerSec: float64(total) / elapsed, P50Ms: ms(p50), P99Ms: ms(p99), MaxMs: ms(mx), Errors: nerr}
}

func newPool(ctx context.Context, url, schema string, maxConns int, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(maxConns)
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	for _, f := range configure {
		f(cfg)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}
