package manager

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/store"
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
// The loop and the listener share no memory. The loop records each change
// of the locks it wants in its outbox (listenerLink.want) and hands the
// whole outbox over when the listener takes it: run's select offers it
// on the unbuffered mail channel whenever it is not empty, so changes that
// come while the listener is busy (connecting, taking locks, posting)
// coalesce into the next handover, and the loop never waits for the
// listener. The listener waits for notifications and for mail at once
// (listener.wait) and applies each mail to its own copy of what the loop
// wants. A lock is a class and a key (sessionLock): more kinds of session
// lock (a watch of a key, say) are more classes in sessionLockClasses,
// carried by the same mail.

// lockClass names a kind of lock the listener holds on its session for
// the loop.
type lockClass uint8

const (
	// classWaiter: this process waits for the key (store.WaiterLockClass).
	classWaiter lockClass = iota
	// classWatch: a caller of this process watches the key
	// (store.WatchLockClass, watch.go).
	classWatch
)

// sessionLockClasses take and drop the session locks of each class, on
// the listening connection, one round trip each. take reports per key
// whether the lock was taken (false: held exclusively at that instant,
// to be tried again soon).
var sessionLockClasses = [...]struct {
	take func(ctx context.Context, conn *pgx.Conn, keys []string) ([]bool, error)
	drop func(ctx context.Context, conn *pgx.Conn, keys []string) error
}{
	classWaiter: {take: store.RegisterWaiters, drop: store.UnregisterWaiters},
	classWatch:  {take: store.RegisterWatchers, drop: store.UnregisterWatchers},
}

// sessionLock is one lock the listener holds on its session for the loop.
type sessionLock struct {
	class lockClass
	key   string // NFC key
}

// listenerMail is one handover from the loop to the listener: the latest
// wish for each session lock that changed since the last one (true:
// hold it; false: let it go). Once sent, it belongs to the listener.
type listenerMail map[sessionLock]bool

// listenerLink is the loop's end of the listener. Owned by run.
type listenerLink struct {
	mail   chan<- listenerMail // unbuffered; nil when no listener runs
	outbox listenerMail        // changes not handed over yet; nil when none
	done   <-chan struct{}     // closed when the listener goroutine has ended; nil when none runs
	stop   context.CancelFunc  // ends the listener (Close)
}

// want records the loop's wish for lock k; the next handover carries it.
func (l *listenerLink) want(k sessionLock, on bool) {
	if l.mail == nil {
		return
	}
	if l.outbox == nil {
		l.outbox = make(listenerMail)
	}
	l.outbox[k] = on
}

// mailbox returns the channel to offer the outbox on in run's select: nil
// (never ready) when there is nothing to hand over.
func (l *listenerLink) mailbox() chan<- listenerMail {
	if len(l.outbox) == 0 {
		return nil
	}
	return l.mail
}

// ended forgets the listener once its goroutine has ended: nothing is
// handed over any more.
func (l *listenerLink) ended() {
	*l = listenerLink{}
}

// sync brings the session's locks (have) to what the loop wants, and,
// with post, posts the locks it took to the loop. Locks held exclusively
// at that instant are left for the next round (retrySoon: the listener
// comes back after waiterRetryDelay). An error means the connection
// failed.
func (l *listener) sync(ctx context.Context, conn *pgx.Conn, post bool) (retrySoon bool, err error) {
	var add, drop [len(sessionLockClasses)][]string
	for k := range l.want {
		if _, ok := l.have[k]; !ok {
			add[k.class] = append(add[k.class], k.key)
		}
	}
	for k := range l.have {
		if _, ok := l.want[k]; !ok {
			drop[k.class] = append(drop[k.class], k.key)
		}
	}
	var got []sessionLock
	for c, fns := range sessionLockClasses {
		class := lockClass(c)
		if len(drop[c]) > 0 {
			if err := fns.drop(ctx, conn, drop[c]); err != nil {
				return false, err
			}
			for _, k := range drop[c] {
				delete(l.have, sessionLock{class, k})
			}
		}
		if len(add[c]) == 0 {
			continue
		}
		ok, err := fns.take(ctx, conn, add[c])
		if err != nil {
			return false, err
		}
		for i, k := range add[c] {
			if ok[i] {
				l.have[sessionLock{class, k}] = struct{}{}
				got = append(got, sessionLock{class, k})
			} else {
				retrySoon = true
			}
		}
	}
	if post && len(got) > 0 && !l.post(ctx, notice{registered: got}) {
		return retrySoon, ctx.Err()
	}
	return retrySoon, nil
}

// wantWaiter asks for ks's registration: an attempt found the key taken
// by someone else, or failed, and callers here still wait.
func (st *loopState) wantWaiter(ks *keyState) {
	if st.lis.mail == nil || ks.waitReg || (len(ks.queue) == 0 && len(ks.setWaiters()) == 0) || st.closing {
		return
	}
	ks.waitReg = true
	st.lis.want(sessionLock{classWaiter, ks.key}, true)
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

func (m *Manager) waiterLinger() time.Duration {
	if m.test.waiterLinger != 0 {
		return max(m.test.waiterLinger, 0)
	}
	return waiterLinger
}

// dropWaiter ends ks's registration (run forgets the key): it lingers
// (see waiterLinger), unless the Manager is closing or too many linger.
func (st *loopState) dropWaiter(ks *keyState) {
	if !ks.waitReg {
		return
	}
	ks.waitReg = false
	linger := st.m.waiterLinger()
	if st.closing || st.lis.mail == nil || linger <= 0 || len(st.lingering) >= maxLingering {
		st.lis.want(sessionLock{classWaiter, ks.key}, false)
		return
	}
	if st.lingering == nil {
		st.lingering = make(map[string]time.Time)
	}
	until := st.m.now().Add(linger)
	st.lingering[ks.key] = until
	if st.lingerAt.IsZero() {
		st.lingerAt = until
	}
}

// resumeWaiter gives a key state that is being made back the
// registration that lingers for its key, if any (keyFor).
func (st *loopState) resumeWaiter(ks *keyState) {
	if _, ok := st.lingering[ks.key]; ok {
		delete(st.lingering, ks.key)
		ks.waitReg = st.lis.mail != nil
	}
}

// sweepLingering drops the registrations whose linger has ended, and
// those that would end within the next quarter of it (so that one sweep,
// one unregister statement, takes many), and schedules the next sweep.
func (st *loopState) sweepLingering(now time.Time) {
	if st.lingerAt.IsZero() || now.Before(st.lingerAt) {
		return
	}
	cut := now.Add(st.m.waiterLinger() / 4)
	var next time.Time
	for key, until := range st.lingering {
		if !until.After(cut) {
			delete(st.lingering, key)
			st.lis.want(sessionLock{classWaiter, key}, false)
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
func (st *loopState) handleRegistered(locks []sessionLock) {
	n := 0
	for _, k := range locks {
		if k.class == classWatch {
			st.handleWatchRegistered(k.key) // watch.go
			continue
		}
		if k.class != classWaiter {
			continue
		}
		n++
		ks := st.keys[k.key]
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
		st.sig().woken.signal(ks.key)
	}
	st.sig().registered.signal(n)
}
