package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// TestRuntimeRoleStore runs the Store operations that
// TestLeastPrivilegeRoles does not (handoff, ExtendMany, Owns, raw
// lookups, ListLeases, FenceCounter, the schema checks) and the fence
// guard's four writes as the runtime role of roles.sql, on a schema the
// owner role set up (pgtest.RoleSchemaForTest), as in production. What
// the runtime role cannot do is DDL: creating or changing the schema (Up
// of an older schema, To, SetupReleaseTrigger) is the owner's
// (documented exception; SetupReleaseTrigger checked refused here).
func TestRuntimeRoleStore(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	rs := pgtest.RoleSchemaForTest(t)
	rp := rs.RuntimePool(t)
	s, err := store.New("pg.New", rp, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	mg, err := migrate.New(rp, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.Check(c); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if v, _, err := mg.Version(c); err != nil || v < 1 {
		t.Fatalf("Version = %d, %v", v, err)
	}
	// Up of a current schema changes nothing (no DDL), so the runtime
	// role may call it; creating a trigger is DDL.
	if err := mg.Up(c); err != nil {
		t.Errorf("Up of a current schema as the runtime role: %v", err)
	}
	if err := mg.SetupReleaseTrigger(c, "pglease_rr"); pglease.CodeOf(err) != pglease.CodeAuthFailed {
		t.Errorf("SetupReleaseTrigger as the runtime role = %v, want AuthFailed", err)
	}

	a, err := s.Acquire(c, store.AcquireRequest{Key: "rr:a", TTL: time.Minute})
	if err != nil || !a.OK {
		t.Fatalf("Acquire = %+v, %v", a, err)
	}
	if ok, err := s.Owns(c, a.LockID); err != nil || !ok {
		t.Fatalf("Owns = %v, %v", ok, err)
	}
	if ext, err := s.ExtendMany(c, []store.ExtendRequest{{LockID: a.LockID, TTL: 2 * time.Minute}}); err != nil || len(ext) != 1 || !ext[0].OK {
		t.Fatalf("ExtendMany = %+v, %v", ext, err)
	}
	if raw, err := s.LookupRawByKey(c, "rr:a"); err != nil || raw == nil {
		t.Fatalf("LookupRawByKey = %v, %v", raw, err)
	}
	if raw, err := s.LookupRawByID(c, a.LockID); err != nil || raw == nil {
		t.Fatalf("LookupRawByID = %v, %v", raw, err)
	}
	list, err := s.ListLeases(c, store.ListOptions{})
	if err != nil || list.Live != 1 || len(list.Rows) != 1 {
		t.Fatalf("ListLeases = %+v, %v", list, err)
	}
	ho, err := s.HandOff(c, []store.HandOffRequest{{Old: a.LockID, Key: "rr:a", TTL: time.Minute}})
	if err != nil || len(ho) != 1 || !ho[0].Released || !ho[0].OK || ho[0].Fence <= a.Fence {
		t.Fatalf("HandOff = %+v, %v", ho, err)
	}
	if f, ok, err := s.FenceCounter(c, "rr:a"); err != nil || !ok || f != ho[0].Fence {
		t.Fatalf("FenceCounter = %v, %v, %v; want %v", f, ok, err, ho[0].Fence)
	}

	// The fence guard at a resource table the runtime role may write.
	admin, err := pgx.Connect(c, rs.Admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	if _, err := admin.Exec(c, `CREATE TABLE `+rs.Schema+`.rr_res (k text PRIMARY KEY, fence bigint, fence_grant text, v int);
		GRANT SELECT, INSERT, UPDATE ON `+rs.Schema+`.rr_res TO `+rs.Runtime); err != nil {
		t.Fatal(err)
	}
	plain, err := pg.NewFenceGuard("rr_res", "k", "fence")
	if err != nil {
		t.Fatal(err)
	}
	gg, err := plain.WithGrantColumn("fence_grant")
	if err != nil {
		t.Fatal(err)
	}
	res := rs.RuntimePool(t)
	f, grant := ho[0].Fence, pg.Set{Column: "fence_grant", Value: pg.GrantID(ho[0].LockID)}
	v := pg.Set{Column: "v", Value: 1}
	for _, w := range []struct {
		what  string
		write func() (bool, error)
	}{
		{"Upsert", func() (bool, error) { return plain.Upsert(c, res, "plain", f, v) }},
		{"Update", func() (bool, error) { return plain.Update(c, res, "plain", f, v) }},
		{"Upsert with grant", func() (bool, error) { return gg.Upsert(c, res, "granted", f, grant, v) }},
		{"Update with grant", func() (bool, error) { return gg.Update(c, res, "granted", f, grant, v) }},
	} {
		if ok, err := w.write(); err != nil || !ok {
			t.Errorf("%s as the runtime role = %v, %v", w.what, ok, err)
		}
	}
	// A repeat of the fence from another grant is refused.
	other, err := s.Acquire(c, store.AcquireRequest{Key: "rr:b", TTL: time.Minute})
	if err != nil || !other.OK {
		t.Fatalf("Acquire = %+v, %v", other, err)
	}
	if _, err := gg.Update(c, res, "granted", f, pg.Set{Column: "fence_grant", Value: pg.GrantID(other.LockID)}, v); pglease.CodeOf(err) != pglease.CodeFenceRegression {
		t.Errorf("Update of a repeated fence = %v, want FenceRegression", err)
	}
	if oks, err := s.ReleaseMany(c, []string{ho[0].LockID, other.LockID}); err != nil || !oks[0] || !oks[1] {
		t.Fatalf("ReleaseMany = %v, %v", oks, err)
	}
	// DDL and deleting fence counters are refused (SQLSTATE 42501).
	for _, q := range []string{"CREATE TABLE rr_x (a int)", "DELETE FROM syncguard_fence_counters"} {
		if _, err := res.Exec(c, q); pglease.CodeOf(pgerr.Map(c, "test", err)) != pglease.CodeAuthFailed {
			t.Errorf("%s as the runtime role: %v, want a privilege error", q, err)
		}
	}
}
