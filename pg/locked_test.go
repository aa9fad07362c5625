package pg_test

import (
	"testing"
	"time"

	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// A "locked" answer tells, from the same statement, the holder's expiry,
// how long until the key can be taken over on the server's clock
// (RetryAfter = ExpiresAt + TimeTolerance − the server's clock at the
// attempt), and the holder's identity: the one its pglease Store
// recorded, none for a SyncGuard holder, none for one that is not fit to
// print. Trying again RetryAfter after the answer is never early.
func TestAcquireLockedTellsExpiryAndHolder(t *testing.T) {
	t.Parallel()
	a, pool, _ := newSuperStore(t, pg.Config{Holder: "worker-a[42]@web-1"})
	b, err := pg.New(pool, pg.Config{Holder: "worker-b"})
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	const ttl = 1500 * time.Millisecond
	held, err := a.Acquire(c, "locked-info", ttl)
	if err != nil || !held.OK {
		t.Fatal(held, err)
	}

	before := serverNow(t, pool)
	r, err := b.Acquire(c, "locked-info", time.Minute)
	returned := time.Now()
	after := serverNow(t, pool)
	if err != nil || r.OK {
		t.Fatalf("Acquire of a held key = %v, %v; want locked", r, err)
	}
	if r.Holder != "worker-a[42]@web-1" || !r.ExpiresAt.Equal(held.ExpiresAt) || !r.AcquiredAt.IsZero() {
		t.Fatalf("locked answer %v; want holder worker-a[42]@web-1, expiry %v", r, held.ExpiresAt)
	}
	free := held.ExpiresAt.UnixMilli() + keys.TimeToleranceMs
	if ms := r.RetryAfter.Milliseconds(); ms < free-after || ms > free-before || r.RetryAfter%time.Millisecond != 0 {
		t.Fatalf("RetryAfter %v; want whole ms in [%d, %d] ms", r.RetryAfter, free-after, free-before)
	}
	// The property under test is a moment on the local clock: wait for it.
	time.Sleep(time.Until(returned.Add(r.RetryAfter)))
	got, err := b.Acquire(c, "locked-info", time.Minute)
	if err != nil || !got.OK {
		t.Fatalf("Acquire RetryAfter after the locked answer = %v, %v; want granted", got, err)
	}

	// A SyncGuard holder records no identity.
	sg := pgtest.NewSyncGuard(t, pool)
	if _, ok, err := sg.Acquire("locked-sg", time.Minute); err != nil || !ok {
		t.Fatalf("SyncGuard acquire: %v %v", ok, err)
	}
	r, err = b.Acquire(c, "locked-sg", time.Minute)
	if err != nil || r.OK || r.Holder != "" || r.RetryAfter < 30*time.Second {
		t.Fatalf("Acquire of SyncGuard's key = %v, %v; want locked, no holder", r, err)
	}

	// An identity written behind pglease's back that is not fit for a
	// terminal is not shown.
	if _, err := pool.Exec(c, "UPDATE syncguard_locks_holders SET holder = E'evil\\x1b[2J' WHERE key = 'locked-info'"); err != nil {
		t.Fatal(err)
	}
	r, err = a.Acquire(c, "locked-info", time.Minute)
	if err != nil || r.OK || r.Holder != "" {
		t.Fatalf("Acquire with an unprintable holder = %v, %v; want locked, no holder", r, err)
	}
}
