package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
)

// nextPayload returns the next notification's payload on l (skipping
// none), failing after 10 s.
func nextPayload(t *testing.T, l *pgx.Conn) string {
	t.Helper()
	return nextNotification(t, l)
}

// A lock delay stored with a grant keeps a takeover after its expiry
// until expires_at + max(1 s, delay), and the refused attempt's
// RetryAfter says so; a delay under 1 s changes nothing.
func TestLockDelayTakeover(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	key := pgtest.RandomName("delay_")
	r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 300 * time.Millisecond, LockDelay: 2500 * time.Millisecond})
	if err != nil || !r.OK {
		t.Fatal(r, err)
	}
	exp := r.ExpiresAt.UnixMilli()
	// Past expires_at + 1 s (a takeover without the delay).
	waitServer(t, pool, exp+keys.TimeToleranceMs+5)
	now := serverNow(t, pool)
	x := exclusive(t, s, key, time.Minute)
	if x.OK || x.ExpiresAt.UnixMilli() != exp {
		t.Fatalf("takeover inside the lock delay = %+v", x)
	}
	// RetryAfter is counted from the attempt's own clock reading, which
	// is after now: at most exp+2500-now, and more than the tolerance
	// alone would give.
	if ra := x.RetryAfter.Milliseconds(); ra > exp+2500-now || ra <= 0 {
		t.Fatalf("RetryAfter %v; want at most %d ms (to expires_at + the delay)", x.RetryAfter, exp+2500-now)
	}
	if sh := shared(t, s, key, 0, time.Minute); sh.OK {
		t.Fatal("a reader got the key inside the lock delay")
	}
	waitServer(t, pool, exp+2500)
	if x := exclusive(t, s, key, time.Minute); !x.OK || x.Fence != r.Fence+1 {
		t.Fatalf("takeover after the delay = %+v", x)
	}
	// A delay shorter than the tolerance: the tolerance rules.
	key2 := pgtest.RandomName("delay2_")
	r2, err := s.Acquire(c, store.AcquireRequest{Key: key2, TTL: 200 * time.Millisecond, LockDelay: 100 * time.Millisecond})
	if err != nil || !r2.OK {
		t.Fatal(r2, err)
	}
	waitServer(t, pool, r2.ExpiresAt.UnixMilli()+keys.TimeToleranceMs)
	if x := exclusive(t, s, key2, time.Minute); !x.OK {
		t.Fatalf("takeover at expires_at + 1 s with a 100 ms delay = %+v", x)
	}
	for _, d := range []time.Duration{-time.Millisecond, time.Microsecond} {
		if _, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute, LockDelay: d}); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Fatalf("LockDelay %v: %v", d, err)
		}
	}
}

// Revoke deletes the live lease whatever its lockId, answers its lockId's
// hash and fence, tells the holder ("r:key:lockId" hashes), wakes the
// waiters of the key, keeps the key for the given delay (or the grant's
// lock delay) and otherwise frees it at once; the revoked holder's extend
// and release fail. A free key is not revoked and notifies nothing.
func TestRevoke(t *testing.T) {
	t.Parallel()
	ch := pgtest.RandomName("revoke_")
	s, pool, _ := newStore(t, store.Config{NotifyChannel: ch})
	c := ctx(t)
	l := listenOn(t, ch)
	w := connect(t)
	key := pgtest.RandomName("rv_")
	h := exclusive(t, s, key, time.Minute)
	if ok, err := store.RegisterWaiters(c, w, []string{key}); err != nil || !ok[0] {
		t.Fatal(ok, err)
	}
	res, err := s.Revoke(c, []store.RevokeRequest{{Key: key}, {Key: key + "-free"}})
	if err != nil || len(res) != 2 || res[0].Revoked != 1 || !res[0].Exclusive || res[0].LockIDHashes[0] != pglease.HashKey(h.LockID) || res[0].Fences[0] != h.Fence ||
		!res[0].DelayUntil.IsZero() || res[1].Revoked != 0 {
		t.Fatalf("Revoke = %+v, %v", res, err)
	}
	n, ok := store.ParseNotification(nextPayload(t, l))
	if !ok || n.Kind != store.NotifyRevoke || n.KeyHash != pglease.HashKey(key) || n.LockIDHash != pglease.HashKey(h.LockID) {
		t.Fatalf("first notification %+v; want the revoke of the holder's lockId", n)
	}
	if p := nextPayload(t, l); p != pglease.HashKey(key) {
		t.Fatalf("second notification %q; want the waiters' wake-up", p)
	}
	if e, err := s.Extend(c, h.LockID, time.Minute); err != nil || e.OK {
		t.Fatalf("the revoked holder's extend = %+v, %v", e, err)
	}
	if ok, err := s.Release(c, h.LockID); err != nil || ok {
		t.Fatalf("the revoked holder's release = %v, %v", ok, err)
	}
	// No delay: free at once, the fence continues.
	h2 := exclusive(t, s, key, time.Minute)
	if !h2.OK || h2.Fence != h.Fence+1 {
		t.Fatalf("acquire after the revoke = %+v", h2)
	}
	// With a delay: nothing before it ends; RetryAfter says when.
	res, err = s.Revoke(c, []store.RevokeRequest{{Key: key, Delay: 2 * time.Second}})
	if err != nil || res[0].Revoked != 1 || res[0].DelayUntil.IsZero() {
		t.Fatalf("Revoke with a delay = %+v, %v", res, err)
	}
	until := res[0].DelayUntil.UnixMilli()
	for _, try := range []func() store.AcquireResult{
		func() store.AcquireResult { return exclusive(t, s, key, time.Minute) },
		func() store.AcquireResult { return shared(t, s, key, 0, time.Minute) },
	} {
		now := serverNow(t, pool)
		if r := try(); r.OK || r.RetryAfter <= 0 || r.RetryAfter.Milliseconds() > until-now {
			t.Fatalf("acquire inside the revoke's delay = %+v; want refused, RetryAfter at most %d ms", r, until-now)
		}
	}
	sets, err := s.AcquireSets(c, [][]store.AcquireRequest{set(time.Minute, key)})
	if err != nil || sets[0][0].OK {
		t.Fatalf("set inside the revoke's delay = %+v, %v", sets, err)
	}
	waitServer(t, pool, until)
	h3 := exclusive(t, s, key, time.Minute)
	if !h3.OK {
		t.Fatalf("acquire after the delay = %+v", h3)
	}
	// The grant's own lock delay applies to a revoke without one.
	key2 := pgtest.RandomName("rv2_")
	g, err := s.Acquire(c, store.AcquireRequest{Key: key2, TTL: time.Minute, LockDelay: 1500 * time.Millisecond})
	if err != nil || !g.OK {
		t.Fatal(g, err)
	}
	res, err = s.Revoke(c, []store.RevokeRequest{{Key: key2}})
	if err != nil || res[0].Revoked != 1 || res[0].DelayUntil.IsZero() {
		t.Fatalf("Revoke of a grant with a lock delay = %+v, %v", res, err)
	}
	if r := exclusive(t, s, key2, time.Minute); r.OK {
		t.Fatal("acquire inside the grant's lock delay after a revoke")
	}
	// An expired lease is not "revoked" (nothing live to take).
	key3 := pgtest.RandomName("rv3_")
	e := exclusive(t, s, key3, 200*time.Millisecond)
	waitServer(t, pool, e.ExpiresAt.UnixMilli()+keys.TimeToleranceMs)
	if res, err := s.Revoke(c, []store.RevokeRequest{{Key: key3}}); err != nil || res[0].Revoked != 0 || !res[0].DelayUntil.IsZero() {
		t.Fatalf("Revoke of an expired lease = %+v, %v", res, err)
	}
	// From SQL: the same, on pglease.notify_channel.
	h4 := exclusive(t, s, key3, time.Minute)
	conn, err := pool.Acquire(c)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(c, "SET pglease.notify_channel = "+ch); err != nil {
		t.Fatal(err)
	}
	var revoked int
	if err := conn.QueryRow(c, "SELECT revoked FROM syncguard_locks_revoke($1)", key3).Scan(&revoked); err != nil || revoked != 1 {
		t.Fatalf("SQL revoke = %v, %v", revoked, err)
	}
	for {
		n, ok := store.ParseNotification(nextPayload(t, l))
		if ok && n.Kind == store.NotifyRevoke && n.KeyHash == pglease.HashKey(key3) {
			if n.LockIDHash != pglease.HashKey(h4.LockID) {
				t.Fatalf("SQL revoke notified %+v", n)
			}
			break
		}
	}
	for name, reqs := range map[string][]store.RevokeRequest{"bad key": {{Key: ""}}, "bad delay": {{Key: "k", Delay: -time.Second}}} {
		if _, err := s.Revoke(c, reqs); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// RequestRelease sends "q:" + the key's hash and changes nothing.
func TestRequestRelease(t *testing.T) {
	t.Parallel()
	ch := pgtest.RandomName("rr_")
	s, _, _ := newStore(t, store.Config{NotifyChannel: ch})
	c := ctx(t)
	l := listenOn(t, ch)
	key := pgtest.RandomName("rrk_")
	h := exclusive(t, s, key, time.Minute)
	if err := s.RequestRelease(c, []string{key}, nil); err != nil {
		t.Fatal(err)
	}
	if n, ok := store.ParseNotification(nextPayload(t, l)); !ok || n.Kind != store.NotifyReleaseRequest || n.KeyHash != pglease.HashKey(key) {
		t.Fatalf("notification %+v", n)
	}
	if e, err := s.Extend(c, h.LockID, time.Minute); err != nil || !e.OK {
		t.Fatalf("the holder's extend after a request = %+v, %v", e, err)
	}
	noCh, err := store.New("pg.New", s.DBForTest(), store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := noCh.RequestRelease(c, []string{key}, nil); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("RequestRelease without a channel = %v", err)
	}
	if err := s.RequestRelease(c, []string{""}, nil); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("RequestRelease(bad key) = %v", err)
	}
}

// Watch notifications are sent for a key only while a session holds its
// watch lock: grants, releases, revokes, shared grants and releases, with
// the fence; an unwatched key's changes send nothing (the next
// notification after them is the watched key's).
func TestWatchNotifications(t *testing.T) {
	t.Parallel()
	ch := pgtest.RandomName("watch_")
	s, _, _ := newStore(t, store.Config{NotifyChannel: ch})
	c := ctx(t)
	l := listenOn(t, ch)
	watched, other := pgtest.RandomName("w_"), pgtest.RandomName("o_")
	if ok, err := store.RegisterWatchers(c, l, []string{watched}); err != nil || !ok[0] {
		t.Fatal(ok, err)
	}
	want := func(ev store.WatchEvent, f pglease.Fence) {
		t.Helper()
		n, ok := store.ParseNotification(nextPayload(t, l))
		if !ok || n.Kind != store.NotifyWatch || n.KeyHash != pglease.HashKey(watched) || n.Event != ev || n.Fence != f {
			t.Fatalf("notification %+v; want watch %c fence %s", n, ev, f)
		}
	}
	// Releases notify wake-ups only when waited for (ReleaseWaited, as
	// the Manager releases), so that the channel carries watch events only.
	releaseW := func(id, key string) {
		t.Helper()
		if res, err := s.ReleaseWaited(c, []store.ReleaseRequest{{LockID: id, Key: key}}); err != nil || !res[0] {
			t.Fatal(res, err)
		}
	}
	o := exclusive(t, s, other, time.Minute)
	releaseW(o.LockID, other)
	g := exclusive(t, s, watched, time.Minute)
	want(store.WatchGranted, g.Fence)
	releaseW(g.LockID, watched)
	want(store.WatchReleased, g.Fence)
	p := shared(t, s, watched, 2, time.Minute)
	want(store.WatchSharedGranted, p.Fence)
	releaseW(p.LockID, watched)
	want(store.WatchSharedReleased, p.Fence)
	g = exclusive(t, s, watched, time.Minute)
	want(store.WatchGranted, g.Fence)
	ho, err := s.HandOff(c, []store.HandOffRequest{{Old: g.LockID, Key: watched, TTL: time.Minute}})
	if err != nil || !ho[0].OK {
		t.Fatal(ho, err)
	}
	// A handoff tells both: the old lease released, then the grant.
	want(store.WatchReleased, g.Fence)
	want(store.WatchGranted, ho[0].Fence)
	if res, err := s.Revoke(c, []store.RevokeRequest{{Key: watched}}); err != nil || res[0].Revoked != 1 {
		t.Fatal(res, err)
	}
	n, _ := store.ParseNotification(nextPayload(t, l))
	if n.Kind != store.NotifyRevoke {
		t.Fatalf("notification %+v; want the revoke's", n)
	}
	want(store.WatchRevoked, ho[0].Fence)
	sets, err := s.AcquireSets(c, [][]store.AcquireRequest{set(time.Minute, other, watched)})
	if err != nil || !sets[0][1].OK {
		t.Fatal(sets, err)
	}
	want(store.WatchGranted, sets[0][1].Fence)
	// Unwatched: silent again.
	if err := store.UnregisterWatchers(c, l, []string{watched}); err != nil {
		t.Fatal(err)
	}
	releaseW(sets[0][1].LockID, watched)
	sentinel := pgtest.RandomName("ws_")
	if _, err := store.RegisterWatchers(c, l, []string{sentinel}); err != nil {
		t.Fatal(err)
	}
	sg := exclusive(t, s, sentinel, time.Minute)
	if n, _ := store.ParseNotification(nextPayload(t, l)); n.KeyHash != pglease.HashKey(sentinel) || n.Fence != sg.Fence {
		t.Fatalf("notification %+v after unwatching; want the sentinel's grant", n)
	}
}

// Snapshot reads a key only when no change of it is in flight, and
// never waits for one: during an uncommitted acquire (the key's advisory
// lock) or release (the row lock) the key is answered Busy, while another
// key in the same read is read; after the commit it reads what they
// committed.
func TestSnapshotBusyDuringChangesInFlight(t *testing.T) {
	t.Parallel()
	rs := pgtest.RoleSchemaForTest(t)
	pool := rs.RuntimePool(t)
	snap, err := store.New("pg.New", rs.RuntimePool(t), store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	key, other := pgtest.RandomName("sk_"), pgtest.RandomName("so_")
	if st, err := snap.Snapshot(c, []string{key}); err != nil || st[0].Busy || st[0].Held || st[0].Counter != 0 || st[0].LockIDHash != "" {
		t.Fatalf("Snapshot of a fresh key = %+v, %v", st, err)
	}
	o := exclusive(t, snap, other, time.Minute)
	inTx := func(fn func(s *pg.Store)) (commit func()) {
		tx, err := pool.Begin(c)
		if err != nil {
			t.Fatal(err)
		}
		// Before the pool's own cleanup (which waits for its connections)
		// when the test fails with the transaction open.
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		s, err := pg.New(tx, pg.Config{Holder: "tx-holder"})
		if err != nil {
			t.Fatal(err)
		}
		fn(s)
		return func() {
			if err := tx.Commit(c); err != nil {
				t.Fatal(err)
			}
		}
	}
	var id string
	var fence pglease.Fence
	for _, step := range []struct {
		name string
		fn   func(s *pg.Store)
		held bool
	}{
		{"acquire", func(s *pg.Store) {
			r, err := s.Acquire(c, key, time.Minute)
			if err != nil || !r.OK {
				t.Fatal(r, err)
			}
			id, fence = r.LockID, r.Fence
		}, true},
		{"release", func(s *pg.Store) {
			if ok, err := s.Release(c, id); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}, false},
	} {
		commit := inTx(step.fn)
		st, err := snap.Snapshot(c, []string{other, key})
		if err != nil {
			t.Fatal(err)
		}
		if !st[1].Busy || st[1].Held || st[1].LockIDHash != "" || !st[1].Now.IsZero() {
			t.Fatalf("Snapshot during an uncommitted %s = %+v; want busy", step.name, st[1])
		}
		if st[0].Busy || !st[0].Held || st[0].Fence != o.Fence {
			t.Fatalf("Snapshot of another key during an uncommitted %s = %+v; want held at %s", step.name, st[0], o.Fence)
		}
		commit()
		st, err = snap.Snapshot(c, []string{key})
		if err != nil {
			t.Fatal(err)
		}
		if st[0].Busy || st[0].Held != step.held || st[0].Counter != fence {
			t.Fatalf("Snapshot after the %s = %+v; want held %v, counter %s", step.name, st, step.held, fence)
		}
		if step.held && (st[0].LockIDHash != pglease.HashKey(id) || st[0].Fence != fence || st[0].Holder != "tx-holder") {
			t.Fatalf("Snapshot = %+v", st[0])
		}
	}
}

// No missed final state: a watcher that registers, then takes a snapshot,
// while a release runs concurrently, either sees the key released in the
// snapshot or is notified of the release (many rounds).
func TestWatchNoMissedRelease(t *testing.T) {
	t.Parallel()
	ch := pgtest.RandomName("wrace_")
	s, _, _ := newStore(t, store.Config{NotifyChannel: ch})
	c := ctx(t)
	w := listenOn(t, ch)
	rounds := 100
	if testing.Short() {
		rounds = 30
	}
	var seen, notified int
	for i := range rounds {
		key := fmt.Sprintf("wr-%d-%s", i, t.Name())
		held := exclusive(t, s, key, time.Minute)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, err := s.ReleaseWaited(c, []store.ReleaseRequest{{LockID: held.LockID, Key: key}}); err != nil || !res[0] {
				t.Errorf("release = %v, %v", res, err)
			}
		}()
		if ok, err := store.RegisterWatchers(c, w, []string{key}); err != nil {
			t.Fatal(err)
		} else if !ok[0] {
			wg.Wait() // the release held the watch lock at that instant: it is done
			if _, err := store.RegisterWatchers(c, w, []string{key}); err != nil {
				t.Fatal(err)
			}
		}
		st, err := s.Snapshot(c, []string{key})
		for err == nil && st[0].Busy { // the release in flight: read again
			time.Sleep(time.Millisecond)
			st, err = s.Snapshot(c, []string{key})
		}
		if err != nil {
			t.Fatal(err)
		}
		if !st[0].Held {
			seen++
		} else {
			for {
				n, _ := store.ParseNotification(nextNotification(t, w))
				if n.KeyHash == pglease.HashKey(key) && n.Event == store.WatchReleased {
					break
				}
			}
			notified++
		}
		wg.Wait()
		if err := store.UnregisterWatchers(c, w, []string{key}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d rounds: the snapshot saw the release in %d, a notification told it in %d", rounds, seen, notified)
}

// ParseNotification accepts the four payload forms and nothing else.
func TestParseNotification(t *testing.T) {
	h1, h2 := pglease.HashKey("a"), pglease.HashKey("b")
	g := strings.Repeat("0123456789abcdef", 4) // a grant id
	for _, tc := range []struct {
		in   string
		want store.Notification
	}{
		{h1, store.Notification{Kind: store.NotifyWake, KeyHash: h1}},
		{"r:" + h1 + ":" + h2, store.Notification{Kind: store.NotifyRevoke, KeyHash: h1, LockIDHash: h2}},
		{"q:" + h1, store.Notification{Kind: store.NotifyReleaseRequest, KeyHash: h1}},
		{"q:" + h1 + ":" + h2, store.Notification{Kind: store.NotifyReleaseRequest, KeyHash: h1, Hold: h2}},
		{"q:" + h1 + ":" + g, store.Notification{Kind: store.NotifyReleaseRequest, KeyHash: h1, Hold: g}},
		{"w:" + h1 + ":g:000000000000042", store.Notification{Kind: store.NotifyWatch, KeyHash: h1, Event: store.WatchGranted, Fence: 42}},
		{"w:" + h1 + ":u:000000000000000", store.Notification{Kind: store.NotifyWatch, KeyHash: h1, Event: store.WatchSharedReleased}},
	} {
		if got, ok := store.ParseNotification(tc.in); !ok || got != tc.want {
			t.Errorf("ParseNotification(%q) = %+v, %v; want %+v", tc.in, got, ok, tc.want)
		}
	}
	for _, bad := range []string{"", "x", strings.ToUpper(h1), "r:" + h1, "q:" + h1 + ":" + h2 + ":" + h2, "q:" + h1 + ":" + g[1:], "w:" + h1 + ":x:1", "w:" + h1 + ":g:-1",
		"w:" + h1 + ":g", "z:" + h1, "r:" + h1 + ":nothex"} {
		if got, ok := store.ParseNotification(bad); ok {
			t.Errorf("ParseNotification(%q) = %+v, accepted", bad, got)
		}
	}
}
