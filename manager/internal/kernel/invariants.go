package kernel

import (
	"fmt"
	"strconv"
)

// The invariants of the loop's state, after every event the loop handles
// (checkInvariants tests them; the tests' Managers check them after every
// event, see run):
//
//   - Every KeyState is the one of its key: st.keys[ks.key] == ks, and a
//     key in byHash is in keys.
//   - Its counters are never negative: releasing, stale, nShared.
//   - Its holder, if any, is an exclusive hold of that key, held
//     (st.held), and the only exclusive hold of the key here; every held
//     exclusive lock is its key's holder, and its key's state is kept.
//   - nShared counts the shared holds of the key here, which
//     cont.sharedLims counts by limit.
//   - Its queue holds waiting callers only: none answered, no try (a try
//     is never queued) and no set (a set waiter waits beside the queues);
//     a key with waiters is in byHash, so that releases wake them.
//   - Its attempt, if any, is its own (attempt.ks == ks) and not a try.
//   - st.waiting counts the callers in every queue and the set waiters
//     that are not tries.
//   - A batch's slots: stuck ≤ in flight, neither negative.

// idle reports whether nothing refers to ks any more: no waiter, attempt,
// holder, release or stale attempt in flight, shared hold, or set waiter
// (gc forgets it).
func (ks *KeyState) idle() bool {
	return len(ks.queue) == 0 && ks.attempt == nil && !ks.held() && ks.releasing == 0 && ks.stale == 0 && len(ks.setWaiters()) == 0
}

// held reports whether a caller of this process holds the key,
// exclusively or shared.
func (ks *KeyState) held() bool { return ks.holder != nil || ks.nShared > 0 }

// busy reports whether the key's next attempt must wait: one is pending
// or in flight, a caller here holds the key exclusively, or a release of
// one of its lockIds is in flight.
func (ks *KeyState) busy() bool { return ks.attempt != nil || ks.holder != nil || ks.releasing > 0 }

// checkInvariants returns the first invariant (above) the state breaks,
// or nil. Loop only.
func (st *LoopState) checkInvariants() error {
	waiting := 0
	for k, ks := range st.keys {
		if err := st.checkKey(k, ks); err != nil {
			return fmt.Errorf("key %s: %w", keyRef(ks), err)
		}
		waiting += len(ks.queue)
	}
	for _, ks := range st.byHash {
		if st.keys[ks.Key] != ks {
			return fmt.Errorf("key %s: in byHash, not in keys", keyRef(ks))
		}
	}
	for h := range st.held {
		ks := h.ks
		if st.keys[ks.Key] != ks {
			return fmt.Errorf("key %s: held, its state forgotten", keyRef(ks))
		}
		if !h.lock.Shared && ks.holder != h {
			return fmt.Errorf("key %s: an exclusive hold that is not its key's holder", keyRef(ks))
		}
	}
	for _, w := range st.sets {
		if !w.req.Try {
			waiting++
		}
	}
	if waiting != st.waiting {
		return fmt.Errorf("waiting %d, %d callers wait", st.waiting, waiting)
	}
	for _, s := range []*slots{&st.acquireSlots, &st.releaseSlots, &st.extendSlots} {
		if s.stuck < 0 || s.stuck > s.n {
			return fmt.Errorf("slots: %d in flight, %d stuck", s.n, s.stuck)
		}
	}
	return nil
}

func (st *LoopState) checkKey(k string, ks *KeyState) error {
	switch {
	case ks.Key != k:
		return fmt.Errorf("kept under another key")
	case ks.releasing < 0 || ks.stale < 0 || ks.nShared < 0:
		return fmt.Errorf("negative counter: releasing %d, stale %d, shared %d", ks.releasing, ks.stale, ks.nShared)
	case ks.attempt != nil && (ks.attempt.Ks != ks || ks.attempt.try != nil):
		return fmt.Errorf("its attempt is not its own")
	case len(ks.queue) > 0 && st.byHash[ks.hash] != ks:
		return fmt.Errorf("waiters, not in byHash")
	}
	if h := ks.holder; h != nil {
		if _, ok := st.held[h]; !ok || h.ks != ks || h.lock.Shared {
			return fmt.Errorf("its holder is not an exclusive hold of it")
		}
	}
	var shared int32
	if ks.cont != nil {
		for _, n := range ks.cont.sharedLims {
			shared += n
		}
	}
	if shared != ks.nShared {
		return fmt.Errorf("%d shared holds, %d counted by limit", ks.nShared, shared)
	}
	for i, req := range ks.queue {
		if req == nil || req.answered || req.Try || req.Set != nil {
			return fmt.Errorf("queue[%d] is not a waiting caller", i)
		}
	}
	return nil
}

// keyRef names ks in an invariant's error by its hash (never the key).
func keyRef(ks *KeyState) string {
	if len(ks.hash) > 12 {
		return ks.hash[:12]
	}
	return strconv.Quote(ks.hash)
}

// invariantCheckMax bounds the state a test's loop checks after every
// event (keys and held locks): beyond it, the checks would make a test
// with very many keys quadratic.
const invariantCheckMax = 512

// mustHold panics when the state breaks an invariant (tests only: a
// Manager with test signals), unless it is too large to check at every
// event.
func (st *LoopState) mustHold() {
	if len(st.keys)+len(st.held) > invariantCheckMax {
		return
	}
	if err := st.checkInvariants(); err != nil {
		panic("manager: loop state invariant broken: " + err.Error())
	}
}
