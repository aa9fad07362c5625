package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/store"
)

// TestLockedByOpenTransaction: a key whose lock another transaction
// holds and keeps (an acquire or an extend made in a transaction left
// open) is answered "held" by every acquire function within its bounded
// lock wait, instead of the statement waiting for that transaction to
// end; the other keys of the same statement are answered as usual. Each
// statement runs under a statement timeout well above the bound, so
// waiting for the transaction fails it.
func TestLockedByOpenTransaction(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	// "extended": a live lease whose extend another transaction made and
	// keeps open (its row lock held).
	ext, err := s.Acquire(c, store.AcquireRequest{Key: "extended", TTL: time.Minute})
	if err != nil || !ext.OK {
		t.Fatalf("acquire = %v, %v", ext, err)
	}
	// "expired": an expired lease whose row another transaction guards
	// (FOR KEY SHARE), so a takeover would wait for it.
	old, err := s.Acquire(c, store.AcquireRequest{Key: "expired", TTL: 1500 * time.Millisecond})
	if err != nil || !old.OK {
		t.Fatalf("acquire = %v, %v", old, err)
	}
	tx, err := pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	in, err := store.New("pg.New", tx, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := in.Acquire(c, store.AcquireRequest{Key: "held", TTL: time.Minute}); err != nil || !r.OK {
		t.Fatalf("acquire in the transaction = %v, %v", r, err)
	}
	if r, err := in.Extend(c, ext.LockID, time.Minute); err != nil || !r.OK {
		t.Fatalf("extend in the transaction = %v, %v", r, err)
	}
	if _, err := in.Guard(c, tx, old.LockID); err != nil {
		t.Fatalf("guard in the transaction: %v", err)
	}
	waitServer(t, pool, old.ExpiresAt.UnixMilli()+1100)

	conn, err := pool.Acquire(c)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(c, "SET statement_timeout = '3s'"); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), "RESET statement_timeout") }()
	other, err := store.New("pg.New", conn, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	locked := []string{"held", "extended", "expired"}
	check := func(what string, rs []store.AcquireResult, err error, held int) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for i, r := range rs {
			if i < held && (r.OK || r.Err != nil) {
				t.Errorf("%s of %q = %+v, want held", what, locked[i], r)
			}
			if i >= held && (!r.OK || r.Err != nil) {
				t.Errorf("%s of a free key = %+v, want granted", what, r)
			}
		}
	}

	t0 := time.Now()
	rs, err := other.AcquireMany(c, []store.AcquireRequest{
		{Key: "held", TTL: time.Minute}, {Key: "extended", TTL: time.Minute}, {Key: "expired", TTL: time.Minute},
		{Key: "free1", TTL: time.Minute},
	})
	check("AcquireMany", rs, err, 3)
	if rs[1].ExpiresAt.IsZero() || rs[1].RetryAfter <= 0 || rs[1].RetryAfter > time.Second {
		t.Errorf("a live lease whose row another transaction keeps locked = %+v; want its expiry, and to try again within a second", rs[1])
	}
	t.Logf("AcquireMany answered in %v", time.Since(t0))

	sets, err := other.AcquireSets(c, [][]store.AcquireRequest{
		{{Key: "held", TTL: time.Minute}}, {{Key: "extended", TTL: time.Minute}}, {{Key: "expired", TTL: time.Minute}},
		{{Key: "free2", TTL: time.Minute}},
	})
	if err != nil {
		t.Fatalf("AcquireSets: %v", err)
	}
	var flat []store.AcquireResult
	for _, set := range sets {
		flat = append(flat, set...)
	}
	check("AcquireSets", flat, nil, 3)

	rs, err = other.AcquireSharedMany(c, []store.SharedRequest{
		{Key: "held", TTL: time.Minute}, {Key: "free3", TTL: time.Minute},
	})
	locked = []string{"held"}
	check("AcquireSharedMany", rs, err, 1)

	// A handoff of a lease whose key's lock the transaction keeps (it tried
	// the key and was refused): the old lease is released, the new grant
	// answered held.
	mine, err := s.Acquire(c, store.AcquireRequest{Key: "mine", TTL: time.Minute})
	if err != nil || !mine.OK {
		t.Fatalf("acquire = %v, %v", mine, err)
	}
	if r, err := in.Acquire(c, store.AcquireRequest{Key: "mine", TTL: time.Minute}); err != nil || r.OK {
		t.Fatalf("acquire of a held key in the transaction = %v, %v; want held", r, err)
	}
	hs, err := other.HandOff(c, []store.HandOffRequest{
		{Old: mine.LockID, Key: "mine", TTL: time.Minute},
	})
	if err != nil || len(hs) != 1 || !hs[0].Released || hs[0].OK || hs[0].RetryAfter <= 0 {
		t.Fatalf("HandOff of a key another transaction keeps locked = %+v, %v; want released, the grant held", hs, err)
	}

	// The transaction ends: the keys are answered by their rows again.
	if err := tx.Rollback(c); err != nil {
		t.Fatal(err)
	}
	r, err := other.Acquire(c, store.AcquireRequest{Key: "held", TTL: time.Minute})
	if err != nil || !r.OK {
		t.Fatalf("acquire after the transaction = %v, %v", r, err)
	}
	r, err = other.Acquire(c, store.AcquireRequest{Key: "expired", TTL: time.Minute})
	if err != nil || !r.OK {
		t.Fatalf("takeover after the transaction = %v, %v", r, err)
	}
	r, err = other.Acquire(c, store.AcquireRequest{Key: "extended", TTL: time.Minute})
	if err != nil || r.OK || r.ExpiresAt.IsZero() {
		t.Fatalf("acquire of a live lease after the transaction = %v, %v; want held, with its expiry", r, err)
	}
}
