package migrate_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// rolePool connects to the package database as role (trust auth in the
// throwaway cluster) with search_path = schema.
func rolePool(t *testing.T, role, schema string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	cfg.ConnConfig.Password = ""
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 2
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestLeastPrivilegeRoles applies roles.sql (through RolesSQL) to two
// fresh LOGIN roles, runs SetupSchema as the owner and the whole Store API
// as the runtime role, and checks that the runtime role cannot delete or
// truncate fence counters and holds no superuser or pg_signal_backend.
func TestLeastPrivilegeRoles(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	admin, err := pgx.Connect(c, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	var super bool
	var db string
	if err := admin.QueryRow(c, "SELECT rolsuper, current_database() FROM pg_roles WHERE rolname = current_user").Scan(&super, &db); err != nil {
		t.Fatal(err)
	}
	if !super {
		t.Skip("needs a superuser DATABASE_URL (like pgtest's clusters: trust auth) to create login roles")
	}

	owner, runtime := pgtest.RandomName("pglease_owner_"), pgtest.RandomName("pglease_rt_")
	for _, r := range []string{owner, runtime} {
		if _, err := admin.Exec(c, "CREATE ROLE "+r+" LOGIN"); err != nil {
			t.Fatal(err)
		}
	}
	// Registered before pgtest.Schema and the pools, so it runs after the
	// schema is dropped and the pools are closed (cleanups run LIFO).
	t.Cleanup(func() {
		cc, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, q := range []string{"DROP OWNED BY " + owner + ", " + runtime, "DROP ROLE " + owner, "DROP ROLE " + runtime} {
			if err := pgtest.ExecGrants(cc, admin, q); err != nil { // DROP OWNED revokes on the database
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	schema := pgtest.Schema(t)

	ownerSQL, runtimeSQL, err := migrate.RolesSQL(owner, runtime, schema, db)
	if err != nil {
		t.Fatal(err)
	}
	psqlVar := regexp.MustCompile(`[^:]:["'{]`)
	for _, s := range []string{ownerSQL, runtimeSQL} {
		if m := psqlVar.FindString(s); m != "" {
			t.Fatalf("psql variable left unsubstituted: %q", m)
		}
	}

	ownerPool := rolePool(t, owner, schema)
	ownerStore, err := newEnv(ownerPool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// Without step 1 the owner cannot create anything in the schema
	// (qualified names: without USAGE the schema is not on its search_path).
	qualified, err := newEnv(ownerPool, pg.Config{LockTable: schema + ".syncguard_locks", FenceTable: schema + ".syncguard_fence_counters"})
	if err != nil {
		t.Fatal(err)
	}
	if err := qualified.mg.Up(c); pglease.CodeOf(err) != pglease.CodeAuthFailed {
		t.Fatalf("SetupSchema before step 1 = %v, want AuthFailed", err)
	}
	// Step 2 refuses to run before the functions exist.
	if err := pgtest.ExecGrants(c, admin, runtimeSQL); err == nil {
		t.Fatal("runtime step ran before SetupSchema")
	}
	if err := pgtest.ExecGrants(c, admin, ownerSQL); err != nil {
		t.Fatalf("owner step: %v", err)
	}
	if err := ownerStore.mg.Up(c); err != nil {
		t.Fatalf("SetupSchema as owner: %v", err)
	}
	// Both steps are idempotent; run them twice.
	for range 2 {
		if err := pgtest.ExecGrants(c, admin, ownerSQL); err != nil {
			t.Fatalf("owner step: %v", err)
		}
		if err := pgtest.ExecGrants(c, admin, runtimeSQL); err != nil {
			t.Fatalf("runtime step: %v", err)
		}
	}
	// The owner owns both tables and every pglease function.
	var notOwned int
	if err := admin.QueryRow(c, `
		SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace
		          AND relname IN ('syncguard_locks', 'syncguard_fence_counters') AND relowner <> $2::regrole)
		     + (SELECT count(*) FROM pg_proc WHERE pronamespace = $1::regnamespace
		          AND proname LIKE 'pglease\_%' AND proowner <> $2::regrole)
		     + 2 - (SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace
		          AND relname IN ('syncguard_locks', 'syncguard_fence_counters'))`, schema, owner).Scan(&notOwned); err != nil {
		t.Fatal(err)
	}
	if notOwned != 0 {
		t.Fatalf("%d tables/functions missing or not owned by the owner role", notOwned)
	}

	rt := rolePool(t, runtime, schema)
	s, err := newEnv(rt, pg.Config{NotifyChannel: "pglease_roles_test"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(c, store.AcquireRequest{Key: "roles:a", TTL: time.Minute})
	if err != nil || !a.OK {
		t.Fatalf("Acquire as runtime = %+v, %v", a, err)
	}
	if e, err := s.Extend(c, a.LockID, 2*time.Minute); err != nil || !e.OK {
		t.Fatalf("Extend = %+v, %v", e, err)
	}
	if info, err := s.LookupByKey(c, "roles:a"); err != nil || info == nil || info.Fence != a.Fence {
		t.Fatalf("LookupByKey = %v, %v", info, err)
	}
	if info, err := s.LookupByID(c, a.LockID); err != nil || info == nil {
		t.Fatalf("LookupByID = %v, %v", info, err)
	}
	if locked, err := s.IsLocked(c, "roles:a"); err != nil || !locked {
		t.Fatalf("IsLocked = %v, %v", locked, err)
	}
	if ok, err := s.Release(c, a.LockID); err != nil || !ok {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	many, err := s.AcquireMany(c, []store.AcquireRequest{{Key: "roles:a", TTL: time.Minute}, {Key: "roles:b", TTL: time.Minute}})
	if err != nil {
		t.Fatalf("AcquireMany: %v", err)
	}
	var ids []string
	for i, r := range many {
		if r.Err != nil || !r.OK {
			t.Fatalf("AcquireMany[%d] = %+v", i, r)
		}
		ids = append(ids, r.LockID)
	}
	if many[0].Fence <= a.Fence {
		t.Fatalf("fence did not increase: %v then %v", a.Fence, many[0].Fence)
	}
	oks, err := s.ReleaseMany(c, ids)
	if err != nil || len(oks) != 2 || !oks[0] || !oks[1] {
		t.Fatalf("ReleaseMany = %v, %v", oks, err)
	}
	again, err := s.Acquire(c, store.AcquireRequest{Key: "roles:b", TTL: time.Minute})
	if err != nil || !again.OK || again.Fence <= many[1].Fence {
		t.Fatalf("re-Acquire = %+v, %v (previous fence %v)", again, err, many[1].Fence)
	}
	if ok, err := s.Release(c, again.LockID); err != nil || !ok {
		t.Fatalf("Release = %v, %v", ok, err)
	}

	// The runtime role cannot delete or truncate fence counters (nor create
	// objects in the schema); the error is 42501, mapped to AuthFailed.
	for _, q := range []string{
		"DELETE FROM syncguard_fence_counters",
		"TRUNCATE syncguard_fence_counters",
		"CREATE TABLE roles_x (a int)",
	} {
		_, err := rt.Exec(c, q)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Fatalf("%s as runtime: %v, want SQLSTATE 42501", q, err)
		}
		if code := pglease.CodeOf(pgerr.Map(c, "test", err)); code != pglease.CodeAuthFailed {
			t.Fatalf("%s: mapped code %v, want AuthFailed", q, code)
		}
	}
	var n int
	if err := admin.QueryRow(c, "SELECT count(*) FROM "+schema+".syncguard_fence_counters WHERE fence > 0").Scan(&n); err != nil || n != 2 {
		t.Fatalf("fence counters = %d, %v; want 2 kept", n, err)
	}

	// Role attributes and privileges, as the server sees them.
	var (
		rolsuper, signal, monitor, fenceDel, fenceTrunc, lockDel, create bool
		publicExec                                                       int
	)
	if err := admin.QueryRow(c, `
		SELECT r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls,
		       pg_has_role($1, 'pg_signal_backend', 'MEMBER'),
		       pg_has_role($1, 'pg_monitor', 'MEMBER'),
		       has_table_privilege($1, $2 || '.syncguard_fence_counters', 'DELETE'),
		       has_table_privilege($1, $2 || '.syncguard_fence_counters', 'TRUNCATE'),
		       has_table_privilege($1, $2 || '.syncguard_locks', 'DELETE'),
		       has_schema_privilege($1, $2, 'CREATE'),
		       (SELECT count(*) FROM pg_proc AS p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
		         WHERE p.pronamespace = $2::regnamespace AND p.proname LIKE 'pglease\_%'
		           AND a.grantee = 0 AND a.privilege_type = 'EXECUTE')
		FROM pg_roles AS r WHERE r.rolname = $1`, runtime, schema).
		Scan(&rolsuper, &signal, &monitor, &fenceDel, &fenceTrunc, &lockDel, &create, &publicExec); err != nil {
		t.Fatal(err)
	}
	if rolsuper || signal || monitor || fenceDel || fenceTrunc || !lockDel || create || publicExec != 0 {
		t.Fatalf("runtime role: privileged attribute %v, pg_signal_backend %v, pg_monitor %v, fence DELETE %v, fence TRUNCATE %v, "+
			"lock DELETE %v, schema CREATE %v, functions executable by PUBLIC %d",
			rolsuper, signal, monitor, fenceDel, fenceTrunc, lockDel, create, publicExec)
	}
}

func TestRolesSQLInvalid(t *testing.T) {
	t.Parallel()
	for _, bad := range [][4]string{
		{"", "r", "s", "d"},
		{"o", "r\x00", "s", "d"},
		{"o", "r", strings.Repeat("x", 64), "d"},
		{"o", "r", "s", "\xff"},
	} {
		if _, _, err := migrate.RolesSQL(bad[0], bad[1], bad[2], bad[3]); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
			t.Errorf("RolesSQL(%q) = %v, want InvalidArgument", bad, err)
		}
	}
	o, r, err := migrate.RolesSQL(`o"x`, "r'y", "s", "d")
	if err != nil || !regexp.MustCompile(`"o""x"`).MatchString(o) || !regexp.MustCompile(`'r''y'`).MatchString(r) {
		t.Fatalf("quoting: %v\n%s\n%s", err, o, r)
	}
}
