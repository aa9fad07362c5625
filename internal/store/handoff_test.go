package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

func acquireOne(t *testing.T, s *store.Store, key string, ttl time.Duration) store.AcquireResult {
	t.Helper()
	res, err := s.AcquireMany(ctx(t), []store.AcquireRequest{{Key: key, TTL: ttl}})
	if err != nil || !res[0].OK {
		t.Fatalf("acquire %q: %+v, %v", key, res, err)
	}
	return res[0]
}

// A handoff releases the old lockId and grants the key to the new one in
// one round trip, with the next fence, and sends no release notification.
func TestHandOff(t *testing.T) {
	t.Parallel()
	var cnt pgtest.Recorder
	s, pool, _ := newStore(t, store.Config{NotifyChannel: "pglease_handoff"}, cnt.Configure)
	c := ctx(t)
	l, err := pgx.Connect(c, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if _, err := l.Exec(c, listenAllSQL("pglease_handoff")); err != nil {
		t.Fatal(err)
	}
	// Warm up: the first use of a statement on a connection prepares it.
	warm := acquireOne(t, s, "warm", time.Minute)
	if _, err := s.HandOff(c, []store.HandOffRequest{{Old: warm.LockID, Key: "warm", TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	first := acquireOne(t, s, "handoff", time.Minute)
	next := keys.NewLockID()
	cnt.Reset()
	res, err := s.HandOff(c, []store.HandOffRequest{{Old: first.LockID, Key: "handoff", TTL: 30 * time.Second, LockID: next}})
	if err != nil {
		t.Fatal(err)
	}
	if w := cnt.Writes(); w != 1 {
		t.Errorf("HandOff took %d round trips, want 1", w)
	}
	r := res[0]
	if !r.Released || !r.OK || r.LockID != next || r.Fence != first.Fence+1 || r.ExpiresAt.Sub(r.AcquiredAt) != 30*time.Second {
		t.Fatalf("HandOff = %+v", r)
	}
	row := readRow(t, pool, "handoff")
	if row == nil || row.lockID != next || row.fence != fmt.Sprintf("%015d", int64(r.Fence)) || row.expires != r.ExpiresAt.UnixMilli() {
		t.Fatalf("row after handoff: %+v", row)
	}
	// The old lockId is gone: it can be neither released nor extended.
	if ok, err := s.ReleaseMany(c, []string{first.LockID}); err != nil || ok[0] {
		t.Fatalf("release of the old lockId = %v, %v", ok, err)
	}
	// Handing off again from the old lockId finds the key held by next.
	res, err = s.HandOff(c, []store.HandOffRequest{{Old: first.LockID, Key: "handoff", TTL: time.Minute}})
	if err != nil || res[0].Released || res[0].OK {
		t.Fatalf("stale handoff = %+v, %v", res, err)
	}
	if row := readRow(t, pool, "handoff"); row.lockID != next {
		t.Fatal("a stale handoff changed the row")
	}
	// Notifications arrive in commit order: the first one is the sentinel
	// sent after the handoffs, so they sent none.
	if _, err := pool.Exec(c, "SELECT pg_notify('pglease_handoff', 'sentinel')"); err != nil {

		t.Fatal(err)
	}
	wc, cancel := context.WithTimeout(c, 10*time.Second)
	defer cancel()
	n, err := l.WaitForNotification(wc)
	if err != nil || n.Payload != "sentinel" {
		t.Fatalf("first notification %+v, %v; want the sentinel", n, err)
	}
}

// A handoff from a lock that expired follows the acquire rule: refused
// inside the tolerance window, granted after it (not released either way),
// and refused when someone else took the key.
func TestHandOffAfterLoss(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	old := acquireOne(t, s, "lost", 200*time.Millisecond)
	exp := old.ExpiresAt.UnixMilli()
	waitServer(t, pool, exp+1)
	res, err := s.HandOff(c, []store.HandOffRequest{{Old: old.LockID, Key: "lost", TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Released || (res[0].OK && res[0].AcquiredAt.UnixMilli() < exp+keys.TimeToleranceMs) {
		t.Fatalf("handoff of an expired lock inside the tolerance = %+v", res[0])
	}
	waitServer(t, pool, exp+keys.TimeToleranceMs)
	res, err = s.HandOff(c, []store.HandOffRequest{{Old: old.LockID, Key: "lost", TTL: time.Minute}})
	if err != nil || res[0].Released || !res[0].OK || res[0].Fence <= old.Fence {
		t.Fatalf("handoff of an expired lock after the tolerance = %+v, %v", res, err)
	}
	// Now another lockId holds "lost"; a handoff from old is refused.
	res2, err := s.HandOff(c, []store.HandOffRequest{{Old: old.LockID, Key: "lost", TTL: time.Minute}})
	if err != nil || res2[0].Released || res2[0].OK {
		t.Fatalf("handoff from a stale lockId = %+v, %v", res2, err)
	}
	if row := readRow(t, pool, "lost"); row.lockID != res[0].LockID {
		t.Fatal("a refused handoff changed the row")
	}
}

// At the fence limit the handoff releases the key, grants nothing, and
// notifies the release (the key is free).
func TestHandOffFenceOverflow(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{NotifyChannel: "pglease_handoff_max"})
	c := ctx(t)
	if _, err := pool.Exec(c, `INSERT INTO syncguard_fence_counters (fence_key, fence, key_debug) VALUES ('fence:max', $1, 'max')`,
		int64(keys.FenceMax-1)); err != nil {
		t.Fatal(err)
	}
	l, err := pgx.Connect(c, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if _, err := l.Exec(c, listenAllSQL("pglease_handoff_max")); err != nil {
		t.Fatal(err)
	}
	r := acquireOne(t, s, "max", time.Minute) // fence MAX
	res, err := s.HandOff(c, []store.HandOffRequest{{Old: r.LockID, Key: "max", TTL: time.Minute}})
	if err != nil || !res[0].Released || res[0].OK || !errors.Is(res[0].Err, pglease.ErrInternal) {
		t.Fatalf("handoff past MAX = %+v, %v", res, err)
	}
	if row := readRow(t, pool, "max"); row != nil {
		t.Fatal("the released key still has a row")
	}
	wc, cancel := context.WithTimeout(c, 10*time.Second)
	defer cancel()
	if n, err := l.WaitForNotification(wc); err != nil || n.Payload != pglease.HashKey("max") || n.Channel != store.WakeChannel("pglease_handoff_max", n.Payload) {
		t.Fatalf("notification %+v, %v; want the key's on its wake channel", n, err)
	}
}

func TestHandOffBadInput(t *testing.T) {
	t.Parallel()
	var cnt pgtest.Recorder
	s, _, _ := newStore(t, store.Config{}, cnt.Configure)
	c := ctx(t)
	id := keys.NewLockID()
	cnt.Reset()
	for name, reqs := range map[string][]store.HandOffRequest{
		"bad old":     {{Old: "x", Key: "k", TTL: time.Minute}},
		"same lockId": {{Old: id, Key: "k", TTL: time.Minute, LockID: id}},
		"bad key":     {{Old: id, Key: "", TTL: time.Minute}},
		"bad ttl":     {{Old: id, Key: "k", TTL: time.Microsecond}},
		"too large":   make([]store.HandOffRequest, store.MaxBatch+1),
	} {
		if _, err := s.HandOff(c, reqs); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if res, err := s.HandOff(c, nil); err != nil || len(res) != 0 {
		t.Errorf("empty HandOff = %v, %v", res, err)
	}
	if q := cnt.Queries(); q != 0 {
		t.Errorf("bad input sent %d statements", q)
	}
}

// Handoff batches, acquire batches and release batches over the same keys
// in random orders never deadlock, and every grant's fence is above all
// earlier grants of its key (grants never overlap).
func TestHandOffConcurrentNoDeadlock(t *testing.T) {
	t.Parallel()
	s, _, _ := newStore(t, store.Config{}, maxConns(12))
	c := ctx(t)
	keys := make([]string, 8)
	for i := range keys {
		keys[i] = fmt.Sprintf("hk%d", i)
	}
	var mu sync.Mutex
	last := map[string]pglease.Fence{}
	note := func(key string, r store.AcquireResult) error {
		mu.Lock()
		defer mu.Unlock()
		if r.Fence <= last[key] {
			return fmt.Errorf("fence %s for %s not above %s", r.Fence, key, last[key])
		}
		last[key] = r.Fence
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			held := map[string]string{} // key -> lockId
			for range 40 {
				perm := rng.Perm(len(keys))[:3]
				var acq []store.AcquireRequest
				var ho []store.HandOffRequest
				for _, i := range perm {
					k := keys[i]
					if id, ok := held[k]; ok {
						ho = append(ho, store.HandOffRequest{Old: id, Key: k, TTL: time.Minute})
					} else {
						acq = append(acq, store.AcquireRequest{Key: k, TTL: time.Minute})
					}
				}
				if res, err := s.HandOff(c, ho); err != nil {
					errs <- err
					return
				} else {
					for i, r := range res {
						delete(held, ho[i].Key)
						if !r.Released {
							errs <- fmt.Errorf("worker %d lost %s", w, ho[i].Key)
							return
						}
						if r.OK {
							if err := note(ho[i].Key, r.AcquireResult); err != nil {
								errs <- err
								return
							}
							held[ho[i].Key] = r.LockID
						}
					}
				}
				res, err := s.AcquireMany(c, acq)
				if err != nil {
					errs <- err
					return
				}
				for i, r := range res {
					if r.OK {
						if err := note(acq[i].Key, r); err != nil {
							errs <- err
							return
						}
						held[acq[i].Key] = r.LockID
					}
				}
				if rng.IntN(3) == 0 { // release everything now and then
					var ids []string
					for k, id := range held {
						ids = append(ids, id)
						delete(held, k)
					}
					if _, err := s.ReleaseMany(c, ids); err != nil {
						errs <- err
						return
					}
				}
			}
			var ids []string
			for _, id := range held {
				ids = append(ids, id)
			}
			if _, err := s.ReleaseMany(c, ids); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A one-item handoff (a hot key's section) runs a lighter function than a
// batch's, which it leaves every case but the common one to. Each case
// gets the same answer either way: alone, and in a batch with another key.
func TestHandOffOneItemAnswersAsABatch(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{NotifyChannel: "pglease_handoff_one"})
	c := ctx(t)
	type outcome struct {
		released, ok, internal bool
		fenceUp                bool // the new fence is above the old lease's
	}
	cases := []struct {
		name string
		// setup prepares key and returns the handoff item and the old
		// lease's fence (0 when none), plus a cleanup.
		setup func(t *testing.T, key string) (store.HandOffRequest, pglease.Fence, func())
		want  outcome
	}{
		{"live", func(t *testing.T, key string) (store.HandOffRequest, pglease.Fence, func()) {
			r := acquireOne(t, s, key, time.Minute)
			return store.HandOffRequest{Old: r.LockID, Key: key, TTL: time.Minute}, r.Fence, func() {}
		}, outcome{released: true, ok: true, fenceUp: true}},
		{"old lease taken over", func(t *testing.T, key string) (store.HandOffRequest, pglease.Fence, func()) {
			r := acquireOne(t, s, key, time.Minute)
			if res, err := s.HandOff(c, []store.HandOffRequest{{Old: r.LockID, Key: key, TTL: time.Minute}}); err != nil || !res[0].OK {
				t.Fatalf("first handoff = %+v, %v", res, err)
			}
			return store.HandOffRequest{Old: r.LockID, Key: key, TTL: time.Minute}, r.Fence, func() {}
		}, outcome{}},
		{"key free", func(t *testing.T, key string) (store.HandOffRequest, pglease.Fence, func()) {
			return store.HandOffRequest{Old: keys.NewLockID(), Key: key, TTL: time.Minute}, 0, func() {}
		}, outcome{ok: true, fenceUp: true}},
		{"fence at MAX", func(t *testing.T, key string) (store.HandOffRequest, pglease.Fence, func()) {
			if _, err := pool.Exec(c, `INSERT INTO syncguard_fence_counters (fence_key, fence, key_debug) VALUES ($1, $2, $3)`,
				"fence:"+key, int64(keys.FenceMax-1), key); err != nil {
				t.Fatal(err)
			}
			r := acquireOne(t, s, key, time.Minute)
			return store.HandOffRequest{Old: r.LockID, Key: key, TTL: time.Minute}, r.Fence, func() {}
		}, outcome{released: true, internal: true}},
		{"advisory lock kept by another transaction", func(t *testing.T, key string) (store.HandOffRequest, pglease.Fence, func()) {
			r := acquireOne(t, s, key, time.Minute)
			tx, err := pool.Begin(c)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(c, "SELECT pg_advisory_xact_lock(hashtext($1))", key); err != nil {
				t.Fatal(err)
			}
			return store.HandOffRequest{Old: r.LockID, Key: key, TTL: time.Minute}, r.Fence, func() { _ = tx.Rollback(c) }
		}, outcome{released: true}},
	}
	for _, tc := range cases {
		for _, batch := range []bool{false, true} {
			key := fmt.Sprintf("one-%s-%v", tc.name, batch)
			item, oldFence, done := tc.setup(t, key)
			reqs := []store.HandOffRequest{item}
			if batch {
				other := acquireOne(t, s, key+"-other", time.Minute)
				reqs = append(reqs, store.HandOffRequest{Old: other.LockID, Key: key + "-other", TTL: time.Minute})
			}
			res, err := s.HandOff(c, reqs)
			done()
			if err != nil {
				t.Fatalf("%s (batch %v): %v", tc.name, batch, err)
			}
			r := res[0]
			got := outcome{released: r.Released, ok: r.OK, internal: errors.Is(r.Err, pglease.ErrInternal), fenceUp: r.OK && r.Fence > oldFence}
			if got != tc.want {
				t.Errorf("%s (batch %v) = %+v (%+v), want %+v", tc.name, batch, got, r, tc.want)
			}
			if batch && (!res[1].Released || !res[1].OK) {
				t.Errorf("%s: the batch's other item = %+v", tc.name, res[1])
			}
		}
	}
}
