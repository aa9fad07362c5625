package kernel

import (
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
//   - The listener LISTENs to the key's wake channel (store.WakeChannel)
//     in the same round trip, so the release wakes the processes waiting
//     for the key, not every listener.
//   - When nobody here waits for the key any more (its last waiter was
//     granted it, or left: unqueued), the listener drops its lock and, if
//     no other waited key shares it, its wake channel (dropWaiter). A
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

// dropWaiter ends ks's registration (nobody here waits for the key any
// more): the listener drops its waiter lock and, when no other
// key it waits for shares it, UNLISTENs its wake channel
// (store.WakeChannel), in one round trip. A registration that outlived
// its waiters (it used to linger a few seconds, in case the key was
// waited for again) kept its process reading every release of the key:
// in a fleet whose workers wait in turn for a few shared keys, every
// process then read every hand-over (docs/scaling.md, "Wake channels").
func (st *LoopState) dropWaiter(ks *KeyState) {
	if !ks.waitReg {
		return
	}
	ks.waitReg = false
	st.lis.Unsubscribe(notifier.Wake, ks.Key)
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
