// Package worker is one soak worker process: a Manager (through the
// driver's fault proxy) whose goroutines take lease locks on K contended
// keys and, inside each critical section, make fenced writes to the
// resource table over a separate, direct connection; other goroutines
// take advisory session locks, and others the Manager's other primitives:
// permits of counting semaphores (manager.WithLimit, with now and then an
// exclusive grant of the same key), readers and writers of reader-writer
// keys (manager.Shared, Acquire) and all-or-nothing sets
// (Manager.AcquireAll). Every step is logged (package event) for the
// checks that run after the soak.
//
// Broken modes (Config.Broken) make the worker deliberately wrong, so
// that each check is shown to fail when what it guards is broken.
package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/advisory"
	"github.com/pglease/pglease/soak/event"
)

// Broken modes of a worker.
const (
	BrokenIgnoreLoss   = "ignore-loss"   // keeps working after its lock's Context ended, fenced writes
	BrokenNoFence      = "no-fence"      // writes without the fence condition, and ignores loss
	BrokenOldFence     = "old-fence"     // writes with the fence of its previous grant
	BrokenUncoded      = "uncoded"       // reports errors as plain errors (no *pglease.Error)
	BrokenPanic        = "panic"         // panics after a few cycles
	BrokenRace         = "race"          // a data race (seen by -race builds)
	BrokenLeak         = "leak"          // leaves a goroutine running after Close
	BrokenSlowClose    = "slow-close"    // takes far longer than CloseTimeout to close
	BrokenNoClose      = "no-close"      // exits without Release or Close: its leases stay until expiry
	BrokenStall        = "stall"         // stops taking locks 3 s after it started
	BrokenHog          = "hog"           // holds key 0 for ever
	BrokenIgnoreRevoke = "ignore-revoke" // keeps working (fenced writes) 4 TTL past a revoke of its lease
	BrokenIgnoreDelete = "ignore-delete" // as ignore-revoke, past the loss (ErrLockLost) an operator's delete of its lease row shows as
	BrokenFakeGrant    = "fake-grant"    // an acquire that failed for the server (not a timeout of its wait) is reported granted
	BrokenJumpQueue    = "jump-queue"    // with Fair: its Manager runs without the queue (FairQueue off) and polls free keys with TryAcquire, jumping the others' tickets
	// The primitives' (these workers run only the primitive they break).
	BrokenFakePermit     = "fake-permit"      // a refused permit (TryAcquire) is counted as held
	BrokenReaderAsWriter = "reader-as-writer" // a reader's grant is treated (and logged) as a writer's
)

// AdvisoryBase is added to an advisory key index to form its int64 key.
const AdvisoryBase = 7_000_000

// Key indexes: lease keys (with a resource row) count from 0; the
// primitives' keys from a base per kind, so one index space (event.K)
// names every key.
const (
	SetBase = 1 << 20 // keys of all-or-nothing sets: soak:set:i
	SemBase = 2 << 20 // semaphore keys: soak:sem:i
	RWBase  = 3 << 20 // reader-writer keys: soak:rw:i
)

// KeyName is the key of index k.
func KeyName(k int) string {
	switch {
	case k >= RWBase:
		return fmt.Sprintf("soak:rw:%d", k-RWBase)
	case k >= SemBase:
		return fmt.Sprintf("soak:sem:%d", k-SemBase)
	case k >= SetBase:
		return fmt.Sprintf("soak:set:%d", k-SetBase)
	}
	return fmt.Sprintf("soak:%d", k)
}

// KeyIndex is the inverse of KeyName.
func KeyIndex(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "soak:")
	if !ok {
		return 0, false
	}
	base := 0
	for _, p := range []struct {
		prefix string
		base   int
	}{{"set:", SetBase}, {"sem:", SemBase}, {"rw:", RWBase}} {
		if r, ok := strings.CutPrefix(rest, p.prefix); ok {
			rest, base = r, p.base
			break
		}
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n >= SetBase {
		return 0, false
	}
	return base + n, true
}

// Config is a worker's configuration (flags of `soak worker`).
type Config struct {
	ID, Inc int
	URL     string // through the fault proxy: the Manager's pool and LISTEN
	ResURL  string // direct: the resource table
	// SessionURL, when set, is the Manager's pool going through a
	// transaction-mode PgBouncer (URL): the Manager listens on SessionURL
	// (Config.ListenConnString) and the advisory locks are an
	// advisory.Client's on a pool of SessionURL, as docs/poolers.md says.
	SessionURL     string
	Log            string // event log path
	Keys, AdvKeys  int
	LeaseG, AdvG   int // goroutines
	TTL, Margin    time.Duration
	AcquireTimeout time.Duration
	MaxHold        time.Duration // short holds: uniform [0, MaxHold)
	LongHold       float64       // probability of a hold of 1.5–3 TTL (auto-extended)
	Seed           uint64
	Broken         string
	CloseTimeout   time.Duration

	// The primitives: PrimG goroutines each loop over a semaphore, a
	// reader-writer or a set cycle (a kind with keys, drawn uniformly),
	// hold [0, PrimHold) and pause [0, PrimPause) between cycles.
	PrimG     int
	SemKeys   int     // semaphore keys
	SemLimit  int     // their limit N
	RWKeys    int     // reader-writer keys
	RWWriters float64 // share of the reader-writer cycles that are writers
	SetKeys   int     // the pool sets draw 2–3 keys from
	PrimHold  time.Duration
	PrimPause time.Duration

	// Fair runs the Manager with manager.Config.FairQueue: every waiting
	// Acquire (and AcquireAll) keeps a ticket in its key's queue and is
	// served in arrival order across the workers.
	Fair bool
}

type worker struct {
	cfg   Config
	log   *event.Writer
	m     *manager.Manager
	res   *pgxpool.Pool
	guard *pg.FenceGuard
	adv   *advisory.Client // with SessionURL: the advisory locks' (else the Manager's)
	seq   atomic.Uint32
	stop  context.Context

	started   time.Time    // BrokenStall
	raceVar   int          // BrokenRace: written without synchronization
	prevFence atomic.Int64 // BrokenOldFence
}

// Run runs a worker until ctx ends, then closes it and logs how long
// Close took and whether goroutines leaked. It returns an error only for
// set-up failures.
func Run(ctx context.Context, cfg Config) error {
	baseline := goleak.IgnoreCurrent()
	lg, err := event.Create(cfg.Log)
	if err != nil {
		return err
	}
	defer lg.Close()
	w := &worker{cfg: cfg, log: lg, stop: ctx, started: time.Now()}
	lg.Log(event.Event{E: event.Start, W: cfg.ID, I: cfg.Inc, V: int64(os.Getpid())})

	setupCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rcfg, err := pgxpool.ParseConfig(cfg.ResURL)
	if err != nil {
		return err
	}
	rcfg.MaxConns = int32(cfg.LeaseG + 1)
	rcfg.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("soak-res-w%d", cfg.ID)
	w.res, err = pgxpool.NewWithConfig(setupCtx, rcfg)
	if err != nil {
		return err
	}
	w.guard, err = pg.NewFenceGuard("soak_res", "key", "fence")
	if err != nil {
		return err
	}
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return err
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("soak-w%d", cfg.ID)
	// The pool configured by pg.ConfigurePool (what
	// manager.Open does): connects bounded, a broken connection's socket
	// closed at once. Without it a half-open costs the worker ~15 s
	// (pgconn drains a broken connection's socket for up to 15 s while
	// pgxpool keeps its slot) or, for a connect begun during the fault,
	// a slot for 2 min.
	if err := pg.ConfigurePool(pcfg); err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(setupCtx, pcfg)
	if err != nil {
		return err
	}
	mc := manager.Config{
		TTL:          cfg.TTL,
		LossMargin:   cfg.Margin,
		Config:       pg.Config{Holder: fmt.Sprintf("soak-w%d", cfg.ID)},
		CloseTimeout: cfg.CloseTimeout,
		FairQueue:    cfg.Fair && cfg.Broken != BrokenJumpQueue,
	}
	var spool *pgxpool.Pool
	if cfg.SessionURL != "" {
		mc.ListenConnString = cfg.SessionURL
		scfg, err := pgxpool.ParseConfig(cfg.SessionURL)
		if err != nil {
			return err
		}
		scfg.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("soak-w%d", cfg.ID)
		if err := pg.ConfigurePool(scfg); err != nil {
			return err
		}
		if spool, err = pgxpool.NewWithConfig(setupCtx, scfg); err != nil {
			return err
		}
		if w.adv, err = advisory.NewClient(spool, nil); err != nil {
			return err
		}
	}
	w.m, err = manager.New(pool, mc)
	if err != nil {
		pool.Close()
		return err
	}
	lg.Log(event.Event{E: event.Ready, W: cfg.ID, I: cfg.Inc})

	var wg sync.WaitGroup
	for g := range cfg.LeaseG {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.leaseLoop(g)
		}()
	}
	for g := range cfg.AdvG {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.advLoop(cfg.LeaseG + g)
		}()
	}
	for g := range cfg.PrimG {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.primLoop(cfg.LeaseG + cfg.AdvG + g)
		}()
	}
	if cfg.Broken == BrokenRace {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				w.raceVar++ // races with the lease loops' read in cycle
				time.Sleep(time.Millisecond)
			}
		}()
	}
	if cfg.Broken == BrokenPanic {
		go func() {
			time.Sleep(2 * time.Second)
			panic("soak: deliberate panic (broken worker)")
		}()
	}
	wg.Wait()

	if cfg.Broken == BrokenNoClose {
		lg.Log(event.Event{E: event.Exit, W: cfg.ID, I: cfg.Inc, M: "no-close"})
		os.Exit(0)
	}
	if cfg.Broken == BrokenLeak {
		block := make(chan struct{})
		go func() { <-block }()
	}
	lg.Log(event.Event{E: event.CloseCall, W: cfg.ID, I: cfg.Inc})
	start := time.Now()
	cerr := w.m.Close(context.Background())
	if w.adv != nil {
		cerr = errors.Join(cerr, w.adv.Close(context.Background()))
	}
	if cfg.Broken == BrokenSlowClose {
		time.Sleep(3*cfg.CloseTimeout + 5*time.Second)
	}
	lg.Log(event.Event{E: event.CloseRet, W: cfg.ID, I: cfg.Inc, V: int64(time.Since(start)), C: w.code(cerr)})
	pool.Close()
	w.res.Close()
	if spool != nil {
		spool.Close()
	}
	// pgx closes a connection whose query was cancelled in the
	// background, reading until a 15 s deadline (pgconn asyncClose): on a
	// half-open connection that goroutine outlives Close by up to 15 s. A
	// leak is a goroutine still there after 20 s.
	var leak error
	for deadline := time.Now().Add(20 * time.Second); ; {
		if leak = goleak.Find(baseline); leak == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := leak; err != nil {
		msg := err.Error()
		if len(msg) > 4000 {
			msg = msg[:4000]
		}
		lg.Log(event.Event{E: event.Leak, W: cfg.ID, I: cfg.Inc, M: msg, V: int64(runtime.NumGoroutine())})
	}
	lg.Log(event.Event{E: event.Exit, W: cfg.ID, I: cfg.Inc})
	return nil
}

// code names err's pglease code; "" for nil, "uncoded:<type>" for an
// error that is not a *pglease.Error.
func (w *worker) code(err error) string {
	if err == nil {
		return ""
	}
	if w.cfg.Broken == BrokenUncoded {
		err = errors.New(err.Error())
	}
	var e *pglease.Error
	if !errors.As(err, &e) {
		return fmt.Sprintf("uncoded:%T", err)
	}
	return pglease.CodeOf(err).String()
}

func (w *worker) opID() int64 {
	return int64(w.cfg.ID+1)<<40 | int64(w.cfg.Inc&0xff)<<32 | int64(w.seq.Add(1))
}

func (w *worker) ev(e event.Event) {
	e.W, e.I = w.cfg.ID, w.cfg.Inc
	w.log.Log(e)
}

func (w *worker) rng(g int) *rand.Rand {
	return rand.New(rand.NewPCG(w.cfg.Seed, uint64(w.cfg.ID)<<32|uint64(w.cfg.Inc)<<16|uint64(g)))
}

// sleep waits d or until one of the contexts ends; it reports whether
// the full time passed.
func sleep(d time.Duration, ctxs ...context.Context) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	cases := make([]<-chan struct{}, 0, len(ctxs))
	for _, c := range ctxs {
		cases = append(cases, c.Done())
	}
	switch len(cases) {
	case 0:
		<-t.C
		return true
	case 1:
		select {
		case <-t.C:
			return true
		case <-cases[0]:
			return false
		}
	default:
		select {
		case <-t.C:
			return true
		case <-cases[0]:
			return false
		case <-cases[1]:
			return false
		}
	}
}

func (w *worker) leaseLoop(g int) {
	r := w.rng(g)
	for w.stop.Err() == nil {
		if w.cfg.Broken == BrokenStall && time.Since(w.started) > 3*time.Second {
			sleep(time.Hour, w.stop)
			return
		}
		k := r.IntN(w.cfg.Keys)
		if w.cfg.Broken == BrokenHog && g == 0 {
			k = 0
		}
		w.cycle(r, g, k)
	}
}

func (w *worker) cycle(r *rand.Rand, g, k int) {
	op := w.opID()
	w.ev(event.Event{E: event.AcqCall, G: g, K: k, O: op})
	var lk *manager.Lock
	var err error
	if w.cfg.Broken == BrokenJumpQueue {
		lk, err = w.jump(k)
	} else {
		lk, err = w.m.Acquire(w.stop, KeyName(k), manager.WithTTL(w.cfg.TTL), manager.WithAcquireTimeout(w.cfg.AcquireTimeout))
	}
	if err != nil && w.cfg.Broken == BrokenFakeGrant && w.stop.Err() == nil &&
		slices.Contains([]pglease.Code{pglease.CodeResourceExhausted, pglease.CodeServiceUnavailable, pglease.CodeAmbiguous, pglease.CodeNetworkTimeout}, pglease.CodeOf(err)) {
		// A client that takes a failed acquire for a grant: a fence no
		// server issued.
		w.ev(event.Event{E: event.AcqOK, G: g, K: k, O: op, F: op})
		w.ev(event.Event{E: event.RelCall, G: g, K: k, O: op, F: op})
		w.ev(event.Event{E: event.RelRet, G: g, K: k, O: op, F: op})
		return
	}
	if err != nil {
		w.ev(event.Event{E: event.AcqErr, G: g, K: k, O: op, C: w.code(err)})
		if w.stop.Err() == nil {
			sleep(time.Duration(r.Int64N(int64(20*time.Millisecond))), w.stop)
		}
		return
	}
	fence := int64(lk.Fence())
	w.ev(event.Event{E: event.AcqOK, G: g, K: k, O: op, F: fence, V: lk.AcquiredAt().UnixMilli(), V2: lk.ExpiresAt().UnixMilli()})
	// The notice is logged when the Manager ends the lock's Context, by
	// the AfterFunc goroutine, not when this goroutine gets to look.
	context.AfterFunc(lk.Context(), func() {
		w.ev(event.Event{E: event.End, G: g, K: k, O: op, F: fence, C: w.code(context.Cause(lk.Context())), V2: lk.ExpiresAt().UnixMilli()})
	})
	if w.cfg.Broken == BrokenRace {
		_ = w.raceVar // unsynchronized read
	}
	w.critical(r, g, k, op, lk)
	if w.cfg.Broken == BrokenNoClose && w.stop.Err() != nil {
		return // leave the lease to expire
	}
	w.ev(event.Event{E: event.RelCall, G: g, K: k, O: op, F: fence})
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err = lk.Release(rctx)
	cancel()
	w.ev(event.Event{E: event.RelRet, G: g, K: k, O: op, F: fence, C: w.code(err)})
	w.prevFence.Store(fence)
}

// jump is the jump-queue worker's acquire: it takes no ticket and polls
// the key with TryAcquire every millisecond for up to AcquireTimeout, so
// it takes the key whenever it is free, ahead of the tickets of callers
// that have waited longer (its own releases, without the queue, leave the
// key free rather than grant the head).
func (w *worker) jump(k int) (*manager.Lock, error) {
	deadline := time.Now().Add(w.cfg.AcquireTimeout)
	for {
		lk, ok, err := w.m.TryAcquire(w.stop, KeyName(k), manager.WithTTL(w.cfg.TTL))
		switch {
		case err != nil:
			return nil, err
		case ok:
			return lk, nil
		case w.stop.Err() != nil:
			return nil, &pglease.Error{Code: pglease.CodeAborted, Op: "soak.jump", Msg: "stopped"}
		case time.Now().After(deadline):
			return nil, &pglease.Error{Code: pglease.CodeAcquisitionTimeout, Op: "soak.jump", Msg: "key held for the whole wait"}
		}
		sleep(time.Millisecond, w.stop)
	}
}

// critical is the work under the lock: claim the resource row (a fenced
// write of the fence alone, shutting older holders out), read it, write
// counter+1; hold for a while; long holds (auto-extended across several
// TTLs) repeat read+write every TTL/2.
func (w *worker) critical(r *rand.Rand, g, k int, grant int64, lk *manager.Lock) {
	ignore := w.cfg.Broken == BrokenIgnoreLoss || w.cfg.Broken == BrokenNoFence
	ignoreRevoke := w.cfg.Broken == BrokenIgnoreRevoke || w.cfg.Broken == BrokenIgnoreDelete
	ignoreDelete := w.cfg.Broken == BrokenIgnoreDelete
	fence := int64(lk.Fence())
	if w.cfg.Broken == BrokenOldFence {
		if pf := w.prevFence.Load(); pf > 0 {
			fence = pf
		}
	}
	opCtx := lk.Context()
	if ignore || ignoreRevoke {
		opCtx = w.stop
	}
	held := func() bool {
		err := lk.Err()
		return ignore || err == nil || ignoreRevoke && errors.Is(err, pglease.ErrRevoked) || ignoreDelete && errors.Is(err, pglease.ErrLockLost)
	}
	// The holder's "stop" is when it stops working on this grant: a
	// correct holder stops when its Context ends (logged as End), a broken
	// one at the end of its critical section.
	defer func() {
		if ignore || ignoreRevoke {
			w.ev(event.Event{E: event.Stop, G: g, K: k, O: grant, F: int64(lk.Fence())})
		}
	}()
	if !held() || !w.resOp(opCtx, g, k, grant, fence, "claim", 0) {
		return
	}
	rounds := 1
	hold := time.Duration(0)
	if w.cfg.MaxHold > 0 {
		hold = time.Duration(r.Int64N(int64(w.cfg.MaxHold)))
	}
	// hog and no-close: goroutine 0 always holds long, so it holds a
	// lease whenever the stop comes.
	long := r.Float64() < w.cfg.LongHold || ((w.cfg.Broken == BrokenHog || w.cfg.Broken == BrokenNoClose) && g == 0) || ignore || ignoreRevoke
	if long {
		total := w.cfg.TTL*3/2 + time.Duration(r.Int64N(int64(w.cfg.TTL*3/2)))
		switch {
		case w.cfg.Broken == BrokenHog && g == 0:
			total = 24 * time.Hour
		case ignore, ignoreRevoke:
			// Work on for 4 TTLs whatever happens: past a loss (a
			// revoke), past the next grant of the key.
			total = 4 * w.cfg.TTL
		}
		rounds = max(1, int(total/(w.cfg.TTL/2)))
		hold = w.cfg.TTL / 2
	}
	for range rounds {
		if !held() {
			return
		}
		// ignore-revoke works on past refused writes too (the next
		// holder's claim refuses them).
		c, ok := w.read(opCtx, g, k, grant, fence)
		if !ok && !ignoreRevoke || !held() {
			return
		}
		if !w.resOp(opCtx, g, k, grant, fence, "write", c+1) && !ignoreRevoke {
			return
		}
		waitCtx := lk.Context()
		if ignore || ignoreRevoke {
			waitCtx = w.stop
		}
		if !sleep(hold, waitCtx, w.stop) {
			return
		}
	}
}

// resOp makes one fenced write (claim: the fence alone; write: counter =
// value) and logs it; it reports whether the write was accepted.
func (w *worker) resOp(ctx context.Context, g, k int, grant, fence int64, kind string, value int64) bool {
	op := w.opID()
	w.ev(event.Event{E: event.ResCall, G: g, K: k, O: op, P: grant, F: fence, M: kind, V: value})
	var ok bool
	var err error
	if w.cfg.Broken == BrokenNoFence {
		var sql string
		args := []any{k, fence, op}
		if kind == "claim" {
			sql = "UPDATE soak_res SET fence = $2, op = $3 WHERE key = $1"
		} else {
			sql = "UPDATE soak_res SET fence = $2, op = $3, counter = $4 WHERE key = $1"
			args = append(args, value)
		}
		tag, e := w.res.Exec(ctx, sql, args...)
		ok, err = e == nil && tag.RowsAffected() == 1, e
		if err != nil {
			err = &pglease.Error{Code: pglease.CodeAmbiguous, Op: "soak.unfenced", Msg: "write failed", Err: err}
		}
	} else {
		sets := []pg.Set{{Column: "op", Value: op}}
		if kind == "write" {
			sets = append(sets, pg.Set{Column: "counter", Value: value})
		}
		ok, err = w.guard.Update(ctx, w.res, k, pglease.Fence(fence), sets...)
	}
	res := "refused"
	switch {
	case err != nil:
		res = w.code(err)
	case ok:
		res = "ok"
	}
	w.ev(event.Event{E: event.ResRet, G: g, K: k, O: op, P: grant, F: fence, C: res})
	return err == nil && ok
}

func (w *worker) read(ctx context.Context, g, k int, grant, fence int64) (int64, bool) {
	op := w.opID()
	w.ev(event.Event{E: event.ResCall, G: g, K: k, O: op, P: grant, F: fence, M: "read"})
	var f *int64
	var c int64
	err := w.res.QueryRow(ctx, "SELECT fence, counter FROM soak_res WHERE key = $1", k).Scan(&f, &c)
	if err != nil {
		code := "read_error"
		if ctx.Err() != nil {
			code = "Aborted"
		}
		w.ev(event.Event{E: event.ResRet, G: g, K: k, O: op, P: grant, F: fence, C: code, M: shortErr(err)})
		return 0, false
	}
	var fv int64
	if f != nil {
		fv = *f
	}
	w.ev(event.Event{E: event.ResRet, G: g, K: k, O: op, P: grant, F: fence, C: "ok", V: c, V2: fv})
	return c, true
}

func shortErr(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

func (w *worker) advLoop(g int) {
	r := w.rng(g)
	for w.stop.Err() == nil {
		k := r.IntN(w.cfg.AdvKeys)
		op := w.opID()
		w.ev(event.Event{E: event.AdvCall, G: g, K: k, O: op})
		actx, cancel := context.WithTimeout(w.stop, w.cfg.AcquireTimeout)
		var al *advisory.Lock
		var err error
		if w.adv != nil {
			al, err = w.adv.Lock(actx, advisory.Int64(AdvisoryBase+int64(k)))
		} else {
			al, err = w.m.LockAdvisory(actx, advisory.Int64(AdvisoryBase+int64(k)))
		}
		cancel()
		if err != nil {
			w.ev(event.Event{E: event.AdvErr, G: g, K: k, O: op, C: w.code(err)})
			if w.stop.Err() == nil {
				sleep(advPause(r), w.stop)
			}
			continue
		}
		w.ev(event.Event{E: event.AdvOK, G: g, K: k, O: op})
		context.AfterFunc(al.Context(), func() {
			w.ev(event.Event{E: event.AdvEnd, G: g, K: k, O: op, C: w.code(context.Cause(al.Context()))})
		})
		hold := time.Duration(0)
		if w.cfg.MaxHold > 0 {
			hold = time.Duration(r.Int64N(int64(w.cfg.MaxHold)))
		}
		sleep(hold, al.Context(), w.stop)
		w.ev(event.Event{E: event.AdvRel, G: g, K: k, O: op})
		rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = al.Release(rctx)
		rcancel()
		w.ev(event.Event{E: event.AdvRet, G: g, K: k, O: op, C: w.code(err)})
		if w.stop.Err() == nil {
			// Leave the key alone a moment, so other workers get it (and
			// the lease cycles most of the CPU).
			sleep(advPause(r), w.stop)
		}
	}
}

// advPause is an advisory goroutine's pause between cycles: advisory
// locks take part at a few cycles a second per worker, leaving most of
// the machine to the lease cycles the soak's target counts.
func advPause(r *rand.Rand) time.Duration {
	return time.Duration(150+r.IntN(200)) * time.Millisecond
}
