package worker

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/soak/event"
)

// semExclusive is the share of semaphore cycles that take the key
// exclusively (a plain Acquire): the fences of permits and of exclusive
// grants of a key come from one counter, and an exclusive holder excludes
// every permit.
const semExclusive = 0.1

// primLoop runs the primitives' cycles: each draws a kind that has keys
// (semaphore, reader-writer, set) and runs one cycle of it.
func (w *worker) primLoop(g int) {
	r := w.rng(g)
	var kinds []func(*rand.Rand, int)
	switch {
	case w.cfg.Broken == BrokenFakePermit && w.cfg.SemKeys > 0:
		kinds = append(kinds, w.semCycle)
	case w.cfg.Broken == BrokenReaderAsWriter && w.cfg.RWKeys > 0:
		kinds = append(kinds, w.rwCycle)
	default:
		if w.cfg.SemKeys > 0 && w.cfg.SemLimit > 0 {
			kinds = append(kinds, w.semCycle)
		}
		if w.cfg.RWKeys > 0 {
			kinds = append(kinds, w.rwCycle)
		}
		if w.cfg.SetKeys >= 2 {
			kinds = append(kinds, w.setCycle)
		}
	}
	if len(kinds) == 0 {
		return
	}
	for w.stop.Err() == nil {
		if w.cfg.Broken == BrokenStall && time.Since(w.started) > 3*time.Second {
			sleep(time.Hour, w.stop)
			return
		}
		kinds[r.IntN(len(kinds))](r, g)
		if w.cfg.PrimPause > 0 && w.stop.Err() == nil {
			sleep(time.Duration(r.Int64N(int64(w.cfg.PrimPause))), w.stop)
		}
	}
}

func (w *worker) primHold(r *rand.Rand) time.Duration {
	if w.cfg.PrimHold <= 0 {
		return 0
	}
	return time.Duration(r.Int64N(int64(w.cfg.PrimHold)))
}

func (w *worker) primOpts(extra ...manager.AcquireOption) []manager.AcquireOption {
	return append([]manager.AcquireOption{manager.WithTTL(w.cfg.TTL), manager.WithAcquireTimeout(w.cfg.AcquireTimeout)}, extra...)
}

// semCycle takes a permit of a semaphore key (now and then the key
// exclusively), holds it and releases it.
func (w *worker) semCycle(r *rand.Rand, g int) {
	k := SemBase + r.IntN(w.cfg.SemKeys)
	if r.Float64() < semExclusive && w.cfg.Broken != BrokenFakePermit {
		w.primOne(r, g, k, event.KindExclusive, 0)
		return
	}
	w.primOne(r, g, k, event.KindPermit, w.cfg.SemLimit)
}

// rwCycle takes a reader-writer key, mostly as a reader.
func (w *worker) rwCycle(r *rand.Rand, g int) {
	k := RWBase + r.IntN(w.cfg.RWKeys)
	if r.Float64() < w.cfg.RWWriters {
		w.primOne(r, g, k, event.KindExclusive, 0)
		return
	}
	w.primOne(r, g, k, event.KindReader, 0)
}

// primOne takes key k as kind (a permit of lim), holds it for a while
// (less if its Context ends) and releases it.
func (w *worker) primOne(r *rand.Rand, g, k int, kind string, lim int) {
	op := w.opID()
	opts := w.primOpts()
	switch kind {
	case event.KindReader:
		opts = append(opts, manager.Shared())
	case event.KindPermit:
		opts = append(opts, manager.WithLimit(lim))
	}
	logKind := kind
	if w.cfg.Broken == BrokenReaderAsWriter && kind == event.KindReader {
		logKind = event.KindExclusive // the reader thinks it writes
	}
	w.ev(event.Event{E: event.AcqCall, G: g, K: k, O: op, M: logKind, L: lim})
	var lk *manager.Lock
	var err error
	if w.cfg.Broken == BrokenFakePermit && kind == event.KindPermit {
		var ok bool
		lk, ok, err = w.m.TryAcquire(w.stop, KeyName(k), opts...)
		if err == nil && !ok {
			w.fakePermit(r, g, k, op, lim)
			return
		}
	} else {
		lk, err = w.m.Acquire(w.stop, KeyName(k), opts...)
	}
	if err != nil {
		w.ev(event.Event{E: event.AcqErr, G: g, K: k, O: op, M: logKind, C: w.code(err)})
		if w.stop.Err() == nil {
			sleep(time.Duration(r.Int64N(int64(20*time.Millisecond))), w.stop)
		}
		return
	}
	w.granted(g, k, op, 0, logKind, lim, lk)
	sleep(w.primHold(r), lk.Context(), w.stop)
	w.release(g, k, op, lk)
}

// fakePermit is BrokenFakePermit's hold of a permit it was refused: it
// logs a grant (fence 0, no grant id) and "holds" it as long as a long
// real hold, whatever happens.
func (w *worker) fakePermit(r *rand.Rand, g, k int, op int64, lim int) {
	w.ev(event.Event{E: event.AcqOK, G: g, K: k, O: op, M: event.KindPermit, L: lim})
	sleep(w.cfg.PrimHold/2+w.primHold(r)/2, w.stop)
	w.ev(event.Event{E: event.RelCall, G: g, K: k, O: op})
	w.ev(event.Event{E: event.RelRet, G: g, K: k, O: op})
}

// granted logs a grant (P: its set's op id, 0 for a single lock) and, by
// an AfterFunc, the end of its Context when the Manager signals it.
func (w *worker) granted(g, k int, op, set int64, kind string, lim int, lk *manager.Lock) {
	fence := int64(lk.Fence())
	w.ev(event.Event{E: event.AcqOK, G: g, K: k, O: op, P: set, F: fence, M: kind, L: lim, X: lk.GrantID(),
		V: lk.AcquiredAt().UnixMilli(), V2: lk.ExpiresAt().UnixMilli()})
	context.AfterFunc(lk.Context(), func() {
		w.ev(event.Event{E: event.End, G: g, K: k, O: op, F: fence, C: w.code(context.Cause(lk.Context())), V2: lk.ExpiresAt().UnixMilli()})
	})
}

func (w *worker) release(g, k int, op int64, lk *manager.Lock) {
	fence := int64(lk.Fence())
	w.ev(event.Event{E: event.RelCall, G: g, K: k, O: op, F: fence})
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := lk.Release(rctx)
	cancel()
	w.ev(event.Event{E: event.RelRet, G: g, K: k, O: op, F: fence, C: w.code(err)})
}

// setCycle takes 2–3 keys of the set pool with AcquireAll, holds them
// until the hold ends or any of their Contexts does, and releases them.
func (w *worker) setCycle(r *rand.Rand, g int) {
	n := min(2+r.IntN(2), w.cfg.SetKeys)
	idx := r.Perm(w.cfg.SetKeys)[:n]
	ids := make([]int, n)
	names := make([]string, n)
	for i, x := range idx {
		ids[i] = SetBase + x
		names[i] = KeyName(ids[i])
	}
	op := w.opID()
	w.ev(event.Event{E: event.SetCall, G: g, O: op, M: joinInts(ids)})
	locks, err := w.m.AcquireAll(w.stop, names, w.primOpts()...)
	if err != nil {
		w.ev(event.Event{E: event.SetErr, G: g, O: op, C: w.code(err)})
		if w.stop.Err() == nil {
			sleep(time.Duration(r.Int64N(int64(20*time.Millisecond))), w.stop)
		}
		return
	}
	got := make([]int, len(locks))
	for i, lk := range locks {
		got[i], _ = KeyIndex(lk.Key())
	}
	w.ev(event.Event{E: event.SetOK, G: g, O: op, V: int64(len(locks)), M: joinInts(got)})
	ops := make([]int64, len(locks))
	held, cancel := context.WithCancel(w.stop)
	defer cancel()
	for i, lk := range locks {
		ops[i] = w.opID()
		w.granted(g, got[i], ops[i], op, event.KindSet, 0, lk)
		stop := context.AfterFunc(lk.Context(), cancel)
		defer stop()
	}
	sleep(w.primHold(r), held)
	for i, lk := range locks {
		w.release(g, got[i], ops[i], lk)
	}
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
