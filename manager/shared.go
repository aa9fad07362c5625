package manager

import (
	"context"
	"math"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/store"
)

// Shared holds. A key is held exclusively (a lease: the SyncGuard row)
// or shared: by readers of a reader-writer lease (Shared), or by the
// permits of a counting semaphore (WithLimit), rows of the lock table's
// {lock}_shared table. The server decides every grant (store.AcquireSharedMany);
// the loop keeps what it needs to send no attempt it knows to be futile
// and to serve waiters in order:
//
//   - A key's queue stays one FIFO of exclusive and shared waiters. Its
//     one attempt serves the head: an exclusive head as before; a shared
//     head together with the shared waiters of the same limit and TTL that
//     follow it (coalescing: one item per waiter in one statement, as many
//     as the server grants; a semaphore's at most limit).
//   - Several callers of this process may hold a key shared at once
//     (keyState.nShared counts them, keyContention.sharedLims by limit:
//     callers may disagree on a semaphore's limit while it is changed).
//     A shared head waits for a local exclusive holder, a reader head for
//     local permits, a permit head for local readers, or for a local
//     permit when the local permits alone reach the smallest of its limit
//     and theirs (the server's rule, store.AcquireSharedMany). An
//     exclusive head does attempt while local shared holds exist: its
//     refusal marks the key as waited for by a writer, which keeps new
//     shared holds of every process away (writer preference; every
//     refused exclusive attempt marks the key, whatever refused it; the
//     mark lapses 2 s after the last one, and a waiting writer tries
//     again within writerRetry to keep it).
//   - A shared hold's release is a plain release (local handoffs are
//     exclusive to exclusive: the store hands over exclusive leases only,
//     and never while shared holds remain); it kicks the key, whose head
//     then tries at once. Releases and extends cover both tables.
//
// Fences: a permit's fence is a fresh increment of the key's counter, so
// it is checked like an exclusive grant's (fence monotonicity), against
// the highest fence seen when its attempt was made (permits of one key
// may be granted by attempts whose answers cross); a reader's is the
// counter as it was (the fence of the state it reads under), which may
// repeat, and is not checked.

// writerRetry is the longest an exclusive waiter goes between attempts of
// a key held elsewhere: each refused exclusive attempt marks the key as
// waited for by a writer for 2 s (no new reader or permit meanwhile:
// writer preference, store.AcquireSharedMany), so a waiter that tries
// again within 1 s keeps the key marked until it has had it, whatever
// holds it: another process's writer, readers or permits, a delay.
const writerRetry = time.Second

// keepMark returns when an exclusive waiter refused at now tries again
// at the latest: at freeAt (zero: unknown) if that comes first, else
// writerRetry after now.
func keepMark(freeAt, now time.Time) time.Time {
	if t := now.Add(writerRetry); freeAt.IsZero() || t.Before(freeAt) {
		return t
	}
	return freeAt
}

// maxCoalesce caps the shared waiters one attempt serves (and the holds
// it asks for).
const maxCoalesce = 64

// Shared makes the acquire a reader of the key's reader-writer lease:
// any number of readers, of any process, hold the key at once, never
// together with an exclusive holder (a plain Acquire: the writer), nor
// with permits (WithLimit). A waiting writer goes first: from its first
// refused attempt, whatever refused it (readers, permits, another
// writer, a delay), no new reader or permit is granted until it has had
// the key (writer preference: a steady stream of readers cannot starve
// it, and when the writer it waits behind releases, the readers waiting
// with it do not get in first). Each refused exclusive attempt marks the
// key for 2 s and a waiting writer tries again at least once a second,
// which keeps the mark (a key no reader or permit has contended for is
// marked a round trip after the first of them is refused on it, which
// wakes the waiting writers); a writer that dies or gives up waiting (a
// refused TryAcquire included) stops blocking readers 2 s after its last
// attempt.
// So, as with sync.RWMutex, a reader must not take the key again while
// it holds it: the second read would wait for a waiting writer, which
// waits for the first.
//
// A reader's Fence is the fence of the state it reads under: the key's
// fence counter at its grant, not incremented (the fence of the last
// exclusive grant or permit of the key; 0 if there was none), so readers
// may share a fence, and a writer's fence is above every reader's before
// it. Present it where a reader must show which writer's state it read.
//
// Shared locks are Locks like any: Release, Extend, heartbeat, loss
// signal, Context, WithTTL, WithHoldLimit, WithoutAutoExtend, and they
// work with Acquire, TryAcquire and Do. Guard refuses them (the database
// guard accepts exclusive leases only). SyncGuard processes sharing the
// tables do not see shared holds: they take the key as if nobody held it.
func Shared() AcquireOption {
	return func(o *acquireOpts) error {
		o.shared = true
		return nil
	}
}

// WithLimit makes the acquire a permit of a counting semaphore of n on
// the key: at most n permits, of any process, are held at once, never
// together with an exclusive holder or readers (Shared: a permit waits
// for readers to go, a reader for permits); n must be at least 1. A
// waiting exclusive acquire keeps new permits away as it keeps readers
// (see Shared). It implies Shared.
//
// Holders may disagree on n, so a limit can be changed in a live fleet
// by deploying the new n process by process: a permit is granted only
// while the live permits are fewer than the smallest n among them and
// the caller's, so the key never has more permits than the smallest n of
// a live permit. A raise takes effect once the permits taken with the old
// n are gone, a lowering as soon as the live permits are fewer than the
// new n (its callers wait until then). A caller whose n disagrees waits
// as for a full semaphore (TryAcquire answers "not acquired"), never an
// error: the disagreement lives in the database, between processes, and
// the same call succeeds later.
//
// Each permit's Fence is a fresh increment of the key's fence counter:
// fences strictly increase across the key's permits and exclusive grants,
// so a resource can refuse a write older than the last one it accepted.
// Permits are Locks like any (see Shared).
func WithLimit(n int) AcquireOption {
	return func(o *acquireOpts) error {
		if n < 1 || n > math.MaxInt32 {
			return invalid("manager.WithLimit", "limit must be at least 1 (and fit in 32 bits)")
		}
		o.shared, o.limit = true, int32(n)
		return nil
	}
}

// addShared counts a shared hold of ks with limit lim (0: a reader).
func (c *keyContention) addShared(ks *keyState, lim int32) {
	if c.sharedLims == nil {
		c.sharedLims = make(map[int32]int32, 1)
	}
	c.sharedLims[lim]++
	ks.nShared++
}

// dropShared uncounts a shared hold of ks with limit lim.
func (ks *keyState) dropShared(lim int32) {
	ks.nShared--
	if ks.cont == nil {
		return
	}
	if n := ks.cont.sharedLims[lim] - 1; n > 0 {
		ks.cont.sharedLims[lim] = n
	} else {
		delete(ks.cont.sharedLims, lim)
	}
}

// localShared describes this process's shared holds of ks: whether
// readers and permits are among them, and the smallest permit limit
// (meaningful when permits).
func (ks *keyState) localShared() (readers, permits bool, minLim int32) {
	if ks.nShared == 0 || ks.cont == nil {
		return false, false, 0
	}
	for lim := range ks.cont.sharedLims {
		switch {
		case lim == 0:
			readers = true
		case !permits || lim < minLim:
			permits, minLim = true, lim
		}
	}
	return readers, permits, minLim
}

// permitRoom returns how many more permits of limit lim the server could
// grant, judging by this process's holds alone: the smallest of lim and
// the local permits' limits, less the local permits (the server's rule,
// AcquireSharedMany; 0 while readers are held here).
func (ks *keyState) permitRoom(lim int32) int32 {
	readers, permits, minLim := ks.localShared()
	switch {
	case readers:
		return 0
	case permits:
		return max(0, min(lim, minLim)-ks.nShared)
	}
	return lim
}

// heldHere reports whether a hold of req's kind cannot be granted because
// of what callers of this Manager hold: an exclusive holder, any shared
// hold for an exclusive request, permits for a reader, readers for a
// permit, or permits that fill the smallest of req's limit and theirs.
func (ks *keyState) heldHere(req *acquireReq) bool {
	switch {
	case ks.holder != nil:
		return true
	case !req.shared:
		return ks.nShared > 0
	case req.limit > 0:
		return ks.permitRoom(req.limit) == 0
	}
	_, permits, _ := ks.localShared()
	return permits
}

// shareAttempt makes a, the key's new attempt for its shared head
// waiter, a shared attempt serving that waiter and the coalescible ones
// behind it.
func (st *loopState) shareAttempt(a *attempt, head *acquireReq) {
	ks := a.ks
	n := min(maxCoalesce, st.m.cfg.MaxBatch)
	if head.limit > 0 {
		n = min(n, max(1, int(ks.permitRoom(head.limit))))
	}
	k := 1
	for k < n && k < len(ks.queue) && coalescible(ks.queue[k], head) {
		k++
	}
	ids := make([]string, k)
	ids[0] = a.lockID
	for j := 1; j < k; j++ {
		ids[j] = keys.NewLockID()
	}
	a.kind = &sharedKind{limit: head.limit, floor: ks.fence, hasFloor: ks.hasFence, ids: ids}
}

// shareTry makes a, a try's attempt for req, a shared attempt of one
// hold.
func shareTry(a *attempt, req *acquireReq) {
	a.kind = &sharedKind{limit: req.limit, floor: a.ks.fence, hasFloor: a.ks.hasFence}
}

// coalescible reports whether waiter q can share the attempt made for
// head: a shared hold of the same limit and TTL.
func coalescible(q, head *acquireReq) bool {
	return q.shared && !q.try && q.limit == head.limit && q.ttl == head.ttl
}

// sharedKind is the kind of a shared attempt (acquire pipeline:
// pipeline.go): shared holds with limit (0: a reader), one per lockId of
// ids (ids[0] is the attempt's lockID; nil for a try's single hold), for
// as many shared waiters at the head of the key's queue, in one
// AcquireSharedMany. floor is the key's highest fence seen when the
// attempt was made (hasFloor: there was one): a permit's fence must be
// above it (fence monotonicity).
type sharedKind struct {
	limit    int32
	hasFloor bool
	floor    pglease.Fence
	ids      []string
}

func (sh *sharedKind) lane(st *loopState) *lane[*attempt] { return &st.sharedAcqs }

func (sh *sharedKind) statement() batchKind { return kindShared }

// exec sends one AcquireSharedMany for every hold of the batch.
func (sh *sharedKind) exec(ctx context.Context, s kernelStore, batch []*attempt) ([]store.AcquireResult, error) {
	n := 0
	for _, a := range batch {
		n += a.kind.holds(a)
	}
	reqs := make([]store.SharedRequest, 0, n)
	for _, a := range batch {
		k := a.kind.(*sharedKind)
		for j := range k.holds(a) {
			reqs = append(reqs, store.SharedRequest{Key: a.ks.key, TTL: a.ttl, LockID: k.id(a, j), Limit: int(k.limit)})
		}
	}
	return s.AcquireSharedMany(ctx, reqs)
}

func (sh *sharedKind) holds(a *attempt) int {
	if sh.ids == nil {
		return 1
	}
	return len(sh.ids)
}

func (sh *sharedKind) id(a *attempt, j int) string {
	if sh.ids == nil {
		return a.lockID
	}
	return sh.ids[j]
}

func (sh *sharedKind) hold(a *attempt, j int) (lockID, key, hash string) {
	return sh.id(a, j), a.ks.key, a.ks.hash
}

// unit: each hold is one waiter's.
func (sh *sharedKind) unit(a *attempt) int { return 1 }

// fenceOK applies fence monotonicity to a permit's grant: its fence must
// be above every fence seen before its attempt was made (permits of one
// key may be granted by attempts whose answers cross); a reader's is the
// counter as it was and is not checked. It records the fence.
func (sh *sharedKind) fenceOK(st *loopState, a *attempt, lo, hi int, rs []store.AcquireResult) bool {
	f := rs[lo].Fence
	switch {
	case sh.limit == 0:
		return true
	case sh.hasFloor && f <= sh.floor:
		return false
	}
	if ks := a.ks; !ks.hasFence || f > ks.fence {
		ks.fence, ks.hasFence = f, true
	}
	return true
}

// heldHere: a try's shared hold is excluded by an exclusive holder here
// (the server decides between shared holds).
func (sh *sharedKind) heldHere(st *loopState, a *attempt, to *acquireReq) bool {
	return a.ks.holder != nil
}

func (sh *sharedKind) grant(st *loopState, a *attempt, to *acquireReq, lo, hi int, rs []store.AcquireResult, lease heartbeat.Lease) {
	if a.try == nil {
		st.popWaiter(a.ks)
	}
	st.grant(a.ks, to, sh.id(a, lo), a.ttl, rs[lo], lease)
}

func (sh *sharedKind) waiters(st *loopState, a *attempt) waiters { return (*keyQueue)(a.ks) }

// serves: the head must want a shared hold of this limit and TTL.
func (sh *sharedKind) serves(a *attempt, q *acquireReq) bool {
	return q.shared && !q.try && q.limit == sh.limit && q.ttl == a.ttl
}

func (sh *sharedKind) refusal(st *loopState, a *attempt, r store.AcquireResult, now time.Time) time.Time {
	return takeoverAt(r, now)
}

// again is the kind of a hedge of a: as many holds, new lockIds (id the
// first).
func (sh *sharedKind) again(a *attempt, id string) attemptKind {
	c := *sh
	if sh.ids != nil {
		c.ids = make([]string, len(sh.ids))
		c.ids[0] = id
		for j := 1; j < len(c.ids); j++ {
			c.ids[j] = keys.NewLockID()
		}
	}
	return &c
}

func (sh *sharedKind) landed(st *loopState, a *attempt, d acquireDone, rs []store.AcquireResult) {}

func (sh *sharedKind) owns(a *attempt, j int, unknown bool) bool { return false }

func (sh *sharedKind) keep(st *loopState, a *attempt) bool { return st.keepKeyAttempt(a) }

func (sh *sharedKind) served(a *attempt, add func(*obs.Acquisition) bool) bool {
	return keyServed(a, add)
}

func (sh *sharedKind) op(try bool) string {
	if try {
		return "manager.TryAcquire"
	}
	return "manager.Acquire"
}
