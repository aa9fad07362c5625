package manager

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/store"
)

// Releases notify only the keys some process waits for (pg.ReleaseWaited):
// a notifying commit serializes with every other one on the server and
// wakes every listener, and most releases have nobody waiting elsewhere.
// A process tells the server it waits for a key by holding the key's
// waiter lock (store.WaiterLockClass) on its listening connection:
//
//   - When an attempt finds the key taken by someone else and callers
//     still wait for it, run asks for the key's registration (waiterSet).
//   - The listener takes the waiter locks asked for (store.RegisterWaiters)
//     and posts the keys it registered; run then tries each of them once
//     more: a release that committed before the registration could not
//     see it, and that try finds the key free.
//   - When run forgets the key (no waiter, no holder), the listener drops
//     its lock. A reconnect starts a session without locks: the listener
//     takes them all again before it posts its resync.
//
// Without a listener (DisableNotify, a transaction-mode pooler) nothing is
// registered: other processes' releases then send no notification to this
// one, whose waiters poll as before.

// waiterSet is the keys run wants registered, shared by run (which only
// edits it, never blocking) and the listener (which applies it).
type waiterSet struct {
	mu          sync.Mutex
	want        map[string]struct{} // NFC keys
	dirty       bool
	interrupt   context.CancelFunc // ends the listener's current wait; nil when it is not waiting
	interrupted bool               // set called interrupt
}

func newWaiterSet() *waiterSet {
	return &waiterSet{want: make(map[string]struct{})}
}

// set asks for key's registration (on) or its end.
func (w *waiterSet) set(key string, on bool) {
	w.mu.Lock()
	_, has := w.want[key]
	if has == on {
		w.mu.Unlock()
		return
	}
	if on {
		w.want[key] = struct{}{}
	} else {
		delete(w.want, key)
	}
	w.dirty = true
	if w.interrupt != nil {
		w.interrupt()
		w.interrupt, w.interrupted = nil, true
	}
	w.mu.Unlock()
}

// beginWait records cancel as the way to end the listener's wait for
// notifications; false (do not wait) when a change is already pending.
func (w *waiterSet) beginWait(cancel context.CancelFunc) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dirty {
		return false
	}
	w.interrupt, w.interrupted = cancel, false
	return true
}

// endWait ends the wait beginWait recorded and reports whether set ended
// it.
func (w *waiterSet) endWait() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.interrupt = nil
	return w.interrupted
}

// diff returns what to take and what to drop for the session's locks to
// match want, and clears dirty.
func (w *waiterSet) diff(have map[string]struct{}) (add, drop []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dirty = false
	for k := range w.want {
		if _, ok := have[k]; !ok {
			add = append(add, k)
		}
	}
	for k := range have {
		if _, ok := w.want[k]; !ok {
			drop = append(drop, k)
		}
	}
	return add, drop
}

func (w *waiterSet) isDirty() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dirty
}

// registerWaiters brings the listening session's waiter locks (have) to
// what run wants, and posts the keys it registered. Keys whose lock was
// held exclusively at that instant are left for the next round
// (retrySoon: the listener comes back after waiterRetryDelay). An error
// means the connection failed.
func (m *Manager) registerWaiters(ctx context.Context, conn *pgx.Conn, have map[string]struct{}, post bool) (retrySoon bool, err error) {
	add, drop := m.waiters.diff(have)
	if len(drop) > 0 {
		if err := store.UnregisterWaiters(ctx, conn, drop); err != nil {
			return false, err
		}
		for _, k := range drop {
			delete(have, k)
		}
	}
	if len(add) == 0 {
		return false, nil
	}
	ok, err := store.RegisterWaiters(ctx, conn, add)
	if err != nil {
		return false, err
	}
	got := add[:0]
	for i, k := range add {
		if ok[i] {
			have[k] = struct{}{}
			got = append(got, k)
		} else {
			retrySoon = true
		}
	}
	if post && len(got) > 0 && !m.post(ctx, notice{registered: got}) {
		return retrySoon, ctx.Err()
	}
	return retrySoon, nil
}

// wantWaiter asks for ks's registration: an attempt found the key taken
// by someone else and callers here still wait.
func (st *loopState) wantWaiter(ks *keyState) {
	if st.m.waiters == nil || ks.waitReg || len(ks.queue) == 0 || st.closing {
		return
	}
	ks.waitReg = true
	st.m.waiters.set(ks.key, true)
}

// dropWaiter ends ks's registration (run forgets the key).
func (st *loopState) dropWaiter(ks *keyState) {
	if ks.waitReg {
		ks.waitReg = false
		st.m.waiters.set(ks.key, false)
	}
}

// handleRegistered tries each key the listener registered once more (see
// above), unless it is held here, has nobody waiting, or has an attempt in
// flight (which may have missed the release: its "locked" answer leads to
// another try).
func (st *loopState) handleRegistered(keys []string) {
	for _, k := range keys {
		ks := st.keys[k]
		if ks == nil || !ks.waitReg || len(ks.queue) == 0 || ks.holder != nil {
			continue
		}
		if ks.attempt != nil {
			ks.woken = true
			continue
		}
		st.forceKick(ks)
		st.sig().woken.signal(ks.key)
	}
	st.sig().registered.signal(len(keys))
}
