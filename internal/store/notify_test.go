package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

// The server-side hashKey equals pglease.HashKey (SyncGuard's vectors),
// and a release notifies HashKey(key) on the key's wake channel of the
// configured channel.
func TestNotifyOnRelease(t *testing.T) {
	t.Parallel()
	s, pool, schema := newStore(t, store.Config{NotifyChannel: "pglease_rel"})
	c := ctx(t)
	sqlFn := `"pglease_hashkey_v1"`
	if s.Names().FnHash != sqlFn {
		t.Fatalf("the hashKey function is %s, not %s", s.Names().FnHash, sqlFn)
	}
	for _, v := range []string{"k1", "resource:123", "café", "😀", strings.Repeat("x", 512), "fence:k1", "a😀b\u00e9"} {
		var got string
		if err := pool.QueryRow(c, "SELECT "+sqlFn+"($1)", v).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != pglease.HashKey(v) {
			t.Errorf("SQL hashKey = %s, Go = %s", got, pglease.HashKey(v))
		}
	}
	l, err := pgx.Connect(c, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if _, err := l.Exec(c, listenAllSQL("pglease_rel")); err != nil {
		t.Fatal(err)
	}
	_ = schema
	r, err := s.Acquire(c, store.AcquireRequest{Key: "notify-😀", TTL: time.Minute})
	if err != nil || !r.OK {
		t.Fatal(r, err)
	}
	if ok, err := s.Release(c, r.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// A failed release does not notify.
	if ok, err := s.Release(c, r.LockID); err != nil || ok {
		t.Fatal(ok, err)
	}
	wc, cancel := context.WithTimeout(c, 5*time.Second)
	defer cancel()
	n, err := l.WaitForNotification(wc)
	if err != nil {
		t.Fatal(err)
	}
	if n.Channel != store.WakeChannel("pglease_rel", pglease.HashKey("notify-😀")) || n.Payload != pglease.HashKey("notify-😀") {
		t.Fatalf("notification %q %q", n.Channel, n.Payload)
	}
	wc2, cancel2 := context.WithTimeout(c, 100*time.Millisecond)
	defer cancel2()
	if n, err := l.WaitForNotification(wc2); err == nil {
		t.Fatalf("unexpected second notification %q", n.Payload)
	}
}

// Mixed fleet: a row written by SyncGuard's acquire statements is read,
// extended and released by pglease; pglease's rows read back as SyncGuard
// expects (covered in TestLifecycleAndStoredFormat).
func TestSyncGuardWrittenRow(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	id := keys.NewLockID()
	// SyncGuard 2.5.2's acquire statements, after its BEGIN.
	tx, err := pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct {
		sql  string
		args []any
	}{
		{"SELECT pg_advisory_xact_lock(hashtext($1))", []any{"sg"}},
		{"INSERT INTO syncguard_fence_counters (fence_key, fence, key_debug) VALUES ($1, 0, $2) ON CONFLICT (fence_key) DO NOTHING", []any{"fence:sg", "sg"}},
		{"UPDATE syncguard_fence_counters SET fence = fence + 1 WHERE fence_key = $1", []any{"fence:sg"}},
		{`INSERT INTO syncguard_locks (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
		  VALUES ($1, $2, (EXTRACT(EPOCH FROM NOW()) * 1000)::bigint + 60000, (EXTRACT(EPOCH FROM NOW()) * 1000)::bigint, '000000000000001', $1)`, []any{"sg", id}},
	} {
		if _, err := tx.Exec(c, st.sql, st.args...); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(c); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Acquire(c, store.AcquireRequest{Key: "sg", TTL: time.Second}); err != nil || r.OK {
		t.Fatalf("Acquire of a SyncGuard-held key = %+v, %v", r, err)
	}
	info, err := s.LookupByKey(c, "sg")
	if err != nil || info == nil || info.Fence != 1 || info.LockIDHash != pglease.HashKey(id) || info.KeyHash != pglease.HashKey("sg") {
		t.Fatalf("LookupByKey = %v, %v", info, err)
	}
	if e, err := s.Extend(c, id, time.Minute); err != nil || !e.OK {
		t.Fatalf("Extend = %+v, %v", e, err)
	}
	if ok, err := s.Release(c, id); err != nil || !ok {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	r, err := s.Acquire(c, store.AcquireRequest{Key: "sg", TTL: time.Second})
	if err != nil || !r.OK || r.Fence != 2 {
		t.Fatalf("Acquire after SyncGuard's grant = %+v, %v; want fence 2", r, err)
	}
}
