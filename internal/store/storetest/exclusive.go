package storetest

import (
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
)

var acquireTests = []test{
	{"GrantsFreeKey", func(t *testing.T, e *env) {
		before := e.Now(t)
		id := keys.NewLockID()
		r := e.acquireReq(e.Store, store.AcquireRequest{Key: "k", TTL: long, LockID: id})
		after := e.Now(t)
		if !r.OK || r.LockID != id || r.Fence != 1 {
			t.Fatalf("first grant of a key: %+v, want OK with the given lockId and fence 1", r)
		}
		e.between("AcquiredAt", r.AcquiredAt, before, after)
		if got := r.ExpiresAt.Sub(r.AcquiredAt); got != long {
			t.Fatalf("ExpiresAt - AcquiredAt = %v, want the TTL %v", got, long)
		}
	}},
	{"GeneratesLockID", func(t *testing.T, e *env) {
		res, err := e.Store.AcquireMany(e.ctx(), []store.AcquireRequest{{Key: "k", TTL: long}})
		if err != nil || len(res) != 1 || !res[0].OK {
			t.Fatalf("AcquireMany = %+v, %v", res, err)
		}
		if err := keys.ValidateLockID(res[0].LockID); err != nil {
			t.Fatalf("generated lockId: %v", err)
		}
		if !e.extend(e.Store, res[0].LockID, long).OK {
			t.Fatal("the generated lockId does not hold the lease")
		}
	}},
	{"HeldKeyRefused", func(t *testing.T, e *env) {
		g := e.mustAcquire(e.Store, "k", long)
		r := e.acquire(e.Other, "k", long)
		e.refused("acquire of a held key", r)
		if !r.ExpiresAt.Equal(g.ExpiresAt) || r.Holder != HolderA || r.SharedHolders != 0 || r.Delayed || r.LockID != "" || r.Fence != 0 {
			t.Fatalf("refusal = %+v, want the holder's expiry %v and identity %q", r, g.ExpiresAt, HolderA)
		}
		e.within("RetryAfter", r.RetryAfter, long-time.Minute/2, long+keys.TimeTolerance)
		// The holder's own second attempt with another lockId is refused too.
		e.refused("second acquire by the holder", e.acquire(e.Store, "k", long))
	}},
	{"FencesStrictlyIncrease", func(t *testing.T, e *env) {
		var last pglease.Fence
		for i := 0; i < 4; i++ {
			g := e.mustAcquire(e.Store, "k", long)
			if g.Fence <= last {
				t.Fatalf("grant %d: fence %v not above %v", i, g.Fence, last)
			}
			last = g.Fence
			if i%2 == 0 {
				e.release(e.Store, "k", g.LockID)
			} else {
				e.revoke(e.Other, store.RevokeRequest{Key: "k"})
			}
		}
		p := e.mustShared(e.Store, "k", long, 2)
		if p.Fence <= last {
			t.Fatalf("permit fence %v not above the last exclusive fence %v", p.Fence, last)
		}
		e.release(e.Store, "k", p.LockID)
		g := e.mustAcquire(e.Store, "k", long)
		if g.Fence <= p.Fence {
			t.Fatalf("exclusive fence %v not above the permit's %v", g.Fence, p.Fence)
		}
		// Another key has its own counter.
		if o := e.mustAcquire(e.Store, "other", long); o.Fence != 1 {
			t.Fatalf("first grant of another key: fence %v, want 1", o.Fence)
		}
	}},
	{"BatchPerItem", func(t *testing.T, e *env) {
		e.mustAcquire(e.Other, "held", long)
		res, err := e.Store.AcquireMany(e.ctx(), []store.AcquireRequest{
			{Key: "a", TTL: long}, {Key: "held", TTL: long}, {Key: "b", TTL: long}, {Key: "a", TTL: long},
		})
		if err != nil || len(res) != 4 {
			t.Fatalf("AcquireMany = %+v, %v", res, err)
		}
		if !res[0].OK || res[1].OK || !res[2].OK || res[3].OK {
			t.Fatalf("per-item results %+v: want a granted, held refused, b granted, a's second item refused", res)
		}
		if res[1].Holder != HolderB || res[3].Holder != HolderA {
			t.Fatalf("refusals name holders %q and %q, want %q and %q", res[1].Holder, res[3].Holder, HolderB, HolderA)
		}
	}},
	{"EmptyBatch", func(t *testing.T, e *env) {
		res, err := e.Store.AcquireMany(e.ctx(), nil)
		if err != nil || res == nil || len(res) != 0 {
			t.Fatalf("AcquireMany(nil) = %#v, %v, want an empty slice", res, err)
		}
	}},
	{"InvalidInput", func(t *testing.T, e *env) {
		id := keys.NewLockID()
		for name, reqs := range map[string][]store.AcquireRequest{
			"empty key":        {{Key: "", TTL: long}},
			"zero TTL":         {{Key: "k"}},
			"sub-ms TTL":       {{Key: "k", TTL: time.Millisecond + 1}},
			"bad lockId":       {{Key: "k", TTL: long, LockID: "nope"}},
			"negative delay":   {{Key: "k", TTL: long, LockDelay: -time.Second}},
			"duplicate lockId": {{Key: "k", TTL: long, LockID: id}, {Key: "j", TTL: long, LockID: id}},
		} {
			_, err := e.Store.AcquireMany(e.ctx(), reqs)
			e.invalid(name, err)
		}
		// Nothing was written by the refused calls.
		if st := e.snapshot(e.Store, "k"); st.Counter != 0 || st.LockIDHash != "" {
			t.Fatalf("an invalid call wrote: %+v", st)
		}
	}},
	{"ExpiryAndTakeover", func(t *testing.T, e *env) {
		g := e.mustAcquire(e.Store, "k", short)
		e.expire(short)
		r := e.mustAcquire(e.Other, "k", long)
		if r.Fence != g.Fence+1 {
			t.Fatalf("takeover fence %v, want %v", r.Fence, g.Fence+1)
		}
		if e.extend(e.Store, g.LockID, long).OK {
			t.Fatal("the expired holder extended the taken-over lease")
		}
	}},
	{"LiveForAcquirersWithinTolerance", func(t *testing.T, e *env) {
		// A lease is live for acquirers until ExpiresAt + 1 s: the attempt is
		// checked against the clock readings around it, whatever the
		// machine's delays.
		g := e.mustAcquire(e.Store, "k", time.Millisecond)
		e.Advance(t, 2*time.Millisecond)
		before := e.Now(t)
		r := e.acquire(e.Other, "k", long)
		after := e.Now(t)
		tol := g.ExpiresAt.Add(keys.TimeTolerance)
		switch {
		case after.Before(tol) && r.OK:
			t.Fatalf("granted at most %v after the expiry, inside the tolerance", after.Sub(g.ExpiresAt))
		case !before.Before(tol) && !r.OK:
			t.Fatalf("refused %v after the expiry, past the tolerance: %+v", before.Sub(g.ExpiresAt), r)
		case !r.OK:
			e.within("RetryAfter inside the tolerance", r.RetryAfter, 0, keys.TimeTolerance+time.Millisecond)
		}
	}},
}

var extendTests = []test{
	{"Live", func(t *testing.T, e *env) {
		g := e.mustAcquire(e.Store, "k", long)
		before := e.Now(t)
		x := e.extend(e.Store, g.LockID, 2*long)
		after := e.Now(t)
		if !x.OK || x.Revoked {
			t.Fatalf("extend of a live lease: %+v", x)
		}
		e.between("new expiry", x.ExpiresAt, before.Add(2*long), after.Add(2*long))
		// The expiry is replaced, not added to: a shorter TTL moves it back.
		y := e.extend(e.Store, g.LockID, long)
		if !y.OK || !y.ExpiresAt.Before(x.ExpiresAt) {
			t.Fatalf("extend with a shorter TTL: %+v after %v", y, x.ExpiresAt)
		}
		if info, _ := e.Store.LookupByKey(e.ctx(), "k"); info == nil || !info.ExpiresAt.Equal(y.ExpiresAt) || info.Fence != g.Fence {
			t.Fatalf("lookup after extend: %v, want expiry %v and the grant's fence", info, y.ExpiresAt)
		}
	}},
	{"Expired", func(t *testing.T, e *env) {
		g := e.mustAcquire(e.Store, "k", short)
		e.Advance(t, short+10*time.Millisecond)
		if x := e.extend(e.Store, g.LockID, long); x.OK || x.Revoked {
			t.Fatalf("extend of an expired lease: %+v, want not OK, not revoked", x)
		}
	}},
	{"WrongLockID", func(t *testing.T, e *env) {
		e.mustAcquire(e.Store, "k", long)
		if x := e.extend(e.Store, keys.NewLockID(), long); x.OK || x.Revoked {
			t.Fatalf("extend of an unknown lockId: %+v", x)
		}
	}},
	{"Released", func(t *testing.T, e *env) {
		g := e.mustAcquire(e.Store, "k", long)
		e.release(e.Store, "k", g.LockID)
		if x := e.extend(e.Store, g.LockID, long); x.OK || x.Revoked {
			t.Fatalf("extend of a released lease: %+v", x)
		}
	}},
	{"Revoked", func(t *testing.T, e *env) {
		g := e.mustAcquire(e.Store, "k", long)
		e.revoke(e.Other, store.RevokeRequest{Key: "k"})
		if x := e.extend(e.Store, g.LockID, long); x.OK || !x.Revoked {
			t.Fatalf("extend of a revoked lease: %+v, want Revoked", x)
		}
		// Still told after the key was granted again.
		e.mustAcquire(e.Other, "k", long)
		if x := e.extend(e.Store, g.LockID, long); x.OK || !x.Revoked {
			t.Fatalf("extend of a revoked lease after a new grant: %+v, want Revoked", x)
		}
	}},
	{"RevokedOnlyLastPerKey", func(t *testing.T, e *env) {
		// The store remembers the last revoked lockId of each key: a later
		// revoke of the key makes an earlier revoked holder's extend an
		// expiry-like answer.
		g1 := e.mustAcquire(e.Store, "k", long)
		e.revoke(e.Other, store.RevokeRequest{Key: "k"})
		g2 := e.mustAcquire(e.Store, "k", long)
		e.revoke(e.Other, store.RevokeRequest{Key: "k"})
		if x := e.extend(e.Store, g2.LockID, long); !x.Revoked {
			t.Fatalf("extend of the last revoked lease: %+v, want Revoked", x)
		}
		if x := e.extend(e.Store, g1.LockID, long); x.OK || x.Revoked {
			t.Fatalf("extend of an earlier revoked lease: %+v, want neither OK nor Revoked", x)
		}
	}},
	{"SharedHold", func(t *testing.T, e *env) {
		r := e.mustShared(e.Store, "k", long, 0)
		if x := e.extend(e.Store, r.LockID, 2*long); !x.OK || !x.ExpiresAt.After(r.ExpiresAt) {
			t.Fatalf("extend of a reader: %+v", x)
		}
		if st := e.snapshot(e.Store, "k"); st.Shared != 1 || !st.SharedExpiresAt.After(r.ExpiresAt) {
			t.Fatalf("snapshot after extending a reader: %+v", st)
		}
	}},
	{"Batch", func(t *testing.T, e *env) {
		a := e.mustAcquire(e.Store, "a", long)
		b := e.mustShared(e.Store, "b", long, 3)
		res, err := e.Store.ExtendMany(e.ctx(), []store.ExtendRequest{
			{LockID: a.LockID, TTL: long}, {LockID: keys.NewLockID(), TTL: long}, {LockID: b.LockID, TTL: long},
		})
		if err != nil || len(res) != 3 || !res[0].OK || res[1].OK || !res[2].OK {
			t.Fatalf("ExtendMany = %+v, %v", res, err)
		}
		if res, err := e.Store.ExtendMany(e.ctx(), nil); err != nil || len(res) != 0 {
			t.Fatalf("ExtendMany(nil) = %+v, %v", res, err)
		}
	}},
	{"InvalidInput", func(t *testing.T, e *env) {
		_, err := e.Store.ExtendMany(e.ctx(), []store.ExtendRequest{{LockID: keys.NewLockID()}})
		e.invalid("zero TTL", err)
		_, err = e.Store.ExtendMany(e.ctx(), []store.ExtendRequest{{LockID: "x", TTL: long}})
		e.invalid("bad lockId", err)
	}},
}

var releaseTests = []test{
	{"Live", func(t *testing.T, e *env) {
		g := e.mustAcquire(e.Store, "k", long)
		if ok := e.release(e.Store, "k", g.LockID); !ok[0] {
			t.Fatal("release of a live lease: false")
		}
		if ok := e.release(e.Store, "k", g.LockID); ok[0] {
			t.Fatal("second release: true")
		}
		if info, err := e.Store.LookupByKey(e.ctx(), "k"); info != nil || err != nil {
			t.Fatalf("lookup after release: %v, %v", info, err)
		}
		e.mustAcquire(e.Other, "k", long)
	}},
	{"WrongLockID", func(t *testing.T, e *env) {
		e.mustAcquire(e.Store, "k", long)
		if ok := e.release(e.Other, "k", keys.NewLockID()); ok[0] {
			t.Fatal("release of an unknown lockId: true")
		}
		e.refused("acquire after a release by a stranger", e.acquire(e.Other, "k", long))
	}},
	{"Expired", func(t *testing.T, e *env) {
		g := e.mustAcquire(e.Store, "k", short)
		e.Advance(t, short+10*time.Millisecond)
		if ok := e.release(e.Store, "k", g.LockID); ok[0] {
			t.Fatal("release of an expired lease: true")
		}
	}},
	{"Shared", func(t *testing.T, e *env) {
		r1 := e.mustShared(e.Store, "k", long, 0)
		r2 := e.mustShared(e.Other, "k", long, 0)
		if ok := e.release(e.Store, "k", r1.LockID); !ok[0] {
			t.Fatal("release of a reader: false")
		}
		if st := e.snapshot(e.Store, "k"); st.Shared != 1 {
			t.Fatalf("after releasing one of two readers: Shared = %d", st.Shared)
		}
		e.release(e.Store, "k", r2.LockID)
		e.mustAcquire(e.Store, "k", long)
	}},
	{"Batch", func(t *testing.T, e *env) {
		a := e.mustAcquire(e.Store, "a", long)
		b := e.mustAcquire(e.Store, "b", long)
		res, err := e.Store.ReleaseWaited(e.ctx(), []store.ReleaseRequest{
			{LockID: a.LockID, Key: "a"}, {LockID: keys.NewLockID(), Key: "c"}, {LockID: b.LockID, Key: "b"}, {LockID: a.LockID, Key: "a"},
		})
		if err != nil || len(res) != 4 || !res[0] || res[1] || !res[2] || res[3] {
			t.Fatalf("ReleaseWaited = %v, %v, want [true false true false]", res, err)
		}
		if res, err := e.Store.ReleaseWaited(e.ctx(), nil); err != nil || len(res) != 0 {
			t.Fatalf("ReleaseWaited(nil) = %v, %v", res, err)
		}
	}},
	{"InvalidInput", func(t *testing.T, e *env) {
		_, err := e.Store.ReleaseWaited(e.ctx(), []store.ReleaseRequest{{LockID: "x", Key: "k"}})
		e.invalid("bad lockId", err)
		_, err = e.Store.ReleaseWaited(e.ctx(), []store.ReleaseRequest{{LockID: keys.NewLockID(), Key: ""}})
		e.invalid("empty key", err)
	}},
}

var delayTests = []test{
	{"AfterExpiry", func(t *testing.T, e *env) {
		g := e.acquireReq(e.Store, store.AcquireRequest{Key: "k", TTL: short, LockID: keys.NewLockID(), LockDelay: delay})
		if !g.OK {
			t.Fatalf("grant with a lock delay: %+v", g)
		}
		e.expire(short)
		r := e.acquire(e.Other, "k", long)
		e.refused("acquire inside the lock delay", r)
		if !r.Delayed || !r.ExpiresAt.Equal(g.ExpiresAt) {
			t.Fatalf("refusal inside the lock delay: %+v, want Delayed and the expired grant's expiry", r)
		}
		e.within("RetryAfter", r.RetryAfter, delay-delay/2, delay)
		e.refused("reader inside the lock delay", e.shared(e.Other, "k", long, 0))
		st := e.snapshot(e.Store, "k")
		if st.Held || st.LockDelay != delay || st.LockIDHash != pglease.HashKey(g.LockID) {
			t.Fatalf("snapshot inside the lock delay: %+v", st)
		}
		if info, _ := e.Store.LookupByKey(e.ctx(), "k"); info != nil {
			t.Fatalf("lookup of an expired lease inside its lock delay: %v, want nil (not live)", info)
		}
	}},
	{"NoneAfterRelease", func(t *testing.T, e *env) {
		g := e.acquireReq(e.Store, store.AcquireRequest{Key: "k", TTL: long, LockID: keys.NewLockID(), LockDelay: delay})
		e.release(e.Store, "k", g.LockID)
		e.mustAcquire(e.Other, "k", long)
	}},
	{"ShortDelayIsTolerance", func(t *testing.T, e *env) {
		// A lock delay below the tolerance changes nothing: the key is free
		// once the tolerance has passed.
		e.acquireReq(e.Store, store.AcquireRequest{Key: "k", TTL: short, LockID: keys.NewLockID(), LockDelay: 500 * time.Millisecond})
		e.expire(short)
		e.mustAcquire(e.Other, "k", long)
	}},
	{"InvalidInput", func(t *testing.T, e *env) {
		_, err := e.Store.AcquireMany(e.ctx(), []store.AcquireRequest{{Key: "k", TTL: long, LockDelay: time.Millisecond / 2}})
		e.invalid("sub-ms lock delay", err)
	}},
}
