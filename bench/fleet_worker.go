package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest/pgrec"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
)

// fleetWorkerEnv marks a process started as a fleet worker (the bench, or
// the test binary, re-executed). Its fleetSpec comes as the first line on
// stdin, not in the environment, so that the connection string does not
// show in the process's environment.
const fleetWorkerEnv = "PGLEASE_BENCH_FLEET_WORKER"

// fleetSpec is what one fleet worker runs.
type fleetSpec struct {
	URL        string        `json:"url"`
	Schema     string        `json:"schema"`
	Channel    string        `json:"channel"` // the Managers' NotifyChannel (unique per run)
	App        string        `json:"app"`     // application_name of the pool; the listener's is App + "-listen"
	Worker     int           `json:"worker"`
	Held       int           `json:"held"`        // leases held for the whole run
	TTL        time.Duration `json:"ttl"`         // of every lease
	OwnRate    int           `json:"own_rate"`    // own-key acquire+release cycles per second
	OwnKeys    int           `json:"own_keys"`    // own keys cycled through; 0: a new key every cycle (churn)
	Shared     int           `json:"shared"`      // goroutines looping on the shared keys
	SharedKeys int           `json:"shared_keys"` // keys shared by the whole fleet
	Hold       time.Duration `json:"hold"`        // how long a shared key is held
	Fair       bool          `json:"fair"`        // manager.Config.FairQueue
	CPUProfile string        `json:"cpu_profile"` // non-empty: write CPU profiles here, one per phase (between two commands)
}

// fleetReport is one JSON line a worker prints: when ready, on "report",
// and its final one on "stop". Counters are cumulative since the worker
// started; SharedMs holds the shared-key Acquire latencies since the
// previous report.
type fleetReport struct {
	Ready        bool             `json:"ready,omitempty"`
	Final        bool             `json:"final,omitempty"`
	Grants       int64            `json:"grants"` // every successful Acquire
	OwnGrants    int64            `json:"own_grants"`
	SharedGrants int64            `json:"shared_grants"`
	HeldGrants   int64            `json:"held_grants"`
	Releases     int64            `json:"releases"`          // Release calls that returned nil
	Lost         int64            `json:"lost"`              // lock contexts that ended with ErrLockLost
	LostBy       map[string]int64 `json:"lost_by,omitempty"` // "held: <error>", "release: <error>"
	OwnSkipped   int64            `json:"own_skipped"`
	Errors       map[string]int64 `json:"errors,omitempty"` // "acquire:<Code>", "release:<Code>"
	Stmts        fleetStmts       `json:"stmts"`            // statements sent on the Manager's pool
	SharedMs     []float64        `json:"shared_ms,omitempty"`
	RSSKB        int64            `json:"rss_kb"`   // VmRSS; -1 where /proc is missing
	CPUMs        float64          `json:"cpu_ms"`   // this process's user+system CPU time since it started; -1 unknown
	Notified     int64            `json:"notified"` // notifications delivered to the Manager's listening connection; -1 unknown
	Err          string           `json:"err,omitempty"`
}

// fleetStmts counts the statements a worker's Manager sends on its pool,
// by pglease server function, and the keys its acquire statements carry
// (every key is one attempt: granted, or found locked).
type fleetStmts struct {
	All      int64 `json:"all"`
	Acquire  int64 `json:"acquire"`
	AcqItems int64 `json:"acq_items"`
	Release  int64 `json:"release"`
	Extend   int64 `json:"extend"`
	HandOff  int64 `json:"handoff"`
}

func (a fleetStmts) minus(b fleetStmts) fleetStmts {
	return fleetStmts{a.All - b.All, a.Acquire - b.Acquire, a.AcqItems - b.AcqItems, a.Release - b.Release, a.Extend - b.Extend, a.HandOff - b.HandOff}
}

func (a fleetStmts) plus(b fleetStmts) fleetStmts {
	return fleetStmts{a.All + b.All, a.Acquire + b.Acquire, a.AcqItems + b.AcqItems, a.Release + b.Release, a.Extend + b.Extend, a.HandOff + b.HandOff}
}

// ---- The fleet's use of pglease, in one place (manager, pg, pglease). ----

// fleetManager is one worker's Manager: manager.New on a pool made as
// manager.Open makes its own (pg.ConfigurePool, pgxpool's default size),
// with the defaults, except: a statement counter on the pool (fleetTracer),
// a notify channel of the run's own (so that an observer can count this
// run's notifications), a notification counter on every connection
// (notifyCounter), the pool's connections and the listening one named
// apart (application_name), so that the server tells them apart, and,
// with -fleet-fair, Config.FairQueue.
type fleetManager struct {
	m     *manager.Manager
	pool  *pgxpool.Pool
	tr    *fleetTracer
	notes *notifyCounter
}

type fleetLock = *manager.Lock

func openFleetManager(ctx context.Context, spec fleetSpec) (*fleetManager, error) {
	// The base config names the listening connection: manager.New makes
	// it from the pool's config (no ListenConnString), so that it is
	// dialled, like the pool's, through the notification counter. The
	// pool's own connections get the pool's name and the statement
	// counter in BeforeConnect.
	listen, err := withConnParams(spec.URL, [][2]string{{"application_name", spec.App + "-listen"}, {"search_path", spec.Schema}})
	if err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(listen)
	if err != nil {
		return nil, err
	}
	if err := pg.ConfigurePool(pc); err != nil {
		return nil, err
	}
	// As manager.Open's own pool (manager.idlePool): connections idle
	// 30 s are closed, looked for every 10 s.
	pc.MaxConnIdleTime, pc.HealthCheckPeriod = 30*time.Second, 10*time.Second
	tr := &fleetTracer{}
	rec := &pgrec.Recorder{OnStart: tr.observe}
	nc := &notifyCounter{}
	pc.ConnConfig.DialFunc = nc.dial(pc.ConnConfig.DialFunc)
	pc.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.RuntimeParams["application_name"] = spec.App
		cc.Tracer = rec
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	m, err := manager.New(pool, manager.Config{Config: pg.Config{NotifyChannel: spec.Channel}, FairQueue: spec.Fair})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &fleetManager{m, pool, tr, nc}, nil
}

// fleetTracer counts the statements on a worker's pool by the pglease
// server function they call (pg's function names, pglease_<op>_<hash>).
type fleetTracer struct {
	mu sync.Mutex
	n  fleetStmts
}

// observe counts one statement started: the acquire statements (and
// their keys), the releases, the extends and the handoffs, of either
// mode (FairQueue or not).
func (t *fleetTracer) observe(data pgrec.Statement) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n.All++
	switch {
	case strings.Contains(data.SQL, "pglease_acquire_"):
		t.n.Acquire++
		if len(data.Args) > 0 {
			keys, _ := data.Args[0].([]string)
			t.n.AcqItems += int64(len(keys))
		}
	case strings.Contains(data.SQL, "pglease_qwait_"):
		// The fair queue's acquire (Config.FairQueue): the keys are its
		// second argument.
		t.n.Acquire++
		if len(data.Args) > 1 {
			keys, _ := data.Args[1].([]string)
			t.n.AcqItems += int64(len(keys))
		}
	case strings.Contains(data.SQL, "pglease_release_"), strings.Contains(data.SQL, "pglease_qrelease_"):
		t.n.Release++
	case strings.Contains(data.SQL, "pglease_extend_"):
		t.n.Extend++
	case strings.Contains(data.SQL, "pglease_handoff_"):
		t.n.HandOff++
	}
}

func (t *fleetTracer) counts() fleetStmts {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// fleetAcquireTimeout caps every Acquire of the fleet, so that a wait too
// long counts as an AcquisitionTimeout (SyncGuard's default, 5 s) instead
// of lasting as long as the run.
const fleetAcquireTimeout = 5 * time.Second

func (f *fleetManager) acquire(ctx context.Context, key string, ttl time.Duration) (fleetLock, error) {
	return f.m.Acquire(ctx, key, manager.WithTTL(ttl), manager.WithAcquireTimeout(fleetAcquireTimeout))
}

func (f *fleetManager) close(ctx context.Context) error {
	err := f.m.Close(ctx)
	f.pool.Close()
	return err
}

// errCode names an error's pglease code ("other" for an error without one).
func errCode(err error) string {
	if c := pglease.CodeOf(err); c != 0 {
		return c.String()
	}
	return "other"
}

func isLost(err error) bool { return errors.Is(err, pglease.ErrLockLost) }

func isClosed(err error) bool { return errors.Is(err, pglease.ErrClosed) }

func isAcquireTimeout(err error) bool { return errors.Is(err, pglease.ErrAcquisitionTimeout) }

// ---- End of the pglease use. ----

// withConnParams returns conn with the given parameters set, in either
// connection string syntax (URL or keyword/value).
func withConnParams(conn string, kv [][2]string) (string, error) {
	if u, err := url.Parse(conn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		for _, p := range kv {
			q.Set(p[0], p[1])
		}
		// Encode writes a space as "+", which libpq and pgx read as a
		// plus sign (a literal "+" is "%2B", so every "+" left is a space).
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
		return u.String(), nil
	}
	if strings.Contains(conn, "://") {
		return "", errors.New("unsupported connection string scheme")
	}
	var b strings.Builder
	b.WriteString(conn)
	for _, p := range kv {
		v := strings.ReplaceAll(strings.ReplaceAll(p[1], `\`, `\\`), `'`, `\'`)
		fmt.Fprintf(&b, " %s='%s'", p[0], v)
	}
	return b.String(), nil
}

// runFleetWorkerMode runs a fleet worker and exits when this process was
// started as one (fleetWorkerEnv set); it returns false otherwise.
//
// Protocol: the spec as one JSON line on stdin; the worker opens its
// Manager, acquires its held leases and prints a ready report; then it
// reads commands, one a line: "go" starts the load, "report" prints a
// report, "idle" stops the load (the held leases stay, auto-extended) and
// prints a report, "stop" stops the load, closes the Manager and prints
// the final report. End of stdin (the bench is gone) ends the worker at once.
func runFleetWorkerMode() bool {
	if os.Getenv(fleetWorkerEnv) == "" {
		return false
	}
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadString('\n')
	var spec fleetSpec
	if err == nil {
		err = json.Unmarshal([]byte(line), &spec)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench fleet worker: bad spec:", err)
		os.Exit(2)
	}
	os.Exit(fleetWorker(spec, in, os.Stdout))
	return true
}

// fleetCounters are a worker's counters; mu guards them all (a few
// hundred updates per second at most).
type fleetCounters struct {
	mu       sync.Mutex
	rep      fleetReport
	stmts    func() fleetStmts
	notified func() int64
}

func (c *fleetCounters) add(f func(r *fleetReport)) {
	c.mu.Lock()
	f(&c.rep)
	c.mu.Unlock()
}

func (c *fleetCounters) countErr(op string, err error) {
	c.add(func(r *fleetReport) {
		if r.Errors == nil {
			r.Errors = map[string]int64{}
		}
		r.Errors[op+":"+errCode(err)]++
	})
}

// lost counts a lost lock, by where it was found (a held lease's
// context, a Release) and the error (it names no key or lockId).
func (c *fleetCounters) lost(where string, err error) {
	c.add(func(r *fleetReport) {
		r.Lost++
		if r.LostBy == nil {
			r.LostBy = map[string]int64{}
		}
		r.LostBy[where+": "+err.Error()]++
	})
}

// snapshot returns the counters and takes the latencies collected since
// the last snapshot.
func (c *fleetCounters) snapshot() fleetReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.rep
	r.Errors = maps.Clone(c.rep.Errors)
	r.LostBy = maps.Clone(c.rep.LostBy)
	c.rep.SharedMs = nil
	r.RSSKB = selfRSSKB()
	r.CPUMs = selfCPUMs()
	if c.stmts != nil {
		r.Stmts = c.stmts()
	}
	r.Notified = -1
	if c.notified != nil {
		r.Notified = c.notified()
	}
	return r
}

func fleetWorker(spec fleetSpec, in *bufio.Reader, stdout io.Writer) int {
	enc := json.NewEncoder(stdout)
	fail := func(err error) int {
		_ = enc.Encode(fleetReport{Err: err.Error()})
		return 1
	}
	ctx := context.Background()
	m, err := openFleetManager(ctx, spec)
	if err != nil {
		return fail(err)
	}
	closeManager := func() error {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		return m.close(cctx)
	}
	c := fleetCounters{stmts: m.tr.counts, notified: m.notes.count}
	prof := newPhaseProfiler(spec.CPUProfile, spec.Worker)
	defer prof.stop("end")
	// End of stdin means the bench is gone: end at once (the leases
	// expire by themselves).
	cmds := make(chan string)
	go func() {
		for {
			line, err := in.ReadString('\n')
			if err != nil {
				os.Exit(3)
			}
			cmds <- strings.TrimSpace(line)
		}
	}()

	// The held leases, each watched by a goroutine that counts a loss and
	// takes the key again; they end when Close ends their locks.
	var heldWG, readyWG sync.WaitGroup
	readyWG.Add(spec.Held)
	for i := range spec.Held {
		heldWG.Add(1)
		go func() {
			defer heldWG.Done()
			key := fmt.Sprintf("fleet:%d:held:%d", spec.Worker, i)
			first := true
			for {
				lk, err := m.acquire(ctx, key, spec.TTL)
				if err != nil {
					if isClosed(err) {
						if first {
							readyWG.Done()
						}
						return
					}
					c.countErr("acquire", err)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				c.add(func(r *fleetReport) { r.Grants++; r.HeldGrants++ })
				if first {
					first = false
					readyWG.Done()
				}
				<-lk.Done()
				if !isLost(lk.Err()) {
					return // closed (or released)
				}
				c.lost("held", lk.Err())
			}
		}()
	}
	readyWG.Wait()
	ready := c.snapshot()
	ready.Ready = true
	_ = enc.Encode(ready)

	runCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var loadWG sync.WaitGroup
	release := func(lk fleetLock) {
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		switch err := lk.Release(rctx); {
		case err == nil:
			c.add(func(r *fleetReport) { r.Releases++ })
		case isLost(err):
			c.lost("release", err)
		default:
			c.countErr("release", err)
		}
	}
	startLoad := func() {
		// Own keys: an open loop of OwnRate cycles per second (at most
		// OwnRate in flight; a tick that finds them all busy is skipped
		// and counted).
		loadWG.Add(1)
		go func() {
			defer loadWG.Done()
			t := time.NewTicker(time.Second / time.Duration(spec.OwnRate))
			defer t.Stop()
			sem := make(chan struct{}, spec.OwnRate)
			for seq := 0; ; seq++ {
				select {
				case <-runCtx.Done():
					return
				case <-t.C:
				}
				select {
				case sem <- struct{}{}:
				default:
					c.add(func(r *fleetReport) { r.OwnSkipped++ })
					continue
				}
				key := fmt.Sprintf("fleet:%d:own:%d", spec.Worker, seq)
				if spec.OwnKeys > 0 {
					key = fmt.Sprintf("fleet:%d:own:%d", spec.Worker, seq%spec.OwnKeys)
				}
				loadWG.Add(1)
				go func() {
					defer loadWG.Done()
					defer func() { <-sem }()
					lk, err := m.acquire(runCtx, key, spec.TTL)
					if err != nil {
						if runCtx.Err() == nil {
							c.countErr("acquire", err)
						}
						return
					}
					c.add(func(r *fleetReport) { r.Grants++; r.OwnGrants++ })
					release(lk)
				}()
			}
		}()
		// Shared keys: acquire, hold briefly, release, in a loop.
		for range spec.Shared {
			loadWG.Add(1)
			go func() {
				defer loadWG.Done()
				for runCtx.Err() == nil {
					key := fmt.Sprintf("fleet:shared:%d", rand.IntN(spec.SharedKeys))
					t0 := time.Now()
					lk, err := m.acquire(runCtx, key, spec.TTL)
					if err != nil {
						if runCtx.Err() == nil {
							c.countErr("acquire", err)
							if !isAcquireTimeout(err) {
								time.Sleep(100 * time.Millisecond) // no busy loop on a failing database
							}
						}
						continue
					}
					wait := ms(time.Since(t0))
					c.add(func(r *fleetReport) { r.Grants++; r.SharedGrants++; r.SharedMs = append(r.SharedMs, wait) })
					time.Sleep(spec.Hold)
					release(lk)
				}
			}()
		}
	}
	started := false
	for cmd := range cmds {
		if cmd == "stop" {
			prof.stop(cmd) // the last: the end of stdin may end the process before the deferred stop
		} else {
			prof.next(cmd)
		}
		switch cmd {
		case "go":
			if !started {
				started = true
				startLoad()
			}
		case "report":
			_ = enc.Encode(c.snapshot())
		case "idle":
			stopLoad()
			loadWG.Wait()
			_ = enc.Encode(c.snapshot())
		case "stop":
			stopLoad()
			loadWG.Wait()
			// A Close that could not release everything (a release whose
			// outcome is unknown: the lease expires by itself) is counted
			// as an error of the step, not a failure of the run.
			if err := closeManager(); err != nil {
				c.countErr("close", err)
			}
			heldWG.Wait()
			final := c.snapshot()
			final.Final = true
			_ = enc.Encode(final)
			return 0
		default:
			return fail(fmt.Errorf("unknown command %q", cmd))
		}
	}
	return 0
}
