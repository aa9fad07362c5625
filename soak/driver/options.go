package driver

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Fault types.
const (
	FTerminatePool   = "terminate-pool"    // pg_terminate_backend of the worker's pooled connections
	FTerminateListen = "terminate-listen"  // … of its LISTEN connection
	FTerminateAdv    = "terminate-adv"     // … of its advisory session
	FHalfOpen        = "half-open"         // proxy: server side closed, client side silent
	FBlackhole       = "blackhole"         // proxy: nothing forwarded, longer than the TTL
	FCut             = "cut"               // proxy: every connection closed, new ones refused
	FDelay           = "delay"             // proxy: latency with jitter
	FStop            = "sigstop"           // SIGSTOP for 1.5–3 TTL, then SIGCONT (a holder when there is one)
	FKill            = "kill"              // SIGKILL of a holder, then a new process
	FStarve          = "starve"            // CPU burners pinned with a holder
	FRevoke          = "revoke"            // Manager.Revoke of a key a worker holds (its holder is told; the key is free at once)
	FCrash           = "crash"             // server stopped -m immediate, then started
	FRestart         = "restart"           // server stopped -m fast, then started
	FTableLock       = "table-lock"        // the lock tables locked ACCESS EXCLUSIVE (a VACUUM FULL queued behind a reader), 0.5–1 TTL
	FReadOnly        = "read-only"         // the server turns read-only under open sessions (default_transaction_read_only, reloaded), 0.5–1.5 TTL
	FClockStep       = "clock-step"        // the server's wall clock (libfaketime) steps forward or back, 0.5–2 TTL, then back to true time
	FPoolPause       = "pool-pause"        // PgBouncer PAUSE, 0.3–2.5 TTL, then RESUME (the pooled workers)
	FPoolReconnect   = "pool-reconnect"    // PgBouncer RECONNECT (server connections replaced as they are released)
	FPoolRestart     = "pool-restart"      // PgBouncer killed and started again on its port
	FDiskFull        = "disk-full"         // the server's filesystem (a tmpfs) shrunk to what it uses, 0.5–2 TTL; half of the times a WAL switch is forced
	FDeleteRows      = "delete-rows"       // an operator's DELETE FROM the lock table (every exclusive lease, writer, set lock)
	FVacuumFull      = "vacuum-full"       // an operator's VACUUM FULL of the lock tables and the fence counters
	FStmtTimeout     = "statement-timeout" // an operator's statement_timeout = 1ms for every session (ALTER SYSTEM, reload), 0.5–1.5 TTL, then reset
)

// FaultTypes lists every fault type, in report order.
var FaultTypes = []string{FTerminatePool, FTerminateListen, FTerminateAdv, FHalfOpen, FBlackhole, FCut,
	FDelay, FStop, FKill, FStarve, FRevoke, FCrash, FRestart, FTableLock, FReadOnly,
	FClockStep, FPoolPause, FPoolReconnect, FPoolRestart, FDiskFull, FDeleteRows, FVacuumFull, FStmtTimeout}

// serverFaults are the fault types that hit every worker at once (one at
// a time: they share the server).
var serverFaults = map[string]bool{FCrash: true, FRestart: true, FTableLock: true, FReadOnly: true,
	FClockStep: true, FPoolPause: true, FPoolReconnect: true, FPoolRestart: true, FDiskFull: true,
	FDeleteRows: true, FVacuumFull: true, FStmtTimeout: true}

// ServerFault reports whether fault type ft hits every worker at once.
func ServerFault(ft string) bool { return serverFaults[ft] }

// DefaultMix weighs the fault types: the server-wide faults are rarer
// because each hits every worker at once.
const DefaultMix = "terminate-pool=10,terminate-listen=8,terminate-adv=6,half-open=12,blackhole=12,cut=10,delay=10,sigstop=10,kill=8,starve=6,revoke=6,crash=3,restart=3,read-only=3,table-lock=2," +
	"clock-step=3,pool-pause=2,pool-reconnect=2,pool-restart=2,disk-full=2,delete-rows=2,vacuum-full=1,statement-timeout=2"

// Driver-side broken modes (the worker ones are in package worker).
const (
	BrokenFenceRollback = "fence-rollback"     // the driver moves fence counters back (a fence rollback)
	BrokenClockJump     = "clock-jump"         // the driver moves lease expiries earlier (a server clock step)
	BrokenPartialSet    = "partial-set"        // a trigger deletes one key's row of a set in the set's own transaction (a partial set committed)
	BrokenExtraPermit   = "extra-permit"       // a trigger adds a permit nobody holds next to every permit granted (the server exceeds the limit)
	BrokenReaderWriter  = "reader-with-writer" // a trigger adds a reader next to every writer of a reader-writer key
)

// driverBroken reports whether mode is one of the driver's (not passed to
// workers).
func driverBroken(mode string) bool {
	switch mode {
	case BrokenFenceRollback, BrokenClockJump, BrokenPartialSet, BrokenExtraPermit, BrokenReaderWriter:
		return true
	}
	return false
}

// Options configure a soak run (the flags of `soak run`).
type Options struct {
	Dir      string        // run directory (logs, dumps); created
	Command  string        // the command that replays the run, for the report (default: this process's command line)
	Bin      string        // the soak binary (worker and burn subcommands)
	Duration time.Duration // longest run (faults phase); the run stops earlier once Cycles and Faults are reached
	Cycles   int64         // lease cycles to reach (0: run for Duration)
	Faults   int           // faults to reach (0: run for Duration)
	Tail     time.Duration // quiet time after the last fault, before the workers are closed

	Workers, Keys, AdvKeys int
	LeaseG, AdvG           int
	TTL, Margin            time.Duration
	AcquireTimeout         time.Duration
	MaxHold                time.Duration
	LongHold               float64
	CloseTimeout           time.Duration
	FaultEvery             time.Duration // mean interval between fault starts

	// The other primitives (worker.Config has their meaning): PrimG
	// goroutines per worker (0: none) over SemKeys semaphores of SemLimit,
	// RWKeys reader-writer keys, sets from a pool of SetKeys.
	PrimG, SemKeys, SemLimit int
	RWKeys, SetKeys          int
	RWWriters                float64
	PrimHold, PrimPause      time.Duration

	// Fair runs every worker's Manager with manager.Config.FairQueue (the
	// fair-order check then applies): waiters are served in arrival order
	// across the workers.
	Fair bool

	Mix  map[string]int
	Seed uint64
	// RoundRobin starts the fault types with a weight in turn (a type
	// whose target is busy is tried again at the next start) instead of
	// drawing them by weight: the smoke uses it so every type occurs.
	RoundRobin bool
	// Regular starts faults every FaultEvery exactly instead of at
	// exponential intervals, and Targets (if set) limits the worker faults
	// to those workers: negative controls use them to place faults.
	Regular bool
	Targets []int

	// Pooled is how many workers (the odd ids first) go through a
	// PgBouncer in transaction mode that the driver starts: their pool,
	// through their proxy, to PgBouncer; their LISTEN connection and
	// advisory session, through a second proxy, to the server. Default:
	// half of them when a pool fault is in the mix, else none; -1: none.
	Pooled int

	// Broken is "mode" or "mode:w1,w2" (worker modes apply to the listed
	// workers, default worker 0; driver modes to the run).
	Broken string

	Log func(format string, args ...any) `json:"-"` // progress; nil = quiet
}

// ParseMix parses "type=weight,…"; types not named get weight 0.
func ParseMix(s string) (map[string]int, error) {
	m := map[string]int{}
	known := map[string]bool{}
	for _, t := range FaultTypes {
		known[t] = true
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, w, ok := strings.Cut(part, "=")
		if !ok {
			w = "1"
		}
		if !known[name] {
			return nil, fmt.Errorf("unknown fault type %q (known: %s)", name, strings.Join(FaultTypes, ", "))
		}
		n, err := strconv.Atoi(w)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad weight in %q", part)
		}
		m[name] = n
	}
	return m, nil
}

// FormatMix is the inverse of ParseMix (types in report order).
func FormatMix(m map[string]int) string {
	var parts []string
	for _, t := range FaultTypes {
		if m[t] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", t, m[t]))
		}
	}
	return strings.Join(parts, ",")
}

// BrokenMode splits Options.Broken into the mode and the workers it
// applies to.
func (o *Options) BrokenMode() (mode string, workers map[int]bool) {
	if o.Broken == "" {
		return "", nil
	}
	mode, list, _ := strings.Cut(o.Broken, ":")
	workers = map[int]bool{}
	if list == "" {
		workers[0] = true
	}
	for _, s := range strings.Split(list, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil {
			workers[n] = true
		}
	}
	return mode, workers
}

func (o *Options) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defi := func(d *int, v int) {
		if *d == 0 {
			*d = v
		}
	}
	defi(&o.Workers, 8)
	defi(&o.Keys, 12)
	defi(&o.AdvKeys, 4)
	defi(&o.LeaseG, 3)
	def(&o.TTL, time.Second)
	def(&o.AcquireTimeout, 2*time.Second)
	def(&o.CloseTimeout, 5*time.Second)
	def(&o.FaultEvery, 1300*time.Millisecond)
	def(&o.Duration, 30*time.Minute)
	defi(&o.SemLimit, 3)
	if o.Tail == 0 {
		o.Tail = o.TTL + 3*time.Second
	}
	if o.Mix == nil {
		o.Mix, _ = ParseMix(DefaultMix)
	}
}
