package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/manager"
)

// workerEnv names the environment variable that turns the bench binary
// (or the test binary) into a hotkey worker process; its value is the
// JSON workerSpec.
const workerEnv = "PGLEASE_BENCH_WORKER"

// workerSpec tells a worker process what to run.
type workerSpec struct {
	URL        string        `json:"url"`
	Schema     string        `json:"schema"`
	Key        string        `json:"key"`
	Callers    int           `json:"callers"`
	Duration   time.Duration `json:"duration"`
	Proc       int           `json:"proc"`
	Fair       bool          `json:"fair,omitempty"` // manager.Config.FairQueue
	CPUProfile string        `json:"cpuprofile,omitempty"`
}

// csRecord is one critical section: the grant's fence and the wall-clock
// times (Unix ns) when Acquire returned and when Release was called.
type csRecord struct {
	Fence   int64 `json:"f"`
	CallNs  int64 `json:"c"` // when Acquire was called
	GrantNs int64 `json:"g"`
	RelNs   int64 `json:"r"`
	Proc    int   `json:"p"`
	Caller  int   `json:"w"` // the caller (goroutine) within its process
}

// workerReport is what a worker prints when done.
type workerReport struct {
	Records  []csRecord `json:"records"`
	Timeouts int64      `json:"timeouts"`
	Errors   int64      `json:"errors"`
	// WaitsMs are the Acquire wait times (ms) of this process's callers.
	WaitsMs []float64 `json:"waits_ms"`
	// Stmts is how many statements this process sent during the run.
	Stmts int64  `json:"stmts"`
	Err   string `json:"err,omitempty"`
}

// runWorkerMode runs a hotkey worker (or a fleet worker, see
// runFleetWorkerMode) and returns true when this process was started as
// one (workerEnv set); main and TestMain call it first.
//
// Protocol on stdin/stdout: the worker connects, warms up and prints
// "ready"; on a "go" line it runs for the spec's duration and prints one
// JSON workerReport line.
func runWorkerMode() bool {
	if runFleetWorkerMode() || runMixedWorkerMode() || runFairWorkerMode() { // exit when this is a fleet or mixed worker
		return true
	}
	raw := os.Getenv(workerEnv)
	if raw == "" {
		return false
	}
	var spec workerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "bench worker: bad spec:", err)
		os.Exit(2)
	}
	rep := hotKeyWorker(spec, bufio.NewReader(os.Stdin), os.Stdout)
	_ = json.NewEncoder(os.Stdout).Encode(rep)
	if rep.Err != "" {
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

func hotKeyWorker(spec workerSpec, in *bufio.Reader, out io.Writer) (rep workerReport) {
	ctx := context.Background()
	tr := &stmtTracer{}
	pool, err := newPool(ctx, spec.URL, spec.Schema, min(spec.Callers, 64)+2, func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = tr.recorder() })
	if err != nil {
		return workerReport{Err: err.Error()}
	}
	defer pool.Close()
	m, err := manager.New(pool, manager.Config{FairQueue: spec.Fair})
	if err != nil {
		return workerReport{Err: err.Error()}
	}
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := m.Close(cctx); err != nil && rep.Err == "" {
			rep.Err = "close: " + err.Error()
		}
	}()
	opts := []manager.AcquireOption{manager.WithTTL(30 * time.Second)}
	// Warm up: every caller takes the key once (opens connections,
	// prepares statements).
	var wg sync.WaitGroup
	var warmErr error
	var mu sync.Mutex
	for range spec.Callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, err := m.Acquire(ctx, spec.Key, manager.WithTTL(30*time.Second), manager.WithAcquireTimeout(30*time.Second))
			if err == nil {
				err = lk.Release(ctx)
			}
			if err != nil {
				mu.Lock()
				warmErr = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if warmErr != nil {
		return workerReport{Err: "warm-up: " + warmErr.Error()}
	}
	fmt.Fprintln(out, "ready")
	if line, err := in.ReadString('\n'); err != nil || line != "go\n" {
		return workerReport{Err: "no go signal"}
	}
	if spec.CPUProfile != "" {
		if f, err := os.Create(spec.CPUProfile); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				defer pprof.StopCPUProfile()
			}
		}
	}
	// Cancel (not a deadline: a deadline would end waits as
	// AcquisitionTimeout) at the end of the run.
	tr.reset(false, 0)
	runCtx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(spec.Duration, cancel)
	defer timer.Stop()
	recs := make([][]csRecord, spec.Callers)
	waits := make([][]float64, spec.Callers)
	timeouts := make([]int64, spec.Callers)
	errs := make([]int64, spec.Callers)
	for w := range spec.Callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				t0 := time.Now()
				lk, err := m.Acquire(runCtx, spec.Key, opts...)
				if err != nil {
					switch {
					case runCtx.Err() != nil:
					case pglease.CodeOf(err) == pglease.CodeAcquisitionTimeout:
						timeouts[w]++
					default:
						errs[w]++
					}
					continue
				}
				g := time.Now()
				r := time.Now() // empty critical section
				// Release detached from runCtx: a lock held at the end is still released.
				if err := lk.Release(ctx); err != nil {
					errs[w]++
				}
				recs[w] = append(recs[w], csRecord{Fence: int64(lk.Fence()), CallNs: t0.UnixNano(), GrantNs: g.UnixNano(),
					RelNs: r.UnixNano(), Proc: spec.Proc, Caller: w})
				waits[w] = append(waits[w], ms(g.Sub(t0)))
			}
		}()
	}
	wg.Wait()
	tr.mu.Lock()
	rep.Stmts = tr.all
	tr.mu.Unlock()
	for w := range spec.Callers {
		rep.Records = append(rep.Records, recs[w]...)
		rep.WaitsMs = append(rep.WaitsMs, waits[w]...)
		rep.Timeouts += timeouts[w]
		rep.Errors += errs[w]
	}
	return rep
}

func runHotKey(ctx context.Context, cfg config, emit func(Result), _ noteFunc) (err error) {
	// The flush bound: measured right before and right after the hot-key
	// points, on the same server, and reported as their mean.
	fd := min(cfg.duration, 2*time.Second)
	before, err := measureFlush(ctx, cfg.url, fd)
	if err != nil {
		return fmt.Errorf("flush bound: %w", err)
	}
	defer func() {
		if err != nil {
			return
		}
		var after Result
		if after, err = measureFlush(ctx, cfg.url, fd); err != nil {
			err = fmt.Errorf("flush bound: %w", err)
			return
		}
		emit(mergeFlush(before, after))
		var chain Result
		if chain, err = measureHandOffChain(ctx, cfg.url, fd); err != nil {
			err = fmt.Errorf("handoff chain: %w", err)
			return
		}
		emit(chain)
		var floor Result
		if floor, err = measureGrantFloor(ctx, cfg.url, fd); err != nil {
			err = fmt.Errorf("grant floor: %w", err)
			return
		}
		emit(floor)
		for _, floor := range []bool{false, true} {
			var relay Result
			if relay, err = measureActorRelay(ctx, cfg.url, cfg.hotCallers[0], floor, fd); err != nil {
				err = fmt.Errorf("actor relay: %w", err)
				return
			}
			emit(relay)
		}
	}()
	for _, procs := range cfg.hotProcs {
		for _, c := range cfg.hotCallers {
			if c < procs {
				continue
			}
			for _, fair := range []bool{false, true} {
				if fair && !cfg.hotFair {
					continue
				}
				r, perr := runHotKeyPoint(ctx, cfg, c, procs, fair)
				if perr != nil {
					err = fmt.Errorf("with C=%d P=%d (fair queue %v): %w", c, procs, fair, perr)
					return err
				}
				emit(r)
			}
		}
	}
	return nil
}

type workerProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func runHotKeyPoint(ctx context.Context, cfg config, callers, procs int, fair bool) (Result, error) {
	pool, schema, cleanup, err := benchSchema(ctx, cfg.url, 2)
	if err != nil {
		return Result{}, err
	}
	defer cleanup()
	pool.Close() // the workers open their own pools
	var workers []*workerProc
	defer func() {
		for _, w := range workers {
			_ = w.stdin.Close()
			_ = w.cmd.Wait()
		}
	}()
	for p := range procs {
		spec := workerSpec{URL: cfg.url, Schema: schema, Key: "bench:hot", Duration: cfg.duration, Proc: p, Fair: fair,
			Callers: callers/procs + boolInt(p < callers%procs)}
		if cfg.cpuprofile != "" {
			spec.CPUProfile = fmt.Sprintf("%s.worker%d", cfg.cpuprofile, p)
		}
		raw, _ := json.Marshal(spec)
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return Result{}, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return Result{}, err
		}
		if err := cmd.Start(); err != nil {
			return Result{}, err
		}
		workers = append(workers, &workerProc{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)})
	}
	for _, w := range workers {
		line, err := w.out.ReadString('\n')
		if err != nil || line != "ready\n" {
			rest, _ := io.ReadAll(w.out)
			return Result{}, fmt.Errorf("worker not ready: %q %s", line+string(rest), errString(err))
		}
	}
	start := time.Now()
	for _, w := range workers {
		if _, err := io.WriteString(w.stdin, "go\n"); err != nil {
			return Result{}, err
		}
	}
	var reps []workerReport
	for _, w := range workers {
		var rep workerReport
		if err := json.NewDecoder(w.out).Decode(&rep); err != nil {
			return Result{}, fmt.Errorf("worker report: %w", err)
		}
		if rep.Err != "" {
			return Result{}, errors.New("worker: " + rep.Err)
		}
		reps = append(reps, rep)
	}
	elapsed := time.Since(start).Seconds()
	r := summarizeHotKey(reps, callers, procs, elapsed)
	if fair {
		r.Impl = "manager-fair"
	}
	return r, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// summarizeHotKey merges the workers' records: sorted by fence (the grant
// order), each grant is paired with the previous holder's release.
func summarizeHotKey(reps []workerReport, callers, procs int, elapsed float64) Result {
	var recs []csRecord
	var waits []float64
	r := Result{Scenario: "hotkey", Impl: "manager", Callers: callers, Processes: procs, Seconds: elapsed}
	var timeouts, stmts int64
	for _, rep := range reps {
		stmts += rep.Stmts
		recs = append(recs, rep.Records...)
		waits = append(waits, rep.WaitsMs...)
		timeouts += rep.Timeouts
		r.Errors += rep.Errors
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Fence < recs[j].Fence })
	var all, xproc latencies
	var dupFence int
	for i := 1; i < len(recs); i++ {
		if recs[i].Fence == recs[i-1].Fence {
			dupFence++ // would be a mutual-exclusion bug
			continue
		}
		h := time.Duration(recs[i].GrantNs - recs[i-1].RelNs)
		all = append(all, h)
		if recs[i].Proc != recs[i-1].Proc {
			xproc = append(xproc, h)
		}
	}
	r.Cycles = int64(len(recs))
	r.CyclesPerSec = float64(len(recs)) / elapsed
	_, p50, p99, mx := summarize([]latencies{all})
	r.P50Ms, r.P99Ms, r.MaxMs, r.Latency = ms(p50), ms(p99), ms(mx), "handoff"
	inv, worst := fifoInversions(recs, fifoTolerance)
	r.Extra = map[string]float64{"timeouts": float64(timeouts), "fifo_inversions": float64(inv),
		"max_share": maxShare(recs)}
	if inv > 0 {
		r.Extra["fifo_worst_ms"] = ms(worst)
	}
	if len(recs) > 0 {
		r.Extra["stmts_per_section"] = float64(stmts) / float64(len(recs))
	}
	if dupFence > 0 {
		r.Extra["duplicate_fences"] = float64(dupFence)
	}
	if procs > 1 {
		_, xp50, xp99, _ := summarize([]latencies{xproc})
		r.Extra["xproc_handoffs"] = float64(len(xproc))
		r.Extra["xproc_p50_ms"] = ms(xp50)
		r.Extra["xproc_p99_ms"] = ms(xp99)
	}
	sort.Float64s(waits)
	if len(waits) > 0 {
		r.Extra["wait_p50_ms"] = waits[len(waits)/2]
		r.Extra["wait_p99_ms"] = waits[int(0.99*float64(len(waits)-1))]
	}
	return r
}

// fifoTolerance is how much earlier a waiter must have called Acquire than
// another of its process for being granted after it to count as a FIFO
// inversion. The call time is taken just before Acquire, and the loop
// queues the request a little later (validation, a channel send, a
// goroutine switch on a busy machine), so near-simultaneous calls have no
// defined order.
const fifoTolerance = 5 * time.Millisecond

// fifoInversions counts, among the records of each process (recs sorted by
// fence, i.e. grant order), the pairs where a caller that called Acquire
// more than tol before another was granted after it, and the largest such
// head start. A caller that called earlier and was granted later waited the
// whole time, so with a FIFO queue there are none.
func fifoInversions(recs []csRecord, tol time.Duration) (n int, worst time.Duration) {
	byProc := map[int][]csRecord{}
	for _, r := range recs {
		byProc[r.Proc] = append(byProc[r.Proc], r)
	}
	for _, rs := range byProc {
		for i := range rs {
			for j := i + 1; j < len(rs); j++ {
				if d := time.Duration(rs[i].CallNs - rs[j].CallNs); d > tol {
					n++
					worst = max(worst, d)
				}
			}
		}
	}
	return n, worst
}

// maxShare is the share of all critical sections taken by the busiest
// caller (1/C when fair).
func maxShare(recs []csRecord) float64 {
	if len(recs) == 0 {
		return 0
	}
	counts := map[[2]int]int{}
	top := 0
	for _, r := range recs {
		k := [2]int{r.Proc, r.Caller}
		counts[k]++
		top = max(top, counts[k])
	}
	return float64(top) / float64(len(recs))
}
