package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The fleet scenario's load per worker process (see "fleet" in main.go's
// documentation).
const (
	fleetHeld       = 100              // leases held for the whole run
	fleetTTL        = 10 * time.Second // TTL of every lease (held ones auto-extended every TTL/3)
	fleetOwnRate    = 20               // own-key acquire+release cycles per second
	fleetOwnKeys    = 64               // own keys cycled through (churn: a new key every cycle)
	fleetShared     = 2                // goroutines looping on the shared keys
	fleetSharedKeys = 8                // keys shared by the whole fleet
)

// fleetConfig holds the fleet scenario's flags.
type fleetConfig struct {
	n        []int         // fleet sizes (processes)
	duration time.Duration // measured window per step
	warmup   time.Duration // load before the window
	hold     time.Duration // how long a shared key is held
	churn    time.Duration // > 0: churn mode (unique own keys, sampled), instead of the steps
	idle     time.Duration // > 0: after each step's window, stop the load and count the idle fleet's connections after this long
	sample   time.Duration // churn: sampling interval
	fair     bool          // the workers' Managers queue their waiters (manager.Config.FairQueue)
	profile  string        // non-empty: worker 0 writes CPU profiles here, one per phase (phaseProfiler)
}

func (fc fleetConfig) describe() string {
	kind := "default"
	if fc.fair {
		kind = "FairQueue"
	}
	return fmt.Sprintf("each worker process a %s Manager holding %d leases (TTL %v, auto-extended), %d own-key acquire+release/s, "+
		"%d goroutines acquire/hold %v/release on %d keys shared by the fleet", kind, fleetHeld, fleetTTL, fleetOwnRate, fleetShared, fc.hold, fleetSharedKeys)
}

// fleetConnsPerWorker is how many connections one worker may open: its
// listening connection, and of its pool (manager.Open's default size,
// pgxpool's max(4, CPUs), read from the same connection string) what a
// Manager uses under full load: one acquire, release and extend batch in
// flight, one more acquire and release batch when 32 or more of a kind
// wait (docs/scaling.md, "connections"), so at most 5.
func fleetConnsPerWorker(url string) (int, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return 0, err
	}
	return min(int(pc.MaxConns), 5) + 1, nil
}

func runFleet(ctx context.Context, cfg config, emit func(Result), note noteFunc) error {
	// Ctrl-C or SIGTERM ends the run through its context: workers are
	// stopped (killed if need be) and the schema dropped.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	fc := cfg.fleet
	per, err := fleetConnsPerWorker(cfg.url)
	if err != nil {
		return err
	}
	budget, err := connBudget(ctx, cfg.url)
	if err != nil {
		return err
	}
	for _, n := range fc.n {
		if need := n*per + 5; need > budget {
			return fmt.Errorf("with N=%d the fleet may need %d connections (%d per worker: pool and listener; and the bench's), the server accepts %d more: "+
				"raise max_connections (the throwaway server: go run ./internal/cmd/withpg -durable -max-connections %d -- go run ./bench …)",
				n, need, per, budget, roundUp(need+50, 100))
		}
	}
	if fc.churn > 0 {
		note("fleet churn: %s; a new own key every cycle; %v per N after %v warm-up, sampled every %v", fc.describe(), fc.churn, fc.warmup, fc.sample)
	}
	var rows []Result
	var churns []fleetChurnResult
	for _, n := range fc.n {
		if fc.churn > 0 {
			cr, err := runFleetChurn(ctx, cfg, n, note)
			if err != nil {
				return fmt.Errorf("churn with N=%d: %w", n, err)
			}
			emit(cr.result)
			churns = append(churns, cr)
			continue
		}
		r, err := runFleetStep(ctx, cfg, n)
		if err != nil {
			return fmt.Errorf("with N=%d: %w", n, err)
		}
		emit(r)
		rows = append(rows, r)
	}
	if !cfg.json && cfg.out != nil {
		if len(rows) > 0 {
			fmt.Fprintf(cfg.out, "\n# fleet: %s; %v per step after %v warm-up\n", fc.describe(), fc.duration, fc.warmup)
			printFleetTable(cfg.out, rows)
		}
		for _, cr := range churns {
			printChurnTable(cfg.out, cr.result)
		}
	}
	return nil
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }

// fleetRun is one fleet on a fresh schema: the workers, the probe, the
// notification observer.
type fleetRun struct {
	workers []*fleetProc
	probe   *serverProbe
	obs     *notifyObserver
	spawn   chan spawnReq
	end     chan struct{}
	cleanup []func()
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// startFleet creates the schema, the probe and the observer, and starts n
// workers, each told by spec(i) what to run; it returns when all are
// ready (their held leases acquired). close stops everything, also after
// an error.
func startFleet(ctx context.Context, cfg config, n int, ownKeys int) (*fleetRun, error) {
	f := &fleetRun{}
	pool, schema, cleanup, err := benchSchema(ctx, cfg.url, 3)
	if err != nil {
		return nil, err
	}
	f.cleanup = append(f.cleanup, cleanup)
	id := time.Now().UnixNano()
	app := fmt.Sprintf("pglease-fleet-%x", id)
	channel := fmt.Sprintf("pglease_fleet_%x", id)
	if f.probe, err = newServerProbe(ctx, pool, app, schema); err != nil {
		f.close()
		return nil, err
	}
	if f.obs, err = startObserver(ctx, cfg.url, channel); err != nil {
		f.close()
		return nil, err
	}
	f.cleanup = append(f.cleanup, f.obs.close)
	f.startSpawner()
	for i := range n {
		spec := fleetSpec{URL: cfg.url, Schema: schema, Channel: channel, App: app, Worker: i, Held: fleetHeld, TTL: fleetTTL,
			OwnRate: fleetOwnRate, OwnKeys: ownKeys, Shared: fleetShared, SharedKeys: fleetSharedKeys, Hold: cfg.fleet.hold, Fair: cfg.fleet.fair}
		if i == 0 {
			spec.CPUProfile = cfg.fleet.profile
		}
		p, err := f.startWorker(spec)
		if err != nil {
			f.close()
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
		f.workers = append(f.workers, p)
	}
	// Ready: each worker opened its Manager and holds its leases.
	for _, p := range f.workers {
		r, err := p.recv(ctx, 60*time.Second+time.Duration(n)*200*time.Millisecond)
		if err == nil && !r.Ready {
			err = fmt.Errorf("worker %d: not ready", p.id)
		}
		if err != nil {
			f.close()
			return nil, err
		}
	}
	return f, nil
}

// startSpawner starts the goroutine that starts every worker, locked to
// its OS thread for the fleet's life: a worker's parent-death signal
// (Pdeathsig) fires when the thread that forked it ends, and Go ends a
// thread whose goroutine exits locked (as pgtest's server goroutine does),
// so the workers are forked from a thread that lives exactly as long as
// the fleet. When close ends it, any worker still alive is killed.
func (f *fleetRun) startSpawner() {
	spawn, end := make(chan spawnReq), make(chan struct{})
	f.spawn, f.end = spawn, end
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the fleet
		for {
			select {
			case r := <-spawn:
				r.done <- r.cmd.Start()
			case <-end:
				return
			}
		}
	}()
}

// fleetProc is one worker process.
type fleetProc struct {
	id     int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	msgs   chan fleetReport // closed at the end of its stdout
	waited bool
}

func (f *fleetRun) startWorker(spec fleetSpec) (*fleetProc, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fleetWorkerEnv+"=1")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = fleetSysProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	f.spawn <- spawnReq{cmd, done}
	if err := <-done; err != nil {
		return nil, err
	}
	p := &fleetProc{id: spec.Worker, cmd: cmd, stdin: stdin, msgs: make(chan fleetReport, 4)}
	go func() {
		defer close(p.msgs)
		dec := json.NewDecoder(stdout)
		for {
			var r fleetReport
			if err := dec.Decode(&r); err != nil {
				return
			}
			p.msgs <- r
		}
	}()
	raw, _ := json.Marshal(spec)
	if _, err := stdin.Write(append(raw, '\n')); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

func (p *fleetProc) send(cmd string) error {
	_, err := io.WriteString(p.stdin, cmd+"\n")
	return err
}

func (p *fleetProc) recv(ctx context.Context, d time.Duration) (fleetReport, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r, ok := <-p.msgs:
		if !ok {
			return r, fmt.Errorf("worker %d exited", p.id)
		}
		if r.Err != "" {
			return r, fmt.Errorf("worker %d: %s", p.id, r.Err)
		}
		return r, nil
	case <-t.C:
		return fleetReport{}, fmt.Errorf("worker %d: no answer within %v", p.id, d)
	case <-ctx.Done():
		return fleetReport{}, ctx.Err()
	}
}

// finish closes the worker's stdin (which ends it if it is still
// running) and waits for it, killing it after grace.
func (p *fleetProc) finish(grace time.Duration) {
	if p.waited {
		return
	}
	p.waited = true
	_ = p.stdin.Close()
	done := make(chan struct{})
	go func() {
		// Drain the reports so that the reader goroutine ends before Wait
		// closes the pipe.
		for range p.msgs {
		}
		_ = p.cmd.Wait()
		close(done)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func (p *fleetProc) kill() {
	if p.cmd.Process != nil && !p.waited {
		_ = p.cmd.Process.Kill()
	}
	p.finish(10 * time.Second)
}

// collect sends cmd to every worker, then reads one report from each.
func (f *fleetRun) collect(ctx context.Context, cmd string, d time.Duration) ([]fleetReport, error) {
	for _, p := range f.workers {
		if err := p.send(cmd); err != nil {
			return nil, fmt.Errorf("worker %d: %w", p.id, err)
		}
	}
	reps := make([]fleetReport, len(f.workers))
	for i, p := range f.workers {
		r, err := p.recv(ctx, d)
		if err != nil {
			return nil, err
		}
		reps[i] = r
	}
	return reps, nil
}

func (f *fleetRun) broadcast(cmd string) error {
	for _, p := range f.workers {
		if err := p.send(cmd); err != nil {
			return fmt.Errorf("worker %d: %w", p.id, err)
		}
	}
	return nil
}

// stop asks every worker to stop (close its Manager) and returns their
// final reports; the workers are then waited for.
func (f *fleetRun) stop(ctx context.Context) ([]fleetReport, error) {
	reps, err := f.collect(ctx, "stop", 60*time.Second)
	for _, p := range f.workers {
		p.finish(10 * time.Second)
	}
	return reps, err
}

// close kills what is left of the fleet and drops its schema. Idempotent.
func (f *fleetRun) close() {
	var wg sync.WaitGroup
	for _, p := range f.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.kill()
		}()
	}
	wg.Wait()
	f.workers = nil
	if f.end != nil {
		close(f.end)
		f.end = nil
	}
	for i := len(f.cleanup) - 1; i >= 0; i-- {
		f.cleanup[i]()
	}
	f.cleanup = nil
}

// sleepCtx sleeps d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fleetDelta is what the workers did between two reports.
type fleetDelta struct {
	grants, own, shared, held, releases, lost, skipped int64
	stmts                                              fleetStmts
	errors                                             map[string]int64
	lostBy                                             map[string]int64 // fleetReport.LostBy
	sharedMs                                           []float64
	rssKB                                              int64   // of the later reports; -1 unknown
	cpuMs                                              float64 // the workers' CPU time; -1 unknown
	notified                                           int64   // notifications delivered to the workers' listeners; -1 unknown
}

func fleetDiff(before, after []fleetReport) fleetDelta {
	d := fleetDelta{errors: map[string]int64{}, lostBy: map[string]int64{}}
	for i, a := range after {
		var b fleetReport
		if i < len(before) {
			b = before[i]
		}
		d.grants += a.Grants - b.Grants
		d.own += a.OwnGrants - b.OwnGrants
		d.shared += a.SharedGrants - b.SharedGrants
		d.held += a.HeldGrants - b.HeldGrants
		d.releases += a.Releases - b.Releases
		d.lost += a.Lost - b.Lost
		d.skipped += a.OwnSkipped - b.OwnSkipped
		d.stmts = d.stmts.plus(a.Stmts.minus(b.Stmts))
		for k, v := range a.Errors {
			if v -= b.Errors[k]; v != 0 {
				d.errors[k] += v
			}
		}
		for k, v := range a.LostBy {
			if v -= b.LostBy[k]; v != 0 {
				d.lostBy[k] += v
			}
		}
		d.sharedMs = append(d.sharedMs, a.SharedMs...)
		if a.RSSKB < 0 || d.rssKB < 0 {
			d.rssKB = -1
		} else {
			d.rssKB += a.RSSKB
		}
		if a.CPUMs < 0 || b.CPUMs < 0 || d.cpuMs < 0 {
			d.cpuMs = -1
		} else {
			d.cpuMs += a.CPUMs - b.CPUMs
		}
		if a.Notified < 0 || b.Notified < 0 || d.notified < 0 {
			d.notified = -1
		} else {
			d.notified += a.Notified - b.Notified
		}
	}
	return d
}

func runFleetStep(ctx context.Context, cfg config, n int) (res Result, err error) {
	fc := cfg.fleet
	f, err := startFleet(ctx, cfg, n, fleetOwnKeys)
	if err != nil {
		return res, err
	}
	defer f.close()
	if err := f.broadcast("go"); err != nil {
		return res, err
	}
	if err := sleepCtx(ctx, fc.warmup); err != nil {
		return res, err
	}
	collectWait := 30*time.Second + time.Duration(n)*100*time.Millisecond
	s0, err := f.probe.snap(ctx)
	if err != nil {
		return res, err
	}
	o0, _ := f.obs.count()
	r0, err := f.collect(ctx, "report", collectWait)
	if err != nil {
		return res, err
	}
	// Sample the gauges every second during the window.
	var maxAdv, maxConns int64
	var sampleErr error
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			c, err := f.probe.counts(sctx, false)
			if err != nil {
				if sctx.Err() == nil {
					sampleErr = err
				}
				return
			}
			maxAdv, maxConns = max(maxAdv, c.advisory), max(maxConns, c.conns)
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	err = sleepCtx(ctx, fc.duration)
	stopSampling()
	<-sampled
	if err != nil {
		return res, err
	}
	if sampleErr != nil {
		return res, sampleErr
	}
	s1, err := f.probe.snap(ctx)
	if err != nil {
		return res, err
	}
	o1, obsErr := f.obs.count()
	r1, err := f.collect(ctx, "report", collectWait)
	if err != nil {
		return res, err
	}
	end, err := f.probe.counts(ctx, false)
	if err != nil {
		return res, err
	}
	idle := serverCounts{conns: -1}
	var idleD fleetDelta
	var idleSecs float64
	if fc.idle > 0 {
		// The idle fleet: the held leases stay (auto-extended), nothing
		// else runs; the pools close the connections idle too long.
		// Its CPU is measured from the end of the load to the end of
		// the idle time.
		i0, err := f.collect(ctx, "idle", collectWait)
		if err != nil {
			return res, err
		}
		t0 := time.Now()
		if err := sleepCtx(ctx, fc.idle); err != nil {
			return res, err
		}
		if idle, err = f.probe.counts(ctx, false); err != nil {
			return res, err
		}
		i1, err := f.collect(ctx, "report", collectWait)
		if err != nil {
			return res, err
		}
		idleD, idleSecs = fleetDiff(i0, i1), time.Since(t0).Seconds()
	}
	finals, err := f.stop(ctx)
	if err != nil {
		return res, err
	}
	d := fleetDiff(r0, r1)
	all := fleetDiff(nil, finals)
	lost := all.lost
	for _, k := range slices.Sorted(maps.Keys(all.lostBy)) {
		fmt.Fprintf(os.Stderr, "fleet N=%d lost %d: %s\n", n, all.lostBy[k], k)
	}
	var notifies int64 = -1
	if obsErr == nil {
		notifies = o1 - o0
	}
	r := summarizeFleetStep(n, s0, s1, d, lost, notifies, end, maxAdv, maxConns)
	// A worker's Close that left a release's outcome unknown (its lease
	// expires by itself): counted with the step's errors, after the
	// window.
	for k, v := range all.errors {
		if strings.HasPrefix(k, "close:") {
			fmt.Fprintf(os.Stderr, "fleet N=%d %s: %d workers\n", n, k, v)
			r.Extra["err_"+k] = float64(v)
			r.Errors += v
		}
	}
	if idle.conns >= 0 {
		r.Extra["idle_conns"] = float64(idle.conns)
		r.Extra["idle_listen_conns"] = float64(idle.listen)
		r.Extra["idle_conns_per_proc"] = float64(idle.conns) / float64(n)
		r.Extra["idle_s"] = fc.idle.Seconds()
		if idleD.cpuMs >= 0 && idleSecs > 0 {
			r.Extra["idle_client_cpu_ms_per_s"] = idleD.cpuMs / idleSecs
			r.Extra["idle_client_cpu_us_per_lease_s"] = idleD.cpuMs * 1000 / (float64(n*fleetHeld) * idleSecs)
		}
		if idleD.notified >= 0 && idleSecs > 0 {
			r.Extra["idle_notified_per_s"] = float64(idleD.notified) / idleSecs
		}
	}
	if fc.fair {
		r.Impl = "manager-fair"
	}
	return r, nil
}

// summarizeFleetStep makes the step's Result. lost is over the whole run
// (warm-up and stop included); everything else over the window s0..s1.
// notifies < 0: unknown.
func summarizeFleetStep(n int, s0, s1 serverSnap, d fleetDelta, lost, notifies int64, end serverCounts, maxAdv, maxConns int64) Result {
	secs := s1.at.Sub(s0.at).Seconds()
	r := Result{Scenario: "fleet", Impl: "manager", Callers: n, Processes: n, Seconds: secs, Cycles: d.grants,
		CyclesPerSec: float64(d.grants) / secs}
	sort.Float64s(d.sharedMs)
	if k := len(d.sharedMs); k > 0 {
		r.Latency = "wait"
		r.P50Ms, r.P99Ms, r.MaxMs = d.sharedMs[int(0.5*float64(k-1))], d.sharedMs[int(0.99*float64(k-1))], d.sharedMs[k-1]
	}
	x := map[string]float64{
		"conns":               float64(end.conns),
		"listen_conns":        float64(end.listen),
		"conns_max":           float64(max(maxConns, end.conns)),
		"server_conns":        float64(end.clients),
		"xact_per_s":          float64(s1.xacts-s0.xacts) / secs,
		"wal_kB_per_s":        float64(s1.walBytes-s0.walBytes) / 1024 / secs,
		"own_per_s":           float64(d.own) / secs,
		"shared_per_s":        float64(d.shared) / secs,
		"releases_per_s":      float64(d.releases) / secs,
		"adv_locks_max":       float64(max(maxAdv, end.advisory)),
		"adv_locks_end":       float64(end.advisory),
		"lost":                float64(lost),
		"own_skipped":         float64(d.skipped),
		"client_stmts_per_s":  float64(d.stmts.All) / secs,
		"acquire_stmts_per_s": float64(d.stmts.Acquire) / secs,
		"handoffs_per_s":      float64(d.stmts.HandOff) / secs,
		// Each pool statement is a transaction of its own; the rest are
		// the listening connections' (waiter locks, probes) and the
		// bench's own sampling (about one per second).
		"nonpool_xact_per_s": max(0, float64(s1.xacts-s0.xacts-d.stmts.All)) / secs,
	}
	if d.grants > 0 {
		x["client_stmts_per_grant"] = float64(d.stmts.All) / float64(d.grants)
		// Every key of an acquire statement is one attempt, granted or
		// found locked; a local handoff grants without one.
		x["attempts_per_grant"] = float64(d.stmts.AcqItems) / float64(d.grants)
		x["xact_per_grant"] = float64(s1.xacts-s0.xacts) / float64(d.grants)
		// The listening backends' own transactions per grant (and the
		// probes'): PostgreSQL (15 here) wakes every session LISTENing in
		// the database on every NOTIFY, whatever its channel, and each
		// reads the queue in a transaction of its own.
		x["nonpool_xact_per_grant"] = max(0, float64(s1.xacts-s0.xacts-d.stmts.All)) / float64(d.grants)
	}
	if s0.cpuTicks >= 0 && s1.cpuTicks >= 0 {
		cpuMs := float64(s1.cpuTicks-s0.cpuTicks) * 1000 / userHZ
		x["server_cpu_cores"] = cpuMs / 1000 / secs
		if d.grants > 0 {
			x["cpu_ms_per_1k_grants"] = cpuMs / float64(d.grants) * 1000
		}
	}
	if notifies >= 0 {
		x["notifies_per_s"] = float64(notifies) / secs
		if d.releases > 0 {
			x["notify_per_release"] = float64(notifies) / float64(d.releases)
			// Deliveries: what the workers' listeners received, when they
			// counted it; else every listener's share of every NOTIFY.
			x["deliveries_per_release"] = float64(notifies) * float64(end.listen) / float64(d.releases)
			if d.notified >= 0 {
				x["deliveries_per_release"] = float64(d.notified) / float64(d.releases)
			}
		}
	}
	if d.rssKB >= 0 {
		x["rss_MB"] = float64(d.rssKB) / 1024
	}
	// The workers' own CPU (getrusage): per second, per grant, and per
	// held lease-second (all of it over the leases held for the whole
	// run: the load's cost included; the idle phase gives the leases'
	// own).
	if d.cpuMs >= 0 {
		x["client_cpu_ms_per_s"] = d.cpuMs / secs
		x["client_cpu_us_per_lease_s"] = d.cpuMs * 1000 / (float64(n*fleetHeld) * secs)
		if d.grants > 0 {
			x["client_cpu_ms_per_grant"] = d.cpuMs / float64(d.grants)
		}
	}
	// Notifications the server delivered to the workers' listening
	// connections, counted on the wire by each worker (notifyCounter).
	if d.notified >= 0 {
		x["notified_per_s"] = float64(d.notified) / secs
		if d.grants > 0 {
			x["notified_per_grant"] = float64(d.notified) / float64(d.grants)
		}
	}
	for k, v := range d.errors {
		x["err_"+k] = float64(v)
		r.Errors += v
	}
	r.Extra = x
	return r
}

// fleetColumns are the fleet table's columns, in order; fleetCells gives
// a row's cells (text and Markdown alike).
var fleetColumns = []string{"N", "conns", "listen", "srv CPU ms/1k grants", "grants/s", "attempts/grant", "xact/s", "non-pool xact/s", "WAL kB/s",
	"notify/release", "deliveries/release", "notified/grant", "client CPU ms/s", "client CPU ms/grant", "client CPU µs/lease·s",
	"idle client CPU µs/lease·s", "adv locks max/end", "shared p50/p99 ms", "lost", "client RSS MB", "idle conns/proc", "errors"}

func fleetCells(r Result) []string {
	x := r.Extra
	opt := func(k, format string) string {
		if v, ok := x[k]; ok {
			return fmt.Sprintf(format, v)
		}
		return "n/a"
	}
	lat := "–"
	if r.Latency != "" {
		lat = fmt.Sprintf("%.1f / %.1f", r.P50Ms, r.P99Ms)
	}
	n := fmt.Sprint(r.Processes)
	if r.Impl == "manager-fair" {
		n += " fair"
	}
	return []string{
		n,
		fmt.Sprintf("%.0f", x["conns"]),
		fmt.Sprintf("%.0f", x["listen_conns"]),
		opt("cpu_ms_per_1k_grants", "%.0f"),
		fmt.Sprintf("%.0f", r.CyclesPerSec),
		opt("attempts_per_grant", "%.2f"),
		fmt.Sprintf("%.0f", x["xact_per_s"]),
		fmt.Sprintf("%.0f", x["nonpool_xact_per_s"]),
		fmt.Sprintf("%.0f", x["wal_kB_per_s"]),
		opt("notify_per_release", "%.3f"),
		opt("deliveries_per_release", "%.2f"),
		opt("notified_per_grant", "%.2f"),
		opt("client_cpu_ms_per_s", "%.0f"),
		opt("client_cpu_ms_per_grant", "%.2f"),
		opt("client_cpu_us_per_lease_s", "%.1f"),
		opt("idle_client_cpu_us_per_lease_s", "%.2f"),
		fmt.Sprintf("%.0f / %.0f", x["adv_locks_max"], x["adv_locks_end"]),
		lat,
		fmt.Sprintf("%.0f", x["lost"]),
		opt("rss_MB", "%.0f"),
		opt("idle_conns_per_proc", "%.2f"),
		fleetErrors(x),
	}
}

// fleetErrors lists a result's errors by operation and code ("0": none).
func fleetErrors(x map[string]float64) string {
	var parts []string
	for _, k := range sortedKeys(x) {
		if name, ok := strings.CutPrefix(k, "err_"); ok {
			parts = append(parts, fmt.Sprintf("%s=%.0f", name, x[k]))
		}
	}
	if len(parts) == 0 {
		return "0"
	}
	return strings.Join(parts, " ")
}

func printFleetTable(w io.Writer, rows []Result) {
	cells := [][]string{fleetColumns}
	for _, r := range rows {
		cells = append(cells, fleetCells(r))
	}
	widths := make([]int, len(fleetColumns))
	for _, row := range cells {
		for i, c := range row {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	for _, row := range cells {
		var b strings.Builder
		for i, c := range row {
			if i == len(row)-1 {
				b.WriteString(c)
				break
			}
			fmt.Fprintf(&b, "%*s  ", widths[i]+len(c)-len([]rune(c)), c)
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// ---- Churn mode ----

// churnSeries are the gauges the churn mode samples, with the slack within
// which a rise is not called growth (absolute, per worker for RSS).
var churnSeries = []struct {
	name  string
	slack func(n int) float64
}{
	{"adv_locks", func(int) float64 { return 2 * fleetSharedKeys }},
	{"pg_locks", func(n int) float64 { return float64(20 + 2*n) }},
	{"lock_rows", func(n int) float64 { return float64(20 + 2*n) }},
	{"fence_rows", func(n int) float64 { return float64(20 + 2*n) }},
	{"conns", func(int) float64 { return 2 }},
	{"listen_conns", func(int) float64 { return 1 }},
	{"rss_MB", func(n int) float64 { return float64(n) }},
}

type fleetChurnResult struct{ result Result }

// growthVerdict judges one series sampled at equal intervals.
type growthVerdict struct {
	first, last, max     float64
	slopePerSample       float64 // least squares over the second half
	known, rising, grows bool
}

// judgeGrowth calls a series rising when the mean of its last third
// exceeds the mean of its first third by more than slack and it still
// rises over its second half (least-squares slope > 0), and growing when
// the rise is also more than 10 %. A series that rose once and then stayed
// flat (pools filling, a cache warming) is neither. A slow leak shows as
// rising before it shows as growing: read the rise per minute. Fewer than
// 6 samples: no verdict.
func judgeGrowth(xs []float64, slack float64) growthVerdict {
	v := growthVerdict{}
	if len(xs) == 0 {
		return v
	}
	v.first, v.last, v.max = xs[0], xs[len(xs)-1], xs[0]
	for _, x := range xs {
		v.max = max(v.max, x)
	}
	if len(xs) < 6 {
		return v
	}
	v.known = true
	third := len(xs) / 3
	a, b := mean(xs[:third]), mean(xs[len(xs)-third:])
	v.slopePerSample = slope(xs[len(xs)/2:])
	v.rising = b > a+slack && v.slopePerSample > 0
	v.grows = v.rising && b > a*1.10+slack
	return v
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// slope is the least-squares slope of xs against their index.
func slope(xs []float64) float64 {
	n := float64(len(xs))
	if n < 2 {
		return 0
	}
	mx, my := (n-1)/2, mean(xs)
	var num, den float64
	for i, y := range xs {
		dx := float64(i) - mx
		num += dx * (y - my)
		den += dx * dx
	}
	return num / den
}

func runFleetChurn(ctx context.Context, cfg config, n int, note noteFunc) (fleetChurnResult, error) {
	fc := cfg.fleet
	f, err := startFleet(ctx, cfg, n, 0)
	if err != nil {
		return fleetChurnResult{}, err
	}
	defer f.close()
	if err := f.broadcast("go"); err != nil {
		return fleetChurnResult{}, err
	}
	if err := sleepCtx(ctx, fc.warmup); err != nil {
		return fleetChurnResult{}, err
	}
	collectWait := 30*time.Second + time.Duration(n)*100*time.Millisecond
	series := map[string][]float64{}
	var first []fleetReport
	var last []fleetReport
	start := time.Now()
	for i := 0; ; i++ {
		c, err := f.probe.counts(ctx, true)
		if err != nil {
			return fleetChurnResult{}, err
		}
		reps, err := f.collect(ctx, "report", collectWait)
		if err != nil {
			return fleetChurnResult{}, err
		}
		if first == nil {
			first = reps
		}
		last = reps
		d := fleetDiff(first, reps)
		rss := math.NaN()
		if d.rssKB >= 0 {
			rss = float64(d.rssKB) / 1024
		}
		vals := map[string]float64{"adv_locks": float64(c.advisory), "pg_locks": float64(c.locks), "lock_rows": float64(c.lockRows),
			"fence_rows": float64(c.fenceRows), "conns": float64(c.conns), "listen_conns": float64(c.listen), "rss_MB": rss}
		for k, v := range vals {
			series[k] = append(series[k], v)
		}
		note("fleet churn N=%d t=%5.1fs adv_locks=%d pg_locks=%d lock_rows=%d fence_rows=%d conns=%d listen=%d rss_MB=%.0f grants=%d lost=%d errors=%d",
			n, time.Since(start).Seconds(), c.advisory, c.locks, c.lockRows, c.fenceRows, c.conns, c.listen, rss, d.grants,
			fleetDiff(nil, reps).lost, sumErrors(d.errors))
		next := start.Add(time.Duration(i+1) * fc.sample)
		if next.After(start.Add(fc.churn)) {
			break
		}
		if err := sleepCtx(ctx, time.Until(next)); err != nil {
			return fleetChurnResult{}, err
		}
	}
	secs := time.Since(start).Seconds()
	finals, err := f.stop(ctx)
	if err != nil {
		return fleetChurnResult{}, err
	}
	d := fleetDiff(first, last)
	r := Result{Scenario: "fleet-churn", Impl: "manager", Callers: n, Processes: n, Seconds: secs, Cycles: d.grants,
		CyclesPerSec: float64(d.grants) / secs, Errors: sumErrors(d.errors)}
	r.Extra = map[string]float64{"samples": float64(len(series["conns"])), "sample_s": fc.sample.Seconds(),
		"lost": float64(fleetDiff(nil, finals).lost)}
	for _, s := range churnSeries {
		xs := series[s.name]
		if s.name == "rss_MB" && len(xs) > 0 && math.IsNaN(xs[0]) {
			continue
		}
		v := judgeGrowth(xs, s.slack(n))
		r.Extra[s.name+"_first"], r.Extra[s.name+"_last"], r.Extra[s.name+"_max"] = v.first, v.last, v.max
		if v.known {
			r.Extra[s.name+"_per_min"] = v.slopePerSample * 60 / fc.sample.Seconds()
			r.Extra[s.name+"_grows"] = float64(boolInt(v.grows))
			r.Extra[s.name+"_rising"] = float64(boolInt(v.rising))
		}
	}
	for k, v := range d.errors {
		r.Extra["err_"+k] = float64(v)
	}
	return fleetChurnResult{result: r}, nil
}

func sumErrors(m map[string]int64) int64 {
	var s int64
	for _, v := range m {
		s += v
	}
	return s
}

// churnRows are a churn result's verdict rows: series, first, last, max,
// rise per minute over the second half, verdict.
func churnRows(r Result) [][]string {
	var rows [][]string
	for _, s := range churnSeries {
		x := r.Extra
		if _, ok := x[s.name+"_first"]; !ok {
			continue
		}
		verdict, rate := "too few samples", "–"
		if g, ok := x[s.name+"_grows"]; ok {
			rate = fmt.Sprintf("%+.1f", x[s.name+"_per_min"])
			verdict = "bounded"
			if x[s.name+"_rising"] == 1 {
				verdict = "rising"
			}
			if g == 1 {
				verdict = "GROWS"
				if s.name == "fence_rows" {
					verdict += " (expected: one fence counter per key ever used, kept for S1)"
				}
			}
		}
		rows = append(rows, []string{s.name, fmt.Sprintf("%.0f", x[s.name+"_first"]), fmt.Sprintf("%.0f", x[s.name+"_last"]),
			fmt.Sprintf("%.0f", x[s.name+"_max"]), rate, verdict})
	}
	return rows
}

var churnColumns = []string{"series", "first", "last", "max", "per min (2nd half)", "verdict"}

func printChurnTable(w io.Writer, r Result) {
	fmt.Fprintf(w, "\n# fleet churn N=%d: %.0f s, %.0f samples, %.0f grants/s, %d errors, %.0f lost\n", r.Processes, r.Seconds,
		r.Extra["samples"], r.CyclesPerSec, r.Errors, r.Extra["lost"])
	fmt.Fprintf(w, "%-13s %10s %10s %10s %18s  %s\n", churnColumns[0], churnColumns[1], churnColumns[2], churnColumns[3], churnColumns[4], churnColumns[5])
	for _, row := range churnRows(r) {
		fmt.Fprintf(w, "%-13s %10s %10s %10s %18s  %s\n", row[0], row[1], row[2], row[3], row[4], row[5])
	}
}
