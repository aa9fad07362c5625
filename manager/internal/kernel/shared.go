package kernel

import (
	"context"
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
//     (KeyState.nShared counts them, keyContention.sharedLims by limit:
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

// addShared counts a shared hold of ks with limit lim (0: a reader).
func (c *keyContention) addShared(ks *KeyState, lim int32) {
	if c.sharedLims == nil {
		c.sharedLims = make(map[int32]int32, 1)
	}
	c.sharedLims[lim]++
	ks.nShared++
}

// dropShared uncounts a shared hold of ks with limit lim.
func (ks *KeyState) dropShared(lim int32) {
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
func (ks *KeyState) localShared() (readers, permits bool, minLim int32) {
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
func (ks *KeyState) permitRoom(lim int32) int32 {
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
func (ks *KeyState) heldHere(req *AcquireReq) bool {
	switch {
	case ks.holder != nil:
		return true
	case !req.Shared:
		return ks.nShared > 0
	case req.Limit > 0:
		return ks.permitRoom(req.Limit) == 0
	}
	_, permits, _ := ks.localShared()
	return permits
}

// shareAttempt makes a, the key's new attempt for its shared head
// waiter, a shared attempt serving that waiter and the coalescible ones
// behind it.
func (st *LoopState) shareAttempt(a *Attempt, head *AcquireReq) {
	ks := a.Ks
	n := min(maxCoalesce, st.m.cfg.MaxBatch)
	if head.Limit > 0 {
		n = min(n, max(1, int(ks.permitRoom(head.Limit))))
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
	a.Kind = &SharedKind{Limit: head.Limit, Floor: ks.Fence, HasFloor: ks.HasFence, ids: ids}
}

// shareTry makes a, a try's attempt for req, a shared attempt of one
// hold.
func shareTry(a *Attempt, req *AcquireReq) {
	a.Kind = &SharedKind{Limit: req.Limit, Floor: a.Ks.Fence, HasFloor: a.Ks.HasFence}
}

// coalescible reports whether waiter q can share the attempt made for
// head: a shared hold of the same limit and TTL.
func coalescible(q, head *AcquireReq) bool {
	return q.Shared && !q.Try && q.Limit == head.Limit && q.TTL == head.TTL
}

// SharedKind is the kind of a shared attempt (acquire pipeline:
// pipeline.go): shared holds with limit (0: a reader), one per lockId of
// ids (ids[0] is the attempt's lockID; nil for a try's single hold), for
// as many shared waiters at the head of the key's queue, in one
// AcquireSharedMany. floor is the key's highest fence seen when the
// attempt was made (hasFloor: there was one): a permit's fence must be
// above it (fence monotonicity).
type SharedKind struct {
	Limit    int32
	HasFloor bool
	Floor    pglease.Fence
	ids      []string
}

func (sh *SharedKind) lane(st *LoopState) *lane[*Attempt] { return &st.sharedAcqs }

func (sh *SharedKind) statement() BatchKind { return KindShared }

// exec sends one AcquireSharedMany for every hold of the batch.
func (sh *SharedKind) exec(ctx context.Context, s Store, batch []*Attempt) ([]store.AcquireResult, error) {
	n := 0
	for _, a := range batch {
		n += a.Kind.holds(a)
	}
	reqs := make([]store.SharedRequest, 0, n)
	for _, a := range batch {
		k := a.Kind.(*SharedKind)
		for j := range k.holds(a) {
			reqs = append(reqs, store.SharedRequest{Key: a.Ks.Key, TTL: a.ttl, LockID: k.id(a, j), Limit: int(k.Limit), Yield: a.yield})
		}
	}
	return s.AcquireSharedMany(ctx, reqs)
}

func (sh *SharedKind) holds(a *Attempt) int {
	if sh.ids == nil {
		return 1
	}
	return len(sh.ids)
}

func (sh *SharedKind) id(a *Attempt, j int) string {
	if sh.ids == nil {
		return a.lockID
	}
	return sh.ids[j]
}

func (sh *SharedKind) hold(a *Attempt, j int) (lockID, key, hash string) {
	return sh.id(a, j), a.Ks.Key, a.Ks.hash
}

// unit: each hold is one waiter's.
func (sh *SharedKind) unit(a *Attempt) int { return 1 }

// FenceOK applies fence monotonicity to a permit's grant: its fence must
// be above every fence seen before its attempt was made (permits of one
// key may be granted by attempts whose answers cross); a reader's is the
// counter as it was and is not checked. It records the fence.
func (sh *SharedKind) FenceOK(st *LoopState, a *Attempt, lo, hi int, rs []store.AcquireResult) bool {
	f := rs[lo].Fence
	switch {
	case sh.Limit == 0:
		return true
	case sh.HasFloor && f <= sh.Floor:
		return false
	}
	if ks := a.Ks; !ks.HasFence || f > ks.Fence {
		ks.Fence, ks.HasFence = f, true
	}
	return true
}

// heldHere: a try's shared hold is excluded by an exclusive holder here
// (the server decides between shared holds).
func (sh *SharedKind) heldHere(st *LoopState, a *Attempt, to *AcquireReq) bool {
	return a.Ks.holder != nil
}

func (sh *SharedKind) grant(st *LoopState, a *Attempt, to *AcquireReq, lo, hi int, rs []store.AcquireResult, lease heartbeat.Lease) {
	if a.try == nil {
		st.popWaiter(a.Ks)
	}
	st.grant(a.Ks, to, sh.id(a, lo), a.ttl, rs[lo], lease)
}

func (sh *SharedKind) waiters(st *LoopState, a *Attempt) waiters { return (*keyQueue)(a.Ks) }

// serves: the head must want a shared hold of this limit and TTL.
func (sh *SharedKind) serves(a *Attempt, q *AcquireReq) bool {
	return q.Shared && !q.Try && q.Limit == sh.Limit && q.TTL == a.ttl
}

func (sh *SharedKind) refusal(st *LoopState, a *Attempt, r store.AcquireResult, now time.Time) time.Time {
	return takeoverAt(r, now)
}

// again is the kind of a hedge of a: as many holds, new lockIds (id the
// first).
func (sh *SharedKind) again(a *Attempt, id string) attemptKind {
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

func (sh *SharedKind) landed(st *LoopState, a *Attempt, d acquireDone, rs []store.AcquireResult) {}

func (sh *SharedKind) owns(a *Attempt, j int, unknown bool) bool { return false }

func (sh *SharedKind) keep(st *LoopState, a *Attempt) bool { return st.keepKeyAttempt(a) }

func (sh *SharedKind) served(a *Attempt, add func(*obs.Acquisition) bool) bool {
	return keyServed(a, add)
}

func (sh *SharedKind) op(try bool) string {
	if try {
		return "manager.TryAcquire"
	}
	return "manager.Acquire"
}
