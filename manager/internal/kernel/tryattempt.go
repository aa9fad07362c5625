package kernel

import (
	"errors"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/obs"
)

// A TryAcquire makes one attempt of its own. It does not join its key's
// queue, and its attempt is outside the key's attempt chain: it does not
// wait for the key's attempt in flight, its scheduled retry, or the
// release of a lockId of the key (an attempt whose callers left, an
// ambiguous one, retried with backoff while the database is away, for up
// to a TTL). Exclusion does not need that wait: the server decides, and
// answers "locked" while any such lockId may still hold the key; a
// release by lockId never touches another lockId's grant.
//
// What a try does not race is this process's own callers: a key held here
// in a way the try's hold cannot share is "locked" (callers of one
// Manager exclude each other), and a key with callers of this Manager
// waiting (in its queue, or a set waiter's turn) is theirs first
// ("locked", or the failure that keeps them from reaching the database,
// KeyState.lastErr: they are waiting out an outage, not a holder).
//
// With FairQueue the same holds for every process's waiters: a try takes
// no ticket, and its attempt yields to the key's queue (Attempt.yield):
// the server answers "locked" while a live ticket of another caller waits
// for the key, also when the key is free (a set's turn, a release that
// could not serve the head), so a loop of tries cannot take a key ahead
// of the queue (docs/fairness.md).

// tryAcquire answers req at once, or queues its attempt.
func (st *LoopState) tryAcquire(ks *KeyState, req *AcquireReq) {
	switch {
	case ks.heldHere(req):
		st.answerTry(req, AcquireReply{Locked: true})
	case len(ks.queue) > 0 && ks.lastErr != nil && Unreachable(ks.lastErr):
		st.answerTry(req, AcquireReply{Err: ks.lastErr})
	case len(ks.queue) > 0 || ks.inTurn():
		st.answerTry(req, AcquireReply{Locked: true})
	default:
		req.Acq.Queued(obs.QueueInfo{})
		a := newAttempt(ks, req, 0) // outside the key's attempt chain
		a.try = req
		a.yield = st.fair() // not ahead of the key's tickets (above)
		if req.Shared {
			shareTry(a, req) // shared.go
		}
		a.Kind.lane(st).add(a)
		return // ks is looked up again when the answer comes (settleTry)
	}
	st.gc(ks)
}

func (st *LoopState) answerTry(req *AcquireReq, r AcquireReply) {
	req.answered = true
	req.Reply <- r
}

// keepTry reports whether flush sends a try's pending attempt: not once
// its caller left, nor during Close (which answers it).
func (st *LoopState) keepTry(a *Attempt) bool {
	switch {
	case a.try.answered: // the caller left before it was sent
	case st.closing:
		st.answerTry(a.try, AcquireReply{Err: ClosedErr("manager.TryAcquire")})
	default:
		return true
	}
	st.gcKey(a.Ks.Key)
	return false
}

// gcKey forgets key's state if nothing refers to it any more.
func (st *LoopState) gcKey(key string) {
	if ks := st.keys[key]; ks != nil {
		st.gc(ks)
	}
}

// mayHaveGranted reports whether an acquire round trip that failed with
// err may have granted its lockIds: only when its outcome is unknown
// (CodeAmbiguous, the store's contract). Any other failure (no connection,
// a server error) ran nothing, or rolled back: there is nothing to
// release.
func mayHaveGranted(err error) bool {
	return err != nil && pglease.CodeOf(err) == pglease.CodeAmbiguous
}

// AttemptCode is the code a caller gets for an attempt's error e (see
// userErr): an ambiguous attempt is not ambiguous to the caller, who was
// not granted the lock, so it gets the code of what went wrong.
func AttemptCode(e *pglease.Error) pglease.Code {
	if e.Code != pglease.CodeAmbiguous {
		return e.Code
	}
	code := pglease.CodeOf(e.Err)
	if code == 0 || code == pglease.CodeAmbiguous {
		code = pglease.CodeServiceUnavailable
	}
	return code
}

// Unreachable reports whether err, an attempt's failure, says the
// database could not be reached or did not answer in time (rather than
// that the key was taken or the request was wrong).
func Unreachable(err error) bool {
	var e *pglease.Error
	if !errors.As(err, &e) {
		return false
	}
	switch AttemptCode(e) {
	case pglease.CodeServiceUnavailable, pglease.CodeNetworkTimeout, pglease.CodeResourceExhausted:
		return true
	}
	return false
}
