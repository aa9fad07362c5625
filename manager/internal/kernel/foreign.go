package kernel

import (
	"container/heap"
	"time"

	"github.com/pglease/pglease/internal/store"
)

// Keys shared with foreign holders. A SyncGuard process (or any process
// that takes the key without pglease) never LISTENs: its waiters poll with
// backoff (SyncGuard: 100 ms doubling, equal jitter, 5 s timeout), while a
// Manager hears every release at once and hands the key over locally in
// one statement. Left alone, the Managers keep such a key all the time: a
// poller finds it free only in the instant between a release and the next
// Manager's grant, backs off further at every refusal, and times out.
//
// How a Manager knows: an attempt's "locked" answer names no pglease
// holder. Every pglease grant writes a holder row (its identity, under
// the grant's lockId) in the grant's transaction, SyncGuard's none, so a
// live exclusive row whose lockId has no holder row is a foreign holder's
// (foreignHolder). A foreign waiter itself leaves no trace (a refused
// SyncGuard attempt writes nothing), but a key a foreign process held
// lately is one its waiters poll. Such a key is shared in time, for
// foreignMemory after a Manager last found a foreign holder on it:
//
//   - The Managers' stint: from the moment the Managers get the key back
//     (a grant here, a pglease holder found, or the notified release of
//     the foreign holder found last), for foreignStint, the Managers use
//     the key as usual: local handoffs, and plain releases that the
//     Managers' waiters race for.
//   - The window: the first plain release of the key by a Manager at the
//     stint's end or after it (its own release here, or the notified
//     release of any Manager's holder, the last quarter of the stint
//     included: the Managers' stints start a round trip apart) ends the
//     stint; no handoff is made once the stint has run out. The key is
//     then left to foreign pollers: no Manager sends an attempt of it for
//     foreignShare times as long as the stint lasted (foreignWindow at
//     least, maxForeignWindow at most). A foreign holder that took the
//     key in the window and still holds it at its end is found by the
//     Managers' next attempts, and its release starts their next stint.
//
// The window scales with the stint actually taken (a loaded server's
// slow round trips stretch it past foreignStint), so the Managers hold
// such a key at most 1/(1+foreignShare) of the time whatever the round
// trip. Every Manager applies the rule on its own, from what it sees: its
// attempts' answers, its grants, and the release notifications (which
// the release trigger sends for every deleted row, SyncGuard's
// included: docs/syncguard.md). All Managers hear a plain release at the
// same moment, so their windows open together. A key no Manager ever
// found held by a foreign holder has no entry: pure pglease fleets pay a
// length check of an empty map per attempt and per notification.
//
// The cost: on such a key the Managers' throughput falls to what their
// stints carry (docs/syncguard.md has the bench figures). A pglease
// process that runs the store alone (pg.Store, no Manager) records a
// holder and so counts as a Manager here, although it polls.
const (
	foreignMemory    = 10 * time.Second
	foreignStint     = 10 * time.Millisecond
	foreignShare     = 3
	foreignWindow    = 30 * time.Millisecond
	maxForeignWindow = time.Second
	maxForeignKeys   = 10_000
)

// foreignKey is what a Manager knows of a key shared with foreign holders
// (LoopState.foreign, by key hash: it outlives the key's KeyState, which
// goes when no caller here wants the key). Owned by run.
type foreignKey struct {
	seen time.Time // last "locked" answer that named a foreign holder
	// heldForeign: that answer is the latest news of the key, so the next
	// release notified is the foreign holder's.
	heldForeign bool
	stintStart  time.Time // start of the Managers' stint (zero: none since the last window)
	stintEnd    time.Time // end of the stint's handoffs
	windowEnd   time.Time // end of the window left to foreign pollers
}

// foreignHolder reports whether the "locked" answer r names a holder that
// is not a pglease process: an exclusive row (its expiry known) without a
// holder identity (every pglease grant records one, SyncGuard's none),
// and no shared holds.
func foreignHolder(r store.AcquireResult) bool {
	return !r.OK && r.Err == nil && r.Holder == "" && r.SharedHolders == 0 && !r.ExpiresAt.IsZero()
}

// foreignKeyOf returns hash's entry while it is fresh (nil otherwise, and
// a stale one is forgotten).
func (st *LoopState) foreignKeyOf(hash string, now time.Time) *foreignKey {
	f := st.foreign[hash]
	if f != nil && now.Sub(f.seen) > foreignMemory {
		delete(st.foreign, hash)
		return nil
	}
	return f
}

// noteLocked takes a "locked" answer r of an attempt of ks's key.
func (st *LoopState) noteLocked(ks *KeyState, r store.AcquireResult, now time.Time) {
	if foreignHolder(r) {
		st.m.Rec.ForeignHolder() // one Info record when the release trigger is missing
		f := st.foreign[ks.hash]
		if f == nil {
			if len(st.foreign) >= maxForeignKeys {
				for h, o := range st.foreign {
					if now.Sub(o.seen) > foreignMemory {
						delete(st.foreign, h)
					}
				}
				if len(st.foreign) >= maxForeignKeys {
					return
				}
			}
			if st.foreign == nil {
				st.foreign = make(map[string]*foreignKey)
			}
			f = &foreignKey{}
			st.foreign[ks.hash] = f
		}
		f.seen, f.heldForeign = now, true
		return
	}
	if f := st.foreignKeyOf(ks.hash, now); f != nil {
		f.heldForeign = false
		if r.Holder != "" {
			f.startStint(now) // another Manager has the key
		}
	}
}

// startStint starts the Managers' stint at now, unless one is running.
func (f *foreignKey) startStint(now time.Time) {
	if f.stintStart.IsZero() {
		f.stintStart, f.stintEnd = now, now.Add(foreignStint)
	}
}

// openWindow ends the stint at now and leaves the key to foreign pollers
// for foreignShare times as long as the stint lasted (within bounds).
func (f *foreignKey) openWindow(now time.Time) {
	w := foreignWindow
	if !f.stintStart.IsZero() {
		w = min(max(w, foreignShare*now.Sub(f.stintStart)), maxForeignWindow)
	}
	f.windowEnd = now.Add(w)
	f.stintStart, f.stintEnd = time.Time{}, time.Time{}
}

// noteForeignGrant: this process got ks's key.
func (st *LoopState) noteForeignGrant(ks *KeyState) {
	if len(st.foreign) == 0 {
		return
	}
	now := st.m.Now()
	if f := st.foreignKeyOf(ks.hash, now); f != nil {
		f.heldForeign = false
		f.startStint(now)
	}
}

// noteReleased takes the notification of a release of the key whose hash
// is hash, by any process (this one's included).
func (st *LoopState) noteReleased(hash string) {
	if len(st.foreign) == 0 {
		return
	}
	now := st.m.Now()
	f := st.foreignKeyOf(hash, now)
	switch {
	case f == nil:
	case f.heldForeign:
		// The foreign holder let go: the Managers' stint starts.
		f.heldForeign = false
		f.windowEnd = time.Time{}
		f.stintStart = time.Time{}
		f.startStint(now)
	case now.Before(f.windowEnd):
		// A foreign holder's release in the window (no Manager takes the
		// key then), or this process's own, which opened it.
	case !f.stintStart.IsZero() && now.Before(f.stintEnd.Add(-foreignStint/4)):
		// A Manager's plain release early in the stint: the Managers'
		// waiters race for the key, as usual.
	default:
		// A Manager's plain release after the stint, or near its end
		// (another Manager's stint started a round trip earlier than
		// this one's, and its release after it ends both).
		f.openWindow(now)
	}
}

// yieldForeign is run at a plain release of ks's key here. It reports
// whether a handoff may be made instead: the key is not shared, or the
// stint is running. Otherwise the release opens the window at once (this
// process's waiters wait for it too; the release's own notification,
// heard later, finds the window open).
func (st *LoopState) yieldForeign(ks *KeyState) bool {
	if len(st.foreign) == 0 {
		return true
	}
	now := st.m.Now()
	f := st.foreignKeyOf(ks.hash, now)
	if f == nil || now.Before(f.stintEnd) {
		return true
	}
	f.openWindow(now)
	return false
}

// foreignWait reports whether ks's key is in a window left to foreign
// pollers, and if so schedules its next attempt for the window's end.
func (st *LoopState) foreignWait(ks *KeyState) bool {
	if len(st.foreign) == 0 {
		return false
	}
	now := st.m.Now()
	f := st.foreignKeyOf(ks.hash, now)
	if f == nil || !now.Before(f.windowEnd) {
		return false
	}
	if ks.retryAt.Equal(f.windowEnd) {
		return true // already scheduled
	}
	ks.retryAt = f.windowEnd
	ks.retryGen++
	heap.Push(&st.retries, retryEntry{at: ks.retryAt, ks: ks, gen: ks.retryGen})
	return true
}
