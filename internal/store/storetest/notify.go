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
	e    *env
	next func() string
	wait func(key string)
	id   string
}

func (e *env) listen() *listener {
	e.t.Helper()
	if e.Listen == nil {
		e.t.Skip("the harness cannot listen")
	}
	next, wait := e.Listen(e.t)
	return &listener{e: e, next: next, wait: wait, id: pglease.HashKey(keys.NewLockID())[:8]}
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
		p := l.next()
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
		l.wait(l.k("k"))
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
		l.wait(l.k("b"))
		l.wait(l.k("r"))
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
		l.wait(l.k("r"))
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
		l.wait(l.k("k"))
		got := l.during(func() { e.refused("reader", e.shared(e.Other, l.k("k"), long, 0)) })
		l.same("the first refused reader", got, pglease.HashKey(l.k("k")))
		got = l.during(func() { e.refused("reader", e.shared(e.Other, l.k("k"), long, 0)) })
		l.same("the second refused reader", got)
	}},
	{"HandOff", func(t *testing.T, e *env) {
		l := e.listen()
		old := e.mustAcquire(e.Store, l.k("k"), long)
		l.wait(l.k("k"))
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
