package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
)

// A lease with a 3 s lock delay and a 500 ms TTL expires unreleased; 1.3 s
// after its expiry a takeover is refused; a revoke then (from Go or from
// SQL) finds nothing live: it answers 0 revoked and the delay's end, leaves
// the row, and the key stays refused until expires_at + 3 s.
func TestRevokeKeepsExpiredLeaseDelay(t *testing.T) {
	t.Parallel()
	ch := pgtest.RandomName("rvdelay_")
	s, pool, _ := newStore(t, store.Config{NotifyChannel: ch})
	c := ctx(t)
	const delay = 3 * time.Second
	for _, via := range []string{"Go", "SQL"} {
		key := pgtest.RandomName("rvdelay_")
		r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 500 * time.Millisecond, LockDelay: delay})
		if err != nil || !r.OK {
			t.Fatal(r, err)
		}
		exp := r.ExpiresAt.UnixMilli()
		waitServer(t, pool, exp+1300)
		if x := exclusive(t, s, key, time.Minute); x.OK {
			t.Fatalf("%s: takeover 1.3 s after expiry, inside the 3 s lock delay = %+v", via, x)
		}
		var revoked int
		var until int64
		switch via {
		case "Go":
			res, err := s.Revoke(c, []store.RevokeRequest{{Key: key}})
			if err != nil {
				t.Fatal(err)
			}
			revoked, until = res[0].Revoked, res[0].DelayUntil.UnixMilli()
		case "SQL":
			if err := pool.QueryRow(c, "SELECT revoked, not_before_ms FROM syncguard_locks_revoke($1)", key).Scan(&revoked, &until); err != nil {
				t.Fatal(err)
			}
		}
		if revoked != 0 || until != exp+delay.Milliseconds() {
			t.Fatalf("%s: revoke of the expired lease = %d revoked, delay until %d; want 0, until expires_at + 3 s = %d",
				via, revoked, until, exp+delay.Milliseconds())
		}
		if n := sharedRows(t, pool, key); n != 0 {
			t.Fatalf("%s: %d shared rows", via, n)
		}
		var rows int
		if err := pool.QueryRow(c, "SELECT count(*) FROM syncguard_locks WHERE key = $1 AND lock_id = $2", key, r.LockID).Scan(&rows); err != nil || rows != 1 {
			t.Fatalf("%s: the expired lease's row after the revoke: %d, %v; want it left in place", via, rows, err)
		}
		now := serverNow(t, pool)
		x := exclusive(t, s, key, time.Minute)
		if now < exp+delay.Milliseconds() && x.OK {
			t.Fatalf("%s: acquire %d ms after expiry, after the revoke, inside the lock delay: granted (fence %v)", via, now-exp, x.Fence)
		}
		if sh := shared(t, s, key, 0, time.Minute); sh.OK && serverNow(t, pool) < exp+delay.Milliseconds() {
			t.Fatalf("%s: a reader inside the lock delay after the revoke", via)
		}
		waitServer(t, pool, exp+delay.Milliseconds())
		if x := exclusive(t, s, key, time.Minute); !x.OK || x.Fence != r.Fence+1 {
			t.Fatalf("%s: acquire after expires_at + the delay = %+v", via, x)
		}
	}
}

// Revoke reaches shared holds: one permit named by its lockId's hash, one
// reader named by its grant id, or every hold of the key; each revoked
// holder is told ("r:" with its lockId's hash), its extend fails, the
// others keep theirs, and the freed slots are taken at once. From SQL too.
// A bad hold is InvalidArgument before any I/O.
func TestRevokeSharedHolds(t *testing.T) {
	t.Parallel()
	ch := pgtest.RandomName("rvshared_")
	s, pool, _ := newStore(t, store.Config{NotifyChannel: ch})
	c := ctx(t)
	l := listenOn(t, ch)
	revokedNote := func(key, lockID string) {
		t.Helper()
		for {
			n, ok := store.ParseNotification(nextPayload(t, l))
			if ok && n.Kind == store.NotifyRevoke && n.KeyHash == pglease.HashKey(key) {
				if n.LockIDHash != pglease.HashKey(lockID) {
					t.Fatalf("revoke notification %+v; want the hold %s", n, pglease.HashKey(lockID))
				}
				return
			}
		}
	}
	extends := func(id string) bool {
		t.Helper()
		e, err := s.Extend(c, id, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return e.OK
	}

	// Permits: one of three, named by its lockId's hash.
	sem := pgtest.RandomName("sem_")
	p := []store.AcquireResult{shared(t, s, sem, 3, time.Minute), shared(t, s, sem, 3, time.Minute), shared(t, s, sem, 3, time.Minute)}
	if x := shared(t, s, sem, 3, time.Minute); x.OK {
		t.Fatal("a fourth permit of three")
	}
	res, err := s.Revoke(c, []store.RevokeRequest{{Key: sem, Hold: pglease.HashKey(p[1].LockID)}})
	if err != nil || res[0].Revoked != 1 || res[0].Exclusive || res[0].LockIDHashes[0] != pglease.HashKey(p[1].LockID) ||
		res[0].Fences[0] != p[1].Fence || !res[0].DelayUntil.IsZero() {
		t.Fatalf("Revoke of one permit = %+v, %v", res, err)
	}
	revokedNote(sem, p[1].LockID)
	if extends(p[1].LockID) || !extends(p[0].LockID) || !extends(p[2].LockID) {
		t.Fatal("after revoking one permit: the revoked one extends, or another does not")
	}
	p3 := shared(t, s, sem, 3, time.Minute)
	if !p3.OK {
		t.Fatalf("the revoked permit's slot was not freed: %+v", p3)
	}
	// All permits.
	res, err = s.Revoke(c, []store.RevokeRequest{{Key: sem}})
	if err != nil || res[0].Revoked != 3 || res[0].Exclusive {
		t.Fatalf("Revoke of every permit = %+v, %v", res, err)
	}
	for _, id := range []string{p[0].LockID, p[2].LockID, p3.LockID} {
		if extends(id) {
			t.Fatal("a permit extends after every permit was revoked")
		}
	}
	if n := sharedRows(t, pool, sem); n != 0 {
		t.Fatalf("%d permits left", n)
	}

	// Readers: one by its grant id, with a delay; then all of them from SQL.
	rw := pgtest.RandomName("rw_")
	r1, r2 := shared(t, s, rw, 0, time.Minute), shared(t, s, rw, 0, time.Minute)
	res, err = s.Revoke(c, []store.RevokeRequest{{Key: rw, Hold: pg.GrantID(r1.LockID), Delay: 1500 * time.Millisecond}})
	if err != nil || res[0].Revoked != 1 || res[0].LockIDHashes[0] != pglease.HashKey(r1.LockID) || res[0].DelayUntil.IsZero() {
		t.Fatalf("Revoke of one reader by grant id = %+v, %v", res, err)
	}
	revokedNote(rw, r1.LockID)
	if extends(r1.LockID) || !extends(r2.LockID) {
		t.Fatal("after revoking one reader: it extends, or the other does not")
	}
	if x := shared(t, s, rw, 0, time.Minute); x.OK && time.Now().Before(res[0].DelayUntil) {
		t.Fatal("a reader granted inside the revoke's delay")
	}
	var revoked int
	var until *int64
	if err := pool.QueryRow(c, "SELECT revoked, not_before_ms FROM syncguard_locks_revoke($1, 0, $2)", rw, pglease.HashKey(r2.LockID)).Scan(&revoked, &until); err != nil ||
		revoked != 1 {
		t.Fatalf("SQL revoke of one reader = %d, %v", revoked, err)
	}
	if extends(r2.LockID) {
		t.Fatal("the reader revoked from SQL extends")
	}
	// Nothing named that is live: nothing changes.
	res, err = s.Revoke(c, []store.RevokeRequest{{Key: rw, Hold: pglease.HashKey(r2.LockID)}})
	if err != nil || res[0].Revoked != 0 {
		t.Fatalf("Revoke of a hold already revoked = %+v, %v", res, err)
	}
	// An exclusive lease named by its grant id; a hold of another key is
	// not found.
	ex := exclusive(t, s, rw+"x", time.Minute)
	if res, err := s.Revoke(c, []store.RevokeRequest{{Key: rw, Hold: pglease.HashKey(ex.LockID)}}); err != nil || res[0].Revoked != 0 {
		t.Fatalf("Revoke naming another key's hold = %+v, %v", res, err)
	}
	if res, err := s.Revoke(c, []store.RevokeRequest{{Key: rw + "x", Hold: pg.GrantID(ex.LockID)}}); err != nil || res[0].Revoked != 1 || !res[0].Exclusive {
		t.Fatalf("Revoke of an exclusive lease by grant id = %+v, %v", res, err)
	}
	for _, bad := range []string{"x", pglease.HashKey("a")[1:], "ABCDEF0123456789ABCDEF01", pg.GrantID(ex.LockID) + "0"} {
		if _, err := s.Revoke(c, []store.RevokeRequest{{Key: rw, Hold: bad}}); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Fatalf("Revoke with hold %q: %v; want InvalidArgument", bad, err)
		}
	}
	for _, q := range []string{"SELECT syncguard_locks_revoke($1, 0, 'nothex')", "SELECT syncguard_locks_request_release($1, 'nothex')"} {
		if _, err := pool.Exec(c, q, rw); err == nil {
			t.Fatalf("%s: no error", q)
		}
	}
	var asked int
	if err := pool.QueryRow(c, "SELECT syncguard_locks_request_release($1)", rw).Scan(&asked); err != nil || asked != 0 {
		t.Fatalf("SQL request of a key nobody holds = %d, %v; want 0", asked, err)
	}
}
