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
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/manager"
)

// fairness: is a hot key served in proportion to who waits for it? P
// processes (-fair-callers, default 1,2,3,4 callers: 4 processes, 10
// callers) loop acquire, hold -fair-hold, release on one key, each
// Acquire waiting at most fairWait, for -fair-duration, in four kinds:
//   - mutex: every caller exclusive;
//   - semaphore: every caller a permit of a semaphore of -fair-limit;
//   - rwlock: callers with an even index in their process write, the
//     others read (writers among readers: writers' shares are reported);
//   - set: process 0 has -fair-set-callers callers taking a set of
//     fairSetKeys keys all or nothing (AcquireAll); every other process
//     has one caller per key of the set, single-key Acquires.
//
// Per process, share = (its share of grants) / (its share of the waiting
// callers): 1 when grants follow the callers, the target is within ±20 %
// (share_min, share_max; for rwlock, writers' grants over writers:
// writer_share_min/max). longest_wait_ms is the longest Acquire of the
// window (timeouts included, at fairWait), wait_bound_ms = 2 × mean hold
// cycle × queue length + 0.5 s, where the mean hold cycle is the window
// over the grants (the time the key, or one permit, is held per grant,
// handoff included, times the limit for a semaphore: window / grants ×
// limit) and the queue length the callers (/ limit for a semaphore):
// wait_ratio = longest_wait_ms / wait_bound_ms (target ≤ 1). timeouts
// counts Acquires that gave up at fairWait (target 0, for the set
// especially: set_timeouts). deliveries_per_grant: notifications on the
// Managers' shared channel, times the Managers listening on it, per grant
// (target ≤ 1.5): a release that wakes every waiting process costs one
// delivery per listening process. For manager-fair (the Manager with
// Config.FairQueue) the count is the shared channel's only: a Manager's
// turn notices on its own queue channel (at most one per handoff, to the
// head's process) are not visible to the bench.
const (
	fairWait     = 10 * time.Second
	fairSetKeys  = 4
	fairWorkerEv = "PGLEASE_BENCH_FAIR_WORKER"
)

// fairConfig is the fairness scenario's part of config.
type fairConfig struct {
	callers    []int         // callers per process
	setCallers int           // set kind: callers of process 0
	duration   time.Duration // measured window per kind
	hold       time.Duration // critical section
	limit      int           // semaphore's n
	kinds      []string
	impls      []string // "manager" (the Manager), "manager-fair" (with Config.FairQueue), "queue" (the fair queue's store calls)
}

var fairKinds = []string{"mutex", "semaphore", "rwlock", "set"}

// fairSpec tells a fairness worker what to run.
type fairSpec struct {
	URL        string        `json:"url"`
	Schema     string        `json:"schema"`
	Kind       string        `json:"kind"`
	Proc       int           `json:"proc"`
	Callers    int           `json:"callers"`
	SetCallers int           `json:"set_callers"`
	Duration   time.Duration `json:"duration"`
	Hold       time.Duration `json:"hold"`
	Limit      int           `json:"limit"`
	Impl       string        `json:"impl"` // "manager", "manager-fair" or "queue"
}

// fairCaller is what one caller of a worker saw in the window.
type fairCaller struct {
	Writer   bool      `json:"writer,omitempty"`
	Set      bool      `json:"set,omitempty"`
	Grants   int64     `json:"grants"`
	Timeouts int64     `json:"timeouts"`
	Errors   int64     `json:"errors"`
	MaxWait  float64   `json:"max_wait_ms"`
	WaitsMs  []float64 `json:"waits_ms,omitempty"`
	FirstErr string    `json:"first_err,omitempty"`
}

type fairReport struct {
	Callers []fairCaller `json:"callers"`
	Notes   int64        `json:"notes"`   // notifications read on the process's queue channel
	Retries int64        `json:"retries"` // queue: attempts after a wait slice without a turn
	Err     string       `json:"err,omitempty"`
}

// runFairWorkerMode runs a fairness worker when this process was started
// as one (fairWorkerEv set).
func runFairWorkerMode() bool {
	raw := os.Getenv(fairWorkerEv)
	if raw == "" {
		return false
	}
	var spec fairSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "bench fairness worker: bad spec:", err)
		os.Exit(2)
	}
	rep := fairWorker(spec, bufio.NewReader(os.Stdin), os.Stdout)
	_ = json.NewEncoder(os.Stdout).Encode(rep)
	if rep.Err != "" {
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

const fairKey = "bench:fair"

// fairSetKeyNames are the set kind's keys.
func fairSetKeyNames() []string {
	ks := make([]string, fairSetKeys)
	for i := range ks {
		ks[i] = fmt.Sprintf("bench:fair:set:%d", i)
	}
	return ks
}

func fairWorker(spec fairSpec, in *bufio.Reader, out io.Writer) (rep fairReport) {
	ctx := context.Background()
	callers := spec.Callers
	setProc := spec.Kind == "set" && spec.Proc == 0
	if setProc {
		callers = spec.SetCallers
	} else if spec.Kind == "set" {
		callers = fairSetKeys
	}
	pool, err := newPool(ctx, spec.URL, spec.Schema, min(callers, 64)+2)
	if err != nil {
		return fairReport{Err: err.Error()}
	}
	defer pool.Close()
	sts := make([]fairCaller, callers)
	var cycles []func(context.Context) (func() error, error)
	if spec.Impl == "queue" {
		q, err := newFairQueue(ctx, pool)
		if err != nil {
			return fairReport{Err: err.Error()}
		}
		defer func() {
			q.stop()
			rep.Notes, rep.Retries = q.notes.Load(), q.retries.Load()
		}()
		cycles = fairQueueCycles(q, spec, sts, setProc)
	} else {
		m, err := manager.New(pool, manager.Config{FairQueue: spec.Impl == "manager-fair"})
		if err != nil {
			return fairReport{Err: err.Error()}
		}
		defer func() {
			cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			if err := m.Close(cctx); err != nil && rep.Err == "" {
				rep.Err = "close: " + err.Error()
			}
		}()
		cycles = fairManagerCycles(m, spec, sts, setProc)
	}
	// Warm up: each caller once (connections, statements).
	var wg sync.WaitGroup
	warm := make([]error, callers)
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, err := cycles[w](ctx)
			if err == nil {
				err = rel()
			}
			warm[w] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(warm...); err != nil {
		return fairReport{Err: "warm-up: " + err.Error()}
	}
	fmt.Fprintln(out, "ready")
	if line, err := in.ReadString('\n'); err != nil || line != "go\n" {
		return fairReport{Err: "no go signal"}
	}
	end := time.Now().Add(spec.Duration)
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := &sts[w]
			for time.Now().Before(end) {
				t0 := time.Now()
				rel, err := cycles[w](ctx)
				wait := time.Since(t0)
				st.MaxWait = max(st.MaxWait, ms(wait))
				if err != nil {
					if pglease.CodeOf(err) == pglease.CodeAcquisitionTimeout {
						st.Timeouts++
					} else {
						st.Errors++
						if st.FirstErr == "" {
							st.FirstErr = err.Error()
						}
					}
					continue
				}
				granted := time.Now()
				time.Sleep(spec.Hold)
				if err := rel(); err != nil {
					st.Errors++
					if st.FirstErr == "" {
						st.FirstErr = err.Error()
					}
				}
				if granted.Before(end) {
					st.Grants++
					st.WaitsMs = append(st.WaitsMs, ms(wait))
				}
			}
		}()
	}
	wg.Wait()
	rep.Callers = sts
	return rep
}

// fairManagerCycles builds the Manager implementation's cycle of each
// caller.
func fairManagerCycles(m *manager.Manager, spec fairSpec, sts []fairCaller, setProc bool) []func(context.Context) (func() error, error) {
	base := []manager.AcquireOption{manager.WithTTL(30 * time.Second), manager.WithAcquireTimeout(fairWait)}
	cycles := make([]func(context.Context) (func() error, error), len(sts))
	for w := range sts {
		opts := base
		key := fairKey
		switch spec.Kind {
		case "semaphore":
			opts = append(base[:len(base):len(base)], manager.WithLimit(spec.Limit))
		case "rwlock":
			sts[w].Writer = w%2 == 0
			if !sts[w].Writer {
				opts = append(base[:len(base):len(base)], manager.Shared())
			}
		case "set":
			if setProc {
				sts[w].Set = true
				ks := fairSetKeyNames()
				cycles[w] = func(ctx context.Context) (func() error, error) {
					locks, err := m.AcquireAll(ctx, ks, base...)
					if err != nil {
						return nil, err
					}
					return func() error {
						var errs []error
						for _, lk := range locks {
							errs = append(errs, lk.Release(context.Background()))
						}
						return errors.Join(errs...)
					}, nil
				}
				continue
			}
			key = fairSetKeyNames()[w]
		}
		cycles[w] = func(ctx context.Context) (func() error, error) {
			lk, err := m.Acquire(ctx, key, opts...)
			if err != nil {
				return nil, err
			}
			return func() error { return lk.Release(context.Background()) }, nil
		}
	}
	return cycles
}

func runFairness(ctx context.Context, cfg config, emit func(Result), note noteFunc) error {
	impls := cfg.fair.impls
	if len(impls) == 0 {
		impls = []string{"manager"}
	}
	for _, impl := range impls {
		for _, kind := range cfg.fair.kinds {
			r, err := runFairPoint(ctx, cfg, impl, kind)
			if err != nil {
				return fmt.Errorf("%s %s: %w", impl, kind, err)
			}
			emit(r)
		}
	}
	return nil
}

func runFairPoint(ctx context.Context, cfg config, impl, kind string) (Result, error) {
	pool, schema, cleanup, err := benchSchema(ctx, cfg.url, 2)
	if err != nil {
		return Result{}, err
	}
	defer cleanup()
	pool.Close()
	fc := cfg.fair
	var workers []*workerProc
	defer func() {
		for _, w := range workers {
			_ = w.stdin.Close()
			_ = w.cmd.Wait()
		}
	}()
	for p, c := range fc.callers {
		spec := fairSpec{URL: cfg.url, Schema: schema, Kind: kind, Proc: p, Callers: c, SetCallers: fc.setCallers,
			Duration: fc.duration, Hold: fc.hold, Limit: fc.limit, Impl: impl}
		raw, _ := json.Marshal(spec)
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), fairWorkerEv+"="+string(raw))
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
	obs, err := startObserver(ctx, cfg.url, manager.DefaultNotifyChannel)
	if err != nil {
		return Result{}, err
	}
	defer obs.close()
	n0, _ := obs.count()
	start := time.Now()
	for _, w := range workers {
		if _, err := io.WriteString(w.stdin, "go\n"); err != nil {
			return Result{}, err
		}
	}
	var reps []fairReport
	for _, w := range workers {
		var rep fairReport
		if err := json.NewDecoder(w.out).Decode(&rep); err != nil {
			return Result{}, fmt.Errorf("worker report: %w", err)
		}
		if rep.Err != "" {
			return Result{}, errors.New("worker: " + rep.Err)
		}
		reps = append(reps, rep)
	}
	elapsed := time.Since(start)
	n1, err := obs.count()
	if err != nil {
		return Result{}, err
	}
	return summarizeFair(impl, kind, fc, reps, min(elapsed, fc.duration), n1-n0), nil
}

// summarizeFair computes the fairness figures of one kind (see the
// scenario's comment). window is the measured window; notes the
// notifications seen on the shared channel during the run.
func summarizeFair(impl, kind string, fc fairConfig, reps []fairReport, window time.Duration, notes int64) Result {
	r := Result{Scenario: "fairness", Impl: fairImplName(impl, kind), Processes: len(reps), Seconds: window.Seconds(), Latency: "wait"}
	var waits []float64
	var grants, callers, timeouts, setGrants, setTimeouts, setCallers int64
	var longest, setLongest float64
	procGrants := make([]int64, len(reps))
	procCallers := make([]int64, len(reps))
	procWGrants := make([]int64, len(reps))
	procWriters := make([]int64, len(reps))
	var wLongest float64
	var firstErr string
	for p, rep := range reps {
		for _, c := range rep.Callers {
			r.Errors += c.Errors
			if firstErr == "" {
				firstErr = c.FirstErr
			}
			waits = append(waits, c.WaitsMs...)
			timeouts += c.Timeouts
			longest = max(longest, c.MaxWait)
			if c.Set {
				setGrants += c.Grants
				setTimeouts += c.Timeouts
				setCallers++
				setLongest = max(setLongest, c.MaxWait)
				continue
			}
			grants += c.Grants
			callers++
			procGrants[p] += c.Grants
			procCallers[p]++
			if c.Writer {
				procWGrants[p] += c.Grants
				procWriters[p]++
				wLongest = max(wLongest, c.MaxWait)
			}
		}
	}
	r.Callers = int(callers + setCallers)
	r.Cycles = grants + setGrants
	r.CyclesPerSec = float64(r.Cycles) / window.Seconds()
	sort.Float64s(waits)
	if k := len(waits); k > 0 {
		r.P50Ms, r.P99Ms = waits[int(0.5*float64(k-1))], waits[int(0.99*float64(k-1))]
	}
	r.MaxMs = longest
	x := map[string]float64{"timeouts": float64(timeouts), "longest_wait_ms": longest}
	shares := func(g, c []int64) (lo, hi float64, per []float64) {
		var G, C int64
		for i := range g {
			G += g[i]
			C += c[i]
		}
		lo, hi = -1, -1
		for i := range g {
			if c[i] == 0 {
				continue
			}
			s := 0.0
			if G > 0 {
				s = (float64(g[i]) / float64(G)) / (float64(c[i]) / float64(C))
			}
			per = append(per, s)
			if lo < 0 || s < lo {
				lo = s
			}
			hi = max(hi, s)
		}
		return lo, hi, per
	}
	if kind != "set" {
		lo, hi, per := shares(procGrants, procCallers)
		x["share_min"], x["share_max"] = lo, hi
		for i, s := range per {
			x[fmt.Sprintf("share_p%d", i)] = s
		}
		// Mean hold cycle: the window over the grants (× limit for a
		// semaphore: each permit is held that long per grant); queue
		// length: the callers (/ limit). The product is the same.
		if grants > 0 {
			cycle := float64(window.Milliseconds()) / float64(grants)
			bound := 2*cycle*float64(callers) + 500
			x["hold_cycle_ms"] = cycle
			x["wait_bound_ms"] = bound
			x["wait_ratio"] = longest / bound
		}
		if kind == "rwlock" {
			lo, hi, _ := shares(procWGrants, procWriters)
			x["writer_share_min"], x["writer_share_max"] = lo, hi
			x["writer_longest_wait_ms"] = wLongest
		}
	} else {
		x["set_grants"] = float64(setGrants)
		x["set_timeouts"] = float64(setTimeouts)
		x["set_longest_wait_ms"] = setLongest
		x["single_grants"] = float64(grants)
		if setGrants+grants > 0 {
			// The set's keys are each contended by len(reps)-1 single
			// callers and the set's callers: the bound uses a key's
			// grants (a set grant counts on each key).
			perKey := float64(grants)/fairSetKeys + float64(setGrants)
			cycle := float64(window.Milliseconds()) / perKey
			bound := 2*cycle*float64(int64(len(reps)-1)+setCallers) + 500
			x["hold_cycle_ms"] = cycle
			x["wait_bound_ms"] = bound
			x["wait_ratio"] = longest / bound
		}
	}
	if r.Cycles > 0 {
		// Each Manager listens on the shared channel (one connection
		// each); the queue implementation listens only on its own
		// channel, where each notification is delivered once.
		listeners := float64(len(reps))
		var own int64
		if impl == "queue" {
			listeners = 0
			for _, rep := range reps {
				own += rep.Notes
			}
		}
		x["notifies_per_grant"] = float64(notes+own) / float64(r.Cycles)
		if impl == "queue" {
			var retries int64
			for _, rep := range reps {
				retries += rep.Retries
			}
			x["slice_retries"] = float64(retries)
		}
		x["deliveries_per_grant"] = (float64(notes)*listeners + float64(own)) / float64(r.Cycles)
	}
	r.Extra = x
	if firstErr != "" {
		fmt.Fprintf(os.Stderr, "bench: fairness %s: first error: %s\n", kind, firstErr)
	}
	return r
}

// fairImplName is a fairness result's Impl: the kind for the Manager,
// "fair-" and the kind for the Manager with Config.FairQueue, "queue-"
// and the kind for the queue implementation.
func fairImplName(impl, kind string) string {
	switch impl {
	case "queue":
		return "queue-" + kind
	case "manager-fair":
		return "fair-" + kind
	}
	return kind
}

// parseFairImpls parses -fair-impls.
func parseFairImpls(s string) ([]string, error) {
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if k != "manager" && k != "manager-fair" && k != "queue" {
			return nil, fmt.Errorf("unknown fairness implementation %q", k)
		}
		out = append(out, k)
	}
	return out, nil
}

// parseFairKinds parses -fair-kinds.
func parseFairKinds(s string) ([]string, error) {
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		ok := false
		for _, known := range fairKinds {
			ok = ok || k == known
		}
		if !ok {
			return nil, fmt.Errorf("unknown fairness kind %q", k)
		}
		out = append(out, k)
	}
	return out, nil
}

// Tolerances of the fairness targets (F).
const (
	fairShareTol       = 0.20 // each process's share within ±20 % of its callers'
	fairDeliveriesMax  = 1.5  // notifications delivered per grant
	fairWaitRatioLimit = 1.0  // longest wait ≤ the bound
)

// fairTargets judges the fairness scenario's results (target F), for
// each implementation measured.
func fairTargets(res resultSet) []Target {
	var ts []Target
	add := func(name, measured string, met *bool) {
		ts = append(ts, Target{ID: "F", Name: name, Measured: measured, Met: met})
	}
	for _, impl := range []string{"manager", "manager-fair", "queue"} {
		for _, kind := range fairKinds {
			name := fairImplName(impl, kind)
			for _, r := range res.all("fairness", name) {
				x := r.Extra
				if kind != "set" {
					lo, hi := x["share_min"], x["share_max"]
					add(fmt.Sprintf("fairness %s: grants/callers share per process 1 ± %.0f %%", name, 100*fairShareTol),
						fmt.Sprintf("%.2f–%.2f", lo, hi), boolp(lo >= 1-fairShareTol && hi <= 1+fairShareTol))
				}
				if kind == "rwlock" {
					lo, hi := x["writer_share_min"], x["writer_share_max"]
					add(fmt.Sprintf("fairness %s: writers' share per process 1 ± %.0f %%", name, 100*fairShareTol),
						fmt.Sprintf("%.2f–%.2f", lo, hi), boolp(lo >= 1-fairShareTol && hi <= 1+fairShareTol))
				}
				if kind == "set" {
					n := x["set_timeouts"]
					add(fmt.Sprintf("fairness %s of %d keys: 0 timeouts at a %v wait", name, fairSetKeys, fairWait),
						fmt.Sprintf("%.0f (%.0f set grants, %.0f single)", n, x["set_grants"], x["single_grants"]), boolp(n == 0 && x["set_grants"] > 0))
				}
				add(fmt.Sprintf("fairness %s: longest wait ≤ 2 × hold cycle × queue + 0.5 s", name),
					fmt.Sprintf("%.0f vs %.0f ms", x["longest_wait_ms"], x["wait_bound_ms"]), boolp(x["wait_ratio"] <= fairWaitRatioLimit))
				add(fmt.Sprintf("fairness %s: notifications delivered per grant ≤ %.1f", name, fairDeliveriesMax),
					fmt.Sprintf("%.2f", x["deliveries_per_grant"]), boolp(x["deliveries_per_grant"] <= fairDeliveriesMax))
			}
		}
	}
	return ts
}
