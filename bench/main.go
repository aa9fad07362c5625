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
//   - "actor-floor": the least a manager of the Manager's shape does
//     (actor.go): requests over a channel to one goroutine, batches of
//     the same statements on worker goroutines, answers on reply
//     channels, and nothing else. What it misses, the shape misses here.
//   - "manager-nonotify" (only with -impls): the same with
//     Config.DisableNotify, to show what the release notifications cost.
//   - "manager-inflight2", "manager-inflight4" (only with -impls): the
//     same with Config.MaxInFlight 2 or 4 (default 1), for A/B runs of the
//     in-flight caps.
//
// A pgx QueryTracer counts the statements each cycle sends
// (stmts_per_cycle) and the items per acquire statement (acq_batch).
// With -rounds N every point runs N times, the implementations
// interleaved, and the median run is reported (min_per_s, max_per_s).
//
// peers: the libraries users would otherwise pick, cirello.io/pglock and
// github.com/bsm/redislock, measured by the module bench/peers (a module
// of its own, so pglease's go.mod gains no dependency; see its doc) on the
// same PostgreSQL with the same -callers, -hot-callers and -duration; the
// bench builds and runs it and prints its rows with pglease's. redislock
// runs against a throwaway redis-server without persistence, only when
// redis-server is installed (the output says so when it is not).
//
// Every caller cycles through 64 keys of its own, so keys never collide
// between callers and the fence table stays small.
//
// flush: the flush bound of the server, measured right before and after
// the hot-key points (see measureFlush): one client commits a one-row
// UPDATE with synchronous_commit=on, one round trip per commit. A hot-key
// critical section needs at least one durable commit (its grant) in
// series, so the hot-key rates are judged as shares of this rate. After it,
// the handoff chain (measureHandOffChain): one client handing one key to
// itself with the store's HandOff, the statement of a local hot-key section,
// without the Manager: what the statement alone reaches. Then the grant
// floor (measureGrantFloor) and the actor relay (measureActorRelay): the
// handoff chain's statement with each grant handed to another of
// -hot-callers' first count goroutines through the actor floor.
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
// fifo_inversions counts pairs of one process's callers where the one that
// called Acquire more than 5 ms earlier was granted later (0 with a FIFO
// queue; see fifoInversions); max_share is the busiest caller's share of
// the sections; stmts_per_section counts every statement the processes
// sent (grants, releases, contended attempts) per critical section.
//
// heartbeat: one Manager holds N locks (-heartbeat-n, default 1,000,
// 10,000 and 100,000) with TTL 3 s (extends due every second; from
// 100,000 locks the default TTL, 30 s, see heartbeatTTL) for
// -heartbeat-duration rounded to whole extend periods, at least two. A pgx QueryTracer on the pool counts the extend
// statements and their items; statements per tick = extend statements per
// TTL/3 period. Transactions/s is the xact_commit delta of
// pg_stat_database (PostgreSQL flushes backend statistics at most once a
// second, so short windows are approximate). Go heap per held lock is
// HeapAlloc after runtime.GC with the locks held minus the same before
// acquiring them, divided by N. The Manager does not expose extend lag, so
// it is measured by the tracer: for every lock, the time its extend was
// sent minus (its previous extend's send time + TTL/3); negative = sent
// early (the heartbeat batches extends due within TTL/12). Its latency
// columns are that extend lag ("lag").
//
// advisory: C callers (-advisory-callers) with distinct keys: "session"
// runs Session.TryLock + Lock.Release on one advisory.Session per caller;
// "xact" runs advisory.WithXactLock with an empty function on a pool of
// min(C, 64) + 2 connections. stmts_per_cycle counts their round trips.
//
// The Manager's other primitives and the database-native features
// (primitives.go, hotshared.go), each at every C of -prim-callers (1, 8,
// 64) with distinct keys per caller, on the uncontended points' pools and
// -rounds; stmts_per_step counts every statement of the pool per step (a
// cycle, a set, a transaction):
//
//   - shared: "exclusive" (m.Acquire + Release), "reader" (Shared) and
//     "semaphore" (WithLimit(4)) acquire+release cycles, in the same run;
//     target P1: reader and semaphore ≥ 80 % of exclusive at every C.
//   - hotshared: -hot-shared-callers (32) callers of one process on one
//     key, empty sections: "semaphore" (WithLimit(-hot-limit), 4) and
//     "rwlock" (each acquire a writer with probability -hot-writers, 10 %,
//     else a reader), against the flush bound measured right before and
//     after ("flush-bound"); every Acquire waits at most 5 s.
//   - sets: "single" (one key per cycle), "set2" and "set8" (AcquireAll of
//     2 or 8 keys, then the concurrent Release of each lock); cycles/s are
//     keys/s, steps_per_s sets/s.
//   - txlease: "tx-lease" (BEGIN; pg.New(tx).Acquire; UPDATE of the
//     caller's row; Release; COMMIT), "plain-lease" (the same three
//     operations in autocommit, pg.Store on the pool) and "write-only"
//     (the UPDATE alone).
//   - guard: each caller holds its row key's lease (a Manager lease) and
//     runs BEGIN; lk.Guard(tx); UPDATE of its row; COMMIT on a table with
//     the database guard (migrate.Migrator.Guard) ("guarded"), the same
//     on a table without it ("guard-call-only"), or BEGIN; UPDATE; COMMIT
//     on a table without it ("unguarded").
//
// Their targets (P1–P5) are printed with the others: P1 judged, P2's
// correctness line judged (no violation, timeout or error), the rest
// reported (P4: a caller's mean time per write, C / writes per second;
// P5: round trips per operation, set, write and hot section).
//
// fleet: N worker processes (-fleet-n, default 1,10,50,100; 200
// with the flag) on one PostgreSQL, as real deployments grow:
// by processes, each with its own Manager. The bench re-executes itself
// as the workers (fleet_worker.go; the parent-death signal kills them if
// the bench dies, and Ctrl-C stops them). Each worker: manager.Open with
// the defaults (a notify channel of the run's own, and its listening
// connection named apart, see fleetManager), 100 leases held for the whole
// run (TTL 10 s, auto-extended), 20 own-key acquire+release cycles/s
// (64 keys of its own), and 2 goroutines that acquire one of 8 keys shared
// by the whole fleet, hold it -fleet-hold (5 ms) and release it. Each
// step loads for -fleet-warmup (10 s), then measures -fleet-duration
// (20 s; docs/scaling.md's tables used 60 s), then idles -fleet-idle (45 s). Every Acquire waits at most 5 s (WithAcquireTimeout), so that a
// wait too long is counted as an AcquisitionTimeout. Per N (a table at the end, and in -markdown):
//
//   - conns, listen: the fleet's server connections at the window's end
//     (pg_stat_activity by application_name: pools and listening
//     connections carry different names), and how many of them LISTEN.
//   - srv CPU ms/1k grants: user+system CPU of the postmaster and all its
//     children (/proc/<pid>/stat; exited children's time is in the
//     postmaster's cutime/cstime), window delta, per 1,000 successful
//     Acquires of all kinds; "n/a" when the server is not on this machine.
//     server_cpu_cores in the JSON is the same CPU per second of wall time.
//   - grants/s: successful Acquires (own, shared, held re-acquired) per
//     second, counted by the workers.
//   - attempts/grant: keys sent in acquire statements (each one attempt,
//     granted or found locked) per grant, counted by a pgx tracer on each
//     worker's pool; the JSON adds statements per grant and handoffs/s.
//   - xact/s: pg_stat_database xact_commit + xact_rollback delta (backends
//     flush their statistics about once a second: approximate). non-pool
//     xact/s is that less the pools' statements (each its own
//     transaction): the listening connections' waiter-lock statements and
//     probes, and the bench's own sampling (about 1/s).
//   - WAL kB/s: pg_current_wal_lsn delta.
//   - notify/release: notifications sent per successful Release, counted
//     by an observer session LISTENing on the fleet's channel and its 256
//     wake channels (it sees each NOTIFY once); deliveries/release is what
//     the workers' listeners received per release (notified, below), or,
//     where they cannot count, that times the fleet's listening
//     connections.
//   - notified/grant: notifications the server delivered to the workers'
//     listening connections per grant, counted by each worker on the wire
//     (the NotificationResponse messages its connections read; unknown on
//     TLS): every channel, the queue channel of -fleet-fair included.
//   - client CPU ms/s, ms/grant, µs/lease·s: the workers' own user+system
//     CPU (getrusage, read by each worker at the window's start and end,
//     summed), per second of the window, per grant, and per held
//     lease-second (the 100 leases each worker holds, the load's cost
//     included); idle client CPU µs/lease·s (with -fleet-idle) is the same
//     over the idle time, when the held leases are all that runs.
//   - adv locks max/end: pg_locks advisory rows of the database, sampled
//     every second (max) and at the window's end.
//   - shared p50/p99 ms: the workers' own timing of Acquire on the shared
//     keys (the Result's latency, "wait").
//   - lost: lock contexts that ended with pglease.ErrLockLost (held leases,
//     and Release answering ErrLockLost), over the whole run.
//   - client RSS MB: the sum of the workers' VmRSS at the window's end.
//   - errors: failed Acquires and Releases in the window, by operation and
//     pglease code (acquire:AcquisitionTimeout …).
//   - idle conns/proc (with -fleet-idle D): after the window the workers
//     stop their load but keep their held leases (auto-extended); D later
//     the fleet's connections per worker (pool and listening connection).
//
// -fleet-fair runs the workers' Managers with manager.Config.FairQueue (the
// rows read "N fair"); -fleet-cpuprofile DIR has worker 0 write a CPU
// profile per phase there (go tool pprof DIR/w0-2-report.pprof: the
// measured window).
//
// Before starting, the bench checks that the server accepts N × (min(pool
// size, 5) + 1) more connections (fleetConnsPerWorker) and otherwise says
// how to raise max_connections (withpg -max-connections).
//
// With -fleet-churn D (e.g. 10m) the fleet runs the churn mode instead:
// the own-key cycles use a new key every time, and every -fleet-sample
// (10 s) the bench samples advisory locks, pg_locks rows, lock and fence
// table rows, connections and the workers' RSS, then judges each series
// bounded, rising or growing (judgeGrowth). Fence counter rows grow by design (one
// per key ever used, never deleted, so a fence never repeats).
//
// Targets: at the end the bench prints the performance targets as target /
// measured / met or MISSED, judged on this run's results (computeTargets),
// with the same targets judged on the baseline (-baseline, default
// bench/baseline.json: the -json lines of an earlier run) next to them;
// target 5 compares the advisory figures with the baseline's.
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
	"slices"
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
	Scenario     string  `json:"scenario"`
	Impl         string  `json:"impl"`
	Callers      int     `json:"callers"`
	Processes    int     `json:"processes,omitempty"`
	Seconds      float64 `json:"seconds"`
	Cycles       int64   `json:"cycles"`
	CyclesPerSec float64 `json:"cycles_per_sec"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	// Latency names what P50Ms/P99Ms/MaxMs measure: "cycle" (one
	// acquire+release), "step" (one set-based step), "handoff" (release to
	// the next holder's grant), "wait" (an Acquire's wait), "lag" (extend
	// lag), "commit" (one durable commit); "" = no latency (not printed).
	Latency string             `json:"latency,omitempty"`
	Errors  int64              `json:"errors"`
	Extra   map[string]float64 `json:"extra,omitempty"`
}

type config struct {
	url        string
	duration   time.Duration
	callers    []int
	hotCallers []int
	hotProcs   []int
	hotFair    bool // hotkey: also each point with manager.Config.FairQueue (impl manager-fair)
	hbN        []int
	hbDuration time.Duration
	hbTTL      time.Duration // 0: heartbeatTTL(n)
	advCallers []int
	// The primitives' scenarios (primitives.go, hotshared.go).
	primCallers      []int
	hotSharedCallers []int
	hotLimit         int     // hotshared: the semaphore's n
	hotWriters       float64 // hotshared: the share of writers among the rwlock's acquires
	scenarios        map[string]bool
	json             bool
	plot             string
	docs             bool
	cpuprofile       string
	memprofile       string
	impls            map[string]bool // uncontended implementations to run; nil = all
	rounds           int             // uncontended: interleaved rounds per point (median reported)
	peersDir         string          // the peers module (pglock, redislock)
	baseline         string          // earlier results (JSON lines) for target 5; "" = none
	markdown         string          // write the run's tables for docs/performance.md here; "" = no
	fleet            fleetConfig
	mixed            mixedConfig
	fair             fairConfig
	out              io.Writer // the run's output (set by run)
}

func main() {
	if runWorkerMode() {
		return
	}
	var cfg config
	var callers, hotCallers, hotProcs, hbN, advCallers, fleetN, scen, primCallers, hotSharedCallers, mixedShape string
	var fairCallers, fairKindsFlag, fairImplsFlag string
	var hb100k bool
	var impls string
	flag.DurationVar(&cfg.duration, "duration", 3*time.Second, "measuring time per point")
	flag.StringVar(&callers, "callers", "1,8,64,256", "uncontended: concurrent callers (comma separated)")
	flag.StringVar(&hotCallers, "hot-callers", "8,64", "hotkey: total callers over all processes")
	flag.StringVar(&hotProcs, "hot-procs", "1,2", "hotkey: processes")
	flag.BoolVar(&cfg.hotFair, "hot-fair", false, "hotkey: also run each point with the workers' Managers queueing their waiters (manager.Config.FairQueue; impl manager-fair)")
	flag.StringVar(&hbN, "heartbeat-n", "1000,10000,100000", "heartbeat: locks held")
	flag.BoolVar(&hb100k, "heartbeat-100k", false, "heartbeat: also hold 100,000 locks (already in the default -heartbeat-n)")
	flag.DurationVar(&cfg.hbDuration, "heartbeat-duration", 6*time.Second, "heartbeat: holding time per point")
	flag.DurationVar(&cfg.hbTTL, "heartbeat-ttl", 0, "heartbeat: lease TTL of the held locks (default 3 s, 30 s from 100,000 locks; longer keeps a slow machine from losing locks while it acquires them)")
	flag.StringVar(&advCallers, "advisory-callers", "1,8,64", "advisory: callers (distinct keys)")
	flag.StringVar(&primCallers, "prim-callers", "1,8,64", "shared, sets, txlease, guard: concurrent callers (distinct keys)")
	flag.StringVar(&hotSharedCallers, "hot-shared-callers", "32", "hotshared: callers on the one key (one process)")
	flag.IntVar(&cfg.hotLimit, "hot-limit", 4, "hotshared: the hot semaphore's n (WithLimit)")
	flag.Float64Var(&cfg.hotWriters, "hot-writers", 0.10, "hotshared: share of writers among the hot reader-writer key's acquires")
	flag.StringVar(&fleetN, "fleet-n", "1,10,50,100", "fleet: worker processes (comma separated), one step each (200 does not start on a 2-core machine)")
	flag.DurationVar(&cfg.fleet.duration, "fleet-duration", 20*time.Second, "fleet: measured window per step")
	flag.DurationVar(&cfg.fleet.warmup, "fleet-warmup", 10*time.Second, "fleet: load before each step's window (and before the churn mode's first sample)")
	flag.DurationVar(&cfg.fleet.hold, "fleet-hold", 5*time.Millisecond, "fleet: how long a shared key is held")
	flag.DurationVar(&cfg.fleet.churn, "fleet-churn", 0, "fleet: run the churn mode for this long per N instead of the steps (e.g. 10m): unique own keys, gauges sampled every -fleet-sample")
	flag.DurationVar(&cfg.fleet.sample, "fleet-sample", 10*time.Second, "fleet: churn mode's sampling interval")
	flag.BoolVar(&cfg.fleet.fair, "fleet-fair", false, "fleet: the workers' Managers queue their waiters (manager.Config.FairQueue)")
	flag.StringVar(&cfg.fleet.profile, "fleet-cpuprofile", "", "fleet: worker 0 writes a CPU profile per phase into this directory (w0-<n>-<command>.pprof: the measured window ends at the second report, the idle time at the report after idle)")
	flag.DurationVar(&cfg.fleet.idle, "fleet-idle", 45*time.Second, "fleet: after each step's window, stop the load (held leases stay) and count the fleet's connections after this long (past the pool's 30 s idle time; 0: skip)")
	flag.DurationVar(&cfg.mixed.duration, "mixed-duration", 60*time.Second, "mixed: length of each phase (SyncGuard alone, Managers alone, both)")
	flag.StringVar(&mixedShape, "mixed-shape", "3,3,2,3,3", "mixed: SyncGuard processes, lock() loops each, Manager processes, goroutines each, hot keys")
	flag.StringVar(&cfg.mixed.nodeDir, "mixed-node-dir", "bench/peers/syncguard", "mixed: folder of the SyncGuard Node worker (worker.mjs)")
	flag.StringVar(&fairCallers, "fair-callers", "1,2,3,4", "fairness: callers of each process (one process per number)")
	flag.IntVar(&cfg.fair.setCallers, "fair-set-callers", 1, "fairness: callers of the set process (set kind)")
	flag.DurationVar(&cfg.fair.duration, "fair-duration", 10*time.Second, "fairness: measured window per kind")
	flag.DurationVar(&cfg.fair.hold, "fair-hold", 2*time.Millisecond, "fairness: how long each grant is held")
	flag.IntVar(&cfg.fair.limit, "fair-limit", 2, "fairness: the semaphore's n")
	flag.StringVar(&fairKindsFlag, "fair-kinds", "mutex,semaphore,rwlock,set", "fairness: kinds to run")
	flag.StringVar(&fairImplsFlag, "fair-impls", "manager,manager-fair,queue", "fairness: implementations (manager: the Manager; manager-fair: the Manager with Config.FairQueue; queue: the fair queue's store calls, no Manager)")
	flag.StringVar(&scen, "scenarios", "uncontended,peers,hotkey,heartbeat,advisory,shared,hotshared,sets,txlease,guard,fleet,mixed,fairness", "scenarios to run")
	flag.StringVar(&cfg.markdown, "markdown", "bench/out/results.md", "write the run's tables (uncontended, hot key, heartbeat, fleet, primitives, targets) as Markdown for docs/performance.md here (empty: none)")
	flag.IntVar(&cfg.rounds, "rounds", 1, "uncontended: run each point this many times, implementations interleaved, and report the median")
	flag.StringVar(&cfg.peersDir, "peers-dir", "bench/peers", "peers: directory of the peers module (cirello pglock, bsm redislock)")
	flag.StringVar(&cfg.baseline, "baseline", "bench/baseline.json", "target 5: earlier results (the -json output of a run) to compare the advisory figures with; empty: none")
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
		{"heartbeat-n", hbN, &cfg.hbN}, {"advisory-callers", advCallers, &cfg.advCallers}, {"fleet-n", fleetN, &cfg.fleet.n},
		{"prim-callers", primCallers, &cfg.primCallers}, {"hot-shared-callers", hotSharedCallers, &cfg.hotSharedCallers},
		{"fair-callers", fairCallers, &cfg.fair.callers}} {
		if *p.dst, err = parseInts(p.s); err != nil {
			fmt.Fprintf(os.Stderr, "bench: bad -%s %q\n", p.name, p.s)
			os.Exit(2)
		}
	}
	if shape, err := parseInts(mixedShape); err != nil || len(shape) != 5 || cfg.mixed.duration <= 0 {
		fmt.Fprintf(os.Stderr, "bench: bad -mixed-shape %q (five positive numbers) or -mixed-duration\n", mixedShape)
		os.Exit(2)
	} else {
		cfg.mixed.sgProcs, cfg.mixed.sgLoops, cfg.mixed.mgrProcs, cfg.mixed.mgrCallers, cfg.mixed.keys = shape[0], shape[1], shape[2], shape[3], shape[4]
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
	if hb100k && !slices.Contains(cfg.hbN, 100000) {
		cfg.hbN = append(cfg.hbN, 100000)
	}
	if cfg.fleet.duration <= 0 || cfg.fleet.warmup < 0 || cfg.fleet.hold < 0 || cfg.fleet.churn < 0 || cfg.fleet.sample <= 0 || cfg.fleet.idle < 0 {
		fmt.Fprintln(os.Stderr, "bench: -fleet-duration and -fleet-sample must be positive, -fleet-warmup, -fleet-hold and -fleet-churn not negative")
		os.Exit(2)
	}
	if cfg.hotLimit < 1 || cfg.hotWriters < 0 || cfg.hotWriters > 1 {
		fmt.Fprintln(os.Stderr, "bench: -hot-limit must be at least 1, -hot-writers between 0 and 1")
		os.Exit(2)
	}
	if cfg.fair.impls, err = parseFairImpls(fairImplsFlag); err != nil {
		fmt.Fprintln(os.Stderr, "bench: -fair-impls must name manager or queue")
		os.Exit(2)
	}
	if cfg.fair.kinds, err = parseFairKinds(fairKindsFlag); err != nil || len(cfg.fair.callers) < 2 || cfg.fair.setCallers < 1 ||
		cfg.fair.duration <= 0 || cfg.fair.hold < 0 || cfg.fair.limit < 1 {
		fmt.Fprintln(os.Stderr, "bench: -fair-kinds must name mutex, semaphore, rwlock or set; -fair-callers at least two processes; -fair-set-callers, -fair-limit and -fair-duration positive")
		os.Exit(2)
	}
	if cfg.rounds < 1 {
		fmt.Fprintln(os.Stderr, "bench: -rounds must be at least 1")
		os.Exit(2)
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
	cfg.out = out
	if !cfg.json {
		host, _ := os.Hostname()
		fmt.Fprintf(out, "# pglease bench on %s: %s/%s, %d CPUs, GOMAXPROCS=%d, %s per point, %s\n",
			host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), cfg.duration, runtime.Version())
		if v, err := serverInfo(ctx, cfg.url); err == nil {
			fmt.Fprintf(out, "# %s\n", v)
		}
	}
	serverLine := "PostgreSQL"
	if v, err := serverInfo(ctx, cfg.url); err == nil {
		serverLine = strings.SplitN(v, " on ", 2)[0] + "; " + v[strings.LastIndex(v, ";")+2:]
	}
	var results []Result
	emit := func(r Result) {
		results = append(results, r)
		if cfg.json {
			_ = json.NewEncoder(out).Encode(r)
			return
		}
		fmt.Fprintln(out, formatResult(r))
	}
	notef := func(format string, args ...any) {
		if cfg.json {
			_ = json.NewEncoder(out).Encode(map[string]string{"note": fmt.Sprintf(format, args...)})
			return
		}
		fmt.Fprintf(out, "# "+format+"\n", args...)
	}
	for _, s := range scenarioOrder {
		if !cfg.scenarios[s.name] {
			continue
		}
		if err := s.run(ctx, cfg, emit, notef); err != nil {
			return results, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	ts := printTargets(out, cfg, results, notef)
	if cfg.markdown != "" {
		_ = os.MkdirAll(dirOf(cfg.markdown), 0o755)
		host, _ := os.Hostname()
		header := fmt.Sprintf("Measured by `go run ./bench %s` on %s (%s/%s, %d CPUs), %s, %s.", strings.Join(os.Args[1:], " "), host,
			runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), serverLine)
		if err := writeMarkdown(cfg.markdown, header, results, ts); err != nil {
			return results, err
		}
	}
	const title = "pglease, peers and baselines: uncontended acquire+release (same PostgreSQL)"
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

// formatResult is one table row. The latency columns say what they
// measure (Result.Latency) and are left out when there is none.
func formatResult(r Result) string {
	lat := "   -"
	if r.Latency != "" {
		lat = fmt.Sprintf("%-7s p50 %6.2f ms  p99 %7.2f ms  max %7.2f ms", r.Latency, r.P50Ms, r.P99Ms, r.MaxMs)
	}
	return fmt.Sprintf("%-11s %-18s C=%-4d P=%d %9.0f/s  %s  errors %d%s",
		r.Scenario, r.Impl, r.Callers, max(r.Processes, 1), r.CyclesPerSec, lat, r.Errors, extraString(r.Extra))
}

// noteFunc prints a remark (a "# " line, or a {"note": …} object in JSON mode).
type noteFunc func(format string, args ...any)

type scenario struct {
	name string
	run  func(ctx context.Context, cfg config, emit func(Result), note noteFunc) error
}

var scenarioOrder = []scenario{
	{"uncontended", runUncontended},
	{"peers", runPeers},
	{"hotkey", runHotKey},
	{"heartbeat", runHeartbeat},
	{"advisory", runAdvisory},
	{"shared", runShared},
	{"hotshared", runHotShared},
	{"sets", runSets},
	{"txlease", runTxLease},
	{"guard", runGuard},
	{"fleet", runFleet},
	{"mixed", runMixed},
	{"fairness", runFairness},
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
		CyclesPerSec: float64(total) / elapsed, P50Ms: ms(p50), P99Ms: ms(p99), MaxMs: ms(mx), Latency: "cycle", Errors: nerr}
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
