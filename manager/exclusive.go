package manager

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
type exclusiveKind struct{}

// newAttempt makes an attempt of ks for req's hold, in the key's attempt
// chain chain (0: none, a try's): exclusive, unless its maker makes it
// shared (shareAttempt, shareTry).
func newAttempt(ks *keyState, req *acquireReq, chain uint64) *attempt {
	return &attempt{ks: ks, lockID: keys.NewLockID(), ttl: req.ttl, delayMs: req.delayMs(), chain: chain, kind: exclusiveKind{}}
}

func (exclusiveKind) lane(st *loopState) *lane[*attempt] { return &st.acquires }

func (exclusiveKind) statement() batchKind { return kindAcquire }

func (exclusiveKind) exec(ctx context.Context, s kernelStore, batch []*attempt) ([]store.AcquireResult, error) {
	reqs := make([]store.AcquireRequest, len(batch))
	for i, a := range batch {
		reqs[i] = store.AcquireRequest{Key: a.ks.key, TTL: a.ttl, LockID: a.lockID, LockDelay: a.lockDelay()}
	}
	return s.AcquireMany(ctx, reqs)
}

func (exclusiveKind) holds(a *attempt) int { return 1 }

func (exclusiveKind) hold(a *attempt, j int) (lockID, key, hash string) {
	return a.lockID, a.ks.key, a.ks.hash
}

func (exclusiveKind) unit(a *attempt) int { return 1 }

func (exclusiveKind) fenceOK(st *loopState, a *attempt, lo, hi int, rs []store.AcquireResult) bool {
	return st.noteFence(a.ks, rs[lo].Fence)
}

// heldHere: any hold here, exclusive or shared, excludes the grant.
func (exclusiveKind) heldHere(st *loopState, a *attempt, to *acquireReq) bool {
	return a.ks.held()
}

func (exclusiveKind) grant(st *loopState, a *attempt, to *acquireReq, lo, hi int, rs []store.AcquireResult, lease heartbeat.Lease) {
	if a.try == nil {
		st.popWaiter(a.ks)
	}
	st.grant(a.ks, to, a.lockID, a.ttl, rs[lo], lease)
}

func (exclusiveKind) waiters(st *loopState, a *attempt) waiters { return (*keyQueue)(a.ks) }

// serves: the head must want this TTL and lock delay, exclusively.
func (exclusiveKind) serves(a *attempt, req *acquireReq) bool {
	return req.ttl == a.ttl && req.delayMs() == a.delayMs && !req.shared
}

// refusal: a holder elsewhere that dies wakes nobody here: try again when
// its lease can be taken over, if the backoff would wait longer; within
// writerRetry, to keep the key marked as waited for by a writer.
func (exclusiveKind) refusal(st *loopState, a *attempt, r store.AcquireResult, now time.Time) time.Time {
	st.noteLocked(a.ks, r, now) // keys shared with foreign holders (foreign.go)
	return keepMark(takeoverAt(r, now), now)
}

// again: a hedge asks for the same.
func (exclusiveKind) again(a *attempt, id string) attemptKind { return exclusiveKind{} }

func (exclusiveKind) landed(st *loopState, a *attempt, d acquireDone, rs []store.AcquireResult) {}

func (exclusiveKind) owns(a *attempt, j int, unknown bool) bool { return false }

func (exclusiveKind) keep(st *loopState, a *attempt) bool { return st.keepKeyAttempt(a) }

func (exclusiveKind) served(a *attempt, add func(*obs.Acquisition) bool) bool {
	return keyServed(a, add)
}

func (exclusiveKind) op(try bool) string {
	if try {
		return "manager.TryAcquire"
	}
	return "manager.Acquire"
}
