package kernel

import (
	"time"

	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/store"
)

// writerMarkMax is the longest a waiting writer's mark holds readers and
// permits off after its last attempt (the acquire function's
// excl_wait_until_ms = now + 2 s).
const writerMarkMax = 2 * time.Second

// waitReasonOf says why a caller asking for a hold (exclusive, a reader,
// or a permit of a semaphore of limit) waits after the refusal r. A
// refusal that names no holder, no expiry and no shared holders comes
// from a delay: for an exclusive attempt a revoke's; for a reader or a
// permit a waiting writer's mark or a revoke's, which the answer does not
// tell apart: reported as the writer's mark when the key is free again
// within the mark's 2 s, else as a lock delay. A refusal for the fair
// queue alone (store.AcquireResult.Queued) is "queued".
func waitReasonOf(shared bool, limit int32, r store.AcquireResult) obs.WaitReason {
	switch {
	case r.SharedHolders > 0 && !shared:
		return obs.WaitSharedHolders
	case r.SharedHolders > 0:
		if limit > 0 {
			return obs.WaitSemaphoreFull
		}
		return obs.WaitHolder
	case r.Delayed:
		return obs.WaitLockDelay
	case !r.ExpiresAt.IsZero():
		return obs.WaitHolder
	case r.Queued:
		return obs.WaitQueued
	case shared && r.RetryAfter <= writerMarkMax:
		return obs.WaitWriterMark
	default:
		return obs.WaitLockDelay
	}
}

// noteWaiting records, on each of reqs' acquire telemetry, why it waits
// after the refusal r and who holds the key.
func noteWaiting(reqs []*AcquireReq, r store.AcquireResult) {
	for _, q := range reqs {
		q.Acq.Waiting(waitReasonOf(q.Shared, q.Limit, r), r.Holder)
	}
}

// noteSetWaiting records why each key of a refused set waits: a refused
// key for its own refusal's reason, a key that was free as one key of a
// set another key of which is held.
func noteSetWaiting(req *AcquireReq, rs []store.AcquireResult) {
	for j, k := range req.Set.Keys {
		if j < len(rs) && refusedInSet(rs[j]) {
			k.Acq.Waiting(waitReasonOf(false, 0, rs[j]), rs[j].Holder)
		} else {
			k.Acq.Waiting(obs.WaitSetMember, "")
		}
	}
}

// refusedInSet reports whether a set attempt's answer for one key says
// that key was held (not granted, nor free in a set refused for another
// key).
func refusedInSet(r store.AcquireResult) bool {
	return !r.OK && (r.RetryAfter > 0 || !r.ExpiresAt.IsZero() || r.Holder != "" || r.SharedHolders > 0)
}
