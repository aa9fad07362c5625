package storetest

import (
	"slices"
	"testing"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
)

// listener is a test's view of the notify channel.
type listener struct {
	Listener
	e  *env
	id string
}

func (e *env) listen() *listener {
	e.t.Helper()
	if e.Listen == nil {
		e.t.Skip("the harness cannot listen")
	}
	return &listener{Listener: e.Listen(e.t), e: e, id: pglease.HashKey(keys.NewLockID())[:8]}
}

// k returns a key of this test's own: waiter locks and notify channels
// are the database's, shared by the tests that run at the same time.
func (l *listener) k(name string) string { return name + "-" + l.id }

// during returns the payloads op caused: op runs, then a release request
// of a key of its own (a marker) is sent, and the payloads received
// before the marker are op's (a channel delivers in commit order).
func (l *listener) during(op func()) []string {
	l.e.t.Helper()
	op()
	marker := l.k("storetest-marker")
	if err := l.e.Other.RequestRelease(l.e.ctx(), []string{marker}, nil); err != nil {
		l.e.t.Fatalf("RequestRelease of the marker: %v", err)
	}
	want := "q:" + pglease.HashKey(marker)
	var got []string
	for {
		p := l.Next()
		if p == want {
			return got
		}
		got = append(got, p)
	}
}

// same checks the payloads, in any order (a statement deletes a key's
// shared holds in no set order).
func (l *listener) same(what string, got []string, want ...string) {
	l.e.t.Helper()
	g, w := slices.Clone(got), slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	if !slices.Equal(g, w) {
		l.e.t.Fatalf("%s notified %q, want %q", what, got, want)
	}
}

func revoked(key, lockID string) string {
	return "r:" + pglease.HashKey(key) + ":" + pglease.HashKey(lockID)
}

var notifyTests = []test{
	{"GrantsAndExtendsSendNothing", func(t *testing.T, e *env) {
		l := e.listen()
		l.Wait(l.k("k"))
		got := l.during(func() {
			g := e.mustAcquire(e.Store, l.k("k"), long)
			e.extend(e.Store, g.LockID, long)
			e.mustShared(e.Store, l.k("r"), long, 0)
			e.sets(e.Store, []string{l.k("s1"), l.k("s2")})
			e.snapshot(e.Store, l.k("k"))
		})
		l.same("grants, an extend and a snapshot", got)
	}},
	{"ReleaseWakesOnlyWaitedKeys", func(t *testing.T, e *env) {
		l := e.listen()
		a := e.mustAcquire(e.Store, l.k("a"), long)
		b := e.mustAcquire(e.Store, l.k("b"), long)
		r := e.mustShared(e.Store, l.k("r"), long, 0)
		l.Wait(l.k("b"))
		l.Wait(l.k("r"))
		got := l.during(func() { e.release(e.Store, l.k("a"), a.LockID, b.LockID, keys.NewLockID()) })
		l.same("a release of a key nobody waits for and of one waited for", got, pglease.HashKey(l.k("b")))
		got = l.during(func() { e.release(e.Store, l.k("r"), r.LockID) })
		l.same("a release of a waited reader", got, pglease.HashKey(l.k("r")))
	}},
	{"Revoke", func(t *testing.T, e *env) {
		l := e.listen()
		g := e.mustAcquire(e.Store, l.k("k"), long)
		got := l.during(func() { e.revoke(e.Other, store.RevokeRequest{Key: l.k("k")}) })
		l.same("a revoke of a key nobody waits for", got, revoked(l.k("k"), g.LockID))
		r1 := e.mustShared(e.Store, l.k("r"), long, 0)
		r2 := e.mustShared(e.Store, l.k("r"), long, 0)
		l.Wait(l.k("r"))
		got = l.during(func() { e.revoke(e.Other, store.RevokeRequest{Key: l.k("r")}) })
		// The wake-up is sent once per hold, and delivered once.
		l.same("a revoke of two readers of a waited key", got, revoked(l.k("r"), r1.LockID), revoked(l.k("r"), r2.LockID), pglease.HashKey(l.k("r")))
		got = l.during(func() { e.revoke(e.Other, store.RevokeRequest{Key: l.k("r")}) })
		l.same("a revoke that found nothing", got)
	}},
	{"RequestRelease", func(t *testing.T, e *env) {
		l := e.listen()
		hold := pglease.HashKey(keys.NewLockID())
		got := l.during(func() {
			if err := e.Store.RequestRelease(e.ctx(), []string{l.k("k"), l.k("cafe\u0301"), l.k("k"), l.k("j")}, []string{"", "", "", hold}); err != nil {
				t.Fatal(err)
			}
		})
		l.same("release requests", got, "q:"+pglease.HashKey(l.k("k")), "q:"+pglease.HashKey(l.k("caf\u00e9")), "q:"+pglease.HashKey(l.k("j"))+":"+hold)
	}},
	{"FirstSharedRefusalWakes", func(t *testing.T, e *env) {
		// The first reader a writer refuses wakes the key's waiters, so that
		// a writer waiting marks the key at its next attempt; later ones
		// do not.
		l := e.listen()
		e.mustAcquire(e.Store, l.k("k"), long)
		l.Wait(l.k("k"))
		got := l.during(func() { e.refused("reader", e.shared(e.Other, l.k("k"), long, 0)) })
		l.same("the first refused reader", got, pglease.HashKey(l.k("k")))
		got = l.during(func() { e.refused("reader", e.shared(e.Other, l.k("k"), long, 0)) })
		l.same("the second refused reader", got)
	}},
	{"HandOff", func(t *testing.T, e *env) {
		l := e.listen()
		old := e.mustAcquire(e.Store, l.k("k"), long)
		l.Wait(l.k("k"))
		got := l.during(func() {
			e.handOff(e.Store, store.HandOffRequest{Old: old.LockID, Key: l.k("k"), TTL: long, LockID: keys.NewLockID()})
		})
		l.same("a handoff in place", got)
	}},
	{"HandOffAtLimitWakesAlways", func(t *testing.T, e *env) {
		l := e.listen()
		e.atLimit(l.k("k"), keys.FenceMax-1)
		old := e.mustAcquire(e.Store, l.k("k"), long)
		got := l.during(func() {
			if _, err := e.Store.HandOff(e.ctx(), []store.HandOffRequest{{Old: old.LockID, Key: l.k("k"), TTL: long}}); err != nil {
				t.Fatal(err)
			}
		})
		l.same("a handoff at the fence limit (a release)", got, pglease.HashKey(l.k("k")))
	}},
}

// exact checks the payloads and their order.
func (l *listener) exact(what string, got []string, want ...string) {
	l.e.t.Helper()
	if !slices.Equal(got, want) {
		l.e.t.Fatalf("%s notified %q, want %q", what, got, want)
	}
}

func watchEvent(key string, ev store.WatchEvent, f pglease.Fence) string {
	return "w:" + pglease.HashKey(key) + ":" + string(rune(ev)) + ":" + f.String()
}

var watchTests = []test{
	{"Exclusive", func(t *testing.T, e *env) {
		l := e.listen()
		k := l.k("k")
		l.Watch(k)
		var g store.AcquireResult
		l.exact("a grant", l.during(func() { g = e.mustAcquire(e.Store, k, long) }), watchEvent(k, store.WatchGranted, 1))
		l.exact("an extend", l.during(func() { e.extend(e.Store, g.LockID, long) }))
		l.exact("a release", l.during(func() { e.release(e.Store, k, g.LockID) }), watchEvent(k, store.WatchReleased, 1))
		l.exact("a grant", l.during(func() { g = e.mustAcquire(e.Store, k, long) }), watchEvent(k, store.WatchGranted, 2))
		var h store.HandOffResult
		l.exact("a handoff", l.during(func() {
			h = e.handOff(e.Store, store.HandOffRequest{Old: g.LockID, Key: k, TTL: long, LockID: keys.NewLockID()})
		}), watchEvent(k, store.WatchReleased, 2), watchEvent(k, store.WatchGranted, 3))
		l.exact("a revoke", l.during(func() { e.revoke(e.Other, store.RevokeRequest{Key: k}) }),
			revoked(k, h.LockID), watchEvent(k, store.WatchRevoked, 3))
		other := l.k("unwatched")
		l.exact("a set", l.during(func() { e.sets(e.Store, []string{k, other}) }), watchEvent(k, store.WatchGranted, 4))
	}},
	{"Shared", func(t *testing.T, e *env) {
		l := e.listen()
		k := l.k("k")
		l.Watch(k)
		var r store.AcquireResult
		l.exact("a reader", l.during(func() { r = e.mustShared(e.Store, k, long, 0) }), watchEvent(k, store.WatchSharedGranted, 0))
		l.exact("its release", l.during(func() { e.release(e.Store, k, r.LockID) }), watchEvent(k, store.WatchSharedReleased, 0))
		var p store.AcquireResult
		l.exact("a permit", l.during(func() { p = e.mustShared(e.Store, k, long, 2) }), watchEvent(k, store.WatchSharedGranted, 1))
		l.exact("its revoke", l.during(func() { e.revoke(e.Other, store.RevokeRequest{Key: k}) }),
			revoked(k, p.LockID), watchEvent(k, store.WatchSharedReleased, 1))
	}},
	{"HandOffAtLimit", func(t *testing.T, e *env) {
		l := e.listen()
		k := l.k("k")
		e.atLimit(k, keys.FenceMax-1)
		old := e.mustAcquire(e.Store, k, long)
		l.Watch(k)
		got := l.during(func() {
			if _, err := e.Store.HandOff(e.ctx(), []store.HandOffRequest{{Old: old.LockID, Key: k, TTL: long}}); err != nil {
				t.Fatal(err)
			}
		})
		l.exact("a handoff at the fence limit", got, pglease.HashKey(k), watchEvent(k, store.WatchReleased, keys.FenceMax))
	}},
}
