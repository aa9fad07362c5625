// Package driver runs a soak: a throwaway PostgreSQL server of its own
// (it crashes and restarts it), one fault proxy per worker, W worker
// processes (package worker, started from the soak binary) and a fault
// schedule drawn from a seed. It logs every fault to the driver's event
// log and, at the end, dumps the server-side audit tables next to the
// workers' logs for package check.
package driver

import (
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
	"github.com/pglease/pglease/soak/event"
)

// Meta is what the checks need to know about a run (meta.json).
type Meta struct {
	Options
	MixString   string    `json:"mix"`
	Started     time.Time `json:"started"`
	Elapsed     time.Duration
	FaultsEnd   int64 // CLOCK_MONOTONIC when faults stopped
	StopAt      int64 // CLOCK_MONOTONIC when the workers were told to close
	StatementTO time.Duration
	RetryCap    time.Duration
	ProbeBound  time.Duration // advisory ProbeInterval + ProbeTimeout
	AdvServerTO time.Duration // an advisory session's idle_session_timeout (a blackholed session's locks are freed then)
	Race        bool          // the workers were built with -race
	Cmdline     string
	Machine     string // Go, OS/arch, CPUs, PostgreSQL version
	// NotRun names the fault types of the mix this machine could not run,
	// and why (no libfaketime, no PgBouncer, no mount).
	NotRun map[string]string `json:",omitempty"`
	// Pooled is how many workers went through PgBouncer (Options.Pooled).
	Pooled int
}

type proc struct {
	id, inc int
	cmd     *exec.Cmd
	exited  chan struct{}
	killed  atomic.Bool // by a fault or the end: not a crash
}

type driver struct {
	o           Options
	log         *event.Writer
	cluster     *pgtest.Cluster
	dbURL       string
	admin       *pgxpool.Pool
	revoker     *manager.Manager // revoke faults: its own Manager (application_name RevokerApp)
	revokerPool *pgxpool.Pool
	proxies     []*faultproxy.Proxy // per worker, to the server (a pooled worker's LISTEN and advisory session)
	poolProxies []*faultproxy.Proxy // per pooled worker, to PgBouncer (its pool); nil for the others
	bouncer     *pgtest.Bouncer
	bouncerLog  *os.File
	clockFile   string // libfaketime's offset file ("" : no clock-step faults)
	diskDir     string // the tmpfs under the server's directory ("": no disk-full faults)

	mu       sync.Mutex
	procs    []*proc // current process per worker id
	busy     []bool  // a fault is on the worker
	srvBusy  bool
	stopping bool
	burners  []*exec.Cmd

	spawnCh  chan spawnReq // to the spawner thread (see startSpawner)
	spawnEnd chan struct{} // closed at the end of the run: the spawner stops

	faultID  atomic.Int64
	faults   atomic.Int64
	faultWG  sync.WaitGroup
	brokenMd string
	brokenW  map[int]bool
}

func (d *driver) logf(format string, args ...any) {
	if d.o.Log != nil {
		d.o.Log(format, args...)
	}
}

func (d *driver) ev(e event.Event) { d.log.Log(e) }

// Run runs a soak and leaves its logs and dumps in o.Dir.
func Run(ctx context.Context, o Options) (*Meta, error) {
	o.defaults()
	if o.Bin == "" {
		return nil, errors.New("soak: Options.Bin (the soak binary) is required")
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	lg, err := event.Create(filepath.Join(o.Dir, "driver.jsonl"))
	if err != nil {
		return nil, err
	}
	defer lg.Close()
	d := &driver{o: o, log: lg}
	d.brokenMd, d.brokenW = o.BrokenMode()
	d.startSpawner()
	defer close(d.spawnEnd)
	meta := &Meta{Options: o, MixString: FormatMix(o.Mix), Started: time.Now(),
		StatementTO: 5 * time.Second, RetryCap: 2 * time.Second, ProbeBound: 2 * time.Second,
		AdvServerTO: 25 * time.Second, Cmdline: o.Command}
	if meta.Cmdline == "" {
		meta.Cmdline = strings.Join(os.Args, " ")
	}
	meta.Machine = fmt.Sprintf("%s %s/%s, %d CPUs", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	if bi, err := buildinfo.ReadFile(o.Bin); err == nil {
		for _, st := range bi.Settings {
			if st.Key == "-race" && st.Value == "true" {
				meta.Race = true
			}
		}
	}

	srvLog, err := os.Create(filepath.Join(o.Dir, "postgres.log"))
	if err != nil {
		return nil, err
	}
	defer srvLog.Close()
	// The mix is the driver's own copy: facilities this machine lacks
	// drop their faults from it.
	mix := map[string]int{}
	for k, v := range o.Mix {
		mix[k] = v
	}
	d.o.Mix = mix
	env := d.setupClock(meta)
	if d.clockFile != "" {
		defer os.RemoveAll(filepath.Dir(d.clockFile))
	}
	parent := d.setupDisk(meta)
	defer d.unmountDisk()
	d.cluster, err = pgtest.Start(ctx, pgtest.Options{Log: srvLog, MaxConnections: 400,
		Settings: map[string]string{"log_min_messages": "warning"}, Env: env, ParentDir: parent})
	if err != nil {
		return nil, err
	}
	defer d.cluster.Stop()
	if err := d.setupDB(ctx); err != nil {
		return nil, err
	}
	d.checkClock(ctx, meta)
	if err := d.setupPooler(ctx, meta); err != nil {
		return nil, err
	}
	defer func() {
		d.bouncer.Stop()
		if d.bouncerLog != nil {
			d.bouncerLog.Close()
		}
	}()
	o = d.o
	meta.Options = o
	meta.MixString = FormatMix(o.Mix)
	var ver string
	if err := d.admin.QueryRow(ctx, "SHOW server_version").Scan(&ver); err == nil {
		meta.Machine += ", PostgreSQL " + strings.Fields(ver)[0]
	}
	defer d.admin.Close()
	if err := d.startRevoker(ctx); err != nil {
		return nil, err
	}
	defer func() {
		_ = d.revoker.Close(context.Background())
		d.revokerPool.Close()
	}()
	d.ev(event.Event{E: event.Offset, W: -1, V: event.RealtimeOffset()})
	d.ev(event.Event{E: event.ServerUp, W: -1})

	target := fmt.Sprintf("127.0.0.1:%d", d.cluster.Port)
	d.procs = make([]*proc, o.Workers)
	d.busy = make([]bool, o.Workers)
	d.poolProxies = make([]*faultproxy.Proxy, o.Workers)
	defer func() {
		for _, p := range append(d.proxies, d.poolProxies...) {
			if p != nil {
				_ = p.Close()
			}
		}
	}()
	for w := range o.Workers {
		p, err := faultproxy.New(target)
		if err != nil {
			return nil, err
		}
		d.proxies = append(d.proxies, p)
		if d.bouncer != nil && d.pooled(w) {
			if d.poolProxies[w], err = faultproxy.New(fmt.Sprintf("127.0.0.1:%d", d.bouncer.Port)); err != nil {
				return nil, err
			}
		}
	}
	for i := range o.Workers {
		if err := d.spawn(i, 0); err != nil {
			return nil, err
		}
	}
	defer d.killAll()

	// Offsets, once a second, so the checks can tell the clocks stayed in step.
	offCtx, offStop := context.WithCancel(ctx)
	defer offStop()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-offCtx.Done():
				return
			case <-t.C:
				d.ev(event.Event{E: event.Offset, W: -1, V: event.RealtimeOffset()})
			}
		}
	}()

	start := time.Now()
	d.schedule(ctx, start)
	d.faultWG.Wait() // every fault healed
	d.stopBurners()
	meta.FaultsEnd = event.Now()
	d.ev(event.Event{E: event.RunEnd, W: -1, V: d.faults.Load()})
	d.logf("faults stopped after %s (%d faults); quiet tail %s", time.Since(start).Round(time.Second), d.faults.Load(), o.Tail)
	sleepCtx(ctx, o.Tail)

	meta.StopAt = event.Now()
	d.ev(event.Event{E: event.StopAll, W: -1})
	d.stopAll()
	meta.Elapsed = time.Since(start)
	offStop()
	d.ev(event.Event{E: event.Offset, W: -1, V: event.RealtimeOffset()})
	if err := d.dump(ctx); err != nil {
		return meta, fmt.Errorf("dump: %w", err)
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return meta, err
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "meta.json"), b, 0o644); err != nil {
		return meta, err
	}
	return meta, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (d *driver) setupDB(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, d.cluster.URL)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE soak"); err != nil {
		conn.Close(ctx)
		return err
	}
	conn.Close(ctx)
	d.dbURL = pgtest.WithDatabase(d.cluster.URL, "soak")
	cfg, err := pgxpool.ParseConfig(d.dbURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["application_name"] = "soak-driver"
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	d.admin, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	mg, err := migrate.New(d.admin, pg.Config{})
	if err != nil {
		return err
	}
	if err := mg.Up(ctx); err != nil {
		return err
	}
	if _, err := d.admin.Exec(ctx, setupSQL); err != nil {
		return err
	}
	if sql := brokenSQL[d.brokenMd]; sql != "" {
		if _, err := d.admin.Exec(ctx, sql); err != nil {
			return err
		}
	}
	_, err = d.admin.Exec(ctx, "INSERT INTO soak_res (key) SELECT generate_series(0, $1 - 1)", d.o.Keys)
	return err
}

// RevokerApp is the application_name of the driver's revoking Manager:
// the lock table's audit tells its revokes (deletes) by it.
const RevokerApp = "soak-revoker"

// startRevoker starts the Manager revoke faults use, on a pool of its own
// straight to the server (not through a worker's proxy).
func (d *driver) startRevoker(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(d.dbURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["application_name"] = RevokerApp
	if err := pg.ConfigurePool(cfg); err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	d.revoker, err = manager.New(pool, manager.Config{Config: pg.Config{Holder: RevokerApp}})
	if err != nil {
		pool.Close()
		return err
	}
	d.revokerPool = pool
	return nil
}

// revoke revokes one key worker w holds (exclusively: leases, writers,
// a set's locks), drawn with param, trying again for up to a second when
// it holds none at the moment; after that, a key another worker holds
// (the event names the worker revoked), so that a run with short holds
// still revokes. A pick released before the revoke came (nothing
// revoked) or a revoke that failed is tried again, for up to 10 s. It
// logs each outcome.
func (d *driver) revoke(ctx context.Context, w int, id int64, param float64) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for try := 0; try < 60 && ctx.Err() == nil; try++ {
		holder := fmt.Sprintf("soak-w%d", w)
		if try >= 20 {
			holder = "" // any worker's
		}
		type held struct {
			key string
			w   int
		}
		var keys []held
		rows, err := d.admin.Query(ctx, `SELECT l.user_key, h.holder FROM syncguard_locks l
			JOIN syncguard_locks_holders h ON h.key = l.key AND h.lock_id = l.lock_id
			WHERE ($1 = '' OR h.holder = $1) AND h.holder ~ '^soak-w[0-9]+$'
			  AND l.expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)
			ORDER BY l.user_key`, holder)
		if err == nil {
			for rows.Next() {
				var k, h string
				if rows.Scan(&k, &h) == nil {
					if n, err := strconv.Atoi(strings.TrimPrefix(h, "soak-w")); err == nil {
						keys = append(keys, held{k, n})
					}
				}
			}
			rows.Close()
		}
		if len(keys) == 0 {
			sleepCtx(ctx, 50*time.Millisecond)
			continue
		}
		pick := keys[int(param*float64(len(keys)))%len(keys)]
		n, _, err := d.revoker.Revoke(ctx, pick.key)
		if n == 0 && err == nil {
			// The holder released it between the query and the
			// revoke (short holds): nothing was revoked, pick again.
			continue
		}
		e := event.Event{E: event.Revoke, W: pick.w, O: id, M: pick.key}
		if n > 0 {
			e.V = 1
		}
		if err != nil {
			// Logged (it may have been applied), then tried again: a
			// fault revokes a live lease when it can.
			e.C = pglease.CodeOf(err).String()
			d.ev(e)
			sleepCtx(ctx, 50*time.Millisecond)
			continue
		}
		d.ev(e)
		return
	}
	d.ev(event.Event{E: event.Revoke, W: w, O: id, C: "no-held-key"})
}

func (d *driver) workerArgs(id, inc int) []string {
	o := d.o
	purl, _ := d.proxies[id].ConnString(d.dbURL)
	var surl string
	if pp := d.poolProxies[id]; pp != nil {
		// The pool through PgBouncer (transaction mode: no statement
		// cache, as docs/poolers.md says); LISTEN and the advisory
		// session straight to the server, through the other proxy.
		surl = withParam(purl, "application_name", fmt.Sprintf("soak-w%d", id))
		purl, _ = pp.ConnString(d.dbURL)
		purl = withParam(purl, "default_query_exec_mode", "exec")
	}
	args := []string{"worker",
		"-id", strconv.Itoa(id), "-inc", strconv.Itoa(inc),
		"-url", purl, "-res-url", d.dbURL, "-session-url", surl,
		"-log", filepath.Join(o.Dir, fmt.Sprintf("w%d.%d.jsonl", id, inc)),
		"-keys", strconv.Itoa(o.Keys), "-adv-keys", strconv.Itoa(o.AdvKeys),
		"-lease-g", strconv.Itoa(o.LeaseG), "-adv-g", strconv.Itoa(o.AdvG),
		"-ttl", o.TTL.String(), "-margin", o.Margin.String(),
		"-acquire-timeout", o.AcquireTimeout.String(), "-max-hold", o.MaxHold.String(),
		"-long-hold", strconv.FormatFloat(o.LongHold, 'g', -1, 64),
		"-close-timeout", o.CloseTimeout.String(),
		"-seed", strconv.FormatUint(o.Seed, 10),
		"-prim-g", strconv.Itoa(o.PrimG), "-sem-keys", strconv.Itoa(o.SemKeys), "-sem-limit", strconv.Itoa(o.SemLimit),
		"-rw-keys", strconv.Itoa(o.RWKeys), "-rw-writers", strconv.FormatFloat(o.RWWriters, 'g', -1, 64),
		"-set-keys", strconv.Itoa(o.SetKeys), "-prim-hold", o.PrimHold.String(), "-prim-pause", o.PrimPause.String(),
	}
	if o.Fair {
		args = append(args, "-fair")
	}
	if d.brokenW[id] && !driverBroken(d.brokenMd) {
		args = append(args, "-broken", d.brokenMd)
	}
	return args
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// startSpawner starts the one goroutine that starts every child process,
// locked to its OS thread until the run ends. A child's parent-death
// signal (Pdeathsig) fires when the *thread* that forked it exits, and Go
// ends threads: pgtest starts postgres from a goroutine locked to its
// thread, which exits when the server stops (crash and restart faults);
// a worker forked earlier on that thread was SIGKILLed with it (seen:
// workers "died by itself: signal: killed" right after server faults).
func (d *driver) startSpawner() {
	d.spawnCh, d.spawnEnd = make(chan spawnReq), make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the run
		for {
			select {
			case r := <-d.spawnCh:
				r.done <- r.cmd.Start()
			case <-d.spawnEnd:
				return
			}
		}
	}()
}

// start starts cmd from the spawner thread.
func (d *driver) start(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	select {
	case d.spawnCh <- spawnReq{cmd, done}:
		return <-done
	case <-d.spawnEnd:
		return errors.New("soak: the run is over")
	}
}

// spawn starts incarnation inc of worker id.
func (d *driver) spawn(id, inc int) error {
	cmd := exec.Command(d.o.Bin, d.workerArgs(id, inc)...)
	out, err := os.Create(filepath.Join(d.o.Dir, fmt.Sprintf("w%d.%d.stderr", id, inc)))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.start(cmd); err != nil {
		out.Close()
		return err
	}
	p := &proc{id: id, inc: inc, cmd: cmd, exited: make(chan struct{})}
	d.mu.Lock()
	d.procs[id] = p
	d.mu.Unlock()
	d.ev(event.Event{E: event.Spawn, W: id, I: inc, V: int64(cmd.Process.Pid)})
	go func() {
		err := cmd.Wait()
		out.Close()
		status := "0"
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			status = ee.String()
		}
		reason := "exit"
		if p.killed.Load() {
			reason = "killed"
		}
		d.ev(event.Event{E: event.Died, W: id, I: inc, C: status, M: reason})
		close(p.exited)
		d.mu.Lock()
		restart := !d.stopping && !p.killed.Load() && d.procs[id] == p
		d.mu.Unlock()
		if restart { // crashed by itself (a panic): keep the run going
			d.logf("worker %d.%d exited by itself (%s); restarting", id, inc, status)
			_ = d.spawn(id, inc+1)
		}
	}()
	return nil
}

// stopAll resumes every worker (a stopped process cannot handle
// SIGTERM), asks each to close (SIGTERM) and waits for them.
func (d *driver) stopAll() {
	d.mu.Lock()
	d.stopping = true
	procs := append([]*proc(nil), d.procs...)
	d.mu.Unlock()
	for _, p := range procs {
		p.killed.Store(true)
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(2*d.o.CloseTimeout + 60*time.Second)
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-deadline:
			d.logf("worker %d.%d did not exit; killing it", p.id, p.inc)
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
}

func (d *driver) killAll() {
	d.mu.Lock()
	d.stopping = true
	procs := append([]*proc(nil), d.procs...)
	d.mu.Unlock()
	for _, p := range procs {
		if p == nil {
			continue
		}
		select {
		case <-p.exited:
		default:
			p.killed.Store(true)
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	d.stopBurners()
}

// pidOf returns the current process of worker id.
func (d *driver) procOf(id int) *proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.procs[id]
}

// holders returns the workers that hold a lease on the server now.
func (d *driver) holders(ctx context.Context) []int {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rows, err := d.admin.Query(ctx, `SELECT h.holder FROM syncguard_locks l
		JOIN syncguard_locks_holders h ON h.key = l.key AND h.lock_id = l.lock_id
		WHERE l.expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)`)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var ws []int
	for rows.Next() {
		var h string
		if rows.Scan(&h) == nil {
			if n, err := strconv.Atoi(strings.TrimPrefix(h, "soak-w")); err == nil && n < d.o.Workers {
				ws = append(ws, n)
			}
		}
	}
	return ws
}

// schedule starts faults at jittered intervals until the run's targets or
// its Duration are reached.
func (d *driver) schedule(ctx context.Context, start time.Time) {
	o := d.o
	r := rand.New(rand.NewPCG(o.Seed, 0x50a4))
	var names []string
	var weights []int
	total := 0
	for _, t := range FaultTypes {
		if w := o.Mix[t]; w > 0 {
			names = append(names, t)
			weights = append(weights, w)
			total += w
		}
	}
	lastProgress := time.Now()
	var cycles int64
	lastCount := time.Time{}
	var brokenTick time.Time
	rr := 0
	for ctx.Err() == nil {
		el := time.Since(start)
		if time.Since(lastCount) > 2*time.Second {
			if n, ok := d.cycles(ctx); ok {
				cycles = n
			}
			lastCount = time.Now()
		}
		done := o.Cycles > 0 || o.Faults > 0
		if o.Cycles > 0 && cycles < o.Cycles {
			done = false
		}
		if o.Faults > 0 && d.faults.Load() < int64(o.Faults) {
			done = false
		}
		if done || el >= o.Duration {
			return
		}
		if time.Since(lastProgress) >= 10*time.Second {
			d.logf("%s: %d lease cycles, %d faults", el.Round(time.Second), cycles, d.faults.Load())
			lastProgress = time.Now()
		}
		if d.brokenMd == BrokenFenceRollback || d.brokenMd == BrokenClockJump {
			if time.Since(brokenTick) > 2*time.Second {
				brokenTick = time.Now()
				d.brokenTamper(ctx)
			}
		}
		// Exponential inter-arrival times (mean FaultEvery), capped.
		wait := time.Duration(r.ExpFloat64() * float64(o.FaultEvery))
		wait = min(wait, 4*o.FaultEvery)
		if o.Regular {
			wait = o.FaultEvery
		}
		// Everything drawn from r is drawn whether or not the fault can
		// start, so the schedule of a seed does not depend on timing.
		pick := r.IntN(max(total, 1))
		ft := ""
		for i, w := range weights {
			if pick < w {
				ft = names[i]
				break
			}
			pick -= w
		}
		targetDraw := r.IntN(1 << 20)
		durDraw := r.Float64()
		paramDraw := r.Float64()
		if o.RoundRobin && len(names) > 0 {
			ft = names[rr%len(names)]
		}
		if !sleepCtx(ctx, wait) {
			return
		}
		if ft != "" && d.startFault(ctx, ft, targetDraw, durDraw, paramDraw) {
			rr++
		}
	}
}

// cycles counts the lease grants so far (the lease keys' fence counters'
// sum; the other primitives' keys do not count).
func (d *driver) cycles(ctx context.Context) (int64, bool) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var n int64
	err := d.admin.QueryRow(ctx, `SELECT coalesce(sum(fence), 0)::bigint FROM syncguard_fence_counters
		WHERE key_debug ~ '^soak:[0-9]+$'`).Scan(&n)
	return n, err == nil
}

// brokenTamper is the driver's deliberate damage for the negative
// controls of the fence and loss checks.
func (d *driver) brokenTamper(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	switch d.brokenMd {
	case BrokenFenceRollback: // an asynchronous failover losing acknowledged grants (a fence rollback)
		_, _ = d.admin.Exec(ctx, "UPDATE syncguard_fence_counters SET fence = greatest(fence - 3, 0)")
	case BrokenClockJump: // the server clock stepping forward (a server clock step)
		_, _ = d.admin.Exec(ctx, "UPDATE syncguard_locks SET expires_at_ms = expires_at_ms - $1", (d.o.TTL + 1500*time.Millisecond).Milliseconds())
	}
}

// pickWorker chooses a free worker: a holder when preferHolder and one is
// free, else the first free one from draw on. ok is false when all are busy.
func (d *driver) pickWorker(ctx context.Context, draw int, preferHolder bool) (int, bool) {
	var hs []int
	if preferHolder {
		hs = d.holders(ctx)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return 0, false
	}
	n := d.o.Workers
	allowed := func(w int) bool { return len(d.o.Targets) == 0 || slices.Contains(d.o.Targets, w) }
	for i := range hs {
		w := hs[(draw+i)%len(hs)]
		if !d.busy[w] && allowed(w) {
			d.busy[w] = true
			return w, true
		}
	}
	for i := range n {
		w := (draw + i) % n
		if !d.busy[w] && allowed(w) {
			d.busy[w] = true
			return w, true
		}
	}
	return 0, false
}

func (d *driver) free(w int) {
	d.mu.Lock()
	d.busy[w] = false
	d.mu.Unlock()
}

// startFault starts one fault of type ft in the background (it heals
// itself) and reports whether it did: it does nothing when no target is
// free.
func (d *driver) startFault(ctx context.Context, ft string, draw int, durDraw, param float64) bool {
	ttl := d.o.TTL
	between := func(lo, hi float64) time.Duration { // lo..hi × TTL
		return time.Duration((lo + (hi-lo)*durDraw) * float64(ttl))
	}
	switch ft {
	case FCrash, FRestart:
		d.mu.Lock()
		if d.srvBusy || d.stopping {
			d.mu.Unlock()
			return false
		}
		d.srvBusy = true
		d.mu.Unlock()
		id := d.faultID.Add(1)
		down := time.Duration(durDraw * float64(time.Second)) // 0–1 s down
		d.faultWG.Add(1)
		d.faults.Add(1)
		go func() {
			defer d.faultWG.Done()
			defer func() { d.mu.Lock(); d.srvBusy = false; d.mu.Unlock() }()
			d.ev(event.Event{E: event.Fault, W: -1, O: id, M: ft, V: int64(down)})
			d.ev(event.Event{E: event.ServerDown, W: -1, O: id})
			_ = d.cluster.StopServer(ft == FCrash)
			sleepCtx(ctx, down)
			for {
				err := d.cluster.StartServer(context.Background())
				if err == nil {
					break
				}
				d.logf("server start failed (%v); retrying", err)
				time.Sleep(time.Second)
			}
			d.ev(event.Event{E: event.ServerUp, W: -1, O: id})
			d.ev(event.Event{E: event.Heal, W: -1, O: id, M: ft})
		}()
		return true
	}
	if ServerFault(ft) {
		d.mu.Lock()
		if d.srvBusy || d.stopping {
			d.mu.Unlock()
			return false
		}
		d.srvBusy = true
		d.mu.Unlock()
		id := d.faultID.Add(1)
		dur := faultDuration(ft, between)
		d.faultWG.Add(1)
		d.faults.Add(1)
		go func() {
			defer d.faultWG.Done()
			defer func() { d.mu.Lock(); d.srvBusy = false; d.mu.Unlock() }()
			d.ev(event.Event{E: event.Fault, W: -1, O: id, M: ft, V: int64(dur)})
			d.serverFault(ctx, ft, id, dur, param)
			d.ev(event.Event{E: event.Heal, W: -1, O: id, M: ft})
		}()
		return true
	}
	preferHolder := ft == FKill || ft == FStop || ft == FStarve || ft == FRevoke
	w, ok := d.pickWorker(ctx, draw, preferHolder)
	if !ok {
		return false
	}
	id := d.faultID.Add(1)
	var dur time.Duration
	switch ft {
	case FHalfOpen:
		dur = between(0.5, 1.5)
	case FBlackhole:
		dur = between(1.2, 2.5) // longer than the TTL
	case FCut:
		dur = between(0.1, 1)
	case FDelay:
		dur = between(1, 3)
	case FStop:
		dur = between(1.5, 3)
	case FKill:
		dur = between(0, 1) // until the new process starts
	case FStarve:
		dur = between(1.5, 3)
	}
	d.faultWG.Add(1)
	d.faults.Add(1)
	go func() {
		defer d.faultWG.Done()
		defer d.free(w)
		d.ev(event.Event{E: event.Fault, W: w, O: id, M: ft, V: int64(dur)})
		d.runFault(ctx, ft, w, id, dur, param)
		d.ev(event.Event{E: event.Heal, W: w, O: id, M: ft})
	}()
	return true
}

func (d *driver) runFault(ctx context.Context, ft string, w int, id int64, dur time.Duration, param float64) {
	px := proxies{d.proxies[w], d.poolProxies[w]}
	switch ft {
	case FTerminatePool, FTerminateListen, FTerminateAdv:
		n := d.terminate(ctx, w, ft)
		d.ev(event.Event{E: "terminated", W: w, O: id, V: int64(n), M: ft})
	case FHalfOpen:
		_ = px.HalfOpen()
		sleepCtx(ctx, dur)
		_ = px.Pass()
	case FBlackhole:
		_ = px.Blackhole()
		sleepCtx(ctx, dur)
		_ = px.Pass()
	case FCut:
		_ = px.Cut()
		sleepCtx(ctx, dur)
		_ = px.Pass()
	case FDelay:
		// latency per direction 5–40 % of the TTL: a round trip takes up
		// to 0.8 TTL (a round trip slower than the lease).
		lat := time.Duration((0.05 + 0.35*param) * float64(d.o.TTL))
		_ = px.SetDelay(lat, lat/4)
		sleepCtx(ctx, dur)
		_ = px.Pass()
	case FStop:
		p := d.procOf(w)
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
		sleepCtx(ctx, dur)
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
	case FKill:
		p := d.procOf(w)
		p.killed.Store(true)
		_ = p.cmd.Process.Kill()
		<-p.exited
		sleepCtx(ctx, dur)
		d.mu.Lock()
		stopping := d.stopping
		d.mu.Unlock()
		if !stopping {
			if err := d.spawn(w, p.inc+1); err != nil {
				d.logf("restart of worker %d failed: %v", w, err)
			}
		}
	case FStarve:
		d.starve(ctx, w, dur, param)
	case FRevoke:
		d.revoke(ctx, w, id, param)
	}
}

// lockTables holds ACCESS EXCLUSIVE locks on the lock tables for dur, as
// an operator's VACUUM FULL (or ALTER TABLE, CLUSTER) does while it waits
// behind a long reader: every statement on them queues behind it. It
// logs why when it could not take them (the server is down, say).
func (d *driver) lockTables(ctx context.Context, dur time.Duration) {
	lctx, cancel := context.WithTimeout(ctx, dur+10*time.Second)
	defer cancel()
	tx, err := d.admin.Begin(lctx)
	if err != nil {
		d.logf("table-lock: %v", err)
		return
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(lctx, "LOCK TABLE syncguard_locks, syncguard_locks_shared IN ACCESS EXCLUSIVE MODE"); err != nil {
		d.logf("table-lock: %v", err)
		return
	}
	sleepCtx(ctx, dur)
}

// readOnly turns the server read-only under every open session for dur,
// as a primary demoted without closing its connections does (some cloud
// databases flip roles that way): default_transaction_read_only set by
// ALTER SYSTEM and a configuration reload, then reset the same way. The
// driver's own session keeps writing (a session-level SET outranks the
// file). It logs why when it could not (the server is down, say); the
// reset is retried until it is made, so the server never stays read-only.
func (d *driver) readOnly(ctx context.Context, dur time.Duration) {
	if err := d.setSystem(ctx, "ALTER SYSTEM SET default_transaction_read_only = on"); err != nil {
		d.logf("read-only: %v", err)
	}
	sleepCtx(ctx, dur)
	d.resetSystem("read-only", "ALTER SYSTEM RESET default_transaction_read_only")
}

// proxies are a worker's fault proxies (the second, to PgBouncer, only
// for a pooled worker): a network fault of the worker hits both.
type proxies [2]*faultproxy.Proxy

func (ps proxies) each(f func(*faultproxy.Proxy) error) error {
	for _, p := range ps {
		if p != nil {
			_ = f(p)
		}
	}
	return nil
}

func (ps proxies) HalfOpen() error  { return ps.each((*faultproxy.Proxy).HalfOpen) }
func (ps proxies) Blackhole() error { return ps.each((*faultproxy.Proxy).Blackhole) }
func (ps proxies) Cut() error       { return ps.each((*faultproxy.Proxy).Cut) }
func (ps proxies) Pass() error      { return ps.each((*faultproxy.Proxy).Pass) }
func (ps proxies) SetDelay(lat, jitter time.Duration) error {
	return ps.each(func(p *faultproxy.Proxy) error { return p.SetDelay(lat, jitter) })
}

// terminate ends the worker's backends of one kind with
// pg_terminate_backend and returns how many.
func (d *driver) terminate(ctx context.Context, w int, ft string) int {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The advisory session's statements name pg_*advisory* functions; its
	// probe is SELECT pg_backend_pid(). (pg_locks would also show pooled
	// backends inside an acquire, which takes a transaction advisory lock.)
	// See adv below.
	// The listener's last statement is its LISTEN, the probe of its
	// connection (SELECT 1) once it probes, or the taking or dropping of
	// waiter and watch locks (store.WaiterLockClass 1886156663,
	// store.WatchLockClass 1886156660, with their wake channels' LISTENs):
	// those name advisory functions too, so the advisory session's
	// condition excludes them.
	const listen = `(a.query ILIKE 'LISTEN %' OR a.query = 'SELECT 1' OR a.query LIKE '%(1886156663,%' OR a.query LIKE '%(1886156660,%')`
	const adv = `((a.query ILIKE '%advisory%' OR a.query = 'SELECT pg_backend_pid()') AND NOT ` + listen + `)`
	var cond string
	switch ft {
	case FTerminateListen:
		cond = listen
	case FTerminateAdv:
		cond = adv
	default:
		cond = "NOT " + listen + " AND NOT " + adv
	}
	var n int
	err := d.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid))
		FROM pg_stat_activity a WHERE a.application_name = $1 AND a.pid <> pg_backend_pid() AND `+cond,
		fmt.Sprintf("soak-w%d", w)).Scan(&n)
	if err != nil {
		return -1
	}
	return n
}

// starve pins the worker and CPU burners to one CPU for dur.
func (d *driver) starve(ctx context.Context, w int, dur time.Duration, param float64) {
	cpus := runtime.NumCPU()
	cpu := int(param*float64(cpus)) % cpus
	p := d.procOf(w)
	if err := pinProcess(p.cmd.Process.Pid, []int{cpu}); err != nil {
		d.logf("starve: pin worker %d: %v", w, err)
	}
	var bs []*exec.Cmd
	for range 3 {
		b := exec.Command(d.o.Bin, "burn", "-cpu", strconv.Itoa(cpu))
		b.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := d.start(b); err == nil {
			bs = append(bs, b)
		}
	}
	d.mu.Lock()
	d.burners = append(d.burners, bs...)
	d.mu.Unlock()
	sleepCtx(ctx, dur)
	for _, b := range bs {
		_ = b.Process.Kill()
		_ = b.Wait()
	}
	d.mu.Lock()
	kept := d.burners[:0]
	for _, b := range d.burners {
		alive := true
		for _, x := range bs {
			if x == b {
				alive = false
			}
		}
		if alive {
			kept = append(kept, b)
		}
	}
	d.burners = kept
	d.mu.Unlock()
	all := make([]int, cpus)
	for i := range all {
		all[i] = i
	}
	_ = pinProcess(p.cmd.Process.Pid, all)
}

func (d *driver) stopBurners() {
	d.mu.Lock()
	bs := d.burners
	d.burners = nil
	d.mu.Unlock()
	for _, b := range bs {
		_ = b.Process.Kill()
		_ = b.Wait()
	}
}
