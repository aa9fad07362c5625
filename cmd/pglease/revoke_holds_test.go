package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager"
)

// serverMs is the server's clock in ms.
func (w *world) serverMs(t *testing.T) int64 {
	t.Helper()
	var now int64
	if err := w.pool.QueryRow(ctx(t), "SELECT "+nowMsSQL).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// release --force of a lease that expired 1.3 s ago with a 3 s lock delay
// refuses and says the truth: expired, still inside its lock delay until
// its end; it deletes nothing, and the key stays refused until then.
func TestReleaseExpiredLeaseInsideDelay(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	const key = "export:nightly"
	g, err := w.store.Acquire(c, store.AcquireRequest{Key: key, TTL: 500 * time.Millisecond, LockDelay: 3 * time.Second})
	if err != nil || !g.OK {
		t.Fatal(g, err)
	}
	exp := g.ExpiresAt.UnixMilli()
	end := exp + 3000
	waitFor(t, "1.3 s after the expiry", func() bool { return w.serverMs(t) >= exp+1300 })
	if a, err := w.store.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute}); err != nil || a.OK {
		t.Fatalf("takeover inside the lock delay = %v, %v", a, err)
	}
	r := run(t, w.url, "", "release", "--key", key, "--force", "--yes")
	want(t, r, exitNotFound, "lease "+pglease.HashKey(key)+" expired", "still inside its own lock delay: no acquire gets the key before",
		"nothing to revoke")
	for _, lie := range []string{"already free", "within the 1 s tolerance", "free for acquirers"} {
		if strings.Contains(r.stderr+r.stdout, lie) {
			t.Fatalf("the refusal says %q of a key inside its lock delay:\n%s", lie, r)
		}
	}
	noSecrets(t, r, key, g.LockID)
	if now := w.serverMs(t); now < end {
		if a, err := w.store.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute}); err != nil || a.OK {
			t.Fatalf("acquire %d ms after expiry, after release --force = %v, %v; want refused until %d ms", now-exp, a, err, end-exp)
		}
	}
	// Just after expiry (within the 1 s tolerance, or later on a slow
	// machine), a lease with a long delay: the delay is what keeps it.
	g2, err := w.store.Acquire(c, store.AcquireRequest{Key: key + ":long", TTL: 300 * time.Millisecond, LockDelay: time.Hour})
	if err != nil || !g2.OK {
		t.Fatal(g2, err)
	}
	waitFor(t, "the expiry", func() bool { return w.serverMs(t) > g2.ExpiresAt.UnixMilli() })
	r = run(t, w.url, "", "release", "--key", key+":long", "--force", "--yes")
	want(t, r, exitNotFound, "still inside its own lock delay: no acquire gets the key before", "(in 59m")
	r = run(t, w.url, "", "inspect", key+":long")
	want(t, r, 0)
	if !strings.Contains(r.stdout, "not grantable before") || strings.Contains(r.stdout, "free for acquirers") {
		t.Fatalf("inspect of an expired lease inside its lock delay:\n%s", r)
	}

	waitFor(t, "the delay's end", func() bool { return w.serverMs(t) >= end })
	r = run(t, w.url, "", "release", "--key", key, "--force", "--yes")
	want(t, r, exitNotFound, "expired", "the key is free for acquirers", "nothing to revoke")
	if a, err := w.store.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute}); err != nil || !a.OK || a.Fence != g.Fence+1 {
		t.Fatalf("acquire after the delay = %v, %v", a, err)
	}
}

// release --key reaches semaphore permits and readers held by a Manager:
// one named with --hold (its grant id, or the id inspect shows), or all;
// the holders' Manager ends each revoked lock with ErrRevoked; without
// --force it refuses and names them; --request --hold asks one holder.
func TestReleaseRevokesSharedHolds(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	m, err := manager.Open(c, w.url, manager.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close(context.Background()) }()
	const sem = "exports:slots"
	h := pglease.HashKey(sem)
	var p [3]*manager.Lock
	for i := range p {
		if p[i], err = m.Acquire(c, sem, manager.WithLimit(3), manager.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	revoked := func(what string, lk *manager.Lock) {
		t.Helper()
		select {
		case <-lk.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: still held", what)
		}
		if cause := context.Cause(lk.Context()); !errors.Is(cause, pglease.ErrRevoked) || pglease.CodeOf(cause) != pglease.CodeRevoked {
			t.Fatalf("%s: ended with %v; want ErrRevoked", what, cause)
		}
	}

	r := run(t, w.url, "", "release", "--key", sem)
	want(t, r, exitRefused, "refusing: 3 shared hold(s) of "+h, "ErrRevoked", "--force", "--hold")
	r = run(t, w.url, "", "inspect", sem)
	want(t, r, 0, "3 of 3 permits (full)")
	if strings.Count(r.stdout, "  permit") != 3 || !strings.Contains(r.stdout, "id ") {
		t.Fatalf("inspect does not show each permit's id:\n%s", r)
	}
	// One permit, by its grant id.
	r = run(t, w.url, "", "release", "--key", sem, "--hold", p[1].GrantID(), "--force", "--yes")
	want(t, r, 0, "revoked 1 shared hold(s) of "+h)
	noSecrets(t, r, sem)
	revoked("the permit named", p[1])
	for _, lk := range []*manager.Lock{p[0], p[2]} {
		if err := lk.Err(); err != nil {
			t.Fatalf("a permit not named: %v", err)
		}
	}
	if a := auditRecords(t, r); len(a) != 1 || a[0]["action"] != "revoke_shared" || a[0]["result"] != "revoked" {
		t.Fatalf("audit records: %v\n%s", a, r)
	}
	// The rest: two left.
	r = run(t, w.url, "", "release", "--key", sem, "--force", "--yes")
	want(t, r, 0, "revoked 2 shared hold(s) of "+h)
	revoked("a permit (all)", p[0])
	revoked("a permit (all)", p[2])
	r = run(t, w.url, "", "release", "--key", sem, "--force", "--yes")
	want(t, r, exitNotFound, "no such lease")

	// Readers: --request --hold asks one; --hold with inspect's id revokes it.
	const rw = "cache:rw"
	r1, err := m.Acquire(c, rw, manager.Shared(), manager.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := m.Acquire(c, rw, manager.Shared(), manager.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	r = run(t, w.url, "", "release", "--key", rw, "--request", "--hold", r2.GrantID())
	want(t, r, 0, "asked the holders of "+pglease.HashKey(rw), "1 shared holder(s)")
	select {
	case <-r2.ReleaseRequested():
	case <-time.After(30 * time.Second):
		t.Fatal("the reader named was not asked to release")
	}
	sec, err := readShared(c, w.pool, w.store.Names(), rw, 10, false)
	if err != nil || len(sec.Rows) != 1 || len(sec.Rows[0].Holders) != 2 {
		t.Fatalf("readers: %+v, %v", sec, err)
	}
	var id string
	for _, hv := range sec.Rows[0].Holders {
		if store.HoldMatches(r1.GrantID(), hv.lockID) {
			id = hv.LockIDHash
		}
	}
	r = run(t, w.url, "", "release", "--key", rw, "--hold", id, "--force", "--yes")
	want(t, r, 0, "revoked 1 shared hold(s) of "+pglease.HashKey(rw), id)
	revoked("the reader named", r1)
	if err := r2.Err(); err != nil {
		t.Fatalf("the other reader: %v", err)
	}
	r = run(t, w.url, "", "release", "--key", rw, "--hold", id, "--force", "--yes")
	want(t, r, exitNotFound, "no live hold "+id)
	r = run(t, w.url, "", "release", "--key", rw, "--hold", "nothex")
	want(t, r, exitUsage, "--hold must be")
	_ = r2.Release(c)
}
