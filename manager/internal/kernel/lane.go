package kernel

import (
	"slices"

	"github.com/pglease/pglease/internal/store"
)

// A lane is one kind of batched statement: acquires, releases, extends,
// local handoffs. Every lane follows the same rules, so that a new kind
// of statement is one more lane:
//
//   - A request goes out at once when its lane has room, so a lone
//     caller never waits for a batch to fill; requests that arrive while
//     the lane is full wait and go out together in the next batch, at
//     most maxBatch items per statement.
//   - Room: fewer batches in flight than the cap of the lane's slots, not
//     counting stuck ones (flight.go), and fewer than the cap plus the
//     pool's MaxConns in all. The caps are Config.MaxInFlight, and for
//     acquires and releases also (pool MaxConns − 1)/2, which leaves a
//     pool connection for the heartbeat's extends; extends have a cap of
//     their own and never wait behind acquires or releases.
//   - An adaptive lane may send one more batch while FullBatch or more
//     requests wait (adapt).
//   - Renewals first: the batches of every lane but the extends' take at
//     most max(1, pool MaxConns − 1) connections together, stuck ones
//     included (a stuck statement still holds its connection), so that an
//     extend batch never waits for a pool connection behind acquires,
//     releases or handoffs. Under overload acquires are also paced
//     (overload.go).
//   - During Close, a lane that drains (releases) sends everything pending
//     at once, in batches of store.MaxBatch; every other lane's pending items
//     are dropped, after keep has settled them (answered a try, turned a
//     handoff into a plain release).
//
// A handoff is a release and an acquire in one statement: its batches
// take a slot of each (counted by both caps), and go out when the acquire
// cap has room (handoff.go).
type lane[T any] struct {
	batchSpec
	pending  []T  // items waiting for the next batch, oldest first
	maxBatch int  // items per statement (immutable)
	adaptive bool // one more batch in flight while fullBatch or more wait
	drains   bool // during Close everything pending goes out at once (releases)
	// keep, if set, reports whether a pending item is still to be sent;
	// for one that is not, it settles it (answers, forgets or moves it).
	// It runs at every flush, or, with keepLazily, only when a batch can
	// go out: a lane that may hold very many items (every lease due at a
	// tick) is not scanned at every turn of the loop.
	keep       func(T) bool
	keepLazily bool
	// send starts a batch on a DB worker (spawn). It runs on the loop and
	// may read loop state (the keys' queues, for telemetry); the worker
	// posts its outcome back to run.
	send func(fl *flight, batch []T)
}

// batchSpec is what every batch of a lane shares (immutable): its kind,
// and the slots it takes. A batch may go out when slots[0] has room, and
// is counted in each of them until its done message for that slot lands.
type batchSpec struct {
	kind  BatchKind
	slots []*slots
}

// slots counts the batches of one kind in flight against that kind's
// cap. Owned by run.
type slots struct {
	n     int // batches in flight
	stuck int // of those, the ones older than stuckAfter, which the cap no longer counts
	limit int // the cap (immutable)
}

// batchLane is what flush and the loop's bookkeeping need of a lane,
// whatever its item type.
type batchLane interface {
	flush(st *LoopState)
	waiting() int
}

func (l *lane[T]) add(x T) { l.pending = append(l.pending, x) }

func (l *lane[T]) waiting() int { return len(l.pending) }

// prune drops the pending items keep refuses.
func (l *lane[T]) prune() {
	live := l.pending[:0]
	for _, x := range l.pending {
		if l.keep(x) {
			live = append(live, x)
		}
	}
	clear(l.pending[len(live):])
	l.pending = live
}

// flush sends what is pending, in as few batches as the lane's room
// allows.
func (l *lane[T]) flush(st *LoopState) {
	if l.keep != nil && !l.keepLazily {
		l.prune()
	}
	if st.closing && !l.drains {
		clear(l.pending)
		l.pending = nil
		return
	}
	paced := l.kind.paced()
	for len(l.pending) > 0 && st.room(l.slots[0], l.adaptive, len(l.pending), l.drains) {
		if l.keep != nil && l.keepLazily {
			if l.prune(); len(l.pending) == 0 {
				break
			}
		}
		if paced && st.shed.on {
			now := st.m.Now()
			if !st.shed.mayAcquire(now) {
				break // shedding: one acquire batch per gap (overload.go)
			}
			st.shed.sentAcquire(now)
		}
		size := l.maxBatch
		if st.closing {
			size = store.MaxBatch // all at once
		}
		n := min(len(l.pending), size)
		batch := slices.Clone(l.pending[:n])
		l.pending = slices.Delete(l.pending, 0, n)
		l.send(st.launch(&l.batchSpec), batch)
	}
}

// FullBatch is the pending count from which one more batch of an
// adaptive lane may go out beyond its cap (adapt). 32: with 64 callers
// cycling, enough wait at once for a second statement to keep the
// server's second core busy (with 64, a second batch seldom went out
// before the first came back); below it, fewer, larger statements win.
const FullBatch = 32

// adapt returns the in-flight cap of a lane with pending requests
// waiting: limit, or one more when a full batch's worth waits (heavy load:
// the batch in flight is large already, and a second statement of that
// size keeps the server's cores busy), within (pool MaxConns − 1)/2.
func (st *LoopState) adapt(limit, pending int) int {
	if pending >= FullBatch {
		return min(limit+1, max(limit, (st.m.maxConns-1)/2))
	}
	return limit
}

// room reports whether one more batch may take a slot of s: fewer than
// the cap batches in flight that are not stuck, and fewer than the cap +
// the pool's MaxConns in all. A draining lane has room without limit
// during Close.
func (st *LoopState) room(s *slots, adaptive bool, pending int, drains bool) bool {
	if st.closing && drains {
		return true
	}
	limit := s.limit
	if adaptive {
		limit = st.adapt(limit, pending)
	}
	if s != &st.extendSlots && st.busyConns >= max(1, st.m.maxConns-1) {
		return false // the last pool connection is the extends' (renewals first)
	}
	return s.n-s.stuck < limit && s.n < limit+st.m.maxConns
}

// launch records a batch of spec about to be sent, taking one of each of
// its slots.
func (st *LoopState) launch(spec *batchSpec) *flight {
	fl := &flight{spec: spec, start: st.m.Now()}
	for _, s := range spec.slots {
		s.n++
	}
	if spec.kind != KindExtend {
		st.busyConns++
	}
	st.flights[fl] = struct{}{}
	return fl
}

// land records the done message of fl for its slot s: the batch no longer
// counts there. fl is forgotten once every slot it took has landed.
func (st *LoopState) land(fl *flight, s *slots) {
	i := slices.Index(fl.spec.slots, s)
	if i < 0 || fl.landed&(1<<i) != 0 {
		return
	}
	if fl.landed == 0 && fl.spec.kind != KindExtend {
		st.busyConns-- // its statement was answered: the connection is free
	}
	fl.landed |= 1 << i
	s.n--
	if fl.stuck {
		s.stuck--
	}
	if fl.landed == 1<<len(fl.spec.slots)-1 {
		delete(st.flights, fl)
	}
}

// inFlight returns the batches in flight, a handoff counted once per slot
// it takes (telemetry: queue depth "inflight").
func (st *LoopState) inFlight() int {
	return st.acquireSlots.n + st.releaseSlots.n + st.extendSlots.n
}

// pendingItems returns the items waiting in every lane (telemetry: queue
// depth "mailbox").
func (st *LoopState) pendingItems() int {
	n := 0
	for _, l := range st.lanes {
		n += l.waiting()
	}
	return n
}
