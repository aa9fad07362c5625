package kernel

import (
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager/internal/notifier"
)

// TestKernelOneEventAtATime drives a loop state by hand, one event at a
// time, against the real store: each handler's decision is an effect the
// test sees (the batch flush launched, the caller's answer) before it
// performs it, in the order it chooses (effects.go). Two callers want one
// key: the first attempt grants the head, the second waits; the holder's
// release becomes a handoff to the second.
func TestKernelOneEventAtATime(t *testing.T) {
	k, pool := pgKernel(t, Config{})
	// The Manager's own loop ends; the test is the loop from here on
	// (its store and DB workers' code stay usable: the pool is the
	// test's).
	if err := k.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	st := newLoopState(k)
	req := func() *AcquireReq {
		return &AcquireReq{Key: "kernel:step", Hash: pglease.HashKey("kernel:step"), TTL: k.cfg.TTL,
			Reply: make(chan AcquireReply, 1), Final: make(chan AcquireReply, 1)}
	}
	// step flushes, checks the invariants, and performs the one batch the
	// event launched, of kind want, handing its answer back as the next
	// event.
	step := func(want BatchKind) {
		t.Helper()
		st.flush()
		if err := st.checkInvariants(); err != nil {
			t.Fatal(err)
		}
		if len(st.work) != 1 || st.work[0].fl.spec.kind != want {
			t.Fatalf("launched %d batches (first %v), want one %s batch", len(st.work), kindsOf(st.work), want)
		}
		w := st.work[0]
		st.work = st.work[:0]
		go w.run()
		switch want {
		case KindAcquire:
			st.handleAcquireDone(<-k.acquireDoneCh)
		case KindRelease:
			st.handleReleaseDone(<-k.releaseDoneCh)
		case KindHandOff: // both halves, in one event
			d := <-k.releaseDoneCh
			if d.then == nil {
				t.Fatal("a handoff's answer without its grant half")
			}
			st.handleReleaseDone(d)
		}
		if err := st.checkInvariants(); err != nil {
			t.Fatal(err)
		}
	}
	r1, r2 := req(), req()
	st.handleAcquire(r1)
	st.handleAcquire(r2)
	if len(r1.Reply) != 0 || len(r2.Reply) != 0 {
		t.Fatal("answered before any statement")
	}
	step(KindAcquire)
	a1 := <-r1.Reply
	if a1.Lock == nil {
		t.Fatalf("head waiter: %+v, want its lock", a1)
	}
	if len(r2.Reply) != 0 {
		t.Fatal("second waiter answered while the key is held")
	}
	st.flush()
	if len(st.work) != 0 {
		t.Fatalf("%d batches launched for a key held here", len(st.work))
	}
	// Release: one handoff statement releases and grants the next waiter.
	rel := make(chan error, 1)
	st.handleRelease(&ReleaseReq{Lock: a1.Lock, Reply: rel})
	step(KindHandOff)
	if err := <-rel; err != nil {
		t.Fatalf("release: %v", err)
	}
	a2 := <-r2.Reply
	if a2.Lock == nil || a2.Lock.Fence <= a1.Lock.Fence {
		t.Fatalf("second waiter: %+v after fence %v, want a lock with a higher fence", a2, a1.Lock.Fence)
	}
	rel2 := make(chan error, 1)
	st.handleRelease(&ReleaseReq{Lock: a2.Lock, Reply: rel2})
	step(KindRelease)
	if err := <-rel2; err != nil {
		t.Fatalf("release: %v", err)
	}
	if len(st.keys) != 0 || len(st.held) != 0 {
		t.Fatalf("state left: %d keys, %d held", len(st.keys), len(st.held))
	}
	if n := countLocks(t, pool); n != 0 {
		t.Fatalf("%d lock rows left", n)
	}
}

func kindsOf(ws []dbWork) []BatchKind {
	var ks []BatchKind
	for _, w := range ws {
		ks = append(ks, w.fl.spec.kind)
	}
	return ks
}

// reqMakers returns makers of k's acquire requests, as the public calls
// build them: one for a single key (try, shared, limit), set for an
// AcquireAll of keys.
func reqMakers(k *Kernel) (one func(key string, try, shared bool, limit int32) *AcquireReq, set func(try bool, keys ...string) *AcquireReq) {
	one = func(key string, try, shared bool, limit int32) *AcquireReq {
		return &AcquireReq{Key: key, Hash: pglease.HashKey(key), TTL: k.cfg.TTL, Try: try, Shared: shared, Limit: limit,
			Reply: make(chan AcquireReply, 1), Final: make(chan AcquireReply, 1)}
	}
	set = func(try bool, keys ...string) *AcquireReq {
		sk := make([]SetKey, len(keys))
		for i, key := range keys {
			sk[i] = SetKey{Key: key, Hash: pglease.HashKey(key)}
		}
		r := one(keys[0], try, false, 0)
		r.Set = &SetReq{Keys: sk}
		return r
	}
	return one, set
}

// TestPipelineAmbiguousNeverGrants drives every kind of attempt, in both
// modes, through one event by hand: the answer of its round trip is lost
// mid-statement (CodeAmbiguous, fabricated: the statement is never run).
// Ambiguity is never success: nobody is granted, every lockId the batch
// carried is queued for release, a try is answered with the failure, and
// waiters keep waiting (their key's next attempt waits for the release).
func TestPipelineAmbiguousNeverGrants(t *testing.T) {
	k, _ := pgKernel(t, Config{})
	one, set := reqMakers(k)
	for _, c := range []struct {
		name  string
		reqs  []*AcquireReq
		kind  BatchKind
		holds int
		try   bool
	}{
		{"exclusive", []*AcquireReq{one("amb:x", false, false, 0), one("amb:x", false, false, 0)}, KindAcquire, 1, false},
		{"readers", []*AcquireReq{one("amb:r", false, true, 0), one("amb:r", false, true, 0)}, KindShared, 1, false}, // the second joins the queue after the first one's attempt was made
		{"permit", []*AcquireReq{one("amb:p", false, true, 3)}, KindShared, 1, false},
		{"set", []*AcquireReq{set(false, "amb:s1", "amb:s2")}, KindSets, 2, false},
		{"try", []*AcquireReq{one("amb:t", true, false, 0)}, KindAcquire, 1, true},
		{"shared try", []*AcquireReq{one("amb:ts", true, true, 0)}, KindShared, 1, true},
		{"set try", []*AcquireReq{set(true, "amb:ts1", "amb:ts2", "amb:ts3")}, KindSets, 3, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := newLoopState(k)
			for _, r := range c.reqs {
				st.handleAcquire(r)
			}
			st.flush()
			if len(st.work) != 1 || st.work[0].fl.spec.kind != c.kind {
				t.Fatalf("launched %v, want one %s batch", kindsOf(st.work), c.kind)
			}
			fl := st.work[0].fl
			st.work = st.work[:0]
			var ids []string
			for _, a := range fl.attempts {
				for j := range a.Kind.holds(a) {
					id, _, _ := a.Kind.hold(a, j)
					ids = append(ids, id)
				}
			}
			if len(ids) != c.holds {
				t.Fatalf("%d lockIds sent, want %d", len(ids), c.holds)
			}
			lost := pgerr.New(pglease.CodeAmbiguous, "store.AcquireMany", "connection lost mid-statement", nil)
			st.handleAcquireDone(acquireDone{fl: fl, batch: fl.attempts, start: k.Now(), err: lost})
			if err := st.checkInvariants(); err != nil {
				t.Fatal(err)
			}
			released := map[string]bool{}
			for _, it := range st.releases.pending {
				released[it.lockID] = true
			}
			for _, id := range ids {
				if !released[id] {
					t.Errorf("a lockId of the ambiguous batch is not released")
				}
			}
			if len(st.held) != 0 {
				t.Errorf("%d locks held after an ambiguous answer", len(st.held))
			}
			for i, r := range c.reqs {
				select {
				case ans := <-r.Reply:
					if !c.try || ans.Lock != nil || ans.Locks != nil || ans.Err == nil {
						t.Errorf("caller %d answered %+v", i, ans)
					}
				default:
					if c.try {
						t.Errorf("try %d not answered", i)
					}
				}
			}
			if !c.try && c.kind != KindSets {
				ks := st.keys[c.reqs[0].Key]
				if ks == nil || int(ks.releasing) != c.holds || len(ks.queue) != len(c.reqs) {
					t.Fatalf("key after the ambiguous answer: %+v; want its waiters, and its attempts held back by %d releases", ks, c.holds)
				}
			}
		})
	}
}

// TestPipelineGrantRules drives every kind of attempt, in both modes,
// through a granted answer (fabricated: the statement is never run) that
// nobody may keep: its caller left while it was in flight (the grant is
// taken back), or its fence is not above one already seen for the key
// (fence monotonicity: refused with CodeFenceRegression). Either way
// every lockId granted is queued for release and nobody holds the key.
func TestPipelineGrantRules(t *testing.T) {
	k, _ := pgKernel(t, Config{})
	one, set := reqMakers(k)
	cases := []struct {
		name string
		req  func() *AcquireReq
	}{
		{"exclusive", func() *AcquireReq { return one("rule:x", false, false, 0) }},
		{"permit", func() *AcquireReq { return one("rule:p", false, true, 2) }},
		{"set", func() *AcquireReq { return set(false, "rule:s1", "rule:s2") }},
		{"try", func() *AcquireReq { return one("rule:t", true, false, 0) }},
		{"permit try", func() *AcquireReq { return one("rule:tp", true, true, 2) }},
		{"set try", func() *AcquireReq { return set(true, "rule:ts1", "rule:ts2") }},
	}
	keysOf := func(r *AcquireReq) []SetKey {
		if r.Set != nil {
			return r.Set.Keys
		}
		return []SetKey{{Key: r.Key, Hash: r.Hash}}
	}
	for _, rule := range []string{"caller left", "fence regression"} {
		for _, c := range cases {
			t.Run(rule+"/"+c.name, func(t *testing.T) {
				st := newLoopState(k)
				r := c.req()
				if rule == "fence regression" {
					for _, k := range keysOf(r) {
						st.Fences[k.Key] = 1000 // seen before: the key's state is made again from it
					}
				}
				st.handleAcquire(r)
				st.flush()
				if len(st.work) != 1 {
					t.Fatalf("launched %v, want one batch", kindsOf(st.work))
				}
				fl := st.work[0].fl
				st.work = st.work[:0]
				if rule == "caller left" {
					st.handleAbandon(r)
					if ans := <-r.Final; !ans.Abandoned {
						t.Fatalf("abandon answered %+v", ans)
					}
				}
				now := k.Now()
				var ids []string
				var res []store.AcquireResult
				for _, a := range fl.attempts {
					for j := range a.Kind.holds(a) {
						id, _, _ := a.Kind.hold(a, j)
						ids = append(ids, id)
						res = append(res, store.AcquireResult{OK: true, Fence: 5, AcquiredAt: now, ExpiresAt: now.Add(k.cfg.TTL)})
					}
				}
				st.handleAcquireDone(acquireDone{fl: fl, batch: fl.attempts, start: now, res: res})
				if err := st.checkInvariants(); err != nil {
					t.Fatal(err)
				}
				released := map[string]bool{}
				for _, it := range st.releases.pending {
					released[it.lockID] = true
				}
				for _, id := range ids {
					if !released[id] {
						t.Error("a lockId granted is not released")
					}
				}
				if len(st.held) != 0 {
					t.Errorf("%d locks held", len(st.held))
				}
				if rule == "fence regression" {
					select {
					case ans := <-r.Reply:
						if pglease.CodeOf(ans.Err) != pglease.CodeFenceRegression {
							t.Errorf("answered %+v, want CodeFenceRegression", ans)
						}
					default:
						t.Error("the caller was not told")
					}
				}
			})
		}
	}
}

// TestPipelineStaleChain drives a key's attempt through a stuck batch by
// hand: the batch is hedged (a new attempt, new lockIds, in the same
// chain), the hedge's grant answers first and is the key's answer, and
// the first attempt's grant, answered later, is stale: released, never
// granted to anyone. One holder here, whatever the order of the answers.
func TestPipelineStaleChain(t *testing.T) {
	k, _ := pgKernel(t, Config{})
	for _, shared := range []bool{false, true} {
		name := "exclusive"
		if shared {
			name = "reader"
		}
		t.Run(name, func(t *testing.T) {
			st := newLoopState(k)
			key := "stale:" + name
			req := &AcquireReq{Key: key, Hash: pglease.HashKey(key), TTL: k.cfg.TTL, Shared: shared,
				Reply: make(chan AcquireReply, 1), Final: make(chan AcquireReply, 1)}
			st.handleAcquire(req)
			launch := func() *flight {
				t.Helper()
				st.flush()
				if len(st.work) != 1 {
					t.Fatalf("launched %v, want one batch", kindsOf(st.work))
				}
				fl := st.work[0].fl
				st.work = st.work[:0]
				return fl
			}
			first := launch()
			st.checkStuck(first.start.Add(k.stuckAfter() + time.Millisecond))
			hedge := launch()
			if hedge.attempts[0].chain != first.attempts[0].chain || !first.attempts[0].stale {
				t.Fatal("the stuck attempt was not hedged in its chain")
			}
			grant := func(fl *flight, fence pglease.Fence) {
				now := k.Now()
				res := []store.AcquireResult{{OK: true, Fence: fence, AcquiredAt: now, ExpiresAt: now.Add(k.cfg.TTL)}}
				st.handleAcquireDone(acquireDone{fl: fl, batch: fl.attempts, start: now, res: res})
				if err := st.checkInvariants(); err != nil {
					t.Fatal(err)
				}
			}
			grant(hedge, 7)
			ans := <-req.Reply
			if ans.Lock == nil || ans.Lock.ID != hedge.attempts[0].lockID {
				t.Fatalf("answered %+v, want the hedge's lock", ans)
			}
			grant(first, 8) // (a real server would have refused one of them)
			if len(st.held) != 1 {
				t.Fatalf("%d holds, want the hedge's alone", len(st.held))
			}
			var released bool
			for _, it := range st.releases.pending {
				if it.lockID == first.attempts[0].lockID && it.unblocked {
					released = true
				}
			}
			if !released {
				t.Fatal("the stale attempt's grant is not released")
			}
			ks := st.keys[key]
			if ks == nil || ks.stale != 0 {
				t.Fatalf("key after both answers: %+v", ks)
			}
		})
	}
}

// TestListenerActiveWhileWaiting: the loop tells the listener it is
// needed at its prompt pace (the Active subscription) as soon as a caller
// waits, keeps it so while callers come and go, and lets it go idle only
// once nothing has waited for listenerIdleAfter, by its own timer.
func TestListenerActiveWhileWaiting(t *testing.T) {
	k, _ := pgKernel(t, Config{})
	if err := k.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	k.Test.Clock = func() time.Time { return now }
	st := newLoopState(k)
	st.lis.Idle() // live, no service: the outbox shows what would be handed over
	active := func() (on, sent bool) {
		on, sent = st.lis.Outbox()[notifier.Sub{Topic: notifier.Active}]
		st.lis.Handed()
		return on, sent
	}
	st.markListener()
	if _, sent := active(); sent {
		t.Fatal("the listener was told about activity with nothing waiting")
	}
	st.waiting = 1 // a caller waits
	st.markListener()
	if on, sent := active(); !on || !sent {
		t.Fatalf("a caller waits: Active %v (sent %v), want on", on, sent)
	}
	for range 3 { // callers come and go within listenerIdleAfter
		st.waiting = 0
		st.markListener()
		now = now.Add(listenerIdleAfter / 2)
		st.markListener()
		st.waiting = 1
		st.markListener()
		if _, sent := active(); sent {
			t.Fatal("the listener was told again while callers came and went")
		}
	}
	st.waiting = 0
	st.markListener()
	if w := st.nextWake(); !w.Equal(now.Add(listenerIdleAfter)) {
		t.Fatalf("next wake %v, want the idle deadline %v", w, now.Add(listenerIdleAfter))
	}
	now = now.Add(listenerIdleAfter)
	st.markListener()
	if on, sent := active(); on || !sent {
		t.Fatalf("nothing waited for %v: Active %v (sent %v), want off", listenerIdleAfter, on, sent)
	}
	if w := st.nextWake(); !w.IsZero() {
		t.Fatalf("next wake %v once idle, want none", w)
	}
}
