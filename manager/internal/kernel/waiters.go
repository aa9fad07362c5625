package kernel

import (
	"time"

	"github.com/pglease/pglease/manager/internal/notifier"
)

// Releases notify only the keys some process waits for (store.ReleaseWaited):
// a notifying commit serializes with every other one on the server and
// wakes every listener, and most releases have nobody waiting elsewhere.
// A process tells the server it waits for a key by holding the key's
// waiter lock (store.WaiterLockClass) on its listening connection:
//
//   - When an attempt finds the key taken by someone else, or fails
//     (whether the key is free is then unknown), and callers still wait
//     for it, the loop asks the listener for the key's waiter lock
//     (wantWaiter).
//   - The listener takes the locks asked for (store.RegisterWaiters) and
//     posts the keys it registered; the loop then tries each of them once
//     more: a release that committed before the registration could not
//     see it, and that try finds the key free.
//   - When the loop forgets the key (no waiter, no holder), the
//     registration lingers a few seconds (waiterLinger), in case the key
//     is waited for again, and the listener then drops its lock. A
//     reconnect starts a session without locks: the listener takes them
//     all again before it posts its resync.
//
// Without a listener (DisableNotify, a transaction-mode pooler) nothing is
// registered: other processes' releases then send no notification to this
// one, whose waiters poll as before.
//
// A registration is the key's subscription of topic notifier.Wake
// (listener.go): the loop subscribes and unsubscribes on its Link, which
// hands the changes to the listening service; the service takes the
// locks and posts the keys it registered (handleRegistered), and each
// release notification of a registered key (handleWake).

// wantWaiter asks for ks's registration: an attempt found the key taken
// by someone else, or failed, and callers here still wait.
func (st *LoopState) wantWaiter(ks *KeyState) {
	if !st.lis.Live() || ks.waitReg || (len(ks.queue) == 0 && len(ks.setWaiters()) == 0) || st.closing {
		return
	}
	ks.waitReg = true
	st.lis.Subscribe(notifier.Wake, ks.Key)
}

// A registration outlives its key's state for waiterLinger: a key that
// was contended once is likely contended again soon (a hot key's waiters
// come and go with every hand-over), and dropping and retaking its lock
// each time cost the listener two round trips per cycle, and the loop one
// more attempt per cycle (the try after each registration). While it
// lingers, other processes' releases of the key notify this one, which
// ignores them (nobody waits here). Expired registrations are dropped
// together, in one sweep every waiterLinger/4 at most, so that one
// unregister statement carries them all. At most maxLingering keys
// linger; beyond that a registration is dropped at once.
const (
	waiterLinger = 5 * time.Second
	maxLingering = 10_000
)

func (m *Kernel) waiterLinger() time.Duration {
	if m.Test.WaiterLinger != 0 {
		return max(m.Test.WaiterLinger, 0)
	}
	return waiterLinger
}

// dropWaiter ends ks's registration (run forgets the key): it lingers
// (see waiterLinger), unless the Manager is closing or too many linger.
func (st *LoopState) dropWaiter(ks *KeyState) {
	if !ks.waitReg {
		return
	}
	ks.waitReg = false
	linger := st.m.waiterLinger()
	if st.closing || !st.lis.Live() || linger <= 0 || len(st.lingering) >= maxLingering {
		st.lis.Unsubscribe(notifier.Wake, ks.Key)
		return
	}
	if st.lingering == nil {
		st.lingering = make(map[string]time.Time)
	}
	until := st.m.Now().Add(linger)
	st.lingering[ks.Key] = until
	if st.lingerAt.IsZero() {
		st.lingerAt = until
	}
}

// resumeWaiter gives a key state that is being made back the
// registration that lingers for its key, if any (keyFor).
func (st *LoopState) resumeWaiter(ks *KeyState) {
	if _, ok := st.lingering[ks.Key]; ok {
		delete(st.lingering, ks.Key)
		ks.waitReg = st.lis.Live()
	}
}

// sweepLingering drops the registrations whose linger has ended, and
// those that would end within the next quarter of it (so that one sweep,
// one unregister statement, takes many), and schedules the next sweep.
func (st *LoopState) sweepLingering(now time.Time) {
	if st.lingerAt.IsZero() || now.Before(st.lingerAt) {
		return
	}
	cut := now.Add(st.m.waiterLinger() / 4)
	var next time.Time
	for key, until := range st.lingering {
		if !until.After(cut) {
			delete(st.lingering, key)
			st.lis.Unsubscribe(notifier.Wake, key)
			continue
		}
		if next.IsZero() || until.Before(next) {
			next = until
		}
	}
	st.lingerAt = next
}

// handleRegistered tries each key whose waiter lock the listener took
// once more (see above), unless it is held here, has nobody waiting, or
// has an attempt in flight (which may have missed the release: its
// "locked" answer leads to another try).
func (st *LoopState) handleRegistered(keys []string) {
	n := 0
	for _, key := range keys {
		n++
		ks := st.keys[key]
		if ks == nil || !ks.waitReg {
			continue
		}
		st.kickSets(ks)
		if len(ks.queue) == 0 || ks.holder != nil {
			continue
		}
		if ks.attempt != nil {
			ks.woken = true
			continue
		}
		st.forceKick(ks)
		st.sig().Woken.signal(ks.Key)
	}
	st.sig().Registered.signal(n)
}

// handleWake: a release of the key of hash committed (a key this process
// waits for: its registration made the server notify). Its waiters try
// at once, unless it is held here or an attempt is in flight (which may
// have missed the release: it tries again).
func (st *LoopState) handleWake(hash string) {
	st.noteReleased(hash) // keys shared with foreign holders (foreign.go)
	ks := st.byHash[hash]
	if ks == nil {
		return
	}
	st.kickSets(ks) // set waiters that want the key (sets.go)
	if len(ks.queue) == 0 || ks.holder != nil {
		return
	}
	if ks.attempt != nil {
		ks.woken = true // the attempt in flight may have missed this release
		return
	}
	st.forceKick(ks)
	st.sig().Woken.signal(ks.Key)
}

// resyncWaiters: the listener (re)subscribed, and releases may have been
// missed while it was not listening: every key is tried once more.
func (st *LoopState) resyncWaiters() {
	for _, ks := range st.keys {
		if ks.attempt != nil {
			ks.woken = true
		}
		st.forceKick(ks)
	}
}

// waitersUnlistened: the listener stopped for good; no registration is
// taken or dropped any more, so none lingers.
func (st *LoopState) waitersUnlistened() {
	st.lingering, st.lingerAt = nil, time.Time{}
}
