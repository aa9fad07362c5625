package manager

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/advisory"
)

// TestRuntimeRoleManager: every lock operation of the
// Manager runs as the runtime role of roles.sql (no DDL, no DELETE on
// the fence table, not superuser); only the schema setup ran as the owner
// (pgtest.RoleSchemaForTest). Two Managers, each on its own pool of the
// runtime role: acquire, contended TryAcquire, Extend, release with a
// local waiter (one-statement handoff), a cross-Manager wake-up through
// LISTEN/NOTIFY (the waiting Manager polls only every 20 s), session
// advisory locks, the fence guard at a resource,
// and Close releasing a held lock.
func TestRuntimeRoleManager(t *testing.T) {
	t.Parallel()
	rs := pgtest.RoleSchemaForTest(t)
	ctx := ctxT(t)
	a, asig := failoverManager(t, rs.RuntimeURL, Config{}, kernel.TestHooks{})
	b, bsig := failoverManager(t, rs.RuntimeURL, Config{Retry: pollingTooSlow}, kernel.TestHooks{})
	wait(t, &asig.Listening)
	wait(t, &bsig.Listening)

	// The Managers' pools connect as the runtime role: no DDL there.
	var pe *pgconn.PgError
	if _, err := rs.RuntimePool(t).Exec(ctx, "CREATE TABLE rr_x (a int)"); !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("CREATE TABLE as the runtime role = %v, want SQLSTATE 42501", err)
	}

	// Acquire, contended TryAcquire from the other Manager, Extend.
	lk, err := a.Acquire(ctx, "rr:a")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.TryAcquire(ctx, "rr:a"); err != nil || ok {
		t.Fatalf("TryAcquire of a held key = %v, %v; want not granted", ok, err)
	}
	before := lk.ExpiresAt()
	if err := lk.Extend(ctx); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if !lk.ExpiresAt().After(before) {
		t.Fatalf("Extend did not move the expiry: %v then %v", before, lk.ExpiresAt())
	}

	// A local waiter: the release hands the key over in one statement.
	drain(&asig.Queued)
	got := make(chan *Lock, 1)
	go func() {
		l, err := a.Acquire(ctx, "rr:a")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitFor(t, &asig.Queued, func(k string) bool { return k == "rr:a" })
	drain(&asig.BatchSent)
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitFor(t, &asig.BatchSent, func(bi kernel.BatchInfo) bool { return bi.Kind == kernel.KindHandOff })
	next := <-got
	if next == nil {
		t.FailNow()
	}
	if next.Fence() <= lk.Fence() {
		t.Fatalf("handoff fence %v not above %v", next.Fence(), lk.Fence())
	}

	// A waiter in the other Manager is woken by the release's NOTIFY.
	woken := make(chan error, 1)
	go func() {
		l, err := b.Acquire(ctx, "rr:a")
		if err == nil {
			err = l.Release(ctx)
		}
		woken <- err
	}()
	waitFor(t, &bsig.Retrying, func(k string) bool { return k == "rr:a" })
	if err := next.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case err := <-woken:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitTimeout()):
		t.Fatal("waiter in the other Manager not woken: LISTEN/NOTIFY does not work as the runtime role")
	}

	// Session advisory locks through the Manager.
	key := advisory.Int64(7070707)
	al, err := a.LockAdvisory(ctx, key)
	if err != nil {
		t.Fatalf("LockAdvisory: %v", err)
	}
	if _, ok, err := b.TryLockAdvisory(ctx, key); err != nil || ok {
		t.Fatalf("TryLockAdvisory of a held key = %v, %v; want not granted", ok, err)
	}
	if err := al.Release(ctx); err != nil {
		t.Fatalf("advisory Release: %v", err)
	}
	bl, ok, err := b.TryLockAdvisory(ctx, key)
	if err != nil || !ok {
		t.Fatalf("TryLockAdvisory after release = %v, %v", ok, err)
	}
	if err := bl.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The fence guard at a resource the runtime role may write to.
	admin, err := pgx.Connect(ctx, rs.Admin)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `CREATE TABLE `+rs.Schema+`.rr_res (k text PRIMARY KEY, fence bigint, fence_grant text, v int);
		GRANT SELECT, INSERT, UPDATE ON `+rs.Schema+`.rr_res TO `+rs.Runtime); err != nil {
		t.Fatal(err)
	}
	g, err := pg.NewFenceGuard("rr_res", "k", "fence")
	if err == nil {
		g, err = g.WithGrantColumn("fence_grant")
	}
	if err != nil {
		t.Fatal(err)
	}
	res := rs.RuntimePool(t)
	w, err := a.Acquire(ctx, "rr:res")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := g.Upsert(ctx, res, "r1", w.Fence(), pg.Set{Column: "fence_grant", Value: w.GrantID()}, pg.Set{Column: "v", Value: 1}); err != nil || !ok {
		t.Fatalf("Upsert with the grant = %v, %v", ok, err)
	}

	// Close releases what is still held.
	if err := a.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+rs.Schema+".syncguard_locks").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d lock rows left after Close (%v)", n, err)
	}
}
