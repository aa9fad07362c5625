package kernel

import (
	"context"
	"time"

	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/store"
)

// exclusive is the kind of an exclusive lease's attempt (Acquire,
// TryAcquire; a local handoff's grant half): one lockId, AcquireMany, its
// fence strictly above every fence seen for the key, its waiters the
// key's queue (acquire pipeline: pipeline.go).
type ExclusiveKind struct{}

// newAttempt makes an attempt of ks for req's hold, in the key's attempt
// chain chain (0: none, a try's): exclusive, unless its maker makes it
// shared (shareAttempt, shareTry).
func newAttempt(ks *KeyState, req *AcquireReq, chain uint64) *Attempt {
	return &Attempt{Ks: ks, lockID: keys.NewLockID(), ttl: req.TTL, delayMs: req.delayMs(), chain: chain, Kind: ExclusiveKind{}}
}

func (ExclusiveKind) lane(st *LoopState) *lane[*Attempt] { return &st.acquires }

func (ExclusiveKind) statement() BatchKind { return KindAcquire }

func (ExclusiveKind) exec(ctx context.Context, s Store, batch []*Attempt) ([]store.AcquireResult, error) {
	reqs := make([]store.AcquireRequest, len(batch))
	for i, a := range batch {
		reqs[i] = store.AcquireRequest{Key: a.Ks.Key, TTL: a.ttl, LockID: a.lockID, LockDelay: a.lockDelay(), Yield: a.yield}
	}
	return s.AcquireMany(ctx, reqs)
}

func (ExclusiveKind) holds(a *Attempt) int { return 1 }

func (ExclusiveKind) hold(a *Attempt, j int) (lockID, key, hash string) {
	return a.lockID, a.Ks.Key, a.Ks.hash
}

func (ExclusiveKind) unit(a *Attempt) int { return 1 }

func (ExclusiveKind) FenceOK(st *LoopState, a *Attempt, lo, hi int, rs []store.AcquireResult) bool {
	return st.noteFence(a.Ks, rs[lo].Fence)
}

// heldHere: any hold here, exclusive or shared, excludes the grant.
func (ExclusiveKind) heldHere(st *LoopState, a *Attempt, to *AcquireReq) bool {
	return a.Ks.held()
}

func (ExclusiveKind) grant(st *LoopState, a *Attempt, to *AcquireReq, lo, hi int, rs []store.AcquireResult, lease heartbeat.Lease) {
	if a.try == nil {
		st.popWaiter(a.Ks)
	}
	st.grant(a.Ks, to, a.lockID, a.ttl, rs[lo], lease)
}

func (ExclusiveKind) waiters(st *LoopState, a *Attempt) waiters { return (*keyQueue)(a.Ks) }

// serves: the head must want this TTL and lock delay, exclusively.
func (ExclusiveKind) serves(a *Attempt, req *AcquireReq) bool {
	return req.TTL == a.ttl && req.delayMs() == a.delayMs && !req.Shared
}

// refusal: a holder elsewhere that dies wakes nobody here: try again when
// its lease can be taken over, if the backoff would wait longer; within
// writerRetry, to keep the key marked as waited for by a writer.
func (ExclusiveKind) refusal(st *LoopState, a *Attempt, r store.AcquireResult, now time.Time) time.Time {
	st.noteLocked(a.Ks, r, now) // keys shared with foreign holders (foreign.go)
	return keepMark(takeoverAt(r, now), now)
}

// again: a hedge asks for the same.
func (ExclusiveKind) again(a *Attempt, id string) attemptKind { return ExclusiveKind{} }

func (ExclusiveKind) landed(st *LoopState, a *Attempt, d acquireDone, rs []store.AcquireResult) {}

func (ExclusiveKind) owns(a *Attempt, j int, unknown bool) bool { return false }

func (ExclusiveKind) keep(st *LoopState, a *Attempt) bool { return st.keepKeyAttempt(a) }

func (ExclusiveKind) served(a *Attempt, add func(*obs.Acquisition) bool) bool {
	return keyServed(a, add)
}

func (ExclusiveKind) op(try bool) string {
	if try {
		return "manager.TryAcquire"
	}
	return "manager.Acquire"
}
