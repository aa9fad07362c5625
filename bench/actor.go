package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager"
)

// The actor floor is the least a lock manager of pglease's shape does:
// callers send their requests over a channel to one goroutine that owns
// the pool and never runs SQL; it batches them, runs each batch on a
// worker goroutine that posts the outcome back, and answers every caller
// on its reply channel. Nothing else: no heartbeat, telemetry, key
// queues, trust window, retries or overload control, none of what
// pglease's kernel adds to that path. It runs pglease's own statements
// (store.AcquireMany, ReleaseMany, HandOff), so next to pg-single, the
// set-based ceiling and the hot key's chains it shows what the shape
// itself costs on this machine: the goroutine hand-overs around each
// round trip. A target the floor misses is one no Manager built this way
// meets here; a gap between the floor and the Manager is the kernel's.

// actorFloorFull is the pending count from which one more batch of a kind
// may go out beyond its cap of one, as the Manager's kernel.FullBatch.
const actorFloorFull = 32

type actorReq struct {
	acquire bool
	key     string
	lockID  string // release
	reply   chan actorAnswer
}

type actorAnswer struct {
	lockID string
	err    error
}

type actorDone struct {
	acquire bool
	batch   []actorReq
	ids     []string // acquire: the lockIds granted, "" where refused
	oks     []bool   // release
	err     error
}

type actorFloor struct {
	st    *store.Store
	plain bool // the set-based ceiling's statements (ReleaseMany, no channel)
	ttl   time.Duration
	reqs  chan actorReq
	done  chan actorDone
	work  chan func()
	quit  chan struct{}
	wg    sync.WaitGroup
}

func newActorFloor(st *store.Store, ttl time.Duration) *actorFloor {
	a := &actorFloor{st: st, ttl: ttl, reqs: make(chan actorReq), done: make(chan actorDone),
		work: make(chan func()), quit: make(chan struct{})}
	a.wg.Add(1)
	go a.run()
	return a
}

func (a *actorFloor) close() { close(a.quit); a.wg.Wait() }

// call sends one request and waits for its answer.
func (a *actorFloor) call(r actorReq) actorAnswer {
	r.reply = make(chan actorAnswer, 1)
	a.reqs <- r
	return <-r.reply
}

func (a *actorFloor) run() {
	defer a.wg.Done()
	var acq, rel []actorReq
	inAcq, inRel := 0, 0
	for {
		a.flush(&acq, &inAcq, a.sendAcquire)
		a.flush(&rel, &inRel, a.sendRelease)
		select {
		case r := <-a.reqs:
			if r.acquire {
				acq = append(acq, r)
			} else {
				rel = append(rel, r)
			}
		case d := <-a.done:
			if d.acquire {
				inAcq--
			} else {
				inRel--
			}
			for i, r := range d.batch {
				var ans actorAnswer
				switch {
				case d.err != nil:
					ans.err = d.err
				case d.acquire && d.ids[i] == "":
					ans.err = errLocked
				case d.acquire:
					ans.lockID = d.ids[i]
				case !d.oks[i]:
					ans.err = fmt.Errorf("release failed")
				}
				r.reply <- ans
			}
		case <-a.quit:
			return
		}
	}
}

// flush sends the pending requests of one kind in batches of at most
// store.MaxBatch while its in-flight count is below its cap.
func (a *actorFloor) flush(pending *[]actorReq, inFlight *int, send func([]actorReq)) {
	for len(*pending) > 0 && *inFlight < capFor(len(*pending)) {
		n := min(len(*pending), store.MaxBatch)
		b := slices.Clone((*pending)[:n])
		*pending = slices.Delete(*pending, 0, n)
		*inFlight++
		a.spawn(func() { send(b) })
	}
}

// capFor is the in-flight cap of a kind with pending requests waiting:
// the Manager's defaults (Config.MaxInFlight 1, one more batch while a
// full batch's worth waits).
func capFor(pending int) int {
	if pending >= actorFloorFull {
		return 2
	}
	return 1
}

// spawn runs f on an idle worker, or on a new one (as the kernel's).
func (a *actorFloor) spawn(f func()) {
	select {
	case a.work <- f:
	default:
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			for {
				f()
				select {
				case f = <-a.work:
				case <-a.quit:
					return
				}
			}
		}()
	}
}

func (a *actorFloor) sendAcquire(b []actorReq) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reqs := make([]store.AcquireRequest, len(b))
	for i, r := range b {
		reqs[i] = store.AcquireRequest{Key: r.key, TTL: a.ttl}
	}
	res, err := a.st.AcquireMany(ctx, reqs)
	d := actorDone{acquire: true, batch: b, err: err}
	if err == nil {
		d.ids = make([]string, len(b))
		for i, r := range res {
			if r.OK {
				d.ids[i] = r.LockID
			}
		}
	}
	a.post(d)
}

func (a *actorFloor) post(d actorDone) {
	select {
	case a.done <- d:
	case <-a.quit:
	}
}

func (a *actorFloor) sendRelease(b []actorReq) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var oks []bool
	var err error
	if a.plain {
		ids := make([]string, len(b))
		for i, r := range b {
			ids[i] = r.lockID
		}
		oks, err = a.st.ReleaseMany(ctx, ids)
	} else {
		reqs := make([]store.ReleaseRequest, len(b))
		for i, r := range b {
			reqs[i] = store.ReleaseRequest{LockID: r.lockID, Key: r.key}
		}
		oks, err = a.st.ReleaseWaited(ctx, reqs)
	}
	a.post(actorDone{batch: b, oks: oks, err: err})
}

// actorFloorSetup returns the uncontended implementation "actor-floor":
// each caller acquires and releases its own keys through the actor
// floor, with the Manager's statements (its notify channel, releases
// that wake waiters); plain, with the set-based ceiling's (no channel,
// plain ReleaseMany).
func actorFloorSetup(plain bool) func(ctx context.Context, pool *pgxpool.Pool, callers int) (int, func(int) step, func() error, error) {
	return func(ctx context.Context, pool *pgxpool.Pool, callers int) (int, func(int) step, func() error, error) {
		cfg := store.Config{NotifyChannel: manager.DefaultNotifyChannel}
		if plain {
			cfg = store.Config{}
		}
		st, err := store.New("pg.New", pool, cfg)
		if err != nil {
			return 0, nil, nil, err
		}
		a := newActorFloor(st, uncontendedTTL)
		a.plain = plain
		return actorFloorCallers(a, callers)
	}
}

func actorFloorCallers(a *actorFloor, callers int) (int, func(int) step, func() error, error) {
	return callers, func(w int) step {
		keys := keySet(w)
		return func(ctx context.Context, w, i int) (int, error) {
			g := a.call(actorReq{acquire: true, key: keys[i%len(keys)]})
			if g.err != nil {
				return 0, g.err
			}
			if r := a.call(actorReq{lockID: g.lockID, key: keys[i%len(keys)]}); r.err != nil {
				return 0, r.err
			}
			return 1, nil
		}
	}, func() error { a.close(); return nil }, nil
}

// measureActorRelay measures the hot key through the actor floor: callers
// goroutines in one process take one key in turn. Each sends "acquire"
// to the actor and waits for its grant, then sends "release" and waits
// for the answer. The actor keeps the waiting callers in FIFO order; a
// release with a caller waiting runs one statement on a worker (floor
// false: the handoff statement, store.HandOff, which releases the old
// lockId and grants a new one in one durable commit; floor true: the
// grant floor's plain statement, see measureGrantFloor) and answers both;
// with nobody waiting the key stays with the actor and the next caller
// gets it by the same statement. So every section is one statement, as
// in the handoff chain and the grant floor: next to them, this shows what
// handing each grant to another goroutine costs, and with the floor's
// statement, the most a manager of the Manager's shape can reach on
// SyncGuard's tables here.
func measureActorRelay(ctx context.Context, url string, callers int, floor bool, d time.Duration) (Result, error) {
	pool, _, cleanup, err := benchSchema(ctx, url, 2, syncCommit)
	if err != nil {
		return Result{}, err
	}
	defer cleanup()
	key := fmt.Sprintf("bench-actor-relay-%d", time.Now().UnixNano())
	var stmt func(ctx context.Context, old, next string) error
	var cur string
	impl := "actor-relay"
	if floor {
		impl = "actor-relay-floor"
		if stmt, err = grantFloorStmt(ctx, pool, key); err != nil {
			return Result{}, err
		}
	} else {
		st, err := store.New("pg.New", pool, store.Config{NotifyChannel: manager.DefaultNotifyChannel})
		if err != nil {
			return Result{}, err
		}
		r, err := st.Acquire(ctx, store.AcquireRequest{Key: key, TTL: time.Minute})
		if err != nil || !r.OK {
			return Result{}, fmt.Errorf("acquire: %+v, %v", r, err)
		}
		cur = r.LockID
		stmt = func(ctx context.Context, old, next string) error {
			res, err := st.HandOff(ctx, []store.HandOffRequest{{Old: old, Key: key, TTL: time.Minute, LockID: next}})
			if err == nil && (!res[0].Released || !res[0].OK) {
				err = fmt.Errorf("handoff not granted: %+v", res[0])
			}
			return err
		}
	}
	rl := &relay{stmt: stmt, cur: cur, reqs: make(chan actorReq), done: make(chan relayDone, 1), quit: make(chan struct{})}
	go rl.run()
	defer close(rl.quit)
	step := func(w int) step {
		return func(ctx context.Context, w, i int) (int, error) {
			g := rl.call(actorReq{acquire: true})
			if g.err != nil {
				return 0, g.err
			}
			if a := rl.call(actorReq{lockID: g.lockID}); a.err != nil {
				return 0, a.err
			}
			return 1, nil
		}
	}
	_ = measure(ctx, "warmup", impl, callers, 200*time.Millisecond, step)
	res := measure(ctx, "flush", impl, callers, d, step)
	res.Latency = "cycle"
	return res, nil
}

// relay is measureActorRelay's actor.
type relay struct {
	stmt func(ctx context.Context, old, next string) error
	cur  string // the lockId on the server: a caller's, or the actor's own between callers
	reqs chan actorReq
	done chan relayDone
	quit chan struct{}
}

type relayDone struct {
	next string
	err  error
}

func (rl *relay) call(r actorReq) actorAnswer {
	r.reply = make(chan actorAnswer, 1)
	rl.reqs <- r
	return <-r.reply
}

func (rl *relay) run() {
	var waiting []actorReq // acquires, oldest first
	var releasing *actorReq
	held, busy := false, false // a caller holds the key; a statement is in flight
	work := make(chan func())
	go func() {
		for f := range work {
			f()
		}
	}()
	defer close(work)
	handOff := func() {
		busy = true
		old, next := rl.cur, keys.NewLockID()
		work <- func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rl.done <- relayDone{next: next, err: rl.stmt(ctx, old, next)}
		}
	}
	for {
		select {
		case r := <-rl.reqs:
			if !r.acquire {
				if len(waiting) == 0 {
					held = false // the key stays with the actor
					r.reply <- actorAnswer{}
					continue
				}
				releasing = &r
				handOff()
				continue
			}
			waiting = append(waiting, r)
			if !held && !busy {
				handOff()
			}
		case d := <-rl.done:
			busy = false
			if releasing != nil {
				releasing.reply <- actorAnswer{err: d.err}
				releasing = nil
			}
			head := waiting[0]
			waiting = waiting[1:]
			if d.err != nil {
				// Counted as the head's error; the next statement tries
				// again from the same lockId.
				head.reply <- actorAnswer{err: d.err}
				if len(waiting) > 0 {
					handOff()
				}
				continue
			}
			rl.cur = d.next
			held = true
			head.reply <- actorAnswer{lockID: d.next}
		case <-rl.quit:
			return
		}
	}
}
