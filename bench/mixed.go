package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest/pgrec"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// The mixed scenario: SyncGuard processes (Node, bench/peers/syncguard)
// and pglease Manager processes (this binary re-executed) on the same few
// hot keys of one lock table, with the release trigger installed (so
// that SyncGuard's releases wake the Managers, as a mixed fleet is set
// up: docs/syncguard.md). SyncGuard's lock() never LISTENs: its waiters
// poll with backoff (100 ms exponential, equal jitter) and give up after
// 5 s (AcquisitionTimeout). A Manager hears every release at once. The
// question is whether the Managers leave the SyncGuard side its share.
//
// Three phases, each on a fresh schema with the trigger, each
// -mixed-duration long in all:
//
//   - syncguard-alone: the SyncGuard processes by themselves;
//   - manager-alone: the Manager processes by themselves;
//   - mixed: both at once ("syncguard-mixed" and "manager-mixed" rows).
//
// They run in rounds of at most 20 s (alone, alone, both, then again),
// so that other load on the machine weighs on the three alike.
//
// Shape (-mixed-shape, default 3,3,2,3,3): S SyncGuard processes × L
// lock() loops, M Manager processes × G goroutines, K hot keys. Every loop
// and goroutine takes a key chosen at random for each critical section
// (empty), then the next. Managers use the defaults, TTL 30 s (SyncGuard's
// default) and WithAcquireTimeout(5 s), SyncGuard's own limit, so a
// starved Manager counts timeouts as SyncGuard does.
//
// Target M (judged in the run, mixedTargets): the SyncGuard side keeps
// ≥ 50 % of its alone throughput in the mixed phase, with 0 acquisition
// timeouts; the Managers' mixed throughput is reported next to theirs
// alone (the cost).

// mixedWorkerEnv marks a process started as a mixed-scenario Manager
// worker; its mixedSpec is the first stdin line (no connection string in
// the environment).
const mixedWorkerEnv = "PGLEASE_BENCH_MIXED_WORKER"

// mixedConfig is the scenario's shape and length.
type mixedConfig struct {
	duration                               time.Duration
	sgProcs, sgLoops, mgrProcs, mgrCallers int
	keys                                   int
	nodeDir                                string // the Node worker's folder (worker.mjs, package.json)
}

// mixedTargetShare is the SyncGuard side's share of its alone throughput
// that the mixed phase must keep (target M).
const mixedTargetShare = 0.50

// mixedAcquireTimeout is SyncGuard's default acquisition timeout, used for
// the Managers' waits too.
const mixedAcquireTimeout = 5 * time.Second

// mixedSpec is what one Manager worker runs.
type mixedSpec struct {
	URL      string        `json:"url"`
	Schema   string        `json:"schema"`
	Channel  string        `json:"channel"`
	Keys     []string      `json:"keys"`
	Callers  int           `json:"callers"`
	Duration time.Duration `json:"duration"`
}

// sgSpec is what one SyncGuard (Node) worker runs (worker.mjs).
type sgSpec struct {
	Host       string   `json:"host"`
	Port       uint16   `json:"port"`
	User       string   `json:"user"`
	Password   string   `json:"password,omitempty"`
	Database   string   `json:"database"`
	SSL        any      `json:"ssl"`
	Schema     string   `json:"schema"`
	App        string   `json:"app"`
	Keys       []string `json:"keys"`
	Loops      int      `json:"loops"`
	DurationMs int64    `json:"durationMs"`
}

// mixedReport is one worker's report, Node or Go.
type mixedReport struct {
	Ready    bool      `json:"ready,omitempty"`
	Impl     string    `json:"impl"`
	Sections int64     `json:"sections"`
	Timeouts int64     `json:"timeouts"`
	Errors   int64     `json:"errors"`
	Error    string    `json:"error,omitempty"`
	Seconds  float64   `json:"seconds"`
	WaitsMs  []float64 `json:"waits_ms"`
	PerKey   []int64   `json:"per_key"`
	Attempts int64     `json:"attempts"` // SyncGuard: backend attempts (-1: not counted); Manager: keys sent in acquire statements
	HandOffs int64     `json:"handoffs,omitempty"`
	Stmts    int64     `json:"stmts,omitempty"`
	Err      string    `json:"err,omitempty"`
}

func runMixed(ctx context.Context, cfg config, emit func(Result), note noteFunc) error {
	mc := cfg.mixed
	if _, err := exec.LookPath("node"); err != nil {
		note("mixed: skipped, node is not installed (SyncGuard runs on Node ≥ 20)")
		return nil
	}
	if err := ensureNodeModules(ctx, mc.nodeDir); err != nil {
		note("mixed: skipped, %v", err)
		return nil
	}
	// The phases run in rounds of ≤ mixedSlice each (alone, alone, both;
	// again), so that a load on the machine that comes and goes weighs
	// on all three alike.
	rounds := max(1, int(mc.duration/mixedSlice))
	rc := cfg
	rc.mixed.duration = mc.duration / time.Duration(rounds)
	var sgAlone, mgrAlone, sgMixed, mgrMixed [][]mixedReport
	impl := ""
	for range rounds {
		sg, _, im, err := runMixedPhase(ctx, rc, true, false)
		if err != nil {
			return fmt.Errorf("syncguard alone: %w", err)
		}
		sgAlone, impl = append(sgAlone, sg), im
		_, mgr, _, err := runMixedPhase(ctx, rc, false, true)
		if err != nil {
			return fmt.Errorf("managers alone: %w", err)
		}
		mgrAlone = append(mgrAlone, mgr)
		sg, mgr, _, err = runMixedPhase(ctx, rc, true, true)
		if err != nil {
			return fmt.Errorf("mixed: %w", err)
		}
		sgMixed, mgrMixed = append(sgMixed, sg), append(mgrMixed, mgr)
	}
	sgRow := func(rs [][]mixedReport, phase string) Result {
		r := summarizeMixed(rs, "syncguard-"+phase, mc.sgProcs*mc.sgLoops, mc.sgProcs)
		r.Extra["replica"] = float64(boolInt(impl == "syncguard-replica"))
		return r
	}
	mgrRow := func(rs [][]mixedReport, phase string) Result {
		return summarizeMixed(rs, "manager-"+phase, mc.mgrProcs*mc.mgrCallers, mc.mgrProcs)
	}
	emit(sgRow(sgAlone, "alone"))
	emit(mgrRow(mgrAlone, "alone"))
	emit(sgRow(sgMixed, "mixed"))
	emit(mgrRow(mgrMixed, "mixed"))
	return nil
}

// mixedSlice is the longest a phase runs at once (runMixed).
const mixedSlice = 20 * time.Second

// ensureNodeModules installs the Node worker's dependencies (postgres.js,
// pinned by package-lock.json) when they are missing.
func ensureNodeModules(ctx context.Context, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "worker.mjs")); err != nil {
		return fmt.Errorf("no SyncGuard worker at %s (run from the repository root)", dir)
	}
	if fileExists(filepath.Join(dir, "node_modules", "postgres", "package.json")) {
		return nil
	}
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci in %s: %w\n%s", dir, err, out)
	}
	return nil
}

// runMixedPhase runs one phase on a fresh schema with the release
// trigger: the SyncGuard processes (withSG), the Manager processes
// (withMgr), or both, started together after all are ready. It returns
// each side's worker reports and the SyncGuard implementation the Node
// workers run.
func runMixedPhase(ctx context.Context, cfg config, withSG, withMgr bool) (sg, mgr []mixedReport, impl string, err error) {
	mc := cfg.mixed
	pool, schema, cleanup, err := benchSchema(ctx, cfg.url, 2)
	if err != nil {
		return sg, mgr, impl, err
	}
	defer cleanup()
	channel := fmt.Sprintf("pglease_mixed_%d", time.Now().UnixNano())
	mg, err := migrate.New(pool, pg.Config{})
	if err == nil {
		err = mg.SetupReleaseTrigger(ctx, channel)
	}
	if err != nil {
		return sg, mgr, impl, fmt.Errorf("release trigger: %w", err)
	}
	keys := make([]string, mc.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench:mixed:%d", i)
	}
	pc, err := pgconn.ParseConfig(cfg.url)
	if err != nil {
		return sg, mgr, impl, err
	}
	var sgWorkers, mgrWorkers []*workerProc
	defer func() {
		for _, w := range append(sgWorkers, mgrWorkers...) {
			_ = w.stdin.Close()
			if err != nil {
				_ = w.cmd.Process.Kill()
			}
			_ = w.cmd.Wait()
		}
	}()
	start := func(cmd *exec.Cmd, spec any) (*workerProc, error) {
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		w := &workerProc{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
		raw, _ := json.Marshal(spec)
		if _, err := stdin.Write(append(raw, '\n')); err != nil {
			return w, err
		}
		return w, nil
	}
	if withSG {
		var ssl any = false
		if pc.TLSConfig != nil {
			ssl = "prefer"
		}
		for p := range mc.sgProcs {
			cmd := exec.CommandContext(ctx, "node", "worker.mjs")
			cmd.Dir = mc.nodeDir
			w, err := start(cmd, sgSpec{Host: pc.Host, Port: pc.Port, User: pc.User, Password: pc.Password, Database: pc.Database,
				SSL: ssl, Schema: schema, App: fmt.Sprintf("syncguard-%d", p), Keys: keys, Loops: mc.sgLoops, DurationMs: mc.duration.Milliseconds()})
			if w != nil {
				sgWorkers = append(sgWorkers, w)
			}
			if err != nil {
				return sg, mgr, impl, err
			}
		}
	}
	if withMgr {
		for range mc.mgrProcs {
			cmd := exec.CommandContext(ctx, os.Args[0])
			cmd.Env = append(os.Environ(), mixedWorkerEnv+"=1")
			w, err := start(cmd, mixedSpec{URL: cfg.url, Schema: schema, Channel: channel, Keys: keys, Callers: mc.mgrCallers, Duration: mc.duration})
			if w != nil {
				mgrWorkers = append(mgrWorkers, w)
			}
			if err != nil {
				return sg, mgr, impl, err
			}
		}
	}
	all := append(append([]*workerProc{}, sgWorkers...), mgrWorkers...)
	for _, w := range all {
		var rep mixedReport
		if err := readMixedLine(w, &rep); err != nil {
			return sg, mgr, impl, fmt.Errorf("worker not ready: %w", err)
		}
		if !rep.Ready {
			return sg, mgr, impl, fmt.Errorf("worker not ready: %s", rep.Err)
		}
		if rep.Impl != "" && rep.Impl != "manager" {
			impl = rep.Impl
		}
	}
	for _, w := range all {
		if _, err := io.WriteString(w.stdin, "go\n"); err != nil {
			return sg, mgr, impl, err
		}
	}
	reps := make([]mixedReport, len(all))
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, w := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = readMixedLine(w, &reps[i])
			if errs[i] == nil && reps[i].Err != "" {
				errs[i] = errors.New(reps[i].Err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return sg, mgr, impl, fmt.Errorf("worker: %w", err)
	}
	return reps[:len(sgWorkers)], reps[len(sgWorkers):], impl, nil
}

// readMixedLine reads one JSON line of a worker (the Node worker may
// print nothing else on stdout).
func readMixedLine(w *workerProc, v *mixedReport) error {
	line, err := w.out.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("%w (read %q)", err, line)
	}
	return json.Unmarshal(line, v)
}

// summarizeMixed merges the reports of one side, round by round:
// sections/s over the sum of each round's longest worker run (a SyncGuard
// lock() under way at the end finishes, up to its 5 s timeout), waits of
// the granted sections, timeouts.
func summarizeMixed(rounds [][]mixedReport, impl string, callers, procs int) Result {
	r := Result{Scenario: "mixed", Impl: impl, Callers: callers, Processes: procs, Latency: "wait",
		Extra: map[string]float64{}}
	var waits []float64
	var timeouts, attempts, handoffs, stmts int64
	perKey := map[int]int64{}
	for _, reps := range rounds {
		secs := 0.0
		for _, rep := range reps {
			secs = max(secs, rep.Seconds)
		}
		r.Seconds += secs
	}
	for _, rep := range slices.Concat(rounds...) {
		r.Cycles += rep.Sections
		r.Errors += rep.Errors
		timeouts += rep.Timeouts
		attempts += rep.Attempts
		handoffs += rep.HandOffs
		stmts += rep.Stmts
		waits = append(waits, rep.WaitsMs...)
		for i, n := range rep.PerKey {
			perKey[i] += n
		}
		if rep.Error != "" {
			fmt.Fprintln(os.Stderr, "bench: mixed", impl, "error:", rep.Error)
		}
	}
	if r.Seconds > 0 {
		r.CyclesPerSec = float64(r.Cycles) / r.Seconds
	}
	sort.Float64s(waits)
	if len(waits) > 0 {
		r.P50Ms = waits[len(waits)/2]
		r.P99Ms = waits[int(0.99*float64(len(waits)-1))]
		r.MaxMs = waits[len(waits)-1]
	}
	r.Extra["timeouts"] = float64(timeouts)
	if r.Cycles > 0 && attempts >= 0 {
		r.Extra["attempts_per_section"] = float64(attempts) / float64(r.Cycles)
	}
	if r.Cycles > 0 && stmts > 0 {
		r.Extra["stmts_per_section"] = float64(stmts) / float64(r.Cycles)
		r.Extra["handoff_share"] = float64(handoffs) / float64(r.Cycles)
	}
	lo, hi := int64(-1), int64(0)
	for _, n := range perKey {
		if lo < 0 || n < lo {
			lo = n
		}
		hi = max(hi, n)
	}
	if hi > 0 {
		r.Extra["key_min_share"] = float64(lo) / float64(hi)
	}
	return r
}

// runMixedWorkerMode runs a mixed-scenario Manager worker and exits when
// this process was started as one; it returns false otherwise.
func runMixedWorkerMode() bool {
	if os.Getenv(mixedWorkerEnv) == "" {
		return false
	}
	in := bufio.NewReader(os.Stdin)
	rep := mixedWorker(in)
	_ = json.NewEncoder(os.Stdout).Encode(rep)
	if rep.Err != "" {
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

// mixedWorker is one Manager process: G goroutines, each taking a key at
// random, empty section, Release, and again.
func mixedWorker(in *bufio.Reader) (rep mixedReport) {
	ctx := context.Background()
	line, err := in.ReadBytes('\n')
	if err != nil {
		return mixedReport{Err: "no spec"}
	}
	var spec mixedSpec
	if err := json.Unmarshal(line, &spec); err != nil {
		return mixedReport{Err: "bad spec: " + err.Error()}
	}
	tr := &fleetTracer{}
	pool, err := newPool(ctx, spec.URL, spec.Schema, min(spec.Callers, 64)+2, func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = &pgrec.Recorder{OnStart: tr.observe} })
	if err != nil {
		return mixedReport{Err: err.Error()}
	}
	defer pool.Close()
	m, err := manager.New(pool, manager.Config{Config: pg.Config{NotifyChannel: spec.Channel}})
	if err != nil {
		return mixedReport{Err: err.Error()}
	}
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := m.Close(cctx); err != nil && rep.Err == "" {
			rep.Err = "close: " + err.Error()
		}
	}()
	opts := []manager.AcquireOption{manager.WithTTL(30 * time.Second), manager.WithAcquireTimeout(mixedAcquireTimeout)}
	for _, k := range spec.Keys { // warm up: connections, prepared statements
		lk, err := m.Acquire(ctx, k, manager.WithTTL(30*time.Second), manager.WithAcquireTimeout(30*time.Second))
		if err == nil {
			err = lk.Release(ctx)
		}
		if err != nil {
			return mixedReport{Err: "warm-up: " + err.Error()}
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(mixedReport{Ready: true, Impl: "manager"})
	if l, err := in.ReadString('\n'); err != nil || l != "go\n" {
		return mixedReport{Err: "no go signal"}
	}
	base := tr.counts()
	// Cancel at the end (a deadline would end waits as timeouts).
	runCtx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(spec.Duration, cancel)
	defer timer.Stop()
	start := time.Now()
	type callerStats struct {
		sections, timeouts, errs int64
		waits                    []float64
		perKey                   []int64
	}
	cs := make([]callerStats, spec.Callers)
	var wg sync.WaitGroup
	for w := range spec.Callers {
		cs[w].perKey = make([]int64, len(spec.Keys))
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &cs[w]
			for runCtx.Err() == nil {
				i := rand.IntN(len(spec.Keys))
				t0 := time.Now()
				lk, err := m.Acquire(runCtx, spec.Keys[i], opts...)
				if err != nil {
					switch {
					case runCtx.Err() != nil:
					case errors.Is(err, pglease.ErrAcquisitionTimeout):
						s.timeouts++
					default:
						s.errs++
					}
					continue
				}
				s.waits = append(s.waits, ms(time.Since(t0)))
				if err := lk.Release(ctx); err != nil {
					s.errs++
				}
				s.sections++
				s.perKey[i]++
			}
		}()
	}
	wg.Wait()
	rep.Impl = "manager"
	rep.Seconds = time.Since(start).Seconds()
	rep.PerKey = make([]int64, len(spec.Keys))
	for _, s := range cs {
		rep.Sections += s.sections
		rep.Timeouts += s.timeouts
		rep.Errors += s.errs
		rep.WaitsMs = append(rep.WaitsMs, s.waits...)
		for i, n := range s.perKey {
			rep.PerKey[i] += n
		}
	}
	n := tr.counts().minus(base)
	rep.Attempts, rep.HandOffs, rep.Stmts = n.AcqItems, n.HandOff, n.All
	return rep
}
