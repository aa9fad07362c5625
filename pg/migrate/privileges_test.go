package migrate_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// TestMissingPrivileges grants a fresh role the runtime privileges the
// docs listed before the shared-hold table existed (lock, fence and
// holder tables, pglease_* functions): its acquire fails with AuthFailed
// naming the roles script, and MissingPrivileges lists exactly the
// shared-hold table's privileges and the SQL API's grants; roles.sql's
// runtime role lacks nothing.
func TestMissingPrivileges(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	rs := pgtest.RoleSchemaForTest(t)
	admin, err := pgx.Connect(c, rs.Admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	role := pgtest.RandomName("pglease_olddoc_")
	if _, err := admin.Exec(c, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, q := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if err := pgtest.ExecGrants(cc, admin, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	s := rs.Schema
	grants := "GRANT USAGE ON SCHEMA " + s + " TO " + role + ";" +
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + s + ".syncguard_locks TO " + role + ";" +
		"GRANT SELECT, INSERT, UPDATE ON " + s + ".syncguard_fence_counters, " + s + ".syncguard_locks_holders TO " + role + ";" +
		"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA " + s + " TO " + role + ";" +
		"REVOKE EXECUTE ON FUNCTION " + s + ".syncguard_locks_acquire(text, bigint), " + s + ".syncguard_locks_release(text), " +
		s + ".syncguard_locks_extend(text, bigint), " + s + ".syncguard_locks_status(text), " + s + ".syncguard_locks_revoke(text, bigint, text), " +
		s + ".syncguard_locks_request_release(text, text), " +
		s + ".syncguard_locks_guard(regclass, name), " + s + ".syncguard_locks_guard(regclass, name, boolean), " + s + ".syncguard_locks_unguard(regclass) FROM " + role
	if err := pgtest.ExecGrants(c, admin, grants); err != nil {
		t.Fatal(err)
	}
	pool := rolePool(t, role, s)

	st, err := pg.New(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Acquire(c, "privs:k", 10*time.Second)
	if pglease.CodeOf(err) != pglease.CodeAuthFailed || !strings.Contains(err.Error(), "pglease sql roles") {
		t.Errorf("acquire as a role without the shared-hold table = %v, want AuthFailed naming `pglease sql roles`", err)
	}

	mg, err := migrate.New(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := mg.MissingPrivileges(c, role)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"SELECT on table syncguard_locks_shared", "INSERT on table syncguard_locks_shared",
		"UPDATE on table syncguard_locks_shared", "DELETE on table syncguard_locks_shared",
		"SELECT on table syncguard_locks_queue", "INSERT on table syncguard_locks_queue",
		"UPDATE on table syncguard_locks_queue", "DELETE on table syncguard_locks_queue",
		"SELECT on table syncguard_locks_leases", "SELECT on table syncguard_locks_waiters", "SELECT on table pglease_advisory_locks",
		"EXECUTE on function syncguard_locks_acquire(text,bigint)", "EXECUTE on function syncguard_locks_release(text)",
		"EXECUTE on function syncguard_locks_extend(text,bigint)", "EXECUTE on function syncguard_locks_status(text)",
		"EXECUTE on function syncguard_locks_revoke(text,bigint,text)",
		"EXECUTE on function syncguard_locks_request_release(text,text)"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("MissingPrivileges(old docs' role):\n got  %q\n want %q", got, want)
	}

	// The script's runtime role lacks nothing; checked through its own
	// connection and through the superuser's.
	for _, db := range []pg.DB{rs.RuntimePool(t), rs.AdminPool(t)} {
		mg, err := migrate.New(db, pg.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := mg.MissingPrivileges(c, rs.Runtime); err != nil || len(got) != 0 {
			t.Errorf("MissingPrivileges(runtime role) = %q, %v; want none", got, err)
		}
	}
	if _, err := mg.MissingPrivileges(c, "no_such_role_"+role); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("MissingPrivileges(unknown role) = %v, want InvalidArgument", err)
	}
	if _, err := mg.MissingPrivileges(c, ""); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("MissingPrivileges(\"\") = %v, want InvalidArgument", err)
	}
}
